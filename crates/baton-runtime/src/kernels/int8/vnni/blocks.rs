//! Block dot products for register blocks of M rows x N tiles, and the float steps
//! (`*_finish`) that every kernel shares so they agree bit for bit. The `unsafe fn`s
//! here share the contract in the parent module's docs.

use super::super::acts::{A256, A32};
use super::Scratch;
use std::arch::x86_64::*;

/// 4 bytes at `p` broadcast to every 32-bit lane.
///
/// # Safety
/// The CPU has AVX-512 F; `p` is valid for reading 4 bytes.
#[inline(always)]
pub(super) unsafe fn bcast(p: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// One 32-value block for M rows x N tiles: Q8_0 (offset 128) or Q5_0 (offset 16).
/// Tile j's 512 canonical bytes at `w[j]`, its f16 scales at `d[j]`.
///
/// # Safety
/// The module contract: `w[j]` holds 512 canonical bytes (64-byte aligned), `d[j]` 16
/// f16 scales, `a[i]` one activation block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn blk32<const M: usize, const N: usize>(
    w: [*const u8; N],
    d: [*const u8; N],
    a: [*const A32; M],
    q8: bool,
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut s = [[_mm512_setzero_si512(); N]; M];
        for i in 0..M {
            let init = _mm512_set1_epi32(if q8 { (*a[i]).nb128 } else { (*a[i]).nb16 });
            for j in 0..N {
                s[i][j] = init;
            }
        }
        for g in 0..8 {
            let mut wv = [_mm512_setzero_si512(); N];
            for j in 0..N {
                wv[j] = _mm512_load_si512(w[j].add(g * 64) as *const _);
            }
            for i in 0..M {
                let av = bcast((*a[i]).qs.as_ptr().add(4 * g) as *const u8);
                for j in 0..N {
                    s[i][j] = _mm512_dpbusd_epi32(s[i][j], wv[j], av);
                }
            }
        }
        blk32_finish(s, d, a, acc);
    }
}

/// The float step of a 32-value block: acc += float(isum) * (d_w * d_a). Shared by
/// every kernel so they agree bit for bit.
///
/// # Safety
/// The module contract: `d[j]` holds 16 f16 scales, `a[i]` one activation block.
#[inline(always)]
pub(super) unsafe fn blk32_finish<const M: usize, const N: usize>(
    s: [[__m512i; N]; M],
    d: [*const u8; N],
    a: [*const A32; M],
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut dw = [_mm512_setzero_ps(); N];
        for j in 0..N {
            dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(d[j] as *const _));
        }
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(s[i][j]),
                    _mm512_mul_ps(dw[j], da),
                    acc[i][j],
                );
            }
        }
    }
}

/// One Q4_K super-block (256 values) for M rows x N tiles from the scratch.
///
/// # Safety
/// The module contract: the scratch holds the expanded unit of N tiles, `a[i]` one
/// activation block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn sb_q4k<const M: usize, const N: usize>(
    s: &Scratch,
    a: [*const A256; M],
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract; scratch reads are inside its arrays, aligned.
    unsafe {
        let mut i1 = [[_mm512_setzero_si512(); N]; M];
        for sb in 0..8 {
            let mut ss = [[_mm512_setzero_si512(); N]; M];
            for g in 0..8 {
                let mut wv = [_mm512_setzero_si512(); N];
                for j in 0..N {
                    wv[j] = _mm512_load_si512(
                        s.w.as_ptr().add(j * 4096 + (sb * 8 + g) * 64) as *const _
                    );
                }
                for i in 0..M {
                    let av = bcast((*a[i]).qs.as_ptr().add(sb * 32 + 4 * g) as *const u8);
                    for j in 0..N {
                        ss[i][j] = _mm512_dpbusd_epi32(ss[i][j], wv[j], av);
                    }
                }
            }
            for j in 0..N {
                let sc = _mm512_load_si512(s.sc.as_ptr().add(j * 256 + sb * 16) as *const _);
                for i in 0..M {
                    i1[i][j] = _mm512_add_epi32(i1[i][j], _mm512_mullo_epi32(ss[i][j], sc));
                }
            }
        }
        let mut i2 = [[_mm512_setzero_si512(); N]; M];
        for pp in 0..4 {
            for j in 0..N {
                let mv = _mm512_load_si512(s.pairs.as_ptr().add(j * 256 + pp * 32) as *const _);
                for i in 0..M {
                    let bv = bcast((*a[i]).b32.as_ptr().add(2 * pp) as *const u8);
                    i2[i][j] = _mm512_dpwssd_epi32(i2[i][j], mv, bv);
                }
            }
        }
        let mut d = [_mm512_setzero_ps(); N];
        let mut dm = [_mm512_setzero_ps(); N];
        for j in 0..N {
            d[j] = _mm512_load_ps(s.d.as_ptr().add(j * 16));
            dm[j] = _mm512_load_ps(s.dmin.as_ptr().add(j * 16));
        }
        q4k_finish(i1, i2, d, dm, a, acc);
    }
}

/// The float step of a Q4_K super-block: acc += i1 * (d * d_a) - i2 * (dmin * d_a).
///
/// # Safety
/// The module contract: `a[i]` is one activation block.
#[inline(always)]
pub(super) unsafe fn q4k_finish<const M: usize, const N: usize>(
    i1: [[__m512i; N]; M],
    i2: [[__m512i; N]; M],
    d: [__m512; N],
    dm: [__m512; N],
    a: [*const A256; M],
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract.
    unsafe {
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(i1[i][j]),
                    _mm512_mul_ps(d[j], da),
                    acc[i][j],
                );
                acc[i][j] = _mm512_fnmadd_ps(
                    _mm512_cvtepi32_ps(i2[i][j]),
                    _mm512_mul_ps(dm[j], da),
                    acc[i][j],
                );
            }
        }
    }
}

/// One Q6_K super-block (256 values) for M rows x N tiles from the scratch.
///
/// # Safety
/// As for [`sb_q4k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
pub(super) unsafe fn sb_q6k<const M: usize, const N: usize>(
    s: &Scratch,
    a: [*const A256; M],
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract; scratch reads are inside its arrays, aligned.
    unsafe {
        let mut i1 = [[_mm512_setzero_si512(); N]; M];
        for sb in 0..16 {
            let mut ss = [[_mm512_setzero_si512(); N]; M];
            for g in 0..4 {
                let mut wv = [_mm512_setzero_si512(); N];
                for j in 0..N {
                    wv[j] = _mm512_load_si512(
                        s.w.as_ptr().add(j * 4096 + (sb * 4 + g) * 64) as *const _
                    );
                }
                for i in 0..M {
                    let av = bcast((*a[i]).qs.as_ptr().add(sb * 16 + 4 * g) as *const u8);
                    for j in 0..N {
                        ss[i][j] = _mm512_dpbusd_epi32(ss[i][j], wv[j], av);
                    }
                }
            }
            for j in 0..N {
                let sc = _mm512_load_si512(s.sc.as_ptr().add(j * 256 + sb * 16) as *const _);
                for i in 0..M {
                    i1[i][j] = _mm512_add_epi32(i1[i][j], _mm512_mullo_epi32(ss[i][j], sc));
                }
            }
        }
        for pp in 0..8 {
            for j in 0..N {
                let pv = _mm512_load_si512(s.pairs.as_ptr().add(j * 256 + pp * 32) as *const _);
                for i in 0..M {
                    let bv = bcast((*a[i]).b16.as_ptr().add(2 * pp) as *const u8);
                    i1[i][j] = _mm512_sub_epi32(i1[i][j], _mm512_madd_epi16(pv, bv));
                }
            }
        }
        let mut d = [_mm512_setzero_ps(); N];
        for j in 0..N {
            d[j] = _mm512_load_ps(s.d.as_ptr().add(j * 16));
        }
        q6k_finish(i1, d, a, acc);
    }
}

/// The float step of a Q6_K super-block: acc += i * (d * d_a).
///
/// # Safety
/// The module contract: `a[i]` is one activation block.
#[inline(always)]
pub(super) unsafe fn q6k_finish<const M: usize, const N: usize>(
    i1: [[__m512i; N]; M],
    d: [__m512; N],
    a: [*const A256; M],
    acc: &mut [[__m512; N]; M],
) {
    // SAFETY: the caller's contract.
    unsafe {
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(i1[i][j]),
                    _mm512_mul_ps(d[j], da),
                    acc[i][j],
                );
            }
        }
    }
}
