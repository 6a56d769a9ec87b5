//! The AVX2 twins of [`super::avx512_exp::exp`]: one polynomial for the attention's
//! softmax and the int8 kernels' SiLU, scaled by 2^n two ways.

use super::avx512_exp::{LN2_HI, LN2_LO, POLY};
use std::arch::x86_64::*;

/// e^x = y · 2^n with y = e^r, r = x − n·ln 2 (Cody–Waite), n = round(x · log2 e).
#[target_feature(enable = "avx2,fma")]
fn parts(x: __m256) -> (__m256, __m256i) {
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    (y, _mm256_cvtps_epi32(n))
}

/// 2^e for e in [-126, 127], from its exponent bits.
#[target_feature(enable = "avx2")]
fn pow2(e: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        e,
        _mm256_set1_epi32(127),
    )))
}

/// e^x for the attention's softmax, deterministic for a given input. Inputs are clamped
/// at -87, where 2^n is still a normal float: e^-87 is 1.6e-38, nothing next to the row's
/// largest weight of 1.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp_normal(x: __m256) -> __m256 {
    let (y, n) = parts(_mm256_max_ps(x, _mm256_set1_ps(-87.0)));
    _mm256_mul_ps(y, pow2(n))
}

/// e^x as the AVX-512 `exp` computes it, lane for lane, inputs clamped below at -104
/// (the int8 kernels' SiLU, whose three paths must agree bit for bit). AVX2 has no
/// `vscalefps`: 2^n (n in [-150, 128]) is applied as two normal powers of two,
/// 2^⌊n/2⌋ then 2^(n−⌊n/2⌋). The first product is exact (its result is still a normal
/// float), so only the second rounds, once, as `vscalefps` does.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp(x: __m256) -> __m256 {
    let (y, n) = parts(_mm256_max_ps(x, _mm256_set1_ps(-104.0)));
    let n1 = _mm256_srai_epi32::<1>(n);
    _mm256_mul_ps(_mm256_mul_ps(y, pow2(n1)), pow2(_mm256_sub_epi32(n, n1)))
}
