//! The AVX2 path, for CPUs without AVX-512 VNNI.
//!
//! It reads the VNNI path's packed tiles as they are: a 64-byte line of 16 columns is two
//! 256-bit halves of 8. AVX2 has no `vpdpbusd`; `vpmaddubsw` multiplies u8 by i8 into
//! saturating i16 pair sums and `vpmaddwd` by ones widens them to i32. The sums stay
//! exact because no pair sum can saturate (each block function says why for its format),
//! so every block yields the integers the other paths form, and the float steps are the
//! portable path's in the same order: the three paths agree bit for bit.
//!
//! Items run both halves of a block one after the other, in registers (no scratch):
//! register blocks of up to [`MT`] rows over one tile for multi-row items, and one row
//! over both tiles with prefetching for decode, which runs at memory speed.
//!
//! Common contract of the `unsafe fn`s here: the CPU has AVX2, FMA and F16C (the
//! dispatcher checks [`KernelPath::available`](crate::kernels::KernelPath::available)
//! before choosing this path), and every pointer argument points into a packed tile or an
//! activation row that holds the bytes the function reads at the offsets the layout in
//! `packed` defines.

mod blocks;

use super::super::avx2_exp::exp;
use super::acts::{Acts, A256, A32};
use super::packed::{Kind, Packed};
use super::{Epilogue, Item, JobRef, NT, RB};
use blocks::{finish32, q4k, q5, q6k, q8, Accs};
use std::arch::x86_64::*;

/// Rows per register block of a multi-row item: one tile's half at a time leaves registers
/// for 8 rows (8 rather than 4 took the capped 0.5B's prefill from 280 to 319 tok/s).
const MT: usize = 8;

/// Per-thread accumulators: [row][tile][half].
pub(super) struct Work {
    acc: Box<[[__m256; 2]; RB * NT]>,
}

thread_local! {
    static WORK: std::cell::RefCell<Option<Work>> = const { std::cell::RefCell::new(None) };
}

/// `f` with this thread's [`Work`].
pub(super) fn with_work(f: impl FnOnce(&mut Work)) {
    WORK.with(|cell| {
        let mut work = cell.borrow_mut();
        // SAFETY: all-zero bytes are valid floats.
        let work = work.get_or_insert_with(|| unsafe {
            Work {
                acc: Box::new_zeroed().assume_init(),
            }
        });
        f(work)
    })
}

/// silu(x) = x / (1 + e^-x), lane for lane the portable path's `silu` (and so the VNNI
/// path's).
#[target_feature(enable = "avx2,fma")]
fn silu(x: __m256) -> __m256 {
    let nx = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(88.0));
    let e = exp(nx);
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// Work item `it` of job `r`: accumulate, then write its rectangle of the output.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `r` and `acts` passed `validate` (shapes, bias and
/// residual lengths agree with the weights and the row count), `it` is one of the items
/// the dispatcher derives from them, and no other thread writes its rectangle meanwhile.
pub(super) unsafe fn item(r: &JobRef<'_>, it: &Item, acts: &Acts, work: &mut Work) {
    let w = r.w;
    let tiles = r.tile_starts(it);
    debug_assert!(it.r1 - it.r0 <= RB && it.r1 <= acts.rows());
    // SAFETY: the tiles lie inside the weights (t0 + nt <= n/16, validated shapes), the
    // activation rows r0..r1 exist, and the caller's contract covers the rest.
    unsafe {
        accumulate(w, acts, tiles, it.nt, it.r0, it.r1, &mut work.acc);
        store(r, it, &work.acc);
    }
}

/// Writes item `it`'s accumulators through its epilogue, in the portable path's order:
/// bias, then residual; or silu(gate) · up.
///
/// # Safety
/// As for [`item`]; `acc` holds the item's accumulators.
#[target_feature(enable = "avx2,fma")]
unsafe fn store(r: &JobRef<'_>, it: &Item, acc: &[[__m256; 2]; RB * NT]) {
    let n = r.w.n();
    for row in 0..it.r1 - it.r0 {
        let at = (it.r0 + row) * n + it.t0 * 16;
        let width = if it.swiglu { 16 } else { 16 * it.nt };
        // SAFETY: this row segment belongs to item `it` alone (the caller's contract).
        let dst = unsafe { r.dst.slice_mut(at, width) }.as_mut_ptr() as *mut f32;
        for h in 0..2 {
            if it.swiglu {
                let y = _mm256_mul_ps(silu(acc[row * NT][h]), acc[row * NT + 1][h]);
                // SAFETY: `dst` holds 16 floats.
                unsafe { _mm256_storeu_ps(dst.add(8 * h), y) };
                continue;
            }
            for j in 0..it.nt {
                let col = (it.t0 + j) * 16 + 8 * h;
                let mut v = acc[row * NT + j][h];
                if let Some(b) = r.bias {
                    let b = &b[col..col + 8];
                    // SAFETY: `b` holds 8 floats.
                    v = _mm256_add_ps(v, unsafe { _mm256_loadu_ps(b.as_ptr()) });
                }
                if let Epilogue::Residual(res) = r.epilogue {
                    let o = at + 16 * j + 8 * h;
                    let res = &res[o..o + 8];
                    // SAFETY: `res` holds 8 floats.
                    v = _mm256_add_ps(v, unsafe { _mm256_loadu_ps(res.as_ptr()) });
                }
                // SAFETY: `dst` holds 16 * nt floats.
                unsafe { _mm256_storeu_ps(dst.add(16 * j + 8 * h), v) };
            }
        }
    }
}

/// The accumulators of output columns [16*t0, 16*(t0+nt)) of rows [r0, r1) into `acc`
/// ([row][NT][half]). Tile j's packed data starts at `tiles[j]`.
///
/// # Safety
/// The module contract: `tiles[..nt]` start tiles of `w` (for SwiGLU, of gate and up,
/// same kind and shape), `acts` holds rows r0..r1 quantized for `w`'s kind, r1 - r0 <= RB.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate(
    w: &Packed,
    acts: &Acts,
    tiles: [*const u8; NT],
    nt: usize,
    r0: usize,
    r1: usize,
    acc: &mut [[__m256; 2]; RB * NT],
) {
    let rows = r1 - r0;
    // SAFETY: the caller's contract, for rows and tiles of this item.
    unsafe {
        if rows == 1 {
            if nt == 2 {
                block::<1, 2>(w, acts, tiles, r0, 0, 0, acc);
            } else {
                block::<1, 1>(w, acts, [tiles[0]], r0, 0, 0, acc);
            }
            return;
        }
        for (j, &t) in tiles.iter().enumerate().take(nt) {
            let mut r = 0;
            while r < rows {
                let mt = (rows - r).min(MT);
                match mt {
                    8 => block::<8, 1>(w, acts, [t], r0, r, j, acc),
                    7 => block::<7, 1>(w, acts, [t], r0, r, j, acc),
                    6 => block::<6, 1>(w, acts, [t], r0, r, j, acc),
                    5 => block::<5, 1>(w, acts, [t], r0, r, j, acc),
                    4 => block::<4, 1>(w, acts, [t], r0, r, j, acc),
                    3 => block::<3, 1>(w, acts, [t], r0, r, j, acc),
                    2 => block::<2, 1>(w, acts, [t], r0, r, j, acc),
                    _ => block::<1, 1>(w, acts, [t], r0, r, j, acc),
                }
                r += mt;
            }
        }
    }
}

/// Rows r0+r .. r0+r+M of tiles j0 .. j0+N, over every block, into `acc`.
///
/// # Safety
/// As for [`accumulate`]; `tiles` are the item's tiles j0 .. j0+N and the rows are its own.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const M: usize, const N: usize>(
    w: &Packed,
    acts: &Acts,
    tiles: [*const u8; N],
    r0: usize,
    r: usize,
    j0: usize,
    acc: &mut [[__m256; 2]; RB * NT],
) {
    let zero = _mm256_setzero_ps();
    let mut a: Accs<M, N> = [[[zero; 2]; N]; M];
    let kind = w.kind();
    let prefetching = M == 1;
    // SAFETY: the caller's contract: blocks b < kb of the tiles and of rows r0+r+i.
    unsafe {
        match kind {
            Kind::Q8_0 | Kind::Q5_0 => {
                let rows: [*const A32; M] =
                    std::array::from_fn(|i| acts.a32_row(r0 + r + i).as_ptr());
                for b in 0..w.kb() {
                    if prefetching {
                        for t in tiles {
                            prefetch(t.wrapping_add(w.qs_off(b + 8)), w.qs_off(1));
                            if kind == Kind::Q5_0 {
                                prefetch(t.wrapping_add(w.hm_off(b + 8)), 64);
                            }
                            if b % 2 == 0 {
                                prefetch(t.wrapping_add(w.d_off(b + 8)), 64);
                            }
                        }
                    }
                    let ab: [*const A32; M] = std::array::from_fn(|i| rows[i].add(b));
                    for h in 0..2 {
                        let s = if kind == Kind::Q8_0 {
                            q8::<M, N>(w, tiles, b, h, ab)
                        } else {
                            q5::<M, N>(w, tiles, b, h, ab)
                        };
                        let d = std::array::from_fn(|j| tiles[j].add(w.d_off(b) + 16 * h));
                        finish32(s, d, ab, h, &mut a);
                    }
                }
            }
            Kind::Q4K | Kind::Q6K => {
                let pb = kind.packed_bytes();
                let rows: [*const A256; M] =
                    std::array::from_fn(|i| acts.a256_row(r0 + r + i).as_ptr());
                for b in 0..w.kb() {
                    if prefetching {
                        for t in tiles {
                            prefetch(t.wrapping_add((b + 2) * pb), pb);
                        }
                    }
                    let ab: [*const A256; M] = std::array::from_fn(|i| rows[i].add(b));
                    let units: [*const u8; N] = std::array::from_fn(|j| tiles[j].add(b * pb));
                    for h in 0..2 {
                        if kind == Kind::Q4K {
                            q4k::<M, N>(units, h, ab, &mut a);
                        } else {
                            q6k::<M, N>(units, h, ab, &mut a);
                        }
                    }
                }
            }
        }
    }
    for i in 0..M {
        for j in 0..N {
            acc[(r + i) * NT + j0 + j] = a[i][j];
        }
    }
}

/// Software prefetch of `bytes` at `p` (which may lie past the data: prefetches do not
/// fault).
///
/// # Safety
/// The CPU has SSE (every x86_64 does); `p` need not be valid.
#[inline(always)]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    for l in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8) };
    }
}

/// [`silu`] over 8 plain floats, for the tests comparing it with the portable one.
#[cfg(test)]
pub(super) fn silu_lanes(x: [f32; 8]) -> [f32; 8] {
    #[target_feature(enable = "avx2,fma")]
    fn go(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: both arrays hold 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), silu(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }
    assert!(crate::kernels::KernelPath::Avx2.available());
    // SAFETY: AVX2 and FMA are available (asserted).
    unsafe { go(x) }
}
