//! AVX2 activation quantizers: the same bytes as the portable ones in the parent module,
//! a block at a time in registers.

use super::{step, A256, A32};
use crate::kernels::avx2_lanes::{max_ps, sum_epi32};
use std::arch::x86_64::*;

/// The largest |x| of `v` lanes folded into `m`, as the portable fold does it: a NaN lane
/// never wins (`vmaxps` returns its second operand when either is NaN).
#[target_feature(enable = "avx2")]
fn amax_into(m: __m256, v: __m256) -> __m256 {
    let abs = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    _mm256_max_ps(abs, m)
}

/// Four vectors of 8 i32 to 32 i8 with saturation, in order (`vpackssdw`/`vpacksswb`
/// saturate twice, which clamps to [-128, 127] as the portable `sat_i8` does; the
/// permute undoes their per-lane interleave).
#[target_feature(enable = "avx2")]
fn pack32(q: [__m256i; 4]) -> __m256i {
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// AVX2 quantization of `x` into per-32 blocks (bit-identical to the portable one).
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(in crate::kernels::int8) unsafe fn quantize_a32(x: &[f32], out: &mut [A32]) {
    assert!(
        x.len() >= 32 * out.len(),
        "activation row shorter than its blocks"
    );
    for (b, o) in out.iter_mut().enumerate() {
        // SAFETY: values 32b..32b+32 lie inside `x` (asserted above).
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(b * 32 + 8 * i)) });
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| amax_into(m, v));
        let (d, id) = step(max_ps(m));
        let idv = _mm256_set1_ps(id);
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv)));
        // SAFETY: `qs` is 32 bytes.
        unsafe { _mm256_storeu_si256(o.qs.as_mut_ptr() as *mut __m256i, pack32(q)) };
        let s = sum_epi32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        o.d = d;
        o.nb128 = s.wrapping_mul(-128);
        o.nb16 = s.wrapping_mul(-16);
        o._pad = 0;
    }
}

/// AVX2 quantization of `x` into per-256 blocks (bit-identical to the portable one).
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(in crate::kernels::int8) unsafe fn quantize_a256(x: &[f32], out: &mut [A256]) {
    assert!(
        x.len() >= 256 * out.len(),
        "activation row shorter than its blocks"
    );
    for (b, o) in out.iter_mut().enumerate() {
        let p = x[b * 256..(b + 1) * 256].as_ptr();
        let mut m = _mm256_setzero_ps();
        for i in 0..32 {
            // SAFETY: p points at 256 values of `x`.
            m = amax_into(m, unsafe { _mm256_loadu_ps(p.add(8 * i)) });
        }
        let (d, id) = step(max_ps(m));
        let idv = _mm256_set1_ps(id);
        for g in 0..8 {
            // SAFETY: as above.
            let q: [__m256i; 4] = std::array::from_fn(|i| unsafe {
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p.add(32 * g + 8 * i)), idv))
            });
            // SAFETY: bytes 32g..32g+32 of the 256 `qs`.
            unsafe {
                _mm256_storeu_si256(o.qs.as_mut_ptr().add(32 * g) as *mut __m256i, pack32(q))
            };
            o.b16[2 * g] = sum_epi32(_mm256_add_epi32(q[0], q[1])) as i16;
            o.b16[2 * g + 1] = sum_epi32(_mm256_add_epi32(q[2], q[3])) as i16;
        }
        for s in 0..8 {
            o.b32[s] = o.b16[2 * s].wrapping_add(o.b16[2 * s + 1]);
        }
        o.d = d;
        o._pad = [0; 12];
    }
}
