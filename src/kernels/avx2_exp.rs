//! The AVX2 twin of [`super::avx512_exp::exp`] over its whole range, for the int8
//! kernels' SiLU, whose three paths must agree bit for bit.

use super::avx512_exp::{LN2_HI, LN2_LO, POLY};
use std::arch::x86_64::*;

/// e^x as the AVX-512 `exp` computes it, lane for lane, inputs clamped below at -104.
/// AVX2 has no `vscalefps`: 2^n (n in [-150, 128]) is applied as two normal powers of
/// two, 2^⌊n/2⌋ then 2^(n−⌊n/2⌋). The first product is exact (its result is still a
/// normal float), so only the second rounds, once, as `vscalefps` does.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-104.0));
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
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let pow2 = |e: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            e,
            _mm256_set1_epi32(127),
        )))
    };
    _mm256_mul_ps(_mm256_mul_ps(y, pow2(n1)), pow2(n2))
}
