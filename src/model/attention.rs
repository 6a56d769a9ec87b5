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
use candle_core::{DType, Device, Storage, Tensor};
use rayon::prelude::*;

/// `q`: [n_head, t, hd] (rows at absolute positions start..start+t); `k`, `v`: views
/// [n_kv_head, start + t, hd] with unit stride in the last dim. Returns [t, n_head * hd].
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    if q.device().is_cpu() && q.dtype() == DType::F32 && k.dtype() == DType::F32 {
        cpu_exact(q, k, v, start)
    } else {
        batched(q, k, v, start)
    }
}

fn cpu_exact(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (nh, t, hd) = q.dims3()?;
    let (nkv, total, khd) = k.dims3()?;
    if khd != hd || total != start + t || nh % nkv != 0 {
        return Err(ModelError::Cache(format!(
            "attention shapes q {:?} k {:?} at start {start}",
            q.dims(),
            k.dims()
        )));
    }
    let group = nh / nkv;
    let q = q.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (Storage::Cpu(qs), Storage::Cpu(ks), Storage::Cpu(vs)) = (&*qs, &*ks, &*vs) else {
        return Err(ModelError::Cache("CPU attention on non-CPU tensors".into()));
    };
    let qd = &qs.as_slice::<f32>()?[ql.start_offset()..];
    let kd = &ks.as_slice::<f32>()?[kl.start_offset()..];
    let vd = &vs.as_slice::<f32>()?[vl.start_offset()..];
    let (ksh, ksr) = (kl.stride()[0], kl.stride()[1]);
    let (vsh, vsr) = (vl.stride()[0], vl.stride()[1]);
    if kl.stride()[2] != 1 || vl.stride()[2] != 1 {
        return Err(ModelError::Cache("KV views must have unit stride in head_dim".into()));
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; t * nh * hd];
    // Each output row (one token) is written by one task: [nh * hd] per token.
    out.par_chunks_mut(nh * hd).enumerate().for_each(|(i, row)| {
        let pos = start + i;
        let mut scores = vec![0f32; pos + 1];
        for h in 0..nh {
            let g = h / group;
            let qrow = &qd[(h * t + i) * hd..(h * t + i + 1) * hd];
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let krow = &kd[g * ksh + j * ksr..g * ksh + j * ksr + hd];
                *s = dot(qrow, krow) * scale;
                max = max.max(*s);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut row[h * hd..(h + 1) * hd];
            o.fill(0.0);
            for (j, &p) in scores.iter().enumerate() {
                let vrow = &vd[g * vsh + j * vsr..g * vsh + j * vsr + hd];
                for (a, &b) in o.iter_mut().zip(vrow) {
                    *a += p * b;
                }
            }
            let inv = 1.0 / sum;
            for a in o.iter_mut() {
                *a *= inv;
            }
        }
    });
    Ok(Tensor::from_vec(out, (t, nh * hd), &Device::Cpu)?)
}

/// Dot product with eight independent accumulators: vectorises, and its summation order
/// depends only on the length.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for r in chunks * 8..a.len() {
        s += a[r] * b[r];
    }
    s
}

/// Masked batched matmul: the GPU path (bf16 there, so bit-exactness is not on offer).
fn batched(q: &Tensor, k: &Tensor, v: &Tensor, start: usize) -> Result<Tensor> {
    let (nh, t, hd) = q.dims3()?;
    let (nkv, total, _) = k.dims3()?;
    let group = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let q = q.contiguous()?.reshape((nkv, group * t, hd))?;
    let scores = (q.matmul(&k.contiguous()?.t()?)? * scale)?;
    let scores = if t > 1 {
        let mut m = vec![0f32; t * total];
        for i in 0..t {
            for j in (start + i + 1)..total {
                m[i * total + j] = f32::NEG_INFINITY;
            }
        }
        let mask = Tensor::from_vec(m, (t, total), q.device())?.to_dtype(q.dtype())?;
        scores
            .reshape((nkv, group, t, total))?
            .broadcast_add(&mask)?
            .reshape((nkv, group * t, total))?
    } else {
        scores
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let o = probs.matmul(&v.contiguous()?)?;
    Ok(o.reshape((nh, t, hd))?.transpose(0, 1)?.reshape((t, nh * hd))?)
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
        let exact = cpu_exact(&q, &k, &v, 0)?;
        let reference = batched(&q, &k, &v, 0)?;
        let err = (&exact - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "{err}");
        // The last 7 rows computed as an extension give the very same bits.
        let tail = cpu_exact(
            &q.narrow(1, 13, 7)?,
            &k.narrow(1, 0, 20)?,
            &v.narrow(1, 0, 20)?,
            13,
        )?;
        let d = (exact.narrow(0, 13, 7)? - tail)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(d, 0.0);
        Ok(())
    }
}
