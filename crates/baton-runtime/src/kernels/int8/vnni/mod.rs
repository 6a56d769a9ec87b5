//! The AVX-512 VNNI path.
//!
//! Multi-row items expand each unit of weights once into a 64-byte-aligned scratch of
//! canonical u8 operands and run register blocks of up to 4 rows x 2 tiles over it;
//! single rows (decode) unpack in registers instead and prefetch ahead, since they run at
//! memory speed. Both form the same exact integer sums per block and call the same float
//! steps (`*_finish`), so a row gets the same bits whichever computed it.
//!
//! Common contract of the `unsafe fn`s here: the CPU has AVX-512 F/BW/VL/VNNI (the
//! dispatcher checks [`KernelPath::available`](crate::kernels::KernelPath::available)
//! before choosing this path), and every pointer argument points into a packed tile, an
//! activation row or a scratch buffer that holds the bytes the function reads at the
//! offsets the layout in `packed` defines.

mod blocks;
mod expand;
mod gemv;

use super::super::avx512_exp::exp;
use super::acts::{Acts, A256, A32};
use super::packed::{Kind, Packed};
use super::{Epilogue, Item, JobRef, NT, RB};
use blocks::{blk32, sb_q4k, sb_q6k};
use expand::{expand_k, expand_q5};
use gemv::{gemv_q4k, gemv_q5, gemv_q6k, gemv_q8};
use std::arch::x86_64::*;

/// Rows per register block.
const MT: usize = 4;

/// Canonical 8-bit weights for one unit of NT tiles, ready for dpbusd:
/// [tile][k4-group][col 16][4] u8, plus the per-tile scales of K-quants.
#[repr(C, align(64))]
pub(super) struct Scratch {
    w: [u8; NT * 4096],
    /// Q4_K: sc as i32 [tile][8][16]; Q6_K: sc as i32 [tile][16][16].
    sc: [i32; NT * 256],
    /// Q4_K: mins as i16 pairs [tile][4][16][2]; Q6_K: 32*sc as i16 pairs [tile][8][16][2].
    pairs: [i16; NT * 256],
    d: [f32; NT * 16],
    dmin: [f32; NT * 16],
}

/// Per-thread scratch and accumulators.
pub(super) struct Work {
    scratch: Box<Scratch>,
    acc: Box<[__m512; RB * NT]>,
}

thread_local! {
    static WORK: std::cell::RefCell<Option<Work>> = const { std::cell::RefCell::new(None) };
}

/// `f` with this thread's [`Work`].
pub(super) fn with_work(f: impl FnOnce(&mut Work)) {
    WORK.with(|cell| {
        let mut work = cell.borrow_mut();
        // SAFETY: all-zero bytes are valid for both (integers and floats).
        let work = work.get_or_insert_with(|| unsafe {
            Work {
                scratch: Box::new_zeroed().assume_init(),
                acc: Box::new_zeroed().assume_init(),
            }
        });
        f(work)
    })
}

/// silu(x) = x / (1 + e^-x), with a fixed polynomial exp (mirrored exactly by the
/// portable path's `silu`).
#[target_feature(enable = "avx512f")]
fn silu(x: __m512) -> __m512 {
    // e^-x, clamped above as well: far out silu is x or 0 anyway.
    let nx = _mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(88.0));
    let e = exp(nx);
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// Work item `it` of job `r`: accumulate, then write its rectangle of the output.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `r` and `acts` passed `validate` (shapes, bias and
/// residual lengths agree with the weights and the row count), `it` is one of the items
/// the dispatcher derives from them, and no other thread writes its rectangle meanwhile.
pub(super) unsafe fn item(r: &JobRef<'_>, it: &Item, acts: &Acts, work: &mut Work) {
    let w = r.w;
    let tiles = r.tile_starts(it);
    let rows = it.r1 - it.r0;
    debug_assert!(rows <= RB && it.r1 <= acts.rows());
    // SAFETY: the tiles lie inside the weights (t0 + nt <= n/16, validated shapes), the
    // activation rows r0..r1 exist, and the caller's contract covers the rest.
    unsafe {
        accumulate(
            w,
            acts,
            tiles,
            it.nt,
            it.r0,
            it.r1,
            &mut work.scratch,
            &mut work.acc,
        );
        store(r, it, &work.acc);
    }
}

/// Writes item `it`'s accumulators through its epilogue.
///
/// # Safety
/// As for [`item`]; `acc` holds the item's accumulators.
#[target_feature(enable = "avx512f")]
unsafe fn store(r: &JobRef<'_>, it: &Item, acc: &[__m512; RB * NT]) {
    let n = r.w.n();
    for row in 0..it.r1 - it.r0 {
        let at = (it.r0 + row) * n + it.t0 * 16;
        let width = if it.swiglu { 16 } else { 16 * it.nt };
        // SAFETY: this row segment belongs to item `it` alone (the caller's contract).
        let dst = unsafe { r.dst.slice_mut(at, width) }.as_mut_ptr() as *mut f32;
        if it.swiglu {
            let y = _mm512_mul_ps(silu(acc[row * NT]), acc[row * NT + 1]);
            // SAFETY: `dst` holds 16 floats.
            unsafe { _mm512_storeu_ps(dst, y) };
            continue;
        }
        for j in 0..it.nt {
            let col = (it.t0 + j) * 16;
            let mut v = acc[row * NT + j];
            if let Some(b) = r.bias {
                let b = &b[col..col + 16];
                // SAFETY: `b` holds 16 floats.
                v = _mm512_add_ps(v, unsafe { _mm512_loadu_ps(b.as_ptr()) });
            }
            if let Epilogue::Residual(res) = r.epilogue {
                let res = &res[at + 16 * j..at + 16 * j + 16];
                // SAFETY: `res` holds 16 floats.
                v = _mm512_add_ps(v, unsafe { _mm512_loadu_ps(res.as_ptr()) });
            }
            // SAFETY: `dst` holds 16 * nt floats.
            unsafe { _mm512_storeu_ps(dst.add(16 * j), v) };
        }
    }
}

/// The accumulators of output columns [16*t0, 16*(t0+nt)) of rows [r0, r1) into
/// `acc` ([row][NT]). Tile j's packed data starts at `tiles[j]`.
///
/// # Safety
/// The module contract: `tiles[..nt]` start tiles of `w` (for SwiGLU, of gate and up,
/// same kind and shape), `acts` holds rows r0..r1 quantized for `w`'s kind, r1 - r0 <= RB.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate(
    w: &Packed,
    acts: &Acts,
    tiles: [*const u8; NT],
    nt: usize,
    r0: usize,
    r1: usize,
    scratch: &mut Scratch,
    acc: &mut [__m512; RB * NT],
) {
    let kind = w.kind();
    let kb = w.kb();
    let rows = r1 - r0;
    for a in acc.iter_mut().take(rows * NT) {
        *a = _mm512_setzero_ps();
    }
    let a32 = |r: usize| acts.a32_row(r).as_ptr();
    let a256 = |r: usize| acts.a256_row(r).as_ptr();
    if rows == 1 {
        let mut v = [[_mm512_setzero_ps(); NT]; 1];
        // SAFETY: the caller's contract; row r0 holds kb blocks of the kind's format.
        unsafe {
            if nt == 2 {
                match kind {
                    Kind::Q8_0 => gemv_q8::<2>(w, tiles, a32(r0), &mut v),
                    Kind::Q5_0 => gemv_q5::<2>(w, tiles, a32(r0), &mut v),
                    Kind::Q4K => gemv_q4k::<2>(kb, tiles, a256(r0), &mut v),
                    Kind::Q6K => gemv_q6k::<2>(kb, tiles, a256(r0), &mut v),
                }
            } else {
                let mut v1 = [[_mm512_setzero_ps(); 1]; 1];
                let t1 = [tiles[0]];
                match kind {
                    Kind::Q8_0 => gemv_q8::<1>(w, t1, a32(r0), &mut v1),
                    Kind::Q5_0 => gemv_q5::<1>(w, t1, a32(r0), &mut v1),
                    Kind::Q4K => gemv_q4k::<1>(kb, t1, a256(r0), &mut v1),
                    Kind::Q6K => gemv_q6k::<1>(kb, t1, a256(r0), &mut v1),
                }
                v[0][0] = v1[0][0];
            }
        }
        acc[..NT].copy_from_slice(&v[0]);
        return;
    }
    macro_rules! rows_loop {
        ($body:ident, $($extra:expr),*) => {{
            let mut r = 0;
            while r < rows {
                let mt = (rows - r).min(MT);
                match (mt, nt) {
                    (4, 2) => $body::<4, 2>(r, $($extra),*),
                    (3, 2) => $body::<3, 2>(r, $($extra),*),
                    (2, 2) => $body::<2, 2>(r, $($extra),*),
                    (1, 2) => $body::<1, 2>(r, $($extra),*),
                    (4, _) => $body::<4, 1>(r, $($extra),*),
                    (3, _) => $body::<3, 1>(r, $($extra),*),
                    (2, _) => $body::<2, 1>(r, $($extra),*),
                    _ => $body::<1, 1>(r, $($extra),*),
                }
                r += mt;
            }
        }};
    }
    fn load_acc<const M: usize, const N: usize>(
        acc: &[__m512; RB * NT],
        r: usize,
    ) -> [[__m512; N]; M] {
        std::array::from_fn(|i| std::array::from_fn(|j| acc[(r + i) * NT + j]))
    }
    fn store_acc<const M: usize, const N: usize>(
        acc: &mut [__m512; RB * NT],
        r: usize,
        a: &[[__m512; N]; M],
    ) {
        for i in 0..M {
            for j in 0..N {
                acc[(r + i) * NT + j] = a[i][j];
            }
        }
    }
    match kind {
        Kind::Q8_0 | Kind::Q5_0 => {
            let q8 = kind == Kind::Q8_0;
            // Units of up to 8 blocks: expand once (Q5_0), then every row group.
            let mut b0 = 0;
            while b0 < kb {
                let ub = (kb - b0).min(8);
                if !q8 {
                    for u in 0..ub {
                        for (j, &t) in tiles.iter().enumerate().take(nt) {
                            // SAFETY: t starts a tile of w, block b0 + u < kb, u < 8.
                            unsafe { expand_q5(w, t, b0 + u, j, u, scratch) };
                        }
                    }
                }
                /// # Safety
                /// The module contract, for rows r0+r..r0+r+M, blocks b0..b0+ub and
                /// (Q5_0) the scratch expanded for those blocks.
                #[inline(always)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn unit<const M: usize, const N: usize>(
                    r: usize,
                    acc: &mut [__m512; RB * NT],
                    acts: &Acts,
                    r0: usize,
                    w: &Packed,
                    b0: usize,
                    ub: usize,
                    tiles: [*const u8; NT],
                    scratch: *const Scratch,
                ) {
                    let q8 = w.kind() == Kind::Q8_0;
                    let mut a = load_acc::<M, N>(acc, r);
                    let mut ap = [std::ptr::null::<A32>(); M];
                    for u in 0..ub {
                        let b = b0 + u;
                        for (i, p) in ap.iter_mut().enumerate() {
                            *p = &acts.a32_row(r0 + r + i)[b];
                        }
                        let mut wp = [std::ptr::null::<u8>(); N];
                        let mut dp = [std::ptr::null::<u8>(); N];
                        // SAFETY: the caller's contract: offsets of block b inside the
                        // tiles, slot (j, u) inside the scratch.
                        unsafe {
                            for j in 0..N {
                                dp[j] = tiles[j].add(w.d_off(b));
                                wp[j] = if q8 {
                                    tiles[j].add(w.qs_off(b))
                                } else {
                                    (*scratch).w.as_ptr().add(j * 4096 + u * 512)
                                };
                            }
                            blk32::<M, N>(wp, dp, ap, q8, &mut a);
                        }
                    }
                    store_acc::<M, N>(acc, r, &a);
                }
                let sp = scratch as *const Scratch;
                // SAFETY: the rows and blocks the loop visits are the item's own.
                unsafe { rows_loop!(unit, acc, acts, r0, w, b0, ub, tiles, sp) };
                b0 += ub;
            }
        }
        Kind::Q4K | Kind::Q6K => {
            let pb = kind.packed_bytes();
            for b in 0..kb {
                for (j, &t) in tiles.iter().enumerate().take(nt) {
                    // SAFETY: unit b of a tile of w.
                    unsafe { expand_k(kind, t.add(b * pb), j, scratch) };
                }
                /// # Safety
                /// The module contract, for rows r0+r..r0+r+M, super-block b and the
                /// scratch expanded for it.
                #[inline(always)]
                unsafe fn unit<const M: usize, const N: usize>(
                    r: usize,
                    acc: &mut [__m512; RB * NT],
                    acts: &Acts,
                    r0: usize,
                    b: usize,
                    q4: bool,
                    scratch: *const Scratch,
                ) {
                    let mut a = load_acc::<M, N>(acc, r);
                    let mut ap = [std::ptr::null::<A256>(); M];
                    for (i, p) in ap.iter_mut().enumerate() {
                        *p = &acts.a256_row(r0 + r + i)[b];
                    }
                    // SAFETY: the caller's contract; the scratch is not written meanwhile.
                    unsafe {
                        if q4 {
                            sb_q4k::<M, N>(&*scratch, ap, &mut a);
                        } else {
                            sb_q6k::<M, N>(&*scratch, ap, &mut a);
                        }
                    }
                    store_acc::<M, N>(acc, r, &a);
                }
                let sp = scratch as *const Scratch;
                // SAFETY: the rows the loop visits are the item's own.
                unsafe { rows_loop!(unit, acc, acts, r0, b, kind == Kind::Q4K, sp) };
            }
        }
    }
}

/// [`silu`] over 16 plain floats, for the tests comparing it with the portable one.
#[cfg(test)]
pub(super) fn silu_lanes(x: [f32; 16]) -> [f32; 16] {
    #[target_feature(enable = "avx512f")]
    fn go(x: [f32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: both arrays hold 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), silu(_mm512_loadu_ps(x.as_ptr()))) };
        out
    }
    assert!(crate::kernels::KernelPath::Avx512.available());
    // SAFETY: AVX-512 F is available (asserted).
    unsafe { go(x) }
}
