//! Integer sums of one weight block for M rows x N tiles, over one half (8 columns) of
//! each tile, and the float steps that fold them into the accumulators. The `unsafe fn`s
//! here share the contract in the parent module's docs; `tiles[j]` (or `units[j]`, a
//! K-quant tile advanced to super-block b) points into a packed tile of the layout in
//! `packed`, `a[i]` at one activation block.

use super::super::acts::{A256, A32};
use super::super::packed::{k_off, Packed};
use std::arch::x86_64::*;

/// One half's accumulators: [row][tile].
pub(super) type Sums<const M: usize, const N: usize> = [[__m256i; N]; M];
/// Float accumulators of both halves: [row][tile][half].
pub(super) type Accs<const M: usize, const N: usize> = [[[__m256; 2]; N]; M];

/// 4 bytes at `p` broadcast to every 32-bit lane.
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 4 bytes.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// 32 bytes at `p`.
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 32 bytes.
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// u8 x i8 products summed in pairs into i16 lanes (`vpmaddubsw`). Exact only while no
/// pair sum passes 2^15: every caller states why its operands cannot.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn pairs(w: __m256i, a: __m256i) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_maddubs_epi16(w, a) }
}

/// i16 lanes summed in pairs into i32 (`vpmaddwd` by ones), exactly.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn widen(p: __m256i) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_madd_epi16(p, _mm256_set1_epi16(1)) }
}

/// Q5_0's fifth bits for one k4-group and 8 columns: bit `4c + j` of the 32-bit mask
/// word at `p` becomes 16 in byte `4c + j`, 0 elsewhere.
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 4 bytes.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let m = _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32));
        // Byte k takes byte k/8 of the word (each 128-bit lane holds the whole word, so
        // the lane-local shuffle can reach it), then tests bit k % 8.
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let bits = _mm256_and_si256(_mm256_shuffle_epi8(m, idx), sel);
        _mm256_and_si256(_mm256_cmpeq_epi8(bits, sel), _mm256_set1_epi8(16))
    }
}

/// Q8_0 block `b`, half `h`. Quants are stored +128; flipped back to signed bytes they
/// are multiplied as |w| · (a · sign w), so each pair sums at most 2 · 128 · 127 < 2^15
/// (activations are quantized into [-127, 127]), and the result is Σ w·a itself, which
/// equals the VNNI path's Σ (w+128)·a − 128·Σa. Only a NaN activation quantizes to -128,
/// whose negation wraps: that row's outputs may then differ from the other paths', and
/// are meaningless on every path.
///
/// # Safety
/// The module contract; b < w.kb(), h < 2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn q8<const M: usize, const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    b: usize,
    h: usize,
    a: [*const A32; M],
) -> Sums<M, N> {
    let flip = _mm256_set1_epi8(i8::MIN);
    let mut s = [[_mm256_setzero_si256(); N]; M];
    // SAFETY: block b's quants lie inside each tile; `a[i]` is one block.
    unsafe {
        for g in 0..8 {
            for j in 0..N {
                let ws = _mm256_xor_si256(load(tiles[j].add(w.qs_off(b) + g * 64 + h * 32)), flip);
                let wa = _mm256_abs_epi8(ws);
                for i in 0..M {
                    let av = _mm256_sign_epi8(bcast((*a[i]).qs.as_ptr().add(4 * g)), ws);
                    s[i][j] = _mm256_add_epi32(s[i][j], widen(pairs(wa, av)));
                }
            }
        }
    }
    s
}

/// Q5_0 block `b`, half `h`: 5-bit unsigned quants (at most 31, offset 16 undone by the
/// activations' `nb16`), so two pair sums add to at most 4 · 31 · 128 < 2^15 in i16.
///
/// # Safety
/// The module contract; b < w.kb(), h < 2.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn q5<const M: usize, const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    b: usize,
    h: usize,
    a: [*const A32; M],
) -> Sums<M, N> {
    let m4 = _mm256_set1_epi8(0x0f);
    // SAFETY: block b's nibbles and masks lie inside each tile; `a[i]` is one block.
    unsafe {
        let mut s: Sums<M, N> = std::array::from_fn(|i| [_mm256_set1_epi32((*a[i]).nb16); N]);
        // Each 64-byte line holds k4-groups 2·g8 (low nibbles) and 2·g8 + 1 (high).
        for g8 in 0..4 {
            for j in 0..N {
                let v = load(tiles[j].add(w.qs_off(b) + g8 * 64 + h * 32));
                let hm = tiles[j].add(w.hm_off(b) + 4 * h);
                let lo = _mm256_or_si256(_mm256_and_si256(v, m4), fifth_bits(hm.add(16 * g8)));
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                    fifth_bits(hm.add(16 * g8 + 8)),
                );
                for i in 0..M {
                    let q = (*a[i]).qs.as_ptr().add(8 * g8);
                    let p = _mm256_add_epi16(pairs(lo, bcast(q)), pairs(hi, bcast(q.add(4))));
                    s[i][j] = _mm256_add_epi32(s[i][j], widen(p));
                }
            }
        }
        s
    }
}

/// acc += float(s) · (d_w · d_a) for one 32-value block's half `h`; `d[j]` points at the
/// 8 f16 scales of the half's columns. The portable path's `mul_add`, lane for lane.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `d[j]` is valid for reading 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn finish32<const M: usize, const N: usize>(
    s: Sums<M, N>,
    d: [*const u8; N],
    a: [*const A32; M],
    h: usize,
    acc: &mut Accs<M, N>,
) {
    // SAFETY: the caller's contract.
    let (dw, da) = unsafe {
        (
            std::array::from_fn(|j| f16x8(d[j])),
            std::array::from_fn(|i| (*a[i]).d),
        )
    };
    fold(&s, dw, da, h, false, acc);
}

/// acc += float(s) · (d_w · d_a) (or −= with `subtract`) for every row and tile of half
/// `h`: one fused multiply-add a lane, as the portable path's `mul_add`. `d[j]` holds
/// tile j's 8 weight scales, `da[i]` row i's activation scale.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fold<const M: usize, const N: usize>(
    s: &Sums<M, N>,
    d: [__m256; N],
    da: [f32; M],
    h: usize,
    subtract: bool,
    acc: &mut Accs<M, N>,
) {
    for i in 0..M {
        let da = _mm256_set1_ps(da[i]);
        for j in 0..N {
            let (x, scale) = (_mm256_cvtepi32_ps(s[i][j]), _mm256_mul_ps(d[j], da));
            let a = &mut acc[i][j][h];
            *a = if subtract {
                _mm256_fnmadd_ps(x, scale, *a)
            } else {
                _mm256_fmadd_ps(x, scale, *a)
            };
        }
    }
}

/// 8 f16 scales at `p` as floats.
///
/// # Safety
/// The CPU has F16C; `p` is valid for reading 16 bytes.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
}

/// 8 bytes at `p` widened to i32 lanes, unsigned or signed.
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 8 bytes.
#[inline(always)]
unsafe fn bytes8(p: *const u8, signed: bool) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm_loadl_epi64(p as *const __m128i);
        if signed {
            _mm256_cvtepi8_epi32(v)
        } else {
            _mm256_cvtepu8_epi32(v)
        }
    }
}

/// One Q4_K super-block, half `h`, folded into `acc`: i1 = Σ_sub sc·(Σ q·a), i2 =
/// Σ_sub m·(Σ a), then acc += i1·(d·d_a) − i2·(dmin·d_a). Nibbles are at most 15, so a
/// sub-block's eight pair sums stay under 8 · 2 · 15 · 128 < 2^15 in i16.
///
/// # Safety
/// The module contract; `units[j]` points at one packed Q4_K unit, h < 2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k<const M: usize, const N: usize>(
    units: [*const u8; N],
    h: usize,
    a: [*const A256; M],
    acc: &mut Accs<M, N>,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut i1 = [[_mm256_setzero_si256(); N]; M];
    let mut i2 = [[_mm256_setzero_si256(); N]; M];
    // SAFETY: every read is inside the unit (offsets from `k_off`) or the block `a[i]`.
    unsafe {
        for sb in 0..8 {
            for j in 0..N {
                let mut p = [_mm256_setzero_si256(); M];
                for g in 0..4 {
                    let v = load(units[j].add((4 * sb + g) * 64 + 32 * h));
                    let lo = _mm256_and_si256(v, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    for i in 0..M {
                        let q = (*a[i]).qs.as_ptr().add(32 * sb + 8 * g);
                        p[i] = _mm256_add_epi16(
                            p[i],
                            _mm256_add_epi16(pairs(lo, bcast(q)), pairs(hi, bcast(q.add(4)))),
                        );
                    }
                }
                let sc = bytes8(units[j].add(k_off::Q4K_SC + sb * 16 + 8 * h), false);
                for i in 0..M {
                    i1[i][j] = _mm256_add_epi32(i1[i][j], _mm256_mullo_epi32(widen(p[i]), sc));
                }
            }
        }
        for pp in 0..4 {
            for j in 0..N {
                let mv = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                    units[j].add(k_off::Q4K_M + pp * 32 + 16 * h) as *const __m128i,
                ));
                for i in 0..M {
                    let bv = bcast((*a[i]).b32.as_ptr().add(2 * pp) as *const i8);
                    i2[i][j] = _mm256_add_epi32(i2[i][j], _mm256_madd_epi16(mv, bv));
                }
            }
        }
        let da = std::array::from_fn(|i| (*a[i]).d);
        let d = std::array::from_fn(|j| f16x8(units[j].add(k_off::Q4K_D + 16 * h)));
        let dm = std::array::from_fn(|j| f16x8(units[j].add(k_off::Q4K_DMIN + 16 * h)));
        fold(&i1, d, da, h, false, acc);
        fold(&i2, dm, da, h, true, acc);
    }
}

/// One Q6_K super-block, half `h`, folded into `acc`: i = Σ_sub sc·(Σ q·a) − Σ_sub
/// 32·sc·(Σ a), then acc += i·(d·d_a). Quants are at most 63, so two pair sums add to at
/// most 4 · 63 · 128 < 2^15 in i16.
///
/// # Safety
/// The module contract; `units[j]` points at one packed Q6_K unit, h < 2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k<const M: usize, const N: usize>(
    units: [*const u8; N],
    h: usize,
    a: [*const A256; M],
    acc: &mut Accs<M, N>,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(0x30);
    let mut i1 = [[_mm256_setzero_si256(); N]; M];
    // SAFETY: every read is inside the unit (offsets from `k_off`) or the block `a[i]`.
    unsafe {
        for sub in 0..16 {
            for j in 0..N {
                let u = units[j];
                let v0 = load(u.add(2 * sub * 64 + 32 * h));
                let v1 = load(u.add((2 * sub + 1) * 64 + 32 * h));
                let hb = load(u.add(k_off::Q6K_HI + sub * 64 + 32 * h));
                // k4-groups 4·sub .. 4·sub + 4: low nibbles with high bits 0–1, high
                // nibbles with bits 2–3, and so on for the second line.
                let w0 = _mm256_or_si256(
                    _mm256_and_si256(v0, m4),
                    _mm256_and_si256(_mm256_slli_epi16(hb, 4), m3),
                );
                let w1 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                    _mm256_and_si256(_mm256_slli_epi16(hb, 2), m3),
                );
                let w2 = _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(hb, m3));
                let w3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(hb, 2), m3),
                );
                let sc = bytes8(u.add(k_off::Q6K_SC + sub * 16 + 8 * h), true);
                for i in 0..M {
                    let q = (*a[i]).qs.as_ptr().add(16 * sub);
                    let p = _mm256_add_epi16(pairs(w0, bcast(q)), pairs(w1, bcast(q.add(4))));
                    let r =
                        _mm256_add_epi16(pairs(w2, bcast(q.add(8))), pairs(w3, bcast(q.add(12))));
                    let ss = _mm256_add_epi32(widen(p), widen(r));
                    i1[i][j] = _mm256_add_epi32(i1[i][j], _mm256_mullo_epi32(ss, sc));
                }
            }
        }
        // The -32 offset: 32·sc of sub-blocks (2pp, 2pp + 1) as i16 pairs against the
        // activations' 16-value sums.
        for pp in 0..8 {
            for j in 0..N {
                let u = units[j];
                let x = bytes8(u.add(k_off::Q6K_SC + 2 * pp * 16 + 8 * h), true);
                let y = bytes8(u.add(k_off::Q6K_SC + (2 * pp + 1) * 16 + 8 * h), true);
                let pv = _mm256_or_si256(
                    _mm256_and_si256(_mm256_slli_epi32(x, 5), _mm256_set1_epi32(0xffff)),
                    _mm256_slli_epi32(y, 21),
                );
                for i in 0..M {
                    let bv = bcast((*a[i]).b16.as_ptr().add(2 * pp) as *const i8);
                    i1[i][j] = _mm256_sub_epi32(i1[i][j], _mm256_madd_epi16(pv, bv));
                }
            }
        }
        let da = std::array::from_fn(|i| (*a[i]).d);
        let d = std::array::from_fn(|j| f16x8(units[j].add(k_off::Q6K_D + 16 * h)));
        fold(&i1, d, da, h, false, acc);
    }
}
