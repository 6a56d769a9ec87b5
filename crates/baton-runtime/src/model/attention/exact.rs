//! The CPU's f32 attention, exact and chunking-invariant.

use crate::kernels::attention::{self as kernel, Causal};
use crate::model::error::{ModelError, Result};
use candle_core::{DType, Device, Storage, Tensor};
use std::ops::Range;

/// The chunking-invariant CPU kernel ([`crate::kernels::attention`]). Shapes, dtypes and
/// strides of all three tensors are checked here, and the kernel checks every index it
/// will read against the buffers, before any of them is read.
pub(super) fn cpu_exact(
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
