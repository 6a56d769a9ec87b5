//! Causal attention over a KV cache.
//!
//! On the CPU every (head, query row) is computed over exactly its causal prefix with a
//! fixed summation order, so a row's result does not depend on how the input was chunked:
//! prefill(A+B) and prefill(A) + extend(B) + decode give bit-identical caches and logits.
//! A masked batched matmul does not have that property (its reductions block differently
//! for different lengths), and candle's 8-bit activation quantization then amplifies
//! last-bit differences into visibly different logits a few layers later. That matters
//! here: the mapped and re-prefilled paths are compared token by token.

// The SIMD kernels index several parallel lane arrays with one counter; iterator
// chains would hide which lanes pair up.
#![allow(clippy::needless_range_loop, clippy::type_complexity)]

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
        return Err(ModelError::Cache(
            "KV views must have unit stride in head_dim".into(),
        ));
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; t * nh * hd];
    #[cfg(target_arch = "x86_64")]
    if simd::available() && hd % 16 == 0 && hd <= 256 {
        let a = simd::Args {
            q: qd,
            k: kd,
            v: vd,
            ksh,
            ksr,
            vsh,
            vsr,
            nh,
            nkv,
            t,
            hd,
            start,
            scale,
        };
        simd::attend(&a, &mut out);
        return Ok(Tensor::from_vec(out, (t, nh * hd), &Device::Cpu)?);
    }
    // Each output row (one token) is written by one task: [nh * hd] per token.
    out.par_chunks_mut(nh * hd)
        .enumerate()
        .for_each(|(i, row)| {
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

/// AVX-512 attention. Work items are (KV head, query row): the query heads of one GQA
/// group share every K and V row load. For each query vector, scores come in blocks of 16
/// keys anchored at key 0 (a fixed per-key product order and a fixed 16-lane reduction
/// tree), softmax uses a deterministic polynomial exp and a fixed-order sum, and the
/// output accumulates p_j v_j in key order. None of that depends on where a chunk starts
/// or how many rows it has, so chunked and unchunked runs agree bit for bit.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    pub(super) fn available() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }

    pub(super) struct Args<'a> {
        pub q: &'a [f32],
        pub k: &'a [f32],
        pub v: &'a [f32],
        pub ksh: usize,
        pub ksr: usize,
        pub vsh: usize,
        pub vsr: usize,
        pub nh: usize,
        pub nkv: usize,
        pub t: usize,
        pub hd: usize,
        pub start: usize,
        pub scale: f32,
    }

    thread_local! {
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    pub(super) fn attend(a: &Args<'_>, out: &mut [f32]) {
        let items = a.nkv * a.t;
        let out_ptr = out.as_mut_ptr() as usize;
        let run = |range: std::ops::Range<usize>| {
            SCORES.with(|cell| {
                let mut scores = cell.borrow_mut();
                for it in range {
                    // Latest (longest) rows first, so the dynamic schedule ends on short ones.
                    let i = a.t - 1 - it / a.nkv;
                    let g = it % a.nkv;
                    unsafe {
                        match a.hd / 16 {
                            1 => row::<1>(a, g, i, &mut scores, out_ptr as *mut f32),
                            2 => row::<2>(a, g, i, &mut scores, out_ptr as *mut f32),
                            3 => row::<3>(a, g, i, &mut scores, out_ptr as *mut f32),
                            4 => row::<4>(a, g, i, &mut scores, out_ptr as *mut f32),
                            5 => row::<5>(a, g, i, &mut scores, out_ptr as *mut f32),
                            6 => row::<6>(a, g, i, &mut scores, out_ptr as *mut f32),
                            7 => row::<7>(a, g, i, &mut scores, out_ptr as *mut f32),
                            8 => row::<8>(a, g, i, &mut scores, out_ptr as *mut f32),
                            _ => row_any(a, g, i, &mut scores, out_ptr as *mut f32),
                        }
                    }
                }
            })
        };
        if items * (a.start + a.t) < 4096 {
            run(0..items);
        } else {
            candle_core::utils::barrier_pool().execute_chunked(items, run);
        }
    }

    /// Sums of 16 vectors, lane e = sum of all lanes of v[e], each by the same fixed tree.
    #[inline(always)]
    unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
        let mut s1 = [_mm512_setzero_ps(); 8];
        for p in 0..8 {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            s1[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            );
        }
        let mut s2 = [_mm512_setzero_ps(); 4];
        for p in 0..4 {
            let (x, y) = (s1[2 * p], s1[2 * p + 1]);
            s2[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(x, y),
                _mm512_shuffle_f32x4::<0xDD>(x, y),
            );
        }
        let mut s3 = [_mm512_setzero_ps(); 2];
        for p in 0..2 {
            let (u, w) = (s2[2 * p], s2[2 * p + 1]);
            s3[p] = _mm512_add_ps(_mm512_unpacklo_ps(u, w), _mm512_unpackhi_ps(u, w));
        }
        let r = _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(s3[0], s3[1]),
            _mm512_shuffle_ps::<0xEE>(s3[0], s3[1]),
        );
        // r[4L + m] holds vector 4m + L.
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, r)
    }

    /// e^x (Cephes-style polynomial, ~1 ulp), deterministic for a given input; 0 far below.
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5e-1));
        let r2 = _mm512_mul_ps(r, r);
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
        _mm512_scalef_ps(y, n)
    }

    /// Softmax numerators in place over `n` scores (padded to a multiple of 16); returns
    /// 1 / sum.
    #[target_feature(enable = "avx512f")]
    unsafe fn softmax(s: *mut f32, n: usize) -> f32 {
        let nb = n.div_ceil(16);
        let rem = n - 16 * (nb - 1);
        let tail: __mmask16 = if rem == 16 { 0xffff } else { (1u16 << rem) - 1 };
        let last = s.add(16 * (nb - 1));
        _mm512_storeu_ps(
            last,
            _mm512_mask_mov_ps(
                _mm512_set1_ps(f32::NEG_INFINITY),
                tail,
                _mm512_loadu_ps(last),
            ),
        );
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for b in 0..nb {
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(s.add(16 * b)));
        }
        let m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        let mut sum = _mm512_setzero_ps();
        for b in 0..nb {
            let mut e = exp(_mm512_sub_ps(_mm512_loadu_ps(s.add(16 * b)), m));
            if b + 1 == nb {
                e = _mm512_maskz_mov_ps(tail, e);
            }
            _mm512_storeu_ps(s.add(16 * b), e);
            sum = _mm512_add_ps(sum, e);
        }
        1.0 / _mm512_reduce_add_ps(sum)
    }

    /// Output of query heads [h0, h0 + H) of group `g` at row `i`: sum_j p_j v_j in key
    /// order, then times 1/sum.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv<const NC: usize, const H: usize>(
        a: &Args<'_>,
        g: usize,
        i: usize,
        h0: usize,
        n: usize,
        scores: *const f32,
        stride: usize,
        inv: &[f32],
        out: *mut f32,
    ) {
        let group = a.nh / a.nkv;
        let vbase = a.v.as_ptr().add(g * a.vsh);
        let mut acc = [[_mm512_setzero_ps(); NC]; H];
        for j in 0..n {
            let vp = vbase.add(j * a.vsr);
            let mut vv = [_mm512_setzero_ps(); NC];
            for c in 0..NC {
                vv[c] = _mm512_loadu_ps(vp.add(16 * c));
            }
            for hh in 0..H {
                let p = _mm512_set1_ps(*scores.add((h0 + hh) * stride + j));
                for c in 0..NC {
                    acc[hh][c] = _mm512_fmadd_ps(p, vv[c], acc[hh][c]);
                }
            }
        }
        for hh in 0..H {
            let h = g * group + h0 + hh;
            let iv = _mm512_set1_ps(inv[h0 + hh]);
            let o = out.add((i * a.nh + h) * a.hd);
            for c in 0..NC {
                _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(acc[hh][c], iv));
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn row<const NC: usize>(
        a: &Args<'_>,
        g: usize,
        i: usize,
        scores: &mut Vec<f32>,
        out: *mut f32,
    ) {
        let hd = a.hd;
        let group = a.nh / a.nkv;
        let n = a.start + i + 1;
        let nb = n.div_ceil(16);
        let stride = nb * 16;
        if scores.len() < group * stride {
            scores.resize(group * stride, 0.0);
        }
        let sp = scores.as_mut_ptr();
        let kbase = a.k.as_ptr().add(g * a.ksh);
        let scale = _mm512_set1_ps(a.scale);
        for h in 0..group {
            let qp = a.q.as_ptr().add(((g * group + h) * a.t + i) * hd);
            let mut q = [_mm512_setzero_ps(); NC];
            for c in 0..NC {
                q[c] = _mm512_loadu_ps(qp.add(16 * c));
            }
            for b in 0..nb {
                let kn = (n - 16 * b).min(16);
                let mut acc = [_mm512_setzero_ps(); 16];
                for (kk, accv) in acc.iter_mut().enumerate() {
                    if kk < kn {
                        let kp = kbase.add((16 * b + kk) * a.ksr);
                        let mut s = _mm512_mul_ps(q[0], _mm512_loadu_ps(kp));
                        for c in 1..NC {
                            s = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kp.add(16 * c)), s);
                        }
                        *accv = s;
                    }
                }
                _mm512_storeu_ps(
                    sp.add(h * stride + 16 * b),
                    _mm512_mul_ps(reduce16(&acc), scale),
                );
            }
        }
        let mut inv = [0f32; 64];
        let mut inv_v = Vec::new();
        let inv: &mut [f32] = if group <= 64 {
            &mut inv[..group]
        } else {
            inv_v.resize(group, 0.0);
            &mut inv_v
        };
        for (h, iv) in inv.iter_mut().enumerate() {
            *iv = softmax(sp.add(h * stride), n);
        }
        let hc = if NC <= 4 { 4 } else { 2 };
        let mut h0 = 0;
        while h0 < group {
            match (group - h0).min(hc) {
                4 => pv::<NC, 4>(a, g, i, h0, n, sp, stride, inv, out),
                3 => pv::<NC, 3>(a, g, i, h0, n, sp, stride, inv, out),
                2 => pv::<NC, 2>(a, g, i, h0, n, sp, stride, inv, out),
                _ => pv::<NC, 1>(a, g, i, h0, n, sp, stride, inv, out),
            }
            h0 += (group - h0).min(hc);
        }
    }

    /// Head sizes past 128 (rare): the same arithmetic, not unrolled.
    #[target_feature(enable = "avx512f")]
    unsafe fn row_any(a: &Args<'_>, g: usize, i: usize, scores: &mut Vec<f32>, out: *mut f32) {
        let hd = a.hd;
        let nc = hd / 16;
        let group = a.nh / a.nkv;
        let n = a.start + i + 1;
        let nb = n.div_ceil(16);
        let stride = nb * 16;
        if scores.len() < group * stride {
            scores.resize(group * stride, 0.0);
        }
        let sp = scores.as_mut_ptr();
        let kbase = a.k.as_ptr().add(g * a.ksh);
        let vbase = a.v.as_ptr().add(g * a.vsh);
        for h in 0..group {
            let qp = a.q.as_ptr().add(((g * group + h) * a.t + i) * hd);
            for b in 0..nb {
                let kn = (n - 16 * b).min(16);
                let mut acc = [_mm512_setzero_ps(); 16];
                for (kk, accv) in acc.iter_mut().enumerate().take(kn) {
                    let kp = kbase.add((16 * b + kk) * a.ksr);
                    let mut s = _mm512_mul_ps(_mm512_loadu_ps(qp), _mm512_loadu_ps(kp));
                    for c in 1..nc {
                        s = _mm512_fmadd_ps(
                            _mm512_loadu_ps(qp.add(16 * c)),
                            _mm512_loadu_ps(kp.add(16 * c)),
                            s,
                        );
                    }
                    *accv = s;
                }
                _mm512_storeu_ps(
                    sp.add(h * stride + 16 * b),
                    _mm512_mul_ps(reduce16(&acc), _mm512_set1_ps(a.scale)),
                );
            }
            let inv = softmax(sp.add(h * stride), n);
            let o = out.add((i * a.nh + g * group + h) * hd);
            for c in 0..nc {
                let mut acc = _mm512_setzero_ps();
                for j in 0..n {
                    let p = _mm512_set1_ps(*sp.add(h * stride + j));
                    acc = _mm512_fmadd_ps(p, _mm512_loadu_ps(vbase.add(j * a.vsr + 16 * c)), acc);
                }
                _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
            }
        }
    }
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
            let whole = cpu_exact(&q, &k, &v, 0)?;
            let reference = batched(&q, &k, &v, 0)?;
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
                )?);
            }
            let split = Tensor::cat(&parts, 0)?;
            let d = (whole - split)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(d, 0.0, "{nh}/{nkv}/{hd}");
        }
        Ok(())
    }
}
