//! Activations quantized to i8: per 32 values for Q8_0 / Q5_0 weights (as ggml's Q8_0),
//! per 256 values for Q4_K / Q6_K (as ggml's Q8_K), each block with one f32 scale and
//! the integer sums that undo the weights' unsigned offsets. Both paths quantize with
//! the same arithmetic (round half to even, the same scale), so they see the same bytes.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

use super::super::send_ptr::SendPtr;
use super::super::KernelPath;

/// 32 activations quantized to i8 with one scale (ggml's Q8_0), plus the sums that
/// undo the unsigned offsets of the weights.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub(super) struct A32 {
    pub qs: [i8; 32],
    pub d: f32,
    /// -128 * sum(qs): initial accumulator for +128-offset Q8_0 weights.
    pub nb128: i32,
    /// -16 * sum(qs): the same for Q5_0's +16 offset.
    pub nb16: i32,
    pub _pad: i32,
}

/// 256 activations with one scale (ggml's Q8_K) and the partial sums K-quants need.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct A256 {
    pub qs: [i8; 256],
    /// Sums of 16 values, as i16 pairs (Q6_K's -32 offset, per 16-value sub-block).
    pub b16: [i16; 16],
    /// Sums of 32 values (Q4_K's mins, per 32-value sub-block).
    pub b32: [i16; 8],
    pub d: f32,
    pub _pad: [u8; 12],
}

impl Default for A256 {
    fn default() -> Self {
        Self {
            qs: [0; 256],
            b16: [0; 16],
            b32: [0; 8],
            d: 0.0,
            _pad: [0; 12],
        }
    }
}

/// `vcvtps2dq` under the default rounding mode: nearest, ties to even; NaN and values out
/// of i32 range give i32::MIN (the "integer indefinite").
pub(super) fn cvt_i32(x: f32) -> i32 {
    let r = x.round_ties_even();
    if r.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&r) {
        i32::MIN
    } else {
        r as i32
    }
}

/// i32 to i8 with saturation (`vpmovsdb`).
fn sat_i8(q: i32) -> i8 {
    q.clamp(-128, 127) as i8
}

/// The block scale of `x`: see [`step`].
fn scales(x: &[f32]) -> (f32, f32) {
    // `vmaxps` semantics (the second operand when either is NaN), in any order: max is
    // exact, so the SIMD reduction tree gives the same value for finite inputs.
    let amax = x
        .iter()
        .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    step(amax)
}

/// The block scale for a block whose largest |x| is `amax`: amax / 127, and its inverse
/// (0 for an all-zero block). Every path's quantizer takes it from here.
pub(super) fn step(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

/// Portable [`A32`] quantization of `x` (`32 * out.len()` values).
pub(super) fn quantize_a32(x: &[f32], out: &mut [A32]) {
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        let (d, id) = scales(xb);
        let mut s = 0i32;
        for (q, &v) in o.qs.iter_mut().zip(xb) {
            let qi = cvt_i32(v * id);
            *q = sat_i8(qi);
            s = s.wrapping_add(qi);
        }
        o.d = d;
        o.nb128 = s.wrapping_mul(-128);
        o.nb16 = s.wrapping_mul(-16);
        o._pad = 0;
    }
}

/// Portable [`A256`] quantization of `x` (`256 * out.len()` values).
pub(super) fn quantize_a256(x: &[f32], out: &mut [A256]) {
    for (xb, o) in x.chunks_exact(256).zip(out.iter_mut()) {
        let (d, id) = scales(xb);
        for i in 0..16 {
            let mut s = 0i32;
            for l in 0..16 {
                let qi = cvt_i32(xb[16 * i + l] * id);
                o.qs[16 * i + l] = sat_i8(qi);
                s = s.wrapping_add(qi);
            }
            o.b16[i] = s as i16;
        }
        for s in 0..8 {
            o.b32[s] = o.b16[2 * s].wrapping_add(o.b16[2 * s + 1]);
        }
        o.d = d;
        o._pad = [0; 12];
    }
}

/// Activation rows: one row-major matrix, or several side by side (row `r` is
/// `parts[0][r] | parts[1][r] | …`, each `width` wide) so a caller need not copy them
/// into one buffer first.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    Whole(&'a [f32]),
    Parts {
        parts: &'a [&'a [f32]],
        width: usize,
    },
}

/// Quantized activation rows, reused across calls on one thread (fresh pages cost a
/// fault each on first touch).
#[derive(Default)]
pub(super) struct Acts {
    a32: Vec<A32>,
    a256: Vec<A256>,
    /// Blocks per row.
    kb: usize,
    m: usize,
}

impl Acts {
    /// Row `r`'s per-32 blocks (after a per-32 [`Acts::quantize`]).
    pub(super) fn a32_row(&self, r: usize) -> &[A32] {
        &self.a32[r * self.kb..(r + 1) * self.kb]
    }
    /// Row `r`'s per-256 blocks (after a per-256 [`Acts::quantize`]).
    pub(super) fn a256_row(&self, r: usize) -> &[A256] {
        &self.a256[r * self.kb..(r + 1) * self.kb]
    }
    pub(super) fn rows(&self) -> usize {
        self.m
    }

    /// Quantize `m` rows of `k` values (validated by the caller: `x` holds them, `k` is a
    /// multiple of the block).
    pub(super) fn quantize(
        &mut self,
        path: KernelPath,
        x: Rows<'_>,
        m: usize,
        k: usize,
        a256: bool,
    ) {
        let bs = if a256 { 256 } else { 32 };
        let kb = k / bs;
        self.kb = kb;
        self.m = m;
        if a256 {
            if self.a256.len() < m * kb {
                self.a256 = vec![A256::default(); m * kb];
            }
        } else if self.a32.len() < m * kb {
            self.a32 = vec![A32::default(); m * kb];
        }
        let o32 = SendPtr::new(&mut self.a32);
        let o256 = SendPtr::new(&mut self.a256);
        let one = |r: usize| {
            if a256 {
                // SAFETY: row r's blocks are written by this call alone, and the buffer
                // outlives the parallel region.
                let out = unsafe { o256.slice_mut(r * kb, kb) };
                let Rows::Whole(x) = x else {
                    // Parts carry per-32 activations only (checked by the caller).
                    return;
                };
                a256_on(path, &x[r * k..(r + 1) * k], out);
                return;
            }
            // SAFETY: as above.
            let out = unsafe { o32.slice_mut(r * kb, kb) };
            match x {
                Rows::Whole(x) => a32_on(path, &x[r * k..(r + 1) * k], out),
                // Each part's 32-value blocks land where the joined row's would, so the
                // kernels see one ordinary row.
                Rows::Parts { parts, width } => {
                    let pb = width / 32;
                    for (j, p) in parts.iter().enumerate() {
                        a32_on(
                            path,
                            &p[r * width..(r + 1) * width],
                            &mut out[j * pb..(j + 1) * pb],
                        );
                    }
                }
            }
        };
        if m * k < 1 << 16 {
            (0..m).for_each(one);
        } else {
            candle_core::utils::barrier_pool().execute_chunked(m, |range| range.for_each(one));
        }
    }
}

fn a32_on(path: KernelPath, x: &[f32], out: &mut [A32]) {
    match path {
        // SAFETY: the caller only picks a path where the CPU has its features (see
        // `matmul_on`); `x` holds 32 values per output block.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { avx512::quantize_a32(x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { avx2::quantize_a32(x, out) },
        _ => quantize_a32(x, out),
    }
}

fn a256_on(path: KernelPath, x: &[f32], out: &mut [A256]) {
    match path {
        // SAFETY: as in `a32_on`, with 256 values per block.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { avx512::quantize_a256(x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { avx2::quantize_a256(x, out) },
        _ => quantize_a256(x, out),
    }
}
