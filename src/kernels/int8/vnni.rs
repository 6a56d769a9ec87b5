//! The AVX-512 VNNI path.
//!
//! Multi-row items expand each unit of weights once into a 64-byte-aligned scratch of
//! canonical u8 operands and run register blocks of up to 4 rows x 2 tiles over it;
//! single rows (decode) unpack in registers instead and prefetch ahead, since they run at
//! memory speed. Both form the same exact integer sums per block and call the same float
//! steps (`*_finish`), so a row gets the same bits whichever computed it.
//!
//! Common contract of the `unsafe fn`s here: the CPU has AVX-512 F/BW/VL/VNNI (the
//! dispatcher checks [`KernelPath::available`](crate::kernels::KernelPath::available)
//! before choosing this path), and every pointer argument points into a packed tile, an
//! activation row or a scratch buffer that holds the bytes the function reads at the
//! offsets the layout in `packed` defines.

use super::acts::{Acts, A256, A32};
use super::packed::{k_off, Kind, Packed};
use super::{Epilogue, Item, JobRef, NT, RB};
use std::arch::x86_64::*;

/// Rows per register block.
const MT: usize = 4;

/// AVX-512 quantization of `x` into per-32 blocks (bit-identical to the portable one).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn quantize_a32(x: &[f32], out: &mut [A32]) {
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
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
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
pub(super) unsafe fn quantize_a256(x: &[f32], out: &mut [A256]) {
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
        let amax = _mm512_reduce_max_ps(m);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
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

/// 4 bytes at `p` broadcast to every 32-bit lane.
///
/// # Safety
/// The CPU has AVX-512 F; `p` is valid for reading 4 bytes.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// Canonical 8-bit weights for one unit of NT tiles, ready for dpbusd:
/// [tile][k4-group][col 16][4] u8, plus the per-tile scales of K-quants.
#[repr(C, align(64))]
pub(super) struct Scratch {
    w: [u8; NT * 4096],
    /// Q4_K: sc as i32 [tile][8][16]; Q6_K: sc as i32 [tile][16][16].
    sc: [i32; NT * 256],
    /// Q4_K: mins as i16 pairs [tile][4][16][2]; Q6_K: 32*sc as i16 pairs [tile][8][16][2].
    pairs: [i16; NT * 256],
    d: [f32; NT * 16],
    dmin: [f32; NT * 16],
}

/// Per-thread scratch and accumulators.
pub(super) struct Work {
    scratch: Box<Scratch>,
    acc: Box<[__m512; RB * NT]>,
}

thread_local! {
    static WORK: std::cell::RefCell<Option<Work>> = const { std::cell::RefCell::new(None) };
}

/// `f` with this thread's [`Work`].
pub(super) fn with_work(f: impl FnOnce(&mut Work)) {
    WORK.with(|cell| {
        let mut work = cell.borrow_mut();
        // SAFETY: all-zero bytes are valid for both (integers and floats).
        let work = work.get_or_insert_with(|| unsafe {
            Work {
                scratch: Box::new_zeroed().assume_init(),
                acc: Box::new_zeroed().assume_init(),
            }
        });
        f(work)
    })
}

/// Expand one K-quant super-block of tile j (packed at `p`) into scratch slot j.
///
/// # Safety
/// The module contract: `p` points at one packed unit of `kind` (64-byte aligned), j < NT.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn expand_k(kind: Kind, p: *const u8, j: usize, s: &mut Scratch) {
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
unsafe fn q6_unpack(p: *const u8, sub: usize) -> [__m512i; 4] {
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
unsafe fn q6_pair(p: *const u8, pp: usize) -> __m512i {
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
unsafe fn expand_q5(w: &Packed, tile: *const u8, b: usize, j: usize, u: usize, s: &mut Scratch) {
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
unsafe fn q5_unpack(qp: *const u8, hp: *const u8, g8: usize) -> (__m512i, __m512i) {
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

/// One 32-value block for M rows x N tiles: Q8_0 (offset 128) or Q5_0 (offset 16).
/// Tile j's 512 canonical bytes at `w[j]`, its f16 scales at `d[j]`.
///
/// # Safety
/// The module contract: `w[j]` holds 512 canonical bytes (64-byte aligned), `d[j]` 16
/// f16 scales, `a[i]` one activation block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn blk32<const M: usize, const N: usize>(
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
unsafe fn blk32_finish<const M: usize, const N: usize>(
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
unsafe fn sb_q4k<const M: usize, const N: usize>(
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
unsafe fn q4k_finish<const M: usize, const N: usize>(
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
unsafe fn sb_q6k<const M: usize, const N: usize>(
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
unsafe fn q6k_finish<const M: usize, const N: usize>(
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

// Single-row kernels (decode): unpack in registers instead of through the scratch.

/// # Safety
/// The module contract: `tiles[j]` start tiles of `w` (Q5_0), `a` one row of w.kb()
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_q5<const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    a: *const A32,
    acc: &mut [[__m512; N]; 1],
) {
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..w.kb() {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add(w.qs_off(b + 8)), 256);
                prefetch(t.wrapping_add(w.hm_off(b + 8)), 64);
                if b % 2 == 0 {
                    prefetch(t.wrapping_add(w.d_off(b + 8)), 64);
                }
            }
            let mut s = [[_mm512_set1_epi32((*ab).nb16); N]; 1];
            let mut sh = [_mm512_setzero_si512(); N];
            for g8 in 0..4 {
                let alo = bcast((*ab).qs.as_ptr().add(8 * g8) as *const u8);
                let ahi = bcast((*ab).qs.as_ptr().add(8 * g8 + 4) as *const u8);
                for j in 0..N {
                    let (lo, hi) =
                        q5_unpack(tiles[j].add(w.qs_off(b)), tiles[j].add(w.hm_off(b)), g8);
                    s[0][j] = _mm512_dpbusd_epi32(s[0][j], lo, alo);
                    sh[j] = _mm512_dpbusd_epi32(sh[j], hi, ahi);
                }
            }
            for j in 0..N {
                s[0][j] = _mm512_add_epi32(s[0][j], sh[j]);
            }
            let mut d = [std::ptr::null(); N];
            for j in 0..N {
                d[j] = tiles[j].add(w.d_off(b));
            }
            blk32_finish(s, d, [ab], acc);
        }
    }
}

/// # Safety
/// The module contract: `tiles[j]` start Q4_K tiles of `kb` units, `a` one row of `kb`
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_q4k<const N: usize>(
    kb: usize,
    tiles: [*const u8; N],
    a: *const A256,
    acc: &mut [[__m512; N]; 1],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let pb = Kind::Q4K.packed_bytes();
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for s in 0..8 {
                // Two chains per tile (low / high nibbles) so dpbusd latency overlaps.
                let mut sl = [_mm512_setzero_si512(); N];
                let mut sh = [_mm512_setzero_si512(); N];
                for g in 0..4 {
                    let alo = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g) as *const u8);
                    let ahi = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g + 4) as *const u8);
                    for j in 0..N {
                        let v =
                            _mm512_load_si512(tiles[j].add(b * pb + (s * 4 + g) * 64) as *const _);
                        sl[j] = _mm512_dpbusd_epi32(sl[j], _mm512_and_si512(v, m4), alo);
                        sh[j] = _mm512_dpbusd_epi32(
                            sh[j],
                            _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                            ahi,
                        );
                    }
                }
                for j in 0..N {
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        tiles[j].add(b * pb + k_off::Q4K_SC + s * 16) as *const _,
                    ));
                    i1[0][j] = _mm512_add_epi32(
                        i1[0][j],
                        _mm512_mullo_epi32(_mm512_add_epi32(sl[j], sh[j]), sc),
                    );
                }
            }
            let mut i2 = [[_mm512_setzero_si512(); N]; 1];
            for pp in 0..4 {
                let bv = bcast((*ab).b32.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    let mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        tiles[j].add(b * pb + k_off::Q4K_M + pp * 32) as *const _,
                    ));
                    i2[0][j] = _mm512_dpwssd_epi32(i2[0][j], mv, bv);
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            let mut dm = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q4K_D) as *const _
                ));
                dm[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q4K_DMIN) as *const _
                ));
            }
            q4k_finish(i1, i2, d, dm, [ab], acc);
        }
    }
}

/// # Safety
/// The module contract: `tiles[j]` start Q6_K tiles of `kb` units, `a` one row of `kb`
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_q6k<const N: usize>(
    kb: usize,
    tiles: [*const u8; N],
    a: *const A256,
    acc: &mut [[__m512; N]; 1],
) {
    let pb = Kind::Q6K.packed_bytes();
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for sub in 0..16 {
                let mut av = [_mm512_setzero_si512(); 4];
                for (i, v) in av.iter_mut().enumerate() {
                    *v = bcast((*ab).qs.as_ptr().add(sub * 16 + 4 * i) as *const u8);
                }
                for j in 0..N {
                    let p = tiles[j].add(b * pb);
                    let w = q6_unpack(p, sub);
                    let s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], av[0]);
                    let s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], av[1]);
                    let s0 = _mm512_dpbusd_epi32(s0, w[2], av[2]);
                    let s1 = _mm512_dpbusd_epi32(s1, w[3], av[3]);
                    let ss = _mm512_add_epi32(s0, s1);
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        p.add(k_off::Q6K_SC + sub * 16) as *const _
                    ));
                    i1[0][j] = _mm512_add_epi32(i1[0][j], _mm512_mullo_epi32(ss, sc));
                }
            }
            for pp in 0..8 {
                let bv = bcast((*ab).b16.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    i1[0][j] = _mm512_sub_epi32(
                        i1[0][j],
                        _mm512_madd_epi16(q6_pair(tiles[j].add(b * pb), pp), bv),
                    );
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    tiles[j].add(b * pb + k_off::Q6K_D) as *const _
                ));
            }
            q6k_finish(i1, d, [ab], acc);
        }
    }
}

/// Software prefetch of `bytes` at `p` (which may lie past the data: prefetches do not
/// fault). Single-row kernels run at memory speed only with it: the hardware
/// prefetcher alone leaves each core at about half the bandwidth.
///
/// # Safety
/// The CPU has SSE (every x86_64 does); `p` need not be valid.
#[inline(always)]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    for l in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8) };
    }
}

/// # Safety
/// The module contract: `tiles[j]` start tiles of `w` (Q8_0), `a` one row of w.kb()
/// activation blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_q8<const N: usize>(
    w: &Packed,
    tiles: [*const u8; N],
    a: *const A32,
    acc: &mut [[__m512; N]; 1],
) {
    // SAFETY: the caller's contract; prefetches past the data do not fault.
    unsafe {
        for b in 0..w.kb() {
            let ab = a.add(b);
            let mut wp = [std::ptr::null::<u8>(); N];
            let mut dp = [std::ptr::null::<u8>(); N];
            for j in 0..N {
                prefetch(tiles[j].wrapping_add(w.qs_off(b + 8)), 512);
                if b % 2 == 0 {
                    prefetch(tiles[j].wrapping_add(w.d_off(b + 8)), 64);
                }
                wp[j] = tiles[j].add(w.qs_off(b));
                dp[j] = tiles[j].add(w.d_off(b));
            }
            blk32::<1, N>(wp, dp, [ab], true, acc);
        }
    }
}

/// silu(x) = x / (1 + e^-x), with a fixed polynomial exp (mirrored exactly by the
/// portable path's `silu`).
#[target_feature(enable = "avx512f")]
fn silu(x: __m512) -> __m512 {
    let nx = _mm512_sub_ps(_mm512_setzero_ps(), x);
    // e^-x: clamp to keep the polynomial in range; far out silu is x or 0 anyway.
    let nx = _mm512_min_ps(
        _mm512_max_ps(nx, _mm512_set1_ps(-104.0)),
        _mm512_set1_ps(88.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(nx, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), nx);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5e-1));
    let e = _mm512_scalef_ps(
        _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        ),
        n,
    );
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// Work item `it` of job `r`: accumulate, then write its rectangle of the output.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `r` and `acts` passed `validate` (shapes, bias and
/// residual lengths agree with the weights and the row count), `it` is one of the items
/// the dispatcher derives from them, and no other thread writes its rectangle meanwhile.
pub(super) unsafe fn item(r: &JobRef<'_>, it: &Item, acts: &Acts, work: &mut Work) {
    let w = r.w;
    let ts = w.tile_bytes();
    let [tw, tu] = r.tiles(it);
    let (tiles, rows) = if it.swiglu {
        (
            [
                tw.base().wrapping_add(it.t0 * ts),
                tu.base().wrapping_add(it.t0 * ts),
            ],
            it.r1 - it.r0,
        )
    } else {
        let second = if it.nt == 2 { it.t0 + 1 } else { it.t0 };
        (
            [
                w.base().wrapping_add(it.t0 * ts),
                w.base().wrapping_add(second * ts),
            ],
            it.r1 - it.r0,
        )
    };
    debug_assert!(rows <= RB && it.r1 <= acts.rows());
    // SAFETY: the tiles lie inside the weights (t0 + nt <= n/16, validated shapes), the
    // activation rows r0..r1 exist, and the caller's contract covers the rest.
    unsafe {
        accumulate(
            w,
            acts,
            tiles,
            it.nt,
            it.r0,
            it.r1,
            &mut work.scratch,
            &mut work.acc,
        );
        store(r, it, &work.acc);
    }
}

/// Writes item `it`'s accumulators through its epilogue.
///
/// # Safety
/// As for [`item`]; `acc` holds the item's accumulators.
#[target_feature(enable = "avx512f")]
unsafe fn store(r: &JobRef<'_>, it: &Item, acc: &[__m512; RB * NT]) {
    let n = r.w.n();
    for row in 0..it.r1 - it.r0 {
        let at = (it.r0 + row) * n + it.t0 * 16;
        let width = if it.swiglu { 16 } else { 16 * it.nt };
        // SAFETY: this row segment belongs to item `it` alone (the caller's contract).
        let dst = unsafe { r.dst.slice_mut(at, width) }.as_mut_ptr() as *mut f32;
        if it.swiglu {
            let y = _mm512_mul_ps(silu(acc[row * NT]), acc[row * NT + 1]);
            // SAFETY: `dst` holds 16 floats.
            unsafe { _mm512_storeu_ps(dst, y) };
            continue;
        }
        for j in 0..it.nt {
            let col = (it.t0 + j) * 16;
            let mut v = acc[row * NT + j];
            if let Some(b) = r.bias {
                let b = &b[col..col + 16];
                // SAFETY: `b` holds 16 floats.
                v = _mm512_add_ps(v, unsafe { _mm512_loadu_ps(b.as_ptr()) });
            }
            if let Epilogue::Residual(res) = r.epilogue {
                let res = &res[at + 16 * j..at + 16 * j + 16];
                // SAFETY: `res` holds 16 floats.
                v = _mm512_add_ps(v, unsafe { _mm512_loadu_ps(res.as_ptr()) });
            }
            // SAFETY: `dst` holds 16 * nt floats.
            unsafe { _mm512_storeu_ps(dst.add(16 * j), v) };
        }
    }
}

/// The accumulators of output columns [16*t0, 16*(t0+nt)) of rows [r0, r1) into
/// `acc` ([row][NT]). Tile j's packed data starts at `tiles[j]`.
///
/// # Safety
/// The module contract: `tiles[..nt]` start tiles of `w` (for SwiGLU, of gate and up,
/// same kind and shape), `acts` holds rows r0..r1 quantized for `w`'s kind, r1 - r0 <= RB.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate(
    w: &Packed,
    acts: &Acts,
    tiles: [*const u8; NT],
    nt: usize,
    r0: usize,
    r1: usize,
    scratch: &mut Scratch,
    acc: &mut [__m512; RB * NT],
) {
    let kind = w.kind();
    let kb = w.kb();
    let rows = r1 - r0;
    for a in acc.iter_mut().take(rows * NT) {
        *a = _mm512_setzero_ps();
    }
    let a32 = |r: usize| acts.a32_row(r).as_ptr();
    let a256 = |r: usize| acts.a256_row(r).as_ptr();
    if rows == 1 {
        let mut v = [[_mm512_setzero_ps(); NT]; 1];
        // SAFETY: the caller's contract; row r0 holds kb blocks of the kind's format.
        unsafe {
            if nt == 2 {
                match kind {
                    Kind::Q8_0 => gemv_q8::<2>(w, tiles, a32(r0), &mut v),
                    Kind::Q5_0 => gemv_q5::<2>(w, tiles, a32(r0), &mut v),
                    Kind::Q4K => gemv_q4k::<2>(kb, tiles, a256(r0), &mut v),
                    Kind::Q6K => gemv_q6k::<2>(kb, tiles, a256(r0), &mut v),
                }
            } else {
                let mut v1 = [[_mm512_setzero_ps(); 1]; 1];
                let t1 = [tiles[0]];
                match kind {
                    Kind::Q8_0 => gemv_q8::<1>(w, t1, a32(r0), &mut v1),
                    Kind::Q5_0 => gemv_q5::<1>(w, t1, a32(r0), &mut v1),
                    Kind::Q4K => gemv_q4k::<1>(kb, t1, a256(r0), &mut v1),
                    Kind::Q6K => gemv_q6k::<1>(kb, t1, a256(r0), &mut v1),
                }
                v[0][0] = v1[0][0];
            }
        }
        acc[..NT].copy_from_slice(&v[0]);
        return;
    }
    macro_rules! rows_loop {
        ($body:ident, $($extra:expr),*) => {{
            let mut r = 0;
            while r < rows {
                let mt = (rows - r).min(MT);
                match (mt, nt) {
                    (4, 2) => $body::<4, 2>(r, $($extra),*),
                    (3, 2) => $body::<3, 2>(r, $($extra),*),
                    (2, 2) => $body::<2, 2>(r, $($extra),*),
                    (1, 2) => $body::<1, 2>(r, $($extra),*),
                    (4, _) => $body::<4, 1>(r, $($extra),*),
                    (3, _) => $body::<3, 1>(r, $($extra),*),
                    (2, _) => $body::<2, 1>(r, $($extra),*),
                    _ => $body::<1, 1>(r, $($extra),*),
                }
                r += mt;
            }
        }};
    }
    fn load_acc<const M: usize, const N: usize>(
        acc: &[__m512; RB * NT],
        r: usize,
    ) -> [[__m512; N]; M] {
        std::array::from_fn(|i| std::array::from_fn(|j| acc[(r + i) * NT + j]))
    }
    fn store_acc<const M: usize, const N: usize>(
        acc: &mut [__m512; RB * NT],
        r: usize,
        a: &[[__m512; N]; M],
    ) {
        for i in 0..M {
            for j in 0..N {
                acc[(r + i) * NT + j] = a[i][j];
            }
        }
    }
    match kind {
        Kind::Q8_0 | Kind::Q5_0 => {
            let q8 = kind == Kind::Q8_0;
            // Units of up to 8 blocks: expand once (Q5_0), then every row group.
            let mut b0 = 0;
            while b0 < kb {
                let ub = (kb - b0).min(8);
                if !q8 {
                    for u in 0..ub {
                        for (j, &t) in tiles.iter().enumerate().take(nt) {
                            // SAFETY: t starts a tile of w, block b0 + u < kb, u < 8.
                            unsafe { expand_q5(w, t, b0 + u, j, u, scratch) };
                        }
                    }
                }
                /// # Safety
                /// The module contract, for rows r0+r..r0+r+M, blocks b0..b0+ub and
                /// (Q5_0) the scratch expanded for those blocks.
                #[inline(always)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn unit<const M: usize, const N: usize>(
                    r: usize,
                    acc: &mut [__m512; RB * NT],
                    acts: &Acts,
                    r0: usize,
                    w: &Packed,
                    b0: usize,
                    ub: usize,
                    tiles: [*const u8; NT],
                    scratch: *const Scratch,
                ) {
                    let q8 = w.kind() == Kind::Q8_0;
                    let mut a = load_acc::<M, N>(acc, r);
                    let mut ap = [std::ptr::null::<A32>(); M];
                    for u in 0..ub {
                        let b = b0 + u;
                        for (i, p) in ap.iter_mut().enumerate() {
                            *p = &acts.a32_row(r0 + r + i)[b];
                        }
                        let mut wp = [std::ptr::null::<u8>(); N];
                        let mut dp = [std::ptr::null::<u8>(); N];
                        // SAFETY: the caller's contract: offsets of block b inside the
                        // tiles, slot (j, u) inside the scratch.
                        unsafe {
                            for j in 0..N {
                                dp[j] = tiles[j].add(w.d_off(b));
                                wp[j] = if q8 {
                                    tiles[j].add(w.qs_off(b))
                                } else {
                                    (*scratch).w.as_ptr().add(j * 4096 + u * 512)
                                };
                            }
                            blk32::<M, N>(wp, dp, ap, q8, &mut a);
                        }
                    }
                    store_acc::<M, N>(acc, r, &a);
                }
                let sp = scratch as *const Scratch;
                // SAFETY: the rows and blocks the loop visits are the item's own.
                unsafe { rows_loop!(unit, acc, acts, r0, w, b0, ub, tiles, sp) };
                b0 += ub;
            }
        }
        Kind::Q4K | Kind::Q6K => {
            let pb = kind.packed_bytes();
            for b in 0..kb {
                for (j, &t) in tiles.iter().enumerate().take(nt) {
                    // SAFETY: unit b of a tile of w.
                    unsafe { expand_k(kind, t.add(b * pb), j, scratch) };
                }
                /// # Safety
                /// The module contract, for rows r0+r..r0+r+M, super-block b and the
                /// scratch expanded for it.
                #[inline(always)]
                unsafe fn unit<const M: usize, const N: usize>(
                    r: usize,
                    acc: &mut [__m512; RB * NT],
                    acts: &Acts,
                    r0: usize,
                    b: usize,
                    q4: bool,
                    scratch: *const Scratch,
                ) {
                    let mut a = load_acc::<M, N>(acc, r);
                    let mut ap = [std::ptr::null::<A256>(); M];
                    for (i, p) in ap.iter_mut().enumerate() {
                        *p = &acts.a256_row(r0 + r + i)[b];
                    }
                    // SAFETY: the caller's contract; the scratch is not written meanwhile.
                    unsafe {
                        if q4 {
                            sb_q4k::<M, N>(&*scratch, ap, &mut a);
                        } else {
                            sb_q6k::<M, N>(&*scratch, ap, &mut a);
                        }
                    }
                    store_acc::<M, N>(acc, r, &a);
                }
                let sp = scratch as *const Scratch;
                // SAFETY: the rows the loop visits are the item's own.
                unsafe { rows_loop!(unit, acc, acts, r0, b, kind == Kind::Q4K, sp) };
            }
        }
    }
}

/// [`silu`] over 16 plain floats, for the tests comparing it with the portable one.
#[cfg(test)]
pub(super) fn silu_lanes(x: [f32; 16]) -> [f32; 16] {
    #[target_feature(enable = "avx512f")]
    fn go(x: [f32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: both arrays hold 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), silu(_mm512_loadu_ps(x.as_ptr()))) };
        out
    }
    assert!(crate::kernels::KernelPath::Avx512.available());
    // SAFETY: AVX-512 F is available (asserted).
    unsafe { go(x) }
}
