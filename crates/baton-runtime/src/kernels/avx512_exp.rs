//! The AVX-512 e^x that both the attention's softmax and the int8 kernels' SiLU use: one
//! polynomial, so their portable twins have one arithmetic to reproduce bit for bit.

use std::arch::x86_64::*;

/// ln 2 in two parts (Cody–Waite): x − n·ln2 with no rounding error in n·LN2_HI.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial's coefficients, highest power first: e^r ≈ 1 + r + r²·p(r).
pub(super) const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];

/// e^x (Cephes-style polynomial, ~1 ulp), deterministic for a given input; 0 far below.
#[target_feature(enable = "avx512f")]
pub(super) fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
    _mm512_scalef_ps(y, n)
}
