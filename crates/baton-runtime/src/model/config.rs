//! Model hyper-parameters, read from GGUF metadata or a Hugging Face config.json.

use super::error::{ModelError, Result};
use candle_core::quantized::gguf_file;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Qwen2,
    Qwen3,
    Llama,
    Mistral,
}

impl Arch {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "llama" => Ok(Self::Llama),
            "mistral" => Ok(Self::Mistral),
            other => Err(ModelError::UnsupportedArchitecture {
                arch: other.to_string(),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Llama => "llama",
            Self::Mistral => "mistral",
        }
    }
}

/// How a head's dimensions are paired for rotation. Hugging Face checkpoints of all our
/// architectures rotate dimension i with i + d/2 ("rotate half"); llama.cpp's converter
/// permutes the Q/K rows of llama-architecture models so that GGUF files of those rotate
/// adjacent pairs (2i, 2i+1) instead, while qwen2/qwen3 GGUF files keep rotate-half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeLayout {
    RotateHalf,
    Interleaved,
}

/// Llama 3 style frequency scaling (HF `rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeConfig {
    pub theta: f64,
    pub layout: RopeLayout,
    /// Rotated dimensions per head (the whole head for every architecture we run).
    pub dim: usize,
    pub llama3_scaling: Option<Llama3Scaling>,
    /// Per-frequency divisors stored in GGUF files as `rope_freqs.weight` (how llama.cpp
    /// carries Llama 3 scaling); applied on top of `theta`.
    #[serde(skip)]
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeConfig {
    /// Inverse frequencies, one per rotated pair, with any scaling applied.
    pub fn inv_freqs(&self) -> Vec<f64> {
        let half = self.dim / 2;
        (0..half)
            .map(|i| {
                let mut f = 1.0 / self.theta.powf((2 * i) as f64 / self.dim as f64);
                if let Some(s) = self.llama3_scaling {
                    f = llama3_scale(f, s);
                }
                if let Some(factors) = &self.freq_factors {
                    if let Some(&d) = factors.get(i) {
                        f /= d as f64;
                    }
                }
                f
            })
            .collect()
    }
}

fn llama3_scale(freq: f64, s: Llama3Scaling) -> f64 {
    let low_wavelen = s.original_max_position as f64 / s.low_freq_factor;
    let high_wavelen = s.original_max_position as f64 / s.high_freq_factor;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor
    } else {
        let smooth = (s.original_max_position as f64 / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rms_eps: f64,
    pub rope: RopeConfig,
    pub context_length: usize,
    pub vocab_size: usize,
}

impl ModelConfig {
    /// Keys and values per token per layer (all KV heads concatenated).
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Weights one token passes through (attention projections and the MLP, over all
    /// layers; the embedding excluded): what a prefill's cost per token scales with.
    pub fn weights_per_token(&self) -> usize {
        let attn =
            self.hidden * (self.n_head * self.head_dim) * 2 + self.hidden * self.kv_width() * 2;
        let mlp = 3 * self.hidden * self.ffn;
        self.n_layer * (attn + mlp)
    }

    fn validate(self) -> Result<Self> {
        let bad = |key: &str, reason: String| ModelError::BadMetadata {
            key: key.to_string(),
            reason,
        };
        if self.n_layer == 0 || self.hidden == 0 || self.n_head == 0 || self.n_kv_head == 0 {
            return Err(bad("layers/heads", "zero-sized model".into()));
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(bad(
                "head_count_kv",
                format!(
                    "{} query heads cannot be grouped over {} KV heads",
                    self.n_head, self.n_kv_head
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.rope.dim != self.head_dim {
            return Err(ModelError::Unsupported(format!(
                "rotary dimension {} over head width {}: only full-width rotation is supported",
                self.rope.dim, self.head_dim
            )));
        }
        Ok(self)
    }

    pub fn from_gguf(metadata: &HashMap<String, gguf_file::Value>) -> Result<Self> {
        let arch_name = metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .ok_or_else(|| ModelError::MissingMetadata {
                key: "general.architecture".into(),
                hint: String::new(),
            })?
            .clone();
        let arch = Arch::parse(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let get_u = |k: &str| -> Result<usize> {
            let full = key(k);
            let v = metadata
                .get(&full)
                .ok_or_else(|| ModelError::MissingMetadata {
                    key: full.clone(),
                    hint: String::new(),
                })?;
            gguf_usize(v).ok_or_else(|| ModelError::BadMetadata {
                key: full,
                reason: format!("expected an integer, found {v:?}"),
            })
        };
        let get_f = |k: &str| -> Option<f64> { metadata.get(&key(k)).and_then(gguf_f64) };

        if let Some(window) = metadata
            .get(&key("attention.sliding_window"))
            .and_then(gguf_usize)
        {
            return Err(ModelError::Unsupported(format!(
                "this {arch_name} model uses sliding-window attention (window {window}); baton maps full-attention KV caches only, where every layer keeps every position"
            )));
        }

        let n_head = get_u("attention.head_count")?;
        let hidden = get_u("embedding_length")?;
        let head_dim = match get_u("attention.key_length") {
            Ok(d) => d,
            Err(_) => hidden / n_head,
        };
        let n_kv_head = get_u("attention.head_count_kv").unwrap_or(n_head);
        let vocab_size = match get_u("vocab_size") {
            Ok(v) => v,
            Err(_) => metadata
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| ModelError::MissingMetadata {
                    key: "tokenizer.ggml.tokens".into(),
                    hint: " (needed for the vocabulary size)".into(),
                })?,
        };
        let layout = match arch {
            Arch::Qwen2 | Arch::Qwen3 => RopeLayout::RotateHalf,
            Arch::Llama | Arch::Mistral => RopeLayout::Interleaved,
        };
        let rope_dim = get_u("rope.dimension_count").unwrap_or(head_dim);
        if let Some(kind) = metadata
            .get(&key("rope.scaling.type"))
            .and_then(|v| v.to_string().ok())
        {
            if kind != "none" && kind != "linear" {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling `{kind}` in GGUF metadata"
                )));
            }
        }
        let cfg = ModelConfig {
            arch,
            n_layer: get_u("block_count")?,
            hidden,
            n_head,
            n_kv_head,
            head_dim,
            ffn: get_u("feed_forward_length")?,
            rms_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope: RopeConfig {
                theta: get_f("rope.freq_base").unwrap_or(10_000.0),
                layout,
                dim: rope_dim,
                llama3_scaling: None,
                freq_factors: None,
            },
            context_length: get_u("context_length")?,
            vocab_size,
        };
        cfg.validate()
    }

    pub fn from_hf_json(text: &str) -> Result<Self> {
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| ModelError::BadMetadata {
            key: "config.json".into(),
            reason: e.to_string(),
        })?;
        let arch_name = hf
            .model_type
            .clone()
            .ok_or_else(|| ModelError::MissingMetadata {
                key: "config.json: model_type".into(),
                hint: String::new(),
            })?;
        let arch = Arch::parse(&arch_name)?;
        if hf.use_sliding_window.unwrap_or(false)
            || (arch == Arch::Mistral && hf.sliding_window.is_some())
        {
            return Err(ModelError::Unsupported(format!(
                "this {arch_name} model uses sliding-window attention; baton maps full-attention KV caches only, where every layer keeps every position"
            )));
        }
        if hf
            .layer_types
            .as_ref()
            .is_some_and(|t| t.iter().any(|l| l != "full_attention"))
        {
            return Err(ModelError::Unsupported(format!(
                "this {arch_name} model mixes attention types across layers (hybrid); baton maps full-attention KV caches only"
            )));
        }
        let head_dim = hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads);
        let llama3_scaling = match &hf.rope_scaling {
            Some(s) if s.kind() == Some("llama3") => Some(Llama3Scaling {
                factor: s.factor.unwrap_or(8.0),
                low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                original_max_position: s.original_max_position_embeddings.unwrap_or(8192),
            }),
            Some(s) if matches!(s.kind(), None | Some("default")) => None,
            Some(s) => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling `{}` in config.json",
                    s.kind().unwrap_or("?")
                )))
            }
            None => None,
        };
        let cfg = ModelConfig {
            arch,
            n_layer: hf.num_hidden_layers,
            hidden: hf.hidden_size,
            n_head: hf.num_attention_heads,
            n_kv_head: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim,
            ffn: hf.intermediate_size,
            rms_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope: RopeConfig {
                theta: hf.rope_theta.unwrap_or(10_000.0),
                layout: RopeLayout::RotateHalf,
                dim: head_dim,
                llama3_scaling,
                freq_factors: None,
            },
            context_length: hf.max_position_embeddings.unwrap_or(4096),
            vocab_size: hf.vocab_size,
        };
        cfg.validate()
    }
}

fn gguf_usize(v: &gguf_file::Value) -> Option<usize> {
    use gguf_file::Value as V;
    match *v {
        V::U8(x) => Some(x as usize),
        V::U16(x) => Some(x as usize),
        V::U32(x) => Some(x as usize),
        V::U64(x) => usize::try_from(x).ok(),
        V::I8(x) => usize::try_from(x).ok(),
        V::I16(x) => usize::try_from(x).ok(),
        V::I32(x) => usize::try_from(x).ok(),
        V::I64(x) => usize::try_from(x).ok(),
        _ => None,
    }
}

fn gguf_f64(v: &gguf_file::Value) -> Option<f64> {
    use gguf_file::Value as V;
    match *v {
        V::F32(x) => Some(x as f64),
        V::F64(x) => Some(x),
        _ => gguf_usize(v).map(|x| x as f64),
    }
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

impl HfRopeScaling {
    fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref()
    }
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    max_position_embeddings: Option<usize>,
    vocab_size: usize,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let rope = RopeConfig {
            theta: 500_000.0,
            layout: RopeLayout::RotateHalf,
            dim: 128,
            llama3_scaling: Some(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            }),
            freq_factors: None,
        };
        let plain = RopeConfig {
            llama3_scaling: None,
            ..rope.clone()
        };
        let (a, b) = (rope.inv_freqs(), plain.inv_freqs());
        assert_eq!(a[0], b[0], "the fastest frequency is untouched");
        let last = a.len() - 1;
        assert!(
            (a[last] - b[last] / 8.0).abs() < 1e-15,
            "the slowest is divided by the factor"
        );
    }

    #[test]
    fn hf_sliding_window_model_is_refused_with_reason() {
        let json = r#"{"model_type":"mistral","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"sliding_window":4096}"#;
        let err = ModelConfig::from_hf_json(json).unwrap_err().to_string();
        assert!(err.contains("sliding-window"), "{err}");
    }

    #[test]
    fn unknown_architecture_is_named() {
        let json = r#"{"model_type":"gemma3","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}"#;
        let err = ModelConfig::from_hf_json(json).unwrap_err().to_string();
        assert!(err.contains("gemma3") && err.contains("qwen2"), "{err}");
    }
}
