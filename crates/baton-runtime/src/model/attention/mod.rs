//! Causal attention over a KV cache.
//!
//! On the CPU every (head, query row) is computed over exactly its causal prefix with a
//! fixed summation order, so a row's result does not depend on how the input was chunked:
//! prefill(A+B) and prefill(A) + extend(B) + decode give bit-identical caches and logits.
//! A masked batched matmul does not have that property (its reductions block differently
//! for different lengths), and candle's 8-bit activation quantization then amplifies
//! last-bit differences into visibly different logits a few layers later. That matters
//! here: the mapped and re-prefilled paths are compared token by token.

mod batched;
mod exact;
pub mod fused;
mod masks;

use super::error::Result;
use batched::batched;
use candle_core::{DType, Tensor};
use exact::cpu_exact;
pub use masks::Masks;
use std::ops::Range;

/// `q`: [n_head, t, hd] (rows at absolute positions start..start+t); `k`, `v`: views
/// [n_kv_head, start + t, hd] with unit stride in the last dim. Returns [t, n_head * hd].
/// No row attends to a position in `hidden` (increasing, disjoint; what lies at or past
/// `start` is ignored, since the rows attend causally and are never hidden themselves).
/// `masks` keeps what every layer of a chunk shares (the batched path's mask, the fused
/// path's kept positions) from one layer to the next. f32 on the CPU always runs the
/// exact kernel; everywhere else `path` chooses.
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    hidden: &[Range<usize>],
    path: AttentionPath,
    masks: &mut Masks,
) -> Result<Tensor> {
    let hidden = before(hidden, start);
    if q.device().is_cpu() && q.dtype() == DType::F32 && k.dtype() == DType::F32 {
        cpu_exact(q, k, v, start, &hidden)
    } else {
        match path {
            AttentionPath::Batched => batched(q, k, v, start, &hidden, masks),
            AttentionPath::Fused => fused::attend(q, k, v, start, &hidden, masks),
        }
    }
}

/// How a model attends off the CPU's f32 kernel: masked batched matmuls (the default),
/// or one fused kernel per layer and chunk (`--attention fused`, a build with
/// `--features flash`; see [`fused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionPath {
    #[default]
    Batched,
    Fused,
}

impl AttentionPath {
    pub fn name(self) -> &'static str {
        match self {
            AttentionPath::Batched => "batched",
            AttentionPath::Fused => "fused",
        }
    }

    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "batched" => Ok(AttentionPath::Batched),
            "fused" => Ok(AttentionPath::Fused),
            other => Err(format!(
                "unknown attention path `{other}`: use batched or fused"
            )),
        }
    }
}

/// The parts of `hidden` before `start`.
fn before(hidden: &[Range<usize>], start: usize) -> Vec<Range<usize>> {
    hidden
        .iter()
        .filter(|r| r.start < start)
        .map(|r| r.start..r.end.min(start))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::error::ModelError;
    use candle_core::Device;

    #[test]
    fn exact_cpu_path_matches_masked_matmul_and_is_chunking_invariant() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, hd, n) = (6, 2, 16, 20);
        let q = Tensor::randn(0f32, 1.0, (nh, n, hd), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        let exact = cpu_exact(&q, &k, &v, 0, &[])?;
        let reference = batched(&q, &k, &v, 0, &[], &mut Masks::default())?;
        let err = (&exact - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "{err}");
        // The last 7 rows computed as an extension give the very same bits.
        let tail = cpu_exact(
            &q.narrow(1, 13, 7)?,
            &k.narrow(1, 0, 20)?,
            &v.narrow(1, 0, 20)?,
            13,
            &[],
        )?;
        let d = (exact.narrow(0, 13, 7)? - tail)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert_eq!(d, 0.0);
        Ok(())
    }

    #[test]
    fn exact_cpu_path_is_chunking_invariant_for_real_head_shapes() -> Result<()> {
        let dev = Device::Cpu;
        // (heads, kv heads, head dim): qwen2.5-0.5b, qwen2.5-1.5b, and a head size past
        // the unrolled kernels.
        for (nh, nkv, hd) in [(14, 2, 64), (12, 2, 128), (4, 2, 160)] {
            let n = 45;
            let q = Tensor::randn(0f32, 1.0, (nh, n, hd), &dev)?;
            let k = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
            let v = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
            let whole = cpu_exact(&q, &k, &v, 0, &[])?;
            let reference = batched(&q, &k, &v, 0, &[], &mut Masks::default())?;
            let err = (&whole - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-4, "{nh}/{nkv}/{hd}: {err}");
            // prefill 17, extend 27, decode 1: the same bits.
            let mut parts = Vec::new();
            for (s, len) in [(0, 17), (17, 27), (44, 1)] {
                parts.push(cpu_exact(
                    &q.narrow(1, s, len)?,
                    &k.narrow(1, 0, s + len)?,
                    &v.narrow(1, 0, s + len)?,
                    s,
                    &[],
                )?);
            }
            let split = Tensor::cat(&parts, 0)?;
            let d = (whole - split)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(d, 0.0, "{nh}/{nkv}/{hd}");
        }
        Ok(())
    }

    /// The masked matmul (the GPU path) and the exact CPU path leave the same positions
    /// out, for a prefill chunk and for a decode step; hidden positions at or past the
    /// rows are not theirs to hide and are ignored.
    #[test]
    fn both_paths_leave_hidden_positions_out() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, hd, n) = (4, 2, 16, 30);
        let k = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        let hidden = [1..4, 9..15, 25..40];
        for (start, t) in [(20, 10), (29, 1)] {
            let q = Tensor::randn(0f32, 1.0, (nh, t, hd), &dev)?;
            let exact = causal_attention(
                &q,
                &k,
                &v,
                start,
                &hidden,
                AttentionPath::Batched,
                &mut Masks::default(),
            )?;
            let masked = batched(
                &q,
                &k,
                &v,
                start,
                &before(&hidden, start),
                &mut Masks::default(),
            )?;
            let err = (&exact - &masked)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{start}+{t}: {err}");
            let plain = causal_attention(
                &q,
                &k,
                &v,
                start,
                &[],
                AttentionPath::Batched,
                &mut Masks::default(),
            )?;
            let moved = (&exact - plain)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(moved > 1e-3, "hiding changed nothing at {start}+{t}");
        }
        Ok(())
    }

    /// The batched path reads keys and values as the cache holds them (views of a
    /// buffer larger than the positions written), and one mask memo serves a chunk's
    /// layers and is rebuilt when the chunk or the hidden positions change.
    #[test]
    fn the_batched_path_reads_cache_views_and_rebuilds_its_mask_when_it_must() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, hd, cap) = (4, 2, 16, 48);
        let kb = Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev)?;
        let vb = Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev)?;
        let mut masks = Masks::default();
        for (start, t, hidden) in [
            (20, 10, vec![]),
            (20, 10, vec![]),
            (20, 10, vec![2..6]),
            (29, 1, vec![2..6]),
            (0, 12, vec![]),
        ] {
            let n = start + t;
            let q = Tensor::randn(0f32, 1.0, (nh, t, hd), &dev)?;
            let (k, v) = (kb.narrow(1, 0, n)?, vb.narrow(1, 0, n)?);
            assert!(!k.is_contiguous());
            let viewed = batched(&q, &k, &v, start, &hidden, &mut masks)?;
            let exact = cpu_exact(&q, &k.contiguous()?, &v.contiguous()?, start, &hidden)?;
            let err = (&exact - &viewed)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{start}+{t} hiding {hidden:?}: {err}");
        }
        // In bf16, as on a GPU: within bf16's rounding of the f32 result.
        let q = Tensor::randn(0f32, 1.0, (nh, 10, hd), &dev)?;
        let (k, v) = (kb.narrow(1, 0, 30)?, vb.narrow(1, 0, 30)?);
        let exact = cpu_exact(&q, &k.contiguous()?, &v.contiguous()?, 20, &[])?;
        let b = |x: &Tensor| x.to_dtype(DType::BF16);
        let half = batched(&b(&q)?, &b(&k)?, &b(&v)?, 20, &[], &mut masks)?.to_dtype(DType::F32)?;
        let err = (&exact - &half)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 0.05, "{err}");
        Ok(())
    }

    /// A value tensor that disagrees with the keys (fewer positions, another head size,
    /// other heads, another dtype, or not a 3-d view) is refused with an error before any
    /// memory is read.
    #[test]
    fn misshaped_value_tensors_are_errors() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, hd, n) = (4, 2, 16, 9);
        let q = Tensor::randn(0f32, 1.0, (nh, n, hd), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        let good = Tensor::randn(0f32, 1.0, (nkv, n, hd), &dev)?;
        assert!(causal_attention(
            &q,
            &k,
            &good,
            0,
            &[],
            AttentionPath::Batched,
            &mut Masks::default()
        )
        .is_ok());
        for v in [
            good.narrow(1, 0, n - 1)?,
            good.narrow(2, 0, hd / 2)?,
            good.narrow(0, 0, 1)?,
            good.flatten_all()?,
            good.to_dtype(DType::BF16)?,
            Tensor::randn(0f32, 1.0, (nkv + 1, n, hd), &dev)?,
        ] {
            let e = causal_attention(
                &q,
                &k,
                &v,
                0,
                &[],
                AttentionPath::Batched,
                &mut Masks::default(),
            );
            assert!(
                matches!(e, Err(ModelError::Cache(_))),
                "value {:?} {:?}: {e:?}",
                v.dims(),
                v.dtype()
            );
        }
        Ok(())
    }
}
