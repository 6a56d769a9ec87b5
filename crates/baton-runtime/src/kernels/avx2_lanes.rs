//! Reductions across the eight lanes of a 256-bit vector, for the AVX2 kernels. Each
//! folds by the same fixed tree, so a given vector always gives the same value.

use std::arch::x86_64::*;

/// The largest lane (max is exact: any tree gives the same value for finite lanes).
#[target_feature(enable = "avx2")]
pub(super) fn max_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// The sum of the lanes.
#[target_feature(enable = "avx2")]
pub(super) fn sum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The wrapping sum of the i32 lanes.
#[target_feature(enable = "avx2")]
pub(super) fn sum_epi32(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
    let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
    _mm_cvtsi128_si32(x)
}
