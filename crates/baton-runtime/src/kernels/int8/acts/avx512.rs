//! AVX-512 activation quantizers: the same bytes as the portable ones in the parent
//! module, a block at a time in registers.

use super::{step, A256, A32};
use std::arch::x86_64::*;

/// AVX-512 quantization of `x` into per-32 blocks (bit-identical to the portable one).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::kernels::int8) unsafe fn quantize_a32(x: &[f32], out: &mut [A32]) {
    assert!(
        x.len() >= 32 * out.len(),
        "activation row shorter than its blocks"
    );
    let absmask = _mm512_set1_epi32(0x7fff_ffff);
    for (b, o) in out.iter_mut().enumerate() {
        // SAFETY: values 32b..32b+32 lie inside `x` (asserted above).
        let (v0, v1) = unsafe {
            let p = x.as_ptr().add(b * 32);
            (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
        };
        let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), absmask));
        let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), absmask));
        let (d, id) = step(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)));
        let idv = _mm512_set1_ps(id);
        let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
        let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
        // SAFETY: `qs` is 32 bytes: two 16-byte stores.
        unsafe {
            _mm_storeu_si128(o.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(
                o.qs.as_mut_ptr().add(16) as *mut __m128i,
                _mm512_cvtsepi32_epi8(q1),
            );
        }
        let s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        o.d = d;
        o.nb128 = s.wrapping_mul(-128);
        o.nb16 = s.wrapping_mul(-16);
        o._pad = 0;
    }
}

/// AVX-512 quantization of `x` into per-256 blocks (bit-identical to the portable one).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::kernels::int8) unsafe fn quantize_a256(x: &[f32], out: &mut [A256]) {
    assert!(
        x.len() >= 256 * out.len(),
        "activation row shorter than its blocks"
    );
    let absmask = _mm512_set1_epi32(0x7fff_ffff);
    for (b, o) in out.iter_mut().enumerate() {
        let p = x[b * 256..(b + 1) * 256].as_ptr();
        let mut m = _mm512_setzero_ps();
        for i in 0..16 {
            // SAFETY: p points at 256 values of `x`.
            let v = unsafe { _mm512_loadu_ps(p.add(16 * i)) };
            m = _mm512_max_ps(
                m,
                _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absmask)),
            );
        }
        let (d, id) = step(_mm512_reduce_max_ps(m));
        let idv = _mm512_set1_ps(id);
        for i in 0..16 {
            // SAFETY: as above for the load; the store writes 16 of the 256 `qs` bytes.
            let q = unsafe {
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p.add(16 * i)), idv));
                _mm_storeu_si128(
                    o.qs.as_mut_ptr().add(16 * i) as *mut __m128i,
                    _mm512_cvtsepi32_epi8(q),
                );
                q
            };
            o.b16[i] = _mm512_reduce_add_epi32(q) as i16;
        }
        for s in 0..8 {
            o.b32[s] = o.b16[2 * s].wrapping_add(o.b16[2 * s + 1]);
        }
        o.d = d;
        o._pad = [0; 12];
    }
}
