//! `baton info`: what a model is, as a table for people or one JSON document.

use baton_runtime::model::{DigestCheck, Model, ModelConfig, ModelIdentity};
use serde::Serialize;
use std::fmt::Write;

/// The `baton info --json` document.
#[derive(Debug, Serialize)]
pub struct ModelSummary<'a> {
    pub identity: &'a ModelIdentity,
    pub config: &'a ModelConfig,
    pub kv_width: usize,
    pub chat_template: bool,
    /// Whether the sha256 was computed from the bytes now or trusted from its stamp.
    pub sha256_check: DigestCheck,
    pub load_conversions: Vec<Conversion<'a>>,
    /// The CPU kernel paths this model runs on; `None` off the CPU.
    pub kernels: Option<Kernels>,
    /// What runs its attention: "exact" (baton's CPU kernels, f32 on the CPU),
    /// "batched" (masked matmuls) or "fused" (one kernel per layer and chunk).
    pub attention: &'static str,
}

/// Which implementation runs the quantized products and the attention on this CPU, as
/// the CPU's features, `BATON_CPU_LEVEL` and `BATON_PORTABLE_KERNELS` decide.
#[derive(Debug, Serialize)]
pub struct Kernels {
    /// "avx512vnni", "avx2" or "portable" (baton's int8 kernels), or "candle" (candle's
    /// own quantized kernels, where baton's do not run).
    pub int8: &'static str,
    /// "avx512", "avx2" or "portable" (baton's), or "candle" (its batched products).
    pub attention: &'static str,
}

impl Kernels {
    /// `packed`: whether the model's projections were packed for baton's int8 kernels;
    /// `f32`: whether its activations are f32 (baton's attention kernels take only f32,
    /// candle's batched products run the rest).
    fn here(head_dim: usize, packed: bool, f32: bool) -> Self {
        use baton_runtime::kernels::{attention, int8};
        Self {
            int8: if packed {
                int8::path().name()
            } else {
                "candle"
            },
            attention: if f32 {
                attention::path_for(head_dim).name()
            } else {
                "candle"
            },
        }
    }
}

/// Weights requantised at load for the CPU kernels.
#[derive(Debug, Serialize)]
pub struct Conversion<'a> {
    pub from: &'a str,
    pub to: &'static str,
    pub tensors: usize,
    pub bytes_before: usize,
    pub bytes_after: usize,
}

impl<'a> ModelSummary<'a> {
    pub fn of(m: &'a Model) -> Self {
        let c = m.config();
        Self {
            identity: &m.identity,
            config: c,
            kv_width: c.kv_width(),
            chat_template: m.template.is_some(),
            sha256_check: m.sha256_check,
            load_conversions: m
                .decoder
                .weights()
                .conversion
                .converted
                .iter()
                .map(|(from, n, before, after)| Conversion {
                    from,
                    to: "Q8_0",
                    tensors: *n,
                    bytes_before: *before,
                    bytes_after: *after,
                })
                .collect(),
            kernels: m.decoder.device().is_cpu().then(|| {
                let packed = m
                    .decoder
                    .weights()
                    .layers
                    .first()
                    .is_some_and(|l| l.q.is_packed());
                let f32 = m.decoder.dtype() == candle_core::DType::F32;
                Kernels::here(c.head_dim, packed, f32)
            }),
            attention: m.decoder.attention_name(),
        }
    }

    /// The table `baton info` prints.
    pub fn table(&self) -> String {
        let (id, c) = (self.identity, self.config);
        let mut t = String::new();
        let mut row = |k: &str, v: String| {
            let _ = writeln!(t, "{k:<14}{v}");
        };
        row("model", id.name.clone());
        row("path", id.path.display().to_string());
        row("format", format!("{:?}", id.format));
        row(
            "sha256",
            match self.sha256_check {
                DigestCheck::HashedNow => format!("{} (hashed now)", id.sha256),
                DigestCheck::Stamp => format!(
                    "{} (from its stamp: size and modification time unchanged since it was \
                     last hashed; `baton fetch --verify` hashes it again)",
                    id.sha256
                ),
            },
        );
        row("architecture", c.arch.name().to_string());
        row("layers", c.n_layer.to_string());
        row("hidden", c.hidden.to_string());
        row(
            "heads",
            format!(
                "{} query, {} KV, head width {}",
                c.n_head, c.n_kv_head, c.head_dim
            ),
        );
        row(
            "KV per token",
            format!("{} per layer for K and for V", self.kv_width),
        );
        row("ffn", c.ffn.to_string());
        let scaled = c.rope.llama3_scaling.is_some() || c.rope.freq_factors.is_some();
        row(
            "rope",
            format!(
                "theta {}, {:?}{}",
                c.rope.theta,
                c.rope.layout,
                if scaled { ", scaled" } else { "" }
            ),
        );
        row("context", format!("{} tokens", c.context_length));
        row("vocabulary", c.vocab_size.to_string());
        row("tokenizer", id.tokenizer_fingerprint.clone());
        row(
            "chat template",
            if self.chat_template { "yes" } else { "no" }.into(),
        );
        if let Some(k) = &self.kernels {
            row(
                "CPU kernels",
                format!("int8 products {}, attention {}", k.int8, k.attention),
            );
        }
        row(
            "attention",
            match self.attention {
                "fused" => "fused: one kernel per layer and chunk (--attention fused)".into(),
                "batched" => "batched: masked matmuls".into(),
                other => format!("{other}: baton's CPU kernels (f32; the same bits however the input is chunked)"),
            },
        );
        for x in &self.load_conversions {
            row(
                "converted",
                format!(
                    "{} {} tensors to {} at load ({:.0} MB -> {:.0} MB) for fast CPU kernels",
                    x.tensors,
                    x.from,
                    x.to,
                    x.bytes_before as f64 / 1e6,
                    x.bytes_after as f64 / 1e6
                ),
            );
        }
        t
    }
}
