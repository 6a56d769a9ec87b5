//! Attention as masked batched matmuls: the path off the CPU's f32 kernel.

use super::Masks;
use crate::model::error::Result;
use candle_core::Tensor;
use std::ops::Range;

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
