//! Prefill and decode throughput of baton's decoder, measured side by side with
//! candle-transformers' `quantized_qwen2` on the same GGUF file (when it is a qwen2 model):
//! the honest baseline later speed-ups are measured against.
//!
//! Both engines run on the CPU in one process. After one warm-up run of each (which also
//! builds any lazily repacked weight layouts), the engines alternate per repeat so drift in
//! machine load hits both alike, and each row reports the median over the repeats.
//!
//! The peer is compiled in only with the `peer-bench` feature (`cargo run --release
//! --features peer-bench -- bench-model`): the workbench never needs it, and it is a
//! large crate to build.

use baton_runtime::model::load::{load_decoder, ModelFormat};
use baton_runtime::model::Decoder;
use baton_runtime::model::LoadOptions;
use baton_runtime::model::{ModelError, Result};
use candle_core::Device;
use std::path::Path;
use std::time::Instant;

/// One engine's throughput on one model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchRow {
    /// `baton` or `candle-transformers quantized_qwen2`.
    pub engine: String,
    pub prefill_tokens: usize,
    /// Prompt tokens per second for one prefill from an empty cache (median).
    pub prefill_tok_s: f64,
    pub decode_tokens: usize,
    /// Single-token steps per second after that prefill (median), logits included.
    pub decode_tok_s: f64,
}

/// One model's rows, as `baton bench-model --json` lists them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelBench {
    pub model: String,
    pub rows: Vec<BenchRow>,
}

impl ModelBench {
    /// One line per engine, then baton's throughput over the peer's, measured in this
    /// same run (the only ratio worth quoting on a shared machine).
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{:<22} {:<38} prefill {:>7.1} tokens/s   decode {:>6.1} tokens/s",
                    self.model, r.engine, r.prefill_tok_s, r.decode_tok_s
                )
            })
            .collect();
        let ours = self.rows.iter().find(|r| r.engine == BATON);
        let peer = self.rows.iter().find(|r| r.engine != BATON);
        if let (Some(ours), Some(peer)) = (ours, peer) {
            out.push(format!(
                "{:<22} baton / peer in this run: prefill {:.2}x, decode {:.2}x",
                self.model,
                ours.prefill_tok_s / peer.prefill_tok_s,
                ours.decode_tok_s / peer.decode_tok_s
            ));
        }
        out
    }
}

/// Engine names used in [`BenchRow::engine`].
pub const BATON: &str = "baton";
pub const PEER_QWEN2: &str = "candle-transformers quantized_qwen2";

/// Deterministic, text-like token ids: a fixed LCG over ids that are ordinary BPE pieces
/// in the vocabularies baton runs (the low few hundred ids are bytes and specials).
pub fn bench_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let lo = 256u64.min(vocab as u64 / 2);
    let hi = (vocab as u64).min(30_000).max(lo + 1);
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (lo + (s >> 33) % (hi - lo)) as u32
        })
        .collect()
}

/// Seconds for (prefill, decode) with baton's decoder.
fn time_baton(dec: &Decoder, prompt: &[u32], steps: &[u32]) -> Result<(f64, f64)> {
    let mut cache = dec.new_cache();
    let t0 = Instant::now();
    let l = dec.next_logits(prompt, &mut cache)?;
    // Force the result (CPU work is synchronous; this keeps an eventual device honest).
    let _ = l.dims();
    let prefill = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for &tok in steps {
        let l = dec.next_logits(&[tok], &mut cache)?;
        let _ = l.dims();
    }
    Ok((prefill, t1.elapsed().as_secs_f64()))
}

/// Whether this build can time the peer.
pub const PEER_BUILT: bool = cfg!(feature = "peer-bench");

#[cfg(feature = "peer-bench")]
type Peer = candle_transformers::models::quantized_qwen2::ModelWeights;
/// Without the feature there is no peer to hold.
#[cfg(not(feature = "peer-bench"))]
enum Peer {}

#[cfg(feature = "peer-bench")]
fn load_peer(path: &Path, dev: &Device) -> Result<Option<Peer>> {
    let content = baton_runtime::model::load::read_gguf_header(path)?;
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok(Some(Peer::from_gguf(content, &mut f, dev)?))
}

#[cfg(not(feature = "peer-bench"))]
fn load_peer(_: &Path, _: &Device) -> Result<Option<Peer>> {
    Ok(None)
}

#[cfg(not(feature = "peer-bench"))]
fn time_peer(m: &mut Peer, _: &[u32], _: &[u32], _: &Device) -> Result<(f64, f64)> {
    match *m {}
}

/// Seconds for (prefill, decode) with candle-transformers' quantized qwen2.
#[cfg(feature = "peer-bench")]
fn time_peer(m: &mut Peer, prompt: &[u32], steps: &[u32], dev: &Device) -> Result<(f64, f64)> {
    m.clear_kv_cache();
    let t0 = Instant::now();
    use candle_core::Tensor;
    let x = Tensor::new(prompt, dev)?.unsqueeze(0)?;
    let l = m.forward(&x, 0)?;
    let _ = l.dims();
    let prefill = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for (i, &tok) in steps.iter().enumerate() {
        let x = Tensor::new(&[tok], dev)?.unsqueeze(0)?;
        let l = m.forward(&x, prompt.len() + i)?;
        let _ = l.dims();
    }
    Ok((prefill, t1.elapsed().as_secs_f64()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn row(engine: &str, prompt_len: usize, decode_len: usize, runs: &[(f64, f64)]) -> BenchRow {
    let mut p: Vec<f64> = runs.iter().map(|r| prompt_len as f64 / r.0).collect();
    let mut d: Vec<f64> = runs
        .iter()
        .map(|r| {
            if decode_len == 0 {
                0.0
            } else {
                decode_len as f64 / r.1
            }
        })
        .collect();
    BenchRow {
        engine: engine.to_string(),
        prefill_tokens: prompt_len,
        prefill_tok_s: median(&mut p),
        decode_tokens: decode_len,
        decode_tok_s: median(&mut d),
    }
}

/// Time baton's decoder (prefill of `prompt_len` tokens from an empty cache, then
/// `decode_len` single-token steps) and, for qwen2 GGUF files, candle-transformers'
/// `quantized_qwen2::ModelWeights` on the same file (prefill = one forward of the whole
/// prompt at index_pos 0, decode = one token at a time at increasing index_pos). Engines
/// alternate per repeat after a warm-up; rows hold the medians, baton's first.
pub fn bench_model(
    path: &Path,
    prompt_len: usize,
    decode_len: usize,
    repeats: usize,
) -> Result<Vec<BenchRow>, ModelError> {
    if prompt_len == 0 {
        return Err(ModelError::Unsupported(
            "a benchmark needs at least one prompt token".into(),
        ));
    }
    let dev = Device::Cpu;
    let repeats = repeats.max(1);
    let loaded = load_decoder(path, &dev, LoadOptions::for_device(&dev))?;
    let dec = &loaded.decoder;
    let cfg = dec.config();
    if prompt_len + decode_len > cfg.context_length {
        return Err(ModelError::ContextOverflow {
            len: prompt_len + decode_len,
            max: cfg.context_length,
        });
    }
    let tokens = bench_tokens(prompt_len + decode_len, cfg.vocab_size, 0x0062_6174_6f6e);
    let (prompt, steps) = tokens.split_at(prompt_len);

    let is_qwen2 = loaded.format == ModelFormat::Gguf
        && loaded
            .gguf
            .as_ref()
            .and_then(|c| c.metadata.get("general.architecture"))
            .and_then(|v| v.to_string().ok().cloned())
            .is_some_and(|a| a == "qwen2");
    let mut peer = if is_qwen2 {
        load_peer(path, &dev)?
    } else {
        None
    };

    // Warm-up: first-use packing, allocator growth, page faults.
    let warm_steps = &steps[..steps.len().min(2)];
    time_baton(dec, prompt, warm_steps)?;
    if let Some(p) = peer.as_mut() {
        time_peer(p, prompt, warm_steps, &dev)?;
    }

    let mut ours = Vec::with_capacity(repeats);
    let mut theirs = Vec::with_capacity(repeats);
    for r in 0..repeats {
        // Alternate which engine goes first so neither always runs on a warmer machine.
        if r % 2 == 0 {
            ours.push(time_baton(dec, prompt, steps)?);
        }
        if let Some(p) = peer.as_mut() {
            theirs.push(time_peer(p, prompt, steps, &dev)?);
        }
        if r % 2 == 1 {
            ours.push(time_baton(dec, prompt, steps)?);
        }
    }
    let mut rows = vec![row(BATON, prompt_len, decode_len, &ours)];
    if peer.is_some() {
        rows.push(row(PEER_QWEN2, prompt_len, decode_len, &theirs));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_line_divides_baton_by_the_peer() {
        let row = |engine: &str, p, d| BenchRow {
            engine: engine.into(),
            prefill_tokens: 512,
            prefill_tok_s: p,
            decode_tokens: 32,
            decode_tok_s: d,
        };
        let b = ModelBench {
            model: "m".into(),
            rows: vec![row(BATON, 300.0, 20.0), row(PEER_QWEN2, 100.0, 40.0)],
        };
        let lines = b.lines();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[2].ends_with("prefill 3.00x, decode 0.50x"),
            "{}",
            lines[2]
        );
        let alone = ModelBench {
            rows: vec![row(BATON, 1.0, 1.0)],
            ..b
        };
        assert_eq!(alone.lines().len(), 1);
    }

    #[test]
    fn tokens_are_deterministic_and_in_range() {
        let a = bench_tokens(300, 151_936, 7);
        assert_eq!(a, bench_tokens(300, 151_936, 7));
        assert!(a.iter().all(|&t| (256..30_000).contains(&t)));
        let small = bench_tokens(50, 300, 1);
        assert!(small.iter().all(|&t| (t as usize) < 300));
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
