//! Single-row kernels (decode): unpack in registers instead of through the scratch.
//! The `unsafe fn`s here share the contract in the parent module's docs.

use super::super::acts::{A256, A32};
use super::super::packed::{k_off, Kind, Packed};
use super::blocks::{bcast, blk32, blk32_finish, q4k_finish, q6k_finish};
use super::expand::{q5_unpack, q6_pair, q6_unpack};
use std::arch::x86_64::*;

/// # Safety
/// The module contract: `tiles[j]` start tiles of `w` (Q5_0), `a` one row of w.kb()
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemv_q5<const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    a: *const A32,
    acc: &mut [[__m512; N]; 1],
) {
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..w.kb() {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add(w.qs_off(b + 8)), 256);
                prefetch(t.wrapping_add(w.hm_off(b + 8)), 64);
                if b % 2 == 0 {
                    prefetch(t.wrapping_add(w.d_off(b + 8)), 64);
                }
            }
            let mut s = [[_mm512_set1_epi32((*ab).nb16); N]; 1];
            let mut sh = [_mm512_setzero_si512(); N];
            for g8 in 0..4 {
                let alo = bcast((*ab).qs.as_ptr().add(8 * g8) as *const u8);
                let ahi = bcast((*ab).qs.as_ptr().add(8 * g8 + 4) as *const u8);
                for j in 0..N {
                    let (lo, hi) =
                        q5_unpack(tiles[j].add(w.qs_off(b)), tiles[j].add(w.hm_off(b)), g8);
                    s[0][j] = _mm512_dpbusd_epi32(s[0][j], lo, alo);
                    sh[j] = _mm512_dpbusd_epi32(sh[j], hi, ahi);
                }
            }
            for j in 0..N {
                s[0][j] = _mm512_add_epi32(s[0][j], sh[j]);
            }
            let mut d = [std::ptr::null(); N];
            for j in 0..N {
                d[j] = tiles[j].add(w.d_off(b));
            }
            blk32_finish(s, d, [ab], acc);
        }
    }
}

/// # Safety
/// The module contract: `tiles[j]` start Q4_K tiles of `kb` units, `a` one row of `kb`
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemv_q4k<const N: usize>(
    kb: usize,
    tiles: [*const u8; N],
    a: *const A256,
    acc: &mut [[__m512; N]; 1],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let pb = Kind::Q4K.packed_bytes();
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for s in 0..8 {
                // Two chains per tile (low / high nibbles) so dpbusd latency overlaps.
                let mut sl = [_mm512_setzero_si512(); N];
                let mut sh = [_mm512_setzero_si512(); N];
                for g in 0..4 {
                    let alo = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g) as *const u8);
                    let ahi = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g + 4) as *const u8);
                    for j in 0..N {
                        let v =
                            _mm512_load_si512(tiles[j].add(b * pb + (s * 4 + g) * 64) as *const _);
                        sl[j] = _mm512_dpbusd_epi32(sl[j], _mm512_and_si512(v, m4), alo);
                        sh[j] = _mm512_dpbusd_epi32(
                            sh[j],
                            _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                            ahi,
                        );
                    }
                }
                for j in 0..N {
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        tiles[j].add(b * pb + k_off::Q4K_SC + s * 16) as *const _,
                    ));
                    i1[0][j] = _mm512_add_epi32(
                        i1[0][j],
                        _mm512_mullo_epi32(_mm512_add_epi32(sl[j], sh[j]), sc),
                    );
                }
            }
            let mut i2 = [[_mm512_setzero_si512(); N]; 1];
            for pp in 0..4 {
                let bv = bcast((*ab).b32.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    let mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        tiles[j].add(b * pb + k_off::Q4K_M + pp * 32) as *const _,
                    ));
                    i2[0][j] = _mm512_dpwssd_epi32(i2[0][j], mv, bv);
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            let mut dm = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q4K_D) as *const _
                ));
                dm[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q4K_DMIN) as *const _
                ));
            }
            q4k_finish(i1, i2, d, dm, [ab], acc);
        }
    }
}

/// # Safety
/// The module contract: `tiles[j]` start Q6_K tiles of `kb` units, `a` one row of `kb`
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemv_q6k<const N: usize>(
    kb: usize,
    tiles: [*const u8; N],
    a: *const A256,
    acc: &mut [[__m512; N]; 1],
) {
    let pb = Kind::Q6K.packed_bytes();
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for sub in 0..16 {
                let mut av = [_mm512_setzero_si512(); 4];
                for (i, v) in av.iter_mut().enumerate() {
                    *v = bcast((*ab).qs.as_ptr().add(sub * 16 + 4 * i) as *const u8);
                }
                for j in 0..N {
                    let p = tiles[j].add(b * pb);
                    let w = q6_unpack(p, sub);
                    let s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], av[0]);
                    let s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], av[1]);
                    let s0 = _mm512_dpbusd_epi32(s0, w[2], av[2]);
                    let s1 = _mm512_dpbusd_epi32(s1, w[3], av[3]);
                    let ss = _mm512_add_epi32(s0, s1);
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        p.add(k_off::Q6K_SC + sub * 16) as *const _
                    ));
                    i1[0][j] = _mm512_add_epi32(i1[0][j], _mm512_mullo_epi32(ss, sc));
                }
            }
            for pp in 0..8 {
                let bv = bcast((*ab).b16.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    i1[0][j] = _mm512_sub_epi32(
                        i1[0][j],
                        _mm512_madd_epi16(q6_pair(tiles[j].add(b * pb), pp), bv),
                    );
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q6K_D) as *const _
                ));
            }
            q6k_finish(i1, d, [ab], acc);
        }
    }
}

/// Software prefetch of `bytes` at `p` (which may lie past the data: prefetches do not
/// fault). Single-row kernels run at memory speed only with it: the hardware
/// prefetcher alone leaves each core at about half the bandwidth.
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

/// # Safety
/// The module contract: `tiles[j]` start tiles of `w` (Q8_0), `a` one row of w.kb()
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gemv_q8<const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    a: *const A32,
    acc: &mut [[__m512; N]; 1],
) {
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..w.kb() {
            let ab = a.add(b);
            let mut wp = [std::ptr::null::<u8>(); N];
            let mut dp = [std::ptr::null::<u8>(); N];
            for j in 0..N {
                prefetch(tiles[j].wrapping_add(w.qs_off(b + 8)), 512);
                if b % 2 == 0 {
                    prefetch(tiles[j].wrapping_add(w.d_off(b + 8)), 64);
                }
                wp[j] = tiles[j].add(w.qs_off(b));
                dp[j] = tiles[j].add(w.d_off(b));
            }
            blk32::<1, N>(wp, dp, [ab], true, acc);
        }
    }
}
