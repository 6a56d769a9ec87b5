//! AVX2 attention, for CPUs without AVX-512: the AVX-512 kernel's structure at eight lanes.
//! Work items are (KV head, query row); scores come in blocks of 8 keys anchored at key 0
//! (a fixed per-key product order and a fixed 8-lane reduction tree), softmax uses a
//! deterministic polynomial exp and a fixed-order sum, and the output accumulates p_j v_j
//! in key order, so chunked and unchunked runs agree bit for bit. Without it such CPUs
//! ran the portable kernel: four lanes and a libm exp per score, which at 4K tokens of
//! the 1.5B model is billions of calls.
//!
//! Common contract of the `unsafe fn`s here: the CPU has AVX2 and FMA, and the [`Args`]
//! passed [`Causal::validate`](super::Causal) (every index the loops form lies inside
//! its slice), with a head size that is a multiple of 8 and at most 256.

use super::super::send_ptr::SendPtr;
use super::simd::{each_row, visible, Args, Buffers};
use super::Causal;
use crate::kernels::avx2_exp::exp_normal as exp;
use crate::kernels::avx2_lanes::{max_ps, sum_ps};
use std::arch::x86_64::*;

/// # Safety
/// The module contract; `out` views t * n_head * head_dim floats no one else touches
/// during the call.
pub(super) unsafe fn attend(c: &Causal<'_>, out: SendPtr<f32>) {
    let a = &Args::of(c);
    // SAFETY: the caller's guarantee on `out`; each row runs under the module contract.
    unsafe {
        each_row(a, out, |g, i, bufs, o| match a.hd / 8 {
            8 => row::<8>(a, g, i, bufs, o),
            16 => row::<16>(a, g, i, bufs, o),
            _ => row_any(a, g, i, bufs, o),
        })
    }
}

/// Sums of 8 vectors, lane e = sum of all lanes of v[e], each by the same fixed tree.
#[target_feature(enable = "avx2")]
fn reduce8(v: &[__m256; 8]) -> __m256 {
    let s01 = _mm256_hadd_ps(v[0], v[1]);
    let s23 = _mm256_hadd_ps(v[2], v[3]);
    let s45 = _mm256_hadd_ps(v[4], v[5]);
    let s67 = _mm256_hadd_ps(v[6], v[7]);
    // Lane e (e < 4) of t0: the low half of v[e]; lane 4 + e: its high half.
    let t0 = _mm256_hadd_ps(s01, s23);
    let t1 = _mm256_hadd_ps(s45, s67);
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(t0, t1),
        _mm256_permute2f128_ps::<0x31>(t0, t1),
    )
}

/// The lanes below `rem` (1..=8) set.
#[target_feature(enable = "avx2")]
fn lanes_below(rem: usize) -> __m256 {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32), idx))
}

/// Softmax numerators in place over `n` scores (padded to a multiple of 8); returns
/// 1 / sum.
///
/// # Safety
/// The CPU has AVX2 and FMA; n >= 1 and `s` is valid for 8 * ceil(n / 8) floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax(s: *mut f32, n: usize) -> f32 {
    let nb = n.div_ceil(8);
    let tail = lanes_below(n - 8 * (nb - 1));
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    // SAFETY: every access is one of the nb blocks of 8 the caller vouches for.
    unsafe {
        let last = s.add(8 * (nb - 1));
        _mm256_storeu_ps(last, _mm256_blendv_ps(ninf, _mm256_loadu_ps(last), tail));
        let mut mx = ninf;
        for b in 0..nb {
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(s.add(8 * b)));
        }
        let m = _mm256_set1_ps(max_ps(mx));
        let mut sum = _mm256_setzero_ps();
        for b in 0..nb {
            let mut e = exp(_mm256_sub_ps(_mm256_loadu_ps(s.add(8 * b)), m));
            if b + 1 == nb {
                e = _mm256_and_ps(e, tail);
            }
            _mm256_storeu_ps(s.add(8 * b), e);
            sum = _mm256_add_ps(sum, e);
        }
        1.0 / sum_ps(sum)
    }
}

/// Output of query heads [h0, h0 + H) of group `g`: sum_j p_j v_j in key order, then
/// times 1/sum. `out` is the group's row of outputs.
///
/// # Safety
/// The module contract; `scores` holds H rows of `stride` >= n softmaxed scores from
/// row h0, h0 + H <= the group size, `inv` one entry per head of the group, n keys.
#[target_feature(enable = "avx2,fma")]
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
    assert!(out.len() >= (h0 + H) * a.hd && NC * 8 == a.hd);
    // SAFETY: value rows j < n of head g lie inside `v` (validated reach), scores inside
    // the caller's buffer, outputs inside `out` (asserted).
    unsafe {
        let vbase = a.v.as_ptr().add(g * a.vsh);
        let mut acc = [[_mm256_setzero_ps(); NC]; H];
        for j in 0..n {
            let vp = vbase.add(j * a.vsr);
            for hh in 0..H {
                let p = _mm256_set1_ps(*scores.add((h0 + hh) * stride + j));
                for c in 0..NC {
                    acc[hh][c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp.add(8 * c)), acc[hh][c]);
                }
            }
        }
        for hh in 0..H {
            let iv = _mm256_set1_ps(inv[h0 + hh]);
            let o = out.as_mut_ptr().add((h0 + hh) * a.hd);
            for c in 0..NC {
                _mm256_storeu_ps(o.add(8 * c), _mm256_mul_ps(acc[hh][c], iv));
            }
        }
    }
}

/// The scores of query head `h` of group `g` at row `i` over keys 0..n, scaled, into
/// `sp + h * stride` in blocks of 8.
///
/// # Safety
/// The module contract; the buffer holds (h + 1) * stride floats, stride >= 8 ceil(n/8).
#[target_feature(enable = "avx2,fma")]
unsafe fn scores(
    a: &Args<'_>,
    g: usize,
    h: usize,
    i: usize,
    n: usize,
    sp: *mut f32,
    stride: usize,
) {
    let hd = a.hd;
    let nc = hd / 8;
    let group = a.group();
    // SAFETY: the query row and key rows j < n lie inside `q` and `k` (validated).
    unsafe {
        let kbase = a.k.as_ptr().add(g * a.ksh);
        let qp = a.q.as_ptr().add(((g * group + h) * a.t + i) * hd);
        for b in 0..n.div_ceil(8) {
            let kn = (n - 8 * b).min(8);
            let mut acc = [_mm256_setzero_ps(); 8];
            for (kk, accv) in acc.iter_mut().enumerate().take(kn) {
                let kp = kbase.add((8 * b + kk) * a.ksr);
                let mut s = _mm256_mul_ps(_mm256_loadu_ps(qp), _mm256_loadu_ps(kp));
                for c in 1..nc {
                    s = _mm256_fmadd_ps(
                        _mm256_loadu_ps(qp.add(8 * c)),
                        _mm256_loadu_ps(kp.add(8 * c)),
                        s,
                    );
                }
                *accv = s;
            }
            _mm256_storeu_ps(
                sp.add(h * stride + 8 * b),
                _mm256_mul_ps(reduce8(&acc), _mm256_set1_ps(a.scale)),
            );
        }
    }
}

/// Query heads of group `g` at row `i` into `out` (group * hd floats).
///
/// # Safety
/// The module contract, with NC * 8 = head size; g < n_kv_head, i < t.
#[target_feature(enable = "avx2,fma")]
unsafe fn row<const NC: usize>(
    a: &Args<'_>,
    g: usize,
    i: usize,
    bufs: &mut Buffers,
    out: &mut [f32],
) {
    let group = a.group();
    let n = a.start + i + 1;
    let stride = n.div_ceil(8) * 8;
    bufs.fit(group, stride);
    let sp = bufs.scores.as_mut_ptr();
    // SAFETY: the buffer is sized just above; the rest is the module contract.
    unsafe {
        for h in 0..group {
            scores(a, g, h, i, n, sp, stride);
        }
        let inv = &mut bufs.inv[..group];
        for (h, iv) in inv.iter_mut().enumerate() {
            *iv = visible(sp.add(h * stride), n, a.hidden, |s, n| softmax(s, n));
        }
        let inv = &*inv;
        // Sixteen ymm registers: one head's accumulators at a time past 32-wide heads.
        let hc = if NC <= 4 { 2 } else { 1 };
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

/// Other head sizes: the same arithmetic, not unrolled.
///
/// # Safety
/// As for [`row`], with any head size the module takes.
#[target_feature(enable = "avx2,fma")]
unsafe fn row_any(a: &Args<'_>, g: usize, i: usize, bufs: &mut Buffers, out: &mut [f32]) {
    let hd = a.hd;
    let nc = hd / 8;
    let group = a.group();
    let n = a.start + i + 1;
    let stride = n.div_ceil(8) * 8;
    bufs.fit(group, stride);
    assert!(out.len() >= group * hd);
    let sp = bufs.scores.as_mut_ptr();
    // SAFETY: as in `row`; values like keys; outputs inside `out` (asserted).
    unsafe {
        let vbase = a.v.as_ptr().add(g * a.vsh);
        for h in 0..group {
            scores(a, g, h, i, n, sp, stride);
            let inv = visible(sp.add(h * stride), n, a.hidden, |s, n| softmax(s, n));
            let o = out.as_mut_ptr().add(h * hd);
            for c in 0..nc {
                let mut acc = _mm256_setzero_ps();
                for j in 0..n {
                    let p = _mm256_set1_ps(*sp.add(h * stride + j));
                    acc = _mm256_fmadd_ps(p, _mm256_loadu_ps(vbase.add(j * a.vsr + 8 * c)), acc);
                }
                _mm256_storeu_ps(o.add(8 * c), _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
            }
        }
    }
}
