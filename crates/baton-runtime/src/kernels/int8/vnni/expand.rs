//! Unpacking of quantized weight tiles into canonical u8 dpbusd operands, into the
//! scratch for multi-row items or into registers for single rows. The `unsafe fn`s
//! here share the contract in the parent module's docs.

use super::super::packed::{k_off, Kind, Packed};
use super::Scratch;
use std::arch::x86_64::*;

/// Expand one K-quant super-block of tile j (packed at `p`) into scratch slot j.
///
/// # Safety
/// The module contract: `p` points at one packed unit of `kind` (64-byte aligned), j < NT.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn expand_k(kind: Kind, p: *const u8, j: usize, s: &mut Scratch) {
    let m4 = _mm512_set1_epi8(0x0f);
    // SAFETY: reads stay inside the unit at `p` (offsets from `k_off`), writes inside
    // slot j of the scratch, whose runs are 64-byte aligned.
    unsafe {
        match kind {
            Kind::Q4K => {
                for g8 in 0..32 {
                    let v = _mm512_load_si512(p.add(g8 * 64) as *const _);
                    let o = s.w.as_mut_ptr().add(j * 4096 + (2 * g8) * 64);
                    _mm512_store_si512(o as *mut _, _mm512_and_si512(v, m4));
                    _mm512_store_si512(
                        o.add(64) as *mut _,
                        _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                    );
                }
                for sb in 0..8 {
                    let sc = _mm_loadu_si128(p.add(k_off::Q4K_SC + sb * 16) as *const _);
                    _mm512_store_si512(
                        s.sc.as_mut_ptr().add(j * 256 + sb * 16) as *mut _,
                        _mm512_cvtepu8_epi32(sc),
                    );
                }
                for pp in 0..4 {
                    let m = _mm256_loadu_si256(p.add(k_off::Q4K_M + pp * 32) as *const _);
                    _mm512_store_si512(
                        s.pairs.as_mut_ptr().add(j * 256 + pp * 32) as *mut _,
                        _mm512_cvtepu8_epi16(m),
                    );
                }
                _mm512_store_ps(
                    s.d.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(k_off::Q4K_D) as *const _)),
                );
                _mm512_store_ps(
                    s.dmin.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(k_off::Q4K_DMIN) as *const _)),
                );
            }
            Kind::Q6K => {
                for sub in 0..16 {
                    let w = q6_unpack(p, sub);
                    for (i, wi) in w.iter().enumerate() {
                        _mm512_store_si512(
                            s.w.as_mut_ptr().add(j * 4096 + (4 * sub + i) * 64) as *mut _,
                            *wi,
                        );
                    }
                }
                for sb in 0..16 {
                    let sc = _mm_loadu_si128(p.add(k_off::Q6K_SC + sb * 16) as *const _);
                    _mm512_store_si512(
                        s.sc.as_mut_ptr().add(j * 256 + sb * 16) as *mut _,
                        _mm512_cvtepi8_epi32(sc),
                    );
                }
                for pp in 0..8 {
                    _mm512_store_si512(
                        s.pairs.as_mut_ptr().add(j * 256 + pp * 32) as *mut _,
                        q6_pair(p, pp),
                    );
                }
                _mm512_store_ps(
                    s.d.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(k_off::Q6K_D) as *const _)),
                );
            }
            Kind::Q8_0 | Kind::Q5_0 => {}
        }
    }
}

/// Q6_K: the four dpbusd operands (k4-groups 4*sub..4*sub+4) of 16-value sub-block `sub`.
///
/// # Safety
/// The module contract: `p` points at one packed, 64-byte aligned Q6_K unit; sub < 16.
#[inline(always)]
pub(super) unsafe fn q6_unpack(p: *const u8, sub: usize) -> [__m512i; 4] {
    // SAFETY: the loads read the unit's low nibbles and high bits of sub-block `sub`.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0f);
        let m3 = _mm512_set1_epi8(0x30);
        let v0 = _mm512_load_si512(p.add((2 * sub) * 64) as *const _);
        let v1 = _mm512_load_si512(p.add((2 * sub + 1) * 64) as *const _);
        let h = _mm512_load_si512(p.add(k_off::Q6K_HI + sub * 64) as *const _);
        [
            _mm512_or_si512(
                _mm512_and_si512(v0, m4),
                _mm512_and_si512(_mm512_slli_epi16(h, 4), m3),
            ),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                _mm512_and_si512(_mm512_slli_epi16(h, 2), m3),
            ),
            _mm512_or_si512(_mm512_and_si512(v1, m4), _mm512_and_si512(h, m3)),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
                _mm512_and_si512(_mm512_srli_epi16(h, 2), m3),
            ),
        ]
    }
}

/// Q6_K: 32*sc of sub-blocks (2pp, 2pp+1) per column as i16 pairs.
///
/// # Safety
/// The module contract: `p` points at one packed Q6_K unit; pp < 8.
#[inline(always)]
pub(super) unsafe fn q6_pair(p: *const u8, pp: usize) -> __m512i {
    // SAFETY: the loads read two 16-byte scale runs of the unit.
    unsafe {
        let x = _mm512_cvtepi8_epi32(_mm_loadu_si128(
            p.add(k_off::Q6K_SC + (2 * pp) * 16) as *const _
        ));
        let y = _mm512_cvtepi8_epi32(_mm_loadu_si128(
            p.add(k_off::Q6K_SC + (2 * pp + 1) * 16) as *const _
        ));
        _mm512_or_si512(
            _mm512_and_si512(_mm512_slli_epi32(x, 5), _mm512_set1_epi32(0xffff)),
            _mm512_slli_epi32(_mm512_slli_epi32(y, 5), 16),
        )
    }
}

/// Q5_0: expand block `b` of tile j into scratch slot (j, u) (512 bytes each).
///
/// # Safety
/// The module contract: `tile` is the start of one of `w`'s tiles; b < w.kb(), j < NT,
/// u < 8.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn expand_q5(
    w: &Packed,
    tile: *const u8,
    b: usize,
    j: usize,
    u: usize,
    s: &mut Scratch,
) {
    // SAFETY: block b's nibbles and masks lie inside the tile; slot (j, u) inside the
    // scratch, 64-byte aligned.
    unsafe {
        let qp = tile.add(w.qs_off(b));
        let hp = tile.add(w.hm_off(b));
        for g8 in 0..4 {
            let (lo, hi) = q5_unpack(qp, hp, g8);
            let o = s.w.as_mut_ptr().add(j * 4096 + u * 512 + (2 * g8) * 64);
            _mm512_store_si512(o as *mut _, lo);
            _mm512_store_si512(o.add(64) as *mut _, hi);
        }
    }
}

/// Q5_0: dpbusd operands of k4-groups 2*g8 and 2*g8+1 (5-bit values, unsigned).
///
/// # Safety
/// The module contract: `qp` / `hp` point at one block's nibbles (64-byte aligned) and
/// high-bit masks; g8 < 4.
#[inline(always)]
pub(super) unsafe fn q5_unpack(qp: *const u8, hp: *const u8, g8: usize) -> (__m512i, __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(16);
        let v = _mm512_load_si512(qp.add(g8 * 64) as *const _);
        let lo = _mm512_and_si512(v, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        let mlo = std::ptr::read_unaligned(hp.add((2 * g8) * 8) as *const u64);
        let mhi = std::ptr::read_unaligned(hp.add((2 * g8 + 1) * 8) as *const u64);
        (
            _mm512_mask_add_epi8(lo, mlo, lo, sixteen),
            _mm512_mask_add_epi8(hi, mhi, hi, sixteen),
        )
    }
}
