//! The fused attention path: one kernel per layer and chunk (candle-flash-attn) instead
//! of the batched path's scores, mask and softmax, which materialise [heads, rows,
//! positions] scores and dominate a long prefill on a GPU. A build with `--features
//! flash` carries the kernels; `scripts/check-cuda --flash` builds them for the shapes
//! the supported models run on a GPU (see docs/gpu.md). `--attention fused` chooses this
//! path; the batched one stays the default until a device check has run both and found
//! them in agreement.
//!
//! What this module adds around the kernel is laid out so that it runs on any device:
//! dropped positions are gathered out of the keys and values first (they carry their
//! RoPE positions already, so nothing else moves), and the cache's [heads, positions,
//! head_dim] views are read as the kernel's [batch, positions, heads, head_dim] by
//! strides alone. The tests run it on the CPU with a reference kernel of the same
//! contract, against the batched path.

use super::Masks;
use crate::model::error::{ModelError, Result};
use candle_core::{DType, Device, Tensor};
use std::ops::Range;

/// The head widths the built kernels cover (`scripts/flash-subset.py` keeps these).
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// The kernels this build carries, for `baton --version`; `None` in a build without them.
pub fn coverage() -> Option<&'static str> {
    #[cfg(feature = "flash")]
    {
        // A build that names the kernels must hold them: keeping the entry point reachable
        // makes the link pull in the kernels' static library, so a missing kernel is a
        // link error of the build, not a surprise on the GPU.
        std::hint::black_box(kernel as Kernel);
        Some("fused attention (bf16; head dims 64 and 128)")
    }
    #[cfg(not(feature = "flash"))]
    None
}

/// An error naming why a model cannot run on the fused path here, and the way out.
/// Asked when the model loads: an unbuilt kernel aborts the process when called.
pub fn check(device: &Device, dtype: DType, head_dim: usize) -> Result<()> {
    match unavailable(device, dtype, head_dim) {
        Some(why) => Err(ModelError::Attention(format!(
            "--attention fused cannot run here: {why}"
        ))),
        None => Ok(()),
    }
}

fn unavailable(device: &Device, dtype: DType, head_dim: usize) -> Option<String> {
    let fix = "or use --attention batched";
    if coverage().is_none() {
        return Some(format!(
            "this build has no fused attention kernels: build it with scripts/check-cuda --flash, {fix}"
        ));
    }
    if !device.is_cuda() {
        return Some(format!(
            "fused attention runs on a CUDA GPU: use --device cuda, {fix}"
        ));
    }
    if dtype != DType::BF16 {
        return Some(format!(
            "the fused kernels take bf16 activations, not {dtype:?}: use --activations bf16 (or auto), {fix}"
        ));
    }
    if !HEAD_DIMS.contains(&head_dim) {
        return Some(format!(
            "this build's fused kernels cover head widths 64 and 128, and this model's heads are {head_dim} wide: {fix}"
        ));
    }
    None
}

/// The kernel's contract: `q` [1, rows, heads, head_dim], `k`, `v` [1, positions, kv_heads,
/// head_dim] (last dim contiguous, other strides free); `causal` masks each row to the
/// positions at or before its own with the rows aligned at the end of the positions.
/// Returns [1, rows, heads, head_dim].
type Kernel = fn(&Tensor, &Tensor, &Tensor, f32, bool) -> candle_core::Result<Tensor>;

#[cfg(feature = "flash")]
fn kernel(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    candle_flash_attn::flash_attn(q, k, v, scale, causal)
}

#[cfg(not(feature = "flash"))]
fn kernel(_: &Tensor, _: &Tensor, _: &Tensor, _: f32, _: bool) -> candle_core::Result<Tensor> {
    // Loading refuses the fused path in such a build (see `unavailable`).
    Err(candle_core::Error::Msg(
        "this build has no fused attention kernels".into(),
    ))
}

/// [`super::causal_attention`]'s contract on the fused kernel: `q` [n_head, t,
/// hd] at positions start..start+t, `k`, `v` views [n_kv_head, start + t, hd]; no row
/// attends to a position in `hidden` (all before `start`). Returns [t, n_head * hd].
pub(super) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    hidden: &[Range<usize>],
    masks: &mut Masks,
) -> Result<Tensor> {
    attend_with(kernel, q, k, v, start, hidden, masks)
}

fn attend_with(
    kernel: Kernel,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    hidden: &[Range<usize>],
    masks: &mut Masks,
) -> Result<Tensor> {
    let (nh, t, hd) = q.dims3()?;
    let (nkv, total, khd) = k.dims3()?;
    if total != start + t || khd != hd || v.dims3()? != (nkv, total, hd) {
        return Err(ModelError::Cache(format!(
            "fused attention shapes q {:?} k {:?} v {:?} at start {start}",
            q.dims(),
            k.dims(),
            v.dims()
        )));
    }
    // The kept positions keep their order and the rows stay last, so the kernel's
    // end-aligned causal mask still lets each row see exactly what it may.
    let (k, v) = match masks.kept(start, t, hidden, k.device())? {
        None => (k.clone(), v.clone()),
        // index_select reads only contiguous sources; the cache's views are not.
        Some(idx) => (
            k.contiguous()?.index_select(idx, 1)?,
            v.contiguous()?.index_select(idx, 1)?,
        ),
    };
    let as_rows = |x: &Tensor| -> Result<Tensor> { Ok(x.transpose(0, 1)?.unsqueeze(0)?) };
    let q = as_rows(&q.contiguous()?)?;
    let scale = 1.0 / (hd as f32).sqrt();
    // A single row sees every kept position: no mask to apply.
    let o = kernel(&q, &as_rows(&k)?, &as_rows(&v)?, scale, t > 1)?;
    Ok(o.reshape((t, nh * hd))?)
}

#[cfg(test)]
mod tests;
