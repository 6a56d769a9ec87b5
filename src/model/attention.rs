//! Causal attention over a KV cache.
//!
//! On the CPU every (head, query row) is computed over exactly its causal prefix with a
//! fixed summation order, so a row's result does not depend on how the input was chunked:
//! prefill(A+B) and prefill(A) + extend(B) + decode give bit-identical caches and logits.
//! A masked batched matmul does not have that property (its reductions block differently
//! for different lengths), and candle's 8-bit activation quantization then amplifies
//! last-bit differences into visibly different logits a few layers later. That matters
//! here: the mapped and re-prefilled paths are compared token by token.

use super::error::{ModelError, Result};
use crate::kernels::attention::{self as kernel, Causal};
use candle_core::{DType, Device, Storage, Tensor};
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
            AttentionPath::Fused => super::fused_attention::attend(q, k, v, start, &hidden, masks),
        }
    }
}

/// How a model attends off the CPU's f32 kernel: masked batched matmuls (the default),
/// or one fused kernel per layer and chunk (`--attention fused`, a build with
/// `--features flash`; see [`super::fused_attention`]).
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

/// What every layer of a forward pass shares, built on the device once per pass instead
/// of once per layer: the batched path's additive masks (one per run of rows: a prefill
/// chunk has one, a re-read one per span), and the fused path's indices of the positions
/// kept out of the hidden ones. Never built on the host: at 16K positions a host-built
/// mask is 32 MB a layer to fill and upload.
#[derive(Default)]
pub struct Masks {
    built: Vec<(MaskKey, Tensor)>,
    kept: Vec<(MaskKey, Tensor)>,
}

struct MaskKey {
    start: usize,
    t: usize,
    hidden: Vec<Range<usize>>,
    dtype: DType,
    device: candle_core::DeviceLocation,
}

impl Masks {
    /// The [t, start + t] additive mask: 0 where row i (at `start + i`) may attend, -inf
    /// past it and at `hidden` positions.
    fn get(
        &mut self,
        start: usize,
        t: usize,
        hidden: &[Range<usize>],
        dtype: DType,
        device: &Device,
    ) -> Result<&Tensor> {
        let key = (start, t, hidden, dtype);
        memo(&mut self.built, key, device, || {
            let total = (start + t) as u32;
            let cols = Tensor::arange(0u32, total, device)?.reshape((1, total as usize))?;
            let rows = Tensor::arange(start as u32, total, device)?.reshape((t, 1))?;
            let mut blocked = cols.broadcast_gt(&rows)?;
            for r in hidden {
                let inside = (cols.ge(r.start as u32)? * cols.lt(r.end as u32)?)?;
                blocked = blocked.broadcast_maximum(&inside)?;
            }
            let shape = (t, total as usize);
            let ninf = Tensor::full(f32::NEG_INFINITY, shape, device)?.to_dtype(dtype)?;
            let zero = Tensor::zeros(shape, dtype, device)?;
            Ok(blocked.where_cond(&ninf, &zero)?)
        })
    }

    /// The indices of the positions a run of `t` rows at `start` attends over when
    /// `hidden` (before `start`) is left out; `None` when nothing is.
    pub(super) fn kept(
        &mut self,
        start: usize,
        t: usize,
        hidden: &[Range<usize>],
        device: &Device,
    ) -> Result<Option<&Tensor>> {
        if hidden.is_empty() {
            return Ok(None);
        }
        let key = (start, t, hidden, DType::U32);
        memo(&mut self.kept, key, device, || {
            let idx = super::fused_attention::kept_positions(start, t, hidden);
            Ok(Tensor::new(idx.as_slice(), device)?)
        })
        .map(Some)
    }
}

/// The tensor `built` holds for (start, t, hidden, dtype) on `device`, built by `build`
/// the first time: every layer after a pass's first finds it here, with nothing
/// allocated.
fn memo<'a>(
    built: &'a mut Vec<(MaskKey, Tensor)>,
    (start, t, hidden, dtype): (usize, usize, &[Range<usize>], DType),
    device: &Device,
    build: impl FnOnce() -> Result<Tensor>,
) -> Result<&'a Tensor> {
    let location = device.location();
    let same = |k: &MaskKey| {
        k.start == start
            && k.t == t
            && k.hidden == hidden
            && k.dtype == dtype
            && k.device == location
    };
    let i = match built.iter().position(|(k, _)| same(k)) {
        Some(i) => i,
        None => {
            let key = MaskKey {
                start,
                t,
                hidden: hidden.to_vec(),
                dtype,
                device: location,
            };
            built.push((key, build()?));
            built.len() - 1
        }
    };
    Ok(&built[i].1)
}

/// The parts of `hidden` before `start`.
fn before(hidden: &[Range<usize>], start: usize) -> Vec<Range<usize>> {
    hidden
        .iter()
        .filter(|r| r.start < start)
        .map(|r| r.start..r.end.min(start))
        .collect()
}

/// The chunking-invariant CPU kernel ([`crate::kernels::attention`]). Shapes, dtypes and
/// strides of all three tensors are checked here, and the kernel checks every index it
/// will read against the buffers, before any of them is read.
fn cpu_exact(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    hidden: &[Range<usize>],
) -> Result<Tensor> {
    let shapes = || {
        format!(
            "attention shapes q {:?} k {:?} v {:?} at start {start}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    };
    let (Ok((nh, t, hd)), Ok((nkv, total, khd)), Ok(vdims)) = (q.dims3(), k.dims3(), v.dims3())
    else {
        return Err(ModelError::Cache(shapes()));
    };
    if khd != hd || total != start + t || nkv == 0 || nh % nkv != 0 || vdims != (nkv, total, hd) {
        return Err(ModelError::Cache(shapes()));
    }
    for (name, x) in [("query", q), ("key", k), ("value", v)] {
        if x.dtype() != DType::F32 || !x.device().is_cpu() {
            return Err(ModelError::Cache(format!(
                "CPU attention takes f32 CPU tensors; the {name}s are {:?} on {:?}",
                x.dtype(),
                x.device().location()
            )));
        }
    }
    let q = q.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (Storage::Cpu(qs), Storage::Cpu(ks), Storage::Cpu(vs)) = (&*qs, &*ks, &*vs) else {
        return Err(ModelError::Cache("CPU attention on non-CPU tensors".into()));
    };
    if kl.stride()[2] != 1 || vl.stride()[2] != 1 {
        return Err(ModelError::Cache(
            "KV views must have unit stride in head_dim".into(),
        ));
    }
    fn from(all: &[f32], off: usize) -> &[f32] {
        all.get(off..).unwrap_or(&[])
    }
    let a = Causal {
        q: from(qs.as_slice::<f32>()?, ql.start_offset()),
        k: from(ks.as_slice::<f32>()?, kl.start_offset()),
        v: from(vs.as_slice::<f32>()?, vl.start_offset()),
        k_stride: (kl.stride()[0], kl.stride()[1]),
        v_stride: (vl.stride()[0], vl.stride()[1]),
        n_head: nh,
        n_kv_head: nkv,
        t,
        head_dim: hd,
        start,
        hidden,
    };
    let mut out = vec![0f32; t * nh * hd];
    kernel::causal(&a, &mut out).map_err(|e| ModelError::Cache(e.to_string()))?;
    Ok(Tensor::from_vec(out, (t, nh * hd), &Device::Cpu)?)
}

/// Masked batched matmul: the GPU path (bf16 there, so bit-exactness is not on offer).
/// The keys and values are read where the cache holds them: a view of a larger buffer
/// with a batch stride of its capacity, which the strided batched products take as it is
/// (a copy of the whole cache per layer and chunk is what they would cost otherwise).
pub(super) fn batched(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    hidden: &[Range<usize>],
    masks: &mut Masks,
) -> Result<Tensor> {
    let (nh, t, hd) = q.dims3()?;
    let (nkv, total, _) = k.dims3()?;
    let group = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let q = q.contiguous()?.reshape((nkv, group * t, hd))?;
    let scores = (q.matmul(&k.t()?)? * scale)?;
    let scores = if t > 1 || !hidden.is_empty() {
        let mask = masks.get(start, t, hidden, scores.dtype(), scores.device())?;
        scores
            .reshape((nkv, group, t, total))?
            .broadcast_add(mask)?
            .reshape((nkv, group * t, total))?
    } else {
        scores
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let o = probs.matmul(v)?;
    Ok(o.reshape((nh, t, hd))?
        .transpose(0, 1)?
        .reshape((t, nh * hd))?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
