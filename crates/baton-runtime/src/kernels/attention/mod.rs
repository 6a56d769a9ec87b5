//! Causal attention for one layer's queries over a KV cache, with every (head, query
//! row) computed over exactly its causal prefix in a fixed summation order, so a row's
//! result does not depend on how the input was chunked: prefill(A+B) and prefill(A) +
//! extend(B) + decode give bit-identical outputs. (A masked batched matmul blocks its
//! reductions differently for different lengths.)
//!
//! Paths: [`KernelPath::Avx512`] (head sizes a multiple of 16, up to 256),
//! [`KernelPath::Avx2`] (a multiple of 8, up to 256) and [`KernelPath::Portable`]. Each
//! is chunking-invariant on its own; they differ from each other in the last bits
//! (different summation trees and exp), so a model runs one of them throughout.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod simd;

use super::send_ptr::SendPtr;
use super::{choose, KernelError, KernelPath};
use rayon::prelude::*;
use std::ops::Range;

/// The paths this kernel has, fastest first.
pub const PATHS: [KernelPath; 3] = [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable];

/// One attention call. `q`: [n_head, t, head_dim] contiguous (rows at absolute positions
/// start..start+t); `k`, `v`: element (g, j, d) at `g * stride.0 + j * stride.1 + d` for
/// KV head g < n_kv_head, position j < start + t, d < head_dim (unit stride in the head
/// dimension). The output is [t, n_head * head_dim].
///
/// `hidden` lists positions dropped from the cache (increasing, disjoint, all before
/// `start`): no row attends to them, as if they were not there, while every other
/// position keeps its place. Empty, the arithmetic is the plain causal one, bit for bit.
#[derive(Clone, Copy, Debug)]
pub struct Causal<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub k_stride: (usize, usize),
    pub v_stride: (usize, usize),
    pub n_head: usize,
    pub n_kv_head: usize,
    pub t: usize,
    pub head_dim: usize,
    pub start: usize,
    pub hidden: &'a [Range<usize>],
}

impl Causal<'_> {
    /// Every index the kernels read lies inside its slice, and the output fits.
    fn validate(&self, out_len: usize) -> Result<(), KernelError> {
        let bad = |s: String| Err(KernelError::Shape(s));
        let (nh, nkv, t, hd) = (self.n_head, self.n_kv_head, self.t, self.head_dim);
        if nh == 0 || nkv == 0 || hd == 0 || !nh.is_multiple_of(nkv) {
            return bad(format!(
                "{nh} query heads, {nkv} KV heads of {hd}: heads must divide evenly"
            ));
        }
        let need = |what: &str, len: usize, want: Option<usize>| match want {
            Some(w) if w <= len => Ok(()),
            _ => bad(format!("{what}: {len} values for {want:?}")),
        };
        need(
            "queries",
            self.q.len(),
            nh.checked_mul(t).and_then(|x| x.checked_mul(hd)),
        )?;
        let total = self.start + t;
        if total > 0 {
            // The furthest element read: last head, last position, last dimension.
            let reach = |(sh, sr): (usize, usize)| {
                (nkv - 1)
                    .checked_mul(sh)
                    .and_then(|a| (total - 1).checked_mul(sr).and_then(|b| a.checked_add(b)))
                    .and_then(|a| a.checked_add(hd))
            };
            need("keys", self.k.len(), reach(self.k_stride))?;
            need("values", self.v.len(), reach(self.v_stride))?;
        }
        if out_len != t * nh * hd {
            return bad(format!("an output of {out_len} for {t} rows of {nh}x{hd}"));
        }
        // A row must see at least itself, so nothing at or after the first row is hidden.
        let mut end = 0;
        for r in self.hidden {
            if r.is_empty() || r.start < end || r.end > self.start {
                return bad(format!(
                    "hidden positions {r:?} (after {end}) must be non-empty, increasing and \
                     before the first row at {}",
                    self.start
                ));
            }
            end = r.end;
        }
        Ok(())
    }
}

/// The path a call takes by default: AVX-512 where the CPU has it, the head size suits
/// it and `BATON_PORTABLE_KERNELS` does not say otherwise; else AVX2 on the same terms;
/// else portable.
pub fn path_for(head_dim: usize) -> KernelPath {
    [KernelPath::Avx512, KernelPath::Avx2]
        .into_iter()
        .find(|&p| choose(p) == p && takes(p, head_dim))
        .unwrap_or(KernelPath::Portable)
}

/// Whether `path` takes heads of `head_dim`: a SIMD path a multiple of its lanes (16 for
/// AVX-512, 8 for AVX2), at most 256.
fn takes(path: KernelPath, head_dim: usize) -> bool {
    let lanes = match path {
        KernelPath::Avx512 => 16,
        KernelPath::Avx2 => 8,
        _ => return true,
    };
    head_dim.is_multiple_of(lanes) && head_dim <= 256
}

/// The attention of `a` into `out` on the default path.
pub fn causal(a: &Causal<'_>, out: &mut [f32]) -> Result<(), KernelError> {
    causal_on(path_for(a.head_dim), a, out)
}

/// The attention of `a` into `out` on `path`.
pub fn causal_on(path: KernelPath, a: &Causal<'_>, out: &mut [f32]) -> Result<(), KernelError> {
    a.validate(out.len())?;
    if !path.available() {
        return Err(KernelError::Unavailable {
            path,
            reason: "this CPU lacks the features it needs",
        });
    }
    if !takes(path, a.head_dim) {
        return Err(KernelError::Unavailable {
            path,
            reason: "head sizes must be a multiple of its lanes (16 for AVX-512, 8 for AVX2), at most 256",
        });
    }
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: AVX-512 F is available (checked above), every read index lies
            // inside its slice (validate), and the head size suits the kernel (`takes`).
            unsafe { avx512::attend(a, SendPtr::new(out)) };
            Ok(())
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => {
            // SAFETY: as above, with AVX2 and FMA.
            unsafe { avx2::attend(a, SendPtr::new(out)) };
            Ok(())
        }
        KernelPath::Portable => {
            portable(a, out);
            Ok(())
        }
        _ => Err(KernelError::Unavailable {
            path,
            reason: "the attention kernel has no such implementation",
        }),
    }
}

/// Each output row (one token) is written by one task: [nh * hd] per token.
fn portable(a: &Causal<'_>, out: &mut [f32]) {
    let (nh, hd, t) = (a.n_head, a.head_dim, a.t);
    let group = nh / a.n_kv_head;
    let (ksh, ksr) = a.k_stride;
    let (vsh, vsr) = a.v_stride;
    let scale = 1.0 / (hd as f32).sqrt();
    out.par_chunks_mut(nh * hd)
        .enumerate()
        .for_each(|(i, row)| {
            let pos = a.start + i;
            let mut scores = vec![0f32; pos + 1];
            for h in 0..nh {
                let g = h / group;
                let qrow = &a.q[(h * t + i) * hd..(h * t + i + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let krow = &a.k[g * ksh + j * ksr..g * ksh + j * ksr + hd];
                    *s = dot(qrow, krow) * scale;
                }
                fill_hidden(&mut scores, a.hidden, f32::NEG_INFINITY);
                for s in scores.iter() {
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
                    let vrow = &a.v[g * vsh + j * vsr..g * vsh + j * vsr + hd];
                    for (x, &y) in o.iter_mut().zip(vrow) {
                        *x += p * y;
                    }
                }
                let inv = 1.0 / sum;
                for x in o.iter_mut() {
                    *x *= inv;
                }
            }
        });
}

/// Scores of hidden positions become `value` (-inf before a softmax, so the row's weight
/// there is 0; the row's own position is never hidden, so the maximum stays finite).
#[inline]
fn fill_hidden(scores: &mut [f32], hidden: &[Range<usize>], value: f32) {
    for r in hidden {
        let end = r.end.min(scores.len());
        if r.start < end {
            scores[r.start..end].fill(value);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args<'a>(q: &'a [f32], k: &'a [f32], v: &'a [f32], n: usize) -> Causal<'a> {
        Causal {
            q,
            k,
            v,
            k_stride: (n * 16, 16),
            v_stride: (n * 16, 16),
            n_head: 4,
            n_kv_head: 2,
            t: n,
            head_dim: 16,
            start: 0,
            hidden: &[],
        }
    }

    /// A value (or key, or query) buffer too short for the shape is an error on every
    /// path, before anything is read.
    #[test]
    fn short_or_misshaped_buffers_are_errors_on_every_path() {
        let n = 5;
        let q = vec![0.5f32; 4 * n * 16];
        let kv = vec![0.25f32; 2 * n * 16];
        let mut out = vec![0f32; n * 4 * 16];
        for path in PATHS {
            let ok = causal_on(path, &args(&q, &kv, &kv, n), &mut out);
            if !path.available() {
                baton_test_support::skipped(
                    &format!("the {path:?} kernel path"),
                    &format!("not available on this CPU (needs {})", path.needs()),
                );
                continue;
            }
            assert_eq!(ok, Ok(()), "{path:?}");
            let short = &kv[..kv.len() - 1];
            for a in [
                args(&q, &kv, short, n),
                args(&q, short, &kv, n),
                args(&q[..q.len() - 16], &kv, &kv, n),
                Causal {
                    v_stride: (n * 16, 17),
                    ..args(&q, &kv, &kv, n)
                },
                Causal {
                    n_kv_head: 3,
                    ..args(&q, &kv, &kv, n)
                },
            ] {
                let e = causal_on(path, &a, &mut out);
                assert!(matches!(e, Err(KernelError::Shape(_))), "{path:?}: {e:?}");
            }
            let e = causal_on(path, &args(&q, &kv, &kv, n), &mut out[1..]);
            assert!(matches!(e, Err(KernelError::Shape(_))), "{path:?}: {e:?}");
        }
    }

    /// Both paths against each other (not bit for bit: different trees), and each
    /// chunking-invariant on its own.
    #[test]
    fn paths_agree_and_each_is_chunking_invariant() {
        let (nh, nkv, hd, n) = (6, 2, 64, 23);
        let val = |len: usize, s: u32| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761).wrapping_add(s) >> 8) as f32
                        / (1u32 << 24) as f32
                        - 0.5
                })
                .collect()
        };
        let (q, k, v) = (
            val(nh * n * hd, 1),
            val(nkv * n * hd, 2),
            val(nkv * n * hd, 3),
        );
        let whole = |path: KernelPath, start: usize, t: usize| {
            // Queries of rows start..start+t, contiguous per head.
            let qs: Vec<f32> = (0..nh)
                .flat_map(|h| q[(h * n + start) * hd..(h * n + start + t) * hd].to_vec())
                .collect();
            let a = Causal {
                q: &qs,
                k: &k,
                v: &v,
                k_stride: (n * hd, hd),
                v_stride: (n * hd, hd),
                n_head: nh,
                n_kv_head: nkv,
                t,
                head_dim: hd,
                start,
                hidden: &[],
            };
            let mut out = vec![0f32; t * nh * hd];
            causal_on(path, &a, &mut out).expect("attention");
            out
        };
        let mut results = Vec::new();
        for path in PATHS {
            if !path.available() {
                baton_test_support::skipped(
                    &format!("the {path:?} kernel path"),
                    &format!("not available on this CPU (needs {})", path.needs()),
                );
                continue;
            }
            let all = whole(path, 0, n);
            let mut parts = whole(path, 0, 9);
            parts.extend(whole(path, 9, 13));
            parts.extend(whole(path, 22, 1));
            assert_eq!(all, parts, "{path:?}");
            results.push(all);
        }
        for r in &results[1..] {
            let d = r
                .iter()
                .zip(&results[0])
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(d < 1e-5, "paths differ by {d}");
        }
    }

    /// Rows over a cache with hidden positions give what they give over the same cache
    /// with those positions cut out (the keys keep the rotation of their own positions,
    /// so attention sees no other difference), on every path; a hidden value row, however
    /// large, adds nothing (its weight is exactly 0).
    #[test]
    fn hidden_positions_are_as_if_cut_out_on_every_path() {
        let (nh, nkv, hd, n) = (4, 2, 32, 41);
        let val = |len: usize, s: u32| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    ((i as u32).wrapping_mul(2246822519).wrapping_add(s) >> 9) as f32 / 8.4e6 - 0.5
                })
                .collect()
        };
        let (start, t) = (33, n - 33);
        let hidden = [2..5, 17..18, 20..31];
        let keep: Vec<usize> = (0..n)
            .filter(|j| !hidden.iter().any(|r| r.contains(j)))
            .collect();
        let q = val(nh * t * hd, 1);
        let (k, mut v) = (val(nkv * n * hd, 2), val(nkv * n * hd, 3));
        for g in 0..nkv {
            for j in hidden.iter().flat_map(|r| r.clone()) {
                v[(g * n + j) * hd..(g * n + j + 1) * hd].fill(1e30);
            }
        }
        let cut = |x: &[f32]| -> Vec<f32> {
            (0..nkv)
                .flat_map(|g| {
                    keep.iter()
                        .flat_map(move |&j| x[(g * n + j) * hd..(g * n + j + 1) * hd].to_vec())
                })
                .collect()
        };
        let (kc, vc) = (cut(&k), cut(&v));
        let m = keep.len();
        for path in PATHS {
            if !path.available() {
                baton_test_support::skipped(
                    &format!("the {path:?} kernel path"),
                    &format!("not available on this CPU (needs {})", path.needs()),
                );
                continue;
            }
            let base = Causal {
                q: &q,
                k: &k,
                v: &v,
                k_stride: (n * hd, hd),
                v_stride: (n * hd, hd),
                n_head: nh,
                n_kv_head: nkv,
                t,
                head_dim: hd,
                start,
                hidden: &hidden,
            };
            let mut got = vec![0f32; t * nh * hd];
            causal_on(path, &base, &mut got).expect("attention with hidden positions");
            let compact = Causal {
                k: &kc,
                v: &vc,
                k_stride: (m * hd, hd),
                v_stride: (m * hd, hd),
                start: m - t,
                hidden: &[],
                ..base
            };
            let mut want = vec![0f32; t * nh * hd];
            causal_on(path, &compact, &mut want).expect("attention over the cut cache");
            let d = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(d < 1e-6, "{path:?}: {d}");
            // Hidden positions at or after the first row are refused.
            for bad in [vec![30..34], vec![5..7, 3..4], vec![4..4]] {
                let a = Causal {
                    hidden: &bad,
                    ..base
                };
                let e = causal_on(path, &a, &mut got);
                assert!(
                    matches!(e, Err(KernelError::Shape(_))),
                    "{path:?} {bad:?}: {e:?}"
                );
            }
        }
    }
}
