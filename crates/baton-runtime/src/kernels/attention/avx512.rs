//! AVX-512 attention. Work items are (KV head, query row): the query heads of one GQA
//! group share every K and V row load. For each query vector, scores come in blocks of 16
//! keys anchored at key 0 (a fixed per-key product order and a fixed 16-lane reduction
//! tree), softmax uses a deterministic polynomial exp and a fixed-order sum, and the
//! output accumulates p_j v_j in key order. None of that depends on where a chunk starts
//! or how many rows it has, so chunked and unchunked runs agree bit for bit.
//!
//! Common contract of the `unsafe fn`s here: the CPU has AVX-512 F, and the [`Args`]
//! passed [`Causal::validate`](super::Causal) (every index the loops form lies inside
//! its slice), with a head size that is a multiple of 16 and at most 256.

use super::super::avx512_exp::exp;
use super::super::send_ptr::SendPtr;
use super::simd::{each_row, visible, Args, Buffers};
use super::Causal;
use std::arch::x86_64::*;

/// # Safety
/// The module contract; `out` views t * n_head * head_dim floats no one else touches
/// during the call.
pub(super) unsafe fn attend(c: &Causal<'_>, out: SendPtr<f32>) {
    let a = &Args::of(c);
    // SAFETY: the caller's guarantee on `out`; each row runs under the module contract.
    unsafe {
        each_row(a, out, |g, i, bufs, o| match a.hd / 16 {
            1 => row::<1>(a, g, i, bufs, o),
            2 => row::<2>(a, g, i, bufs, o),
            3 => row::<3>(a, g, i, bufs, o),
            4 => row::<4>(a, g, i, bufs, o),
            5 => row::<5>(a, g, i, bufs, o),
            6 => row::<6>(a, g, i, bufs, o),
            7 => row::<7>(a, g, i, bufs, o),
            8 => row::<8>(a, g, i, bufs, o),
            _ => row_any(a, g, i, bufs, o),
        })
    }
}

/// Sums of 16 vectors, lane e = sum of all lanes of v[e], each by the same fixed tree.
#[target_feature(enable = "avx512f")]
fn reduce16(v: &[__m512; 16]) -> __m512 {
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

/// Softmax numerators in place over `n` scores (padded to a multiple of 16); returns
/// 1 / sum.
///
/// # Safety
/// The CPU has AVX-512 F; n >= 1 and `s` is valid for 16 * ceil(n / 16) floats.
#[target_feature(enable = "avx512f")]
unsafe fn softmax(s: *mut f32, n: usize) -> f32 {
    let nb = n.div_ceil(16);
    let rem = n - 16 * (nb - 1);
    let tail: __mmask16 = if rem == 16 { 0xffff } else { (1u16 << rem) - 1 };
    // SAFETY: every access is one of the nb blocks of 16 the caller vouches for.
    unsafe {
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
}

/// Output of query heads [h0, h0 + H) of group `g` at row `i`: sum_j p_j v_j in key
/// order, then times 1/sum. `out` is the group's row of outputs.
///
/// # Safety
/// The module contract; `scores` holds H rows of `stride` >= n softmaxed scores from
/// row h0, h0 + H <= the group size, `inv` one entry per head of the group, n keys.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv<const NC: usize, const H: usize>(
    a: &Args<'_>,
    g: usize,
    h0: usize,
    n: usize,
    scores: *const f32,
    stride: usize,
    inv: &[f32],
    out: &mut [f32],
) {
    assert!(out.len() >= (h0 + H) * a.hd && NC * 16 == a.hd);
    // SAFETY: value rows j < n of head g lie inside `v` (validated reach), scores inside
    // the caller's buffer, outputs inside `out` (asserted).
    unsafe {
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
            let iv = _mm512_set1_ps(inv[h0 + hh]);
            let o = out.as_mut_ptr().add((h0 + hh) * a.hd);
            for c in 0..NC {
                _mm512_storeu_ps(o.add(16 * c), _mm512_mul_ps(acc[hh][c], iv));
            }
        }
    }
}

/// Query heads of group `g` at row `i` into `out` (group * hd floats).
///
/// # Safety
/// The module contract, with NC * 16 = head size; g < n_kv_head, i < t.
#[target_feature(enable = "avx512f")]
unsafe fn row<const NC: usize>(
    a: &Args<'_>,
    g: usize,
    i: usize,
    bufs: &mut Buffers,
    out: &mut [f32],
) {
    let hd = a.hd;
    let group = a.group();
    let n = a.start + i + 1;
    let nb = n.div_ceil(16);
    let stride = nb * 16;
    bufs.fit(group, stride);
    let sp = bufs.scores.as_mut_ptr();
    let scale = _mm512_set1_ps(a.scale);
    // SAFETY: query rows of the group's heads at row i lie inside `q`, key rows j < n
    // of head g inside `k` (validated), scores inside the buffer sized just above.
    unsafe {
        let kbase = a.k.as_ptr().add(g * a.ksh);
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
        let inv = &mut bufs.inv[..group];
        for (h, iv) in inv.iter_mut().enumerate() {
            *iv = visible(sp.add(h * stride), n, a.hidden, |s, n| softmax(s, n));
        }
        let inv = &*inv;
        let hc = if NC <= 4 { 4 } else { 2 };
        let mut h0 = 0;
        while h0 < group {
            match (group - h0).min(hc) {
                4 => pv::<NC, 4>(a, g, h0, n, sp, stride, inv, out),
                3 => pv::<NC, 3>(a, g, h0, n, sp, stride, inv, out),
                2 => pv::<NC, 2>(a, g, h0, n, sp, stride, inv, out),
                _ => pv::<NC, 1>(a, g, h0, n, sp, stride, inv, out),
            }
            h0 += (group - h0).min(hc);
        }
    }
}

/// Head sizes past 128 (rare): the same arithmetic, not unrolled.
///
/// # Safety
/// As for [`row`], with any head size the module takes.
#[target_feature(enable = "avx512f")]
unsafe fn row_any(a: &Args<'_>, g: usize, i: usize, bufs: &mut Buffers, out: &mut [f32]) {
    let hd = a.hd;
    let nc = hd / 16;
    let group = a.group();
    let n = a.start + i + 1;
    let nb = n.div_ceil(16);
    let stride = nb * 16;
    bufs.fit(group, stride);
    assert!(out.len() >= group * hd);
    let sp = bufs.scores.as_mut_ptr();
    // SAFETY: as in `row`; values like keys; outputs inside `out` (asserted).
    unsafe {
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
            let inv = visible(sp.add(h * stride), n, a.hidden, |s, n| softmax(s, n));
            let o = out.as_mut_ptr().add(h * hd);
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
