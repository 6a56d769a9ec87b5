//! The portable path: the VNNI path's arithmetic in plain Rust, one output column at a
//! time. Integer sums are the same integers (exact, so their order does not matter); the
//! float steps are the same fused multiply-adds (`f32::mul_add` rounds once, as
//! `vfmadd` does), per block in block order, then bias, then residual, so both paths
//! give the same bits.

use super::acts::{Acts, A256, A32};
use super::packed::{f16_at, get_nibble, k_off, Kind, Packed};
use super::{Epilogue, Item, JobRef, NT, RB};
use std::mem::MaybeUninit;

/// One output column's weights, unpacked: unsigned quants as the SIMD path feeds them to
/// `vpdpbusd`, and per-block (and per-sub-block) scales.
#[derive(Default)]
pub(super) struct Col {
    q: Vec<u8>,
    d: Vec<f32>,
    dmin: Vec<f32>,
    /// Q4_K: 8 per block (u8); Q6_K: 16 per block (i8).
    sc: Vec<i32>,
    /// Q4_K: 8 mins per block.
    mins: Vec<i32>,
}

/// Per-thread buffers.
#[derive(Default)]
pub(super) struct Work {
    col: Col,
    /// [row][NT * 16] accumulators of one item.
    acc: Vec<f32>,
}

thread_local! {
    static WORK: std::cell::RefCell<Work> = std::cell::RefCell::new(Work::default());
}

pub(super) fn with_work(f: impl FnOnce(&mut Work)) {
    WORK.with(|cell| f(&mut cell.borrow_mut()))
}

impl Col {
    /// Column `c` of tile `tile` (the bytes of one tile of `w`).
    fn load(&mut self, w: &Packed, tile: &[u8], c: usize) {
        let kind = w.kind();
        let kb = w.kb();
        self.q.clear();
        self.d.clear();
        self.dmin.clear();
        self.sc.clear();
        self.mins.clear();
        match kind {
            Kind::Q8_0 => {
                for b in 0..kb {
                    let qs = &tile[w.qs_off(b)..];
                    self.q
                        .extend((0..32).map(|i| qs[((i / 4) * 16 + c) * 4 + i % 4]));
                    self.d.push(f16_at(tile, w.d_off(b) + 2 * c));
                }
            }
            Kind::Q5_0 => {
                for b in 0..kb {
                    let (qs, hm) = (&tile[w.qs_off(b)..], &tile[w.hm_off(b)..]);
                    self.q.extend((0..32).map(|i| {
                        let bit = c * 4 + i % 4;
                        let high = (hm[(i / 4) * 8 + bit / 8] >> (bit % 8)) & 1;
                        get_nibble(qs, c, i) | (high << 4)
                    }));
                    self.d.push(f16_at(tile, w.d_off(b) + 2 * c));
                }
            }
            Kind::Q4K => {
                let pb = kind.packed_bytes();
                for b in 0..kb {
                    let o = &tile[b * pb..(b + 1) * pb];
                    self.q.extend((0..256).map(|i| get_nibble(o, c, i)));
                    for s in 0..8 {
                        self.sc.push(o[k_off::Q4K_SC + s * 16 + c] as i32);
                        self.mins
                            .push(o[k_off::Q4K_M + ((s / 2) * 16 + c) * 2 + s % 2] as i32);
                    }
                    self.d.push(f16_at(o, k_off::Q4K_D + 2 * c));
                    self.dmin.push(f16_at(o, k_off::Q4K_DMIN + 2 * c));
                }
            }
            Kind::Q6K => {
                let pb = kind.packed_bytes();
                for b in 0..kb {
                    let o = &tile[b * pb..(b + 1) * pb];
                    self.q.extend((0..256).map(|i| {
                        let (g, r) = (i / 16, i % 16);
                        let (j, sh) = (r % 4, 2 * (r / 4));
                        let hi = (o[k_off::Q6K_HI + (g * 16 + c) * 4 + j] >> sh) & 3;
                        get_nibble(o, c, i) | (hi << 4)
                    }));
                    for s in 0..16 {
                        self.sc.push(o[k_off::Q6K_SC + s * 16 + c] as i8 as i32);
                    }
                    self.d.push(f16_at(o, k_off::Q6K_D + 2 * c));
                }
            }
        }
    }

    /// The column's accumulator against one per-32 activation row (Q8_0, Q5_0).
    fn dot32(&self, kind: Kind, a: &[A32]) -> f32 {
        let mut acc = 0f32;
        for (b, ab) in a.iter().enumerate() {
            let init = if kind == Kind::Q8_0 {
                ab.nb128
            } else {
                ab.nb16
            };
            let q = &self.q[32 * b..32 * b + 32];
            let s = q
                .iter()
                .zip(&ab.qs)
                .fold(init, |s, (&w, &x)| s.wrapping_add(w as i32 * x as i32));
            acc = (s as f32).mul_add(self.d[b] * ab.d, acc);
        }
        acc
    }

    /// The column's accumulator against one per-256 activation row (Q4_K, Q6_K).
    fn dot256(&self, kind: Kind, a: &[A256]) -> f32 {
        let mut acc = 0f32;
        for (b, ab) in a.iter().enumerate() {
            let q = &self.q[256 * b..256 * b + 256];
            let sub_sum = |len: usize, s: usize| -> i32 {
                q[s * len..(s + 1) * len]
                    .iter()
                    .zip(&ab.qs[s * len..(s + 1) * len])
                    .fold(0i32, |t, (&w, &x)| t.wrapping_add(w as i32 * x as i32))
            };
            if kind == Kind::Q4K {
                let (mut i1, mut i2) = (0i32, 0i32);
                for s in 0..8 {
                    i1 = i1.wrapping_add(sub_sum(32, s).wrapping_mul(self.sc[8 * b + s]));
                    i2 = i2.wrapping_add(self.mins[8 * b + s] * ab.b32[s] as i32);
                }
                acc = (i1 as f32).mul_add(self.d[b] * ab.d, acc);
                acc = (-(i2 as f32)).mul_add(self.dmin[b] * ab.d, acc);
            } else {
                let mut i1 = 0i32;
                for s in 0..16 {
                    i1 = i1.wrapping_add(sub_sum(16, s).wrapping_mul(self.sc[16 * b + s]));
                }
                for s in 0..16 {
                    i1 = i1.wrapping_sub(32 * self.sc[16 * b + s] * ab.b16[s] as i32);
                }
                acc = (i1 as f32).mul_add(self.d[b] * ab.d, acc);
            }
        }
        acc
    }
}

/// `silu` exactly as the VNNI path computes it, lane by lane: `vmaxps`/`vminps` keep
/// the second operand unless the first compares greater/smaller, `vrndscaleps` rounds
/// to nearest even, `vscalefps` scales by 2^n with one rounding (done in f64, where the
/// product is exact, then rounded once to f32).
pub(super) fn silu(x: f32) -> f32 {
    let nx = 0.0 - x;
    let nx = if nx > -104.0 { nx } else { -104.0 };
    let nx = if nx < 88.0 { nx } else { 88.0 };
    let n = (nx * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(0.693_359_4, nx);
    let r = (-n).mul_add(-2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let y = p.mul_add(r * r, r) + 1.0;
    // n is an integer in [-150, 128]: 2^n is a normal f64.
    let scale = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    let e = (y as f64 * scale) as f32;
    x / (1.0 + e)
}

/// Work item `it` of job `r`, accumulated and written through its epilogue.
pub(super) fn item(r: &JobRef<'_>, it: &Item, acts: &Acts, work: &mut Work) {
    let rows = it.r1 - it.r0;
    let width = NT * 16;
    work.acc.clear();
    work.acc.resize(rows * width, 0.0);
    let tiles = r.tiles(it);
    for j in 0..it.nt {
        let w = tiles[j];
        // SwiGLU's two tiles are gate's and up's tile t0; otherwise tiles t0 and t0 + 1.
        let t = if it.swiglu { it.t0 } else { it.t0 + j };
        let tile = w.tile(t);
        for c in 0..16 {
            work.col.load(w, tile, c);
            for row in 0..rows {
                let v = if w.kind().a256() {
                    work.col.dot256(w.kind(), acts.a256_row(it.r0 + row))
                } else {
                    work.col.dot32(w.kind(), acts.a32_row(it.r0 + row))
                };
                work.acc[row * width + j * 16 + c] = v;
            }
        }
    }
    debug_assert!(rows <= RB);
    let n = r.w.n();
    for row in 0..rows {
        let at = (it.r0 + row) * n + it.t0 * 16;
        let acc = &work.acc[row * width..(row + 1) * width];
        let cols = if it.swiglu { 16 } else { 16 * it.nt };
        // SAFETY: this row segment belongs to item `it` alone: items partition each job's
        // output, and the dispatcher hands every item to one thread.
        let dst = unsafe { r.dst.slice_mut(at, cols) };
        for (c, d) in dst.iter_mut().enumerate() {
            let v = if it.swiglu {
                silu(acc[c]) * acc[16 + c]
            } else {
                let col = it.t0 * 16 + c;
                let mut v = acc[c];
                if let Some(b) = r.bias {
                    v += b[col];
                }
                if let Epilogue::Residual(res) = r.epilogue {
                    v += res[at + c];
                }
                v
            };
            *d = MaybeUninit::new(v);
        }
    }
}
