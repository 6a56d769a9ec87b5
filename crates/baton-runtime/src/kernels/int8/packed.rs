//! Weight layout: ggml blocks re-arranged into tiles of 16 output columns.
//!
//! A tile holds the blocks of its 16 columns interleaved so that one 64-byte load gives
//! a VNNI `vpdpbusd` operand: 4 consecutive k-values of each of the 16 columns, which
//! the instruction multiplies by 4 activation bytes broadcast to every lane and adds into
//! 16 per-column i32 sums. Quants are stored unsigned (Q8_0 with +128, the others as their
//! natural unsigned nibbles), because `vpdpbusd` multiplies unsigned by signed bytes; the
//! offsets are undone from the activations' sums (see `acts`). Weights keep (close to)
//! their file size.

use super::super::send_ptr::SendPtr;
use super::super::KernelError;
use candle_core::quantized::GgmlDType;

/// The weight block formats the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Q8_0,
    Q5_0,
    Q4K,
    Q6K,
}

impl Kind {
    pub fn of(dt: GgmlDType) -> Option<Kind> {
        match dt {
            GgmlDType::Q8_0 => Some(Kind::Q8_0),
            GgmlDType::Q5_0 => Some(Kind::Q5_0),
            GgmlDType::Q4K => Some(Kind::Q4K),
            GgmlDType::Q6K => Some(Kind::Q6K),
            _ => None,
        }
    }
    /// Values per weight block.
    pub fn block(self) -> usize {
        match self {
            Kind::Q8_0 | Kind::Q5_0 => 32,
            Kind::Q4K | Kind::Q6K => 256,
        }
    }
    /// Bytes of one ggml block.
    pub(super) fn ggml_bytes(self) -> usize {
        match self {
            Kind::Q8_0 => 34,
            Kind::Q5_0 => 22,
            Kind::Q4K => 144,
            Kind::Q6K => 210,
        }
    }
    /// Bytes of one packed (16 columns x one block) unit.
    pub(super) fn packed_bytes(self) -> usize {
        match self {
            // qs 512 (u8, +128) | d 16 x f16
            Kind::Q8_0 => 512 + 32,
            // nibbles 256 | high-bit masks 64 | d 16 x f16
            Kind::Q5_0 => 256 + 64 + 32,
            // nibbles 2048 | sc 128 | m 128 | d 32 | dmin 32
            Kind::Q4K => 2048 + 128 + 128 + 64,
            // low nibbles 2048 | high bits 1024 | sc 256 | d 32 | pad 32
            Kind::Q6K => 2048 + 1024 + 256 + 64,
        }
    }
    /// Whether activations are quantized per 256 values (ggml's Q8_K, for the K-quants)
    /// rather than per 32 (ggml's Q8_0).
    pub fn a256(self) -> bool {
        matches!(self, Kind::Q4K | Kind::Q6K)
    }
}

/// Byte offsets inside one packed K-quant unit (one super-block of 16 columns).
pub(super) mod k_off {
    pub const Q4K_SC: usize = 2048;
    pub const Q4K_M: usize = 2176;
    pub const Q4K_D: usize = 2304;
    pub const Q4K_DMIN: usize = 2336;
    pub const Q6K_HI: usize = 2048;
    pub const Q6K_SC: usize = 3072;
    pub const Q6K_D: usize = 3328;
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Line(pub [u8; 64]);

/// Zeroed 64-byte-aligned storage (calloc: pages are zeroed lazily by the OS).
pub(super) fn lines(bytes: usize) -> Vec<Line> {
    let n = bytes.div_ceil(64);
    // SAFETY: an all-zero Line is a valid value.
    unsafe { Box::<[Line]>::new_zeroed_slice(n).assume_init() }.into_vec()
}

/// Weights of one linear layer, packed for these kernels. `n` output columns (a
/// multiple of 16), `k` inputs (a multiple of the block size).
pub struct Packed {
    kind: Kind,
    n: usize,
    k: usize,
    data: Vec<Line>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({:?}, {}x{})", self.kind, self.n, self.k)
    }
}

impl Packed {
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }
    pub(super) fn kb(&self) -> usize {
        self.k / self.kind.block()
    }
    pub(super) fn tile_bytes(&self) -> usize {
        (self.kb() * self.kind.packed_bytes()).div_ceil(64) * 64
    }
    /// Q8_0 / Q5_0 tiles keep quants, high-bit masks and scales in separate runs so
    /// every 64-byte load is aligned: [kb][qs] | [kb][64 masks] (Q5_0) | [kb][16 f16].
    pub(super) fn qs_off(&self, b: usize) -> usize {
        match self.kind {
            Kind::Q8_0 => b * 512,
            _ => b * 256,
        }
    }
    pub(super) fn hm_off(&self, b: usize) -> usize {
        self.kb() * 256 + b * 64
    }
    pub(super) fn d_off(&self, b: usize) -> usize {
        match self.kind {
            Kind::Q8_0 => self.kb() * 512 + b * 32,
            _ => self.kb() * 320 + b * 32,
        }
    }
    /// Start of the packed data; tile `t` starts `t * tile_bytes()` later, and every tile
    /// is 64-byte aligned.
    pub(super) fn base(&self) -> *const u8 {
        self.data.as_ptr() as *const u8
    }
    /// All packed bytes.
    pub fn raw(&self) -> &[u8] {
        // SAFETY: `data` is `data.len()` initialised 64-byte lines, viewed as bytes.
        unsafe { std::slice::from_raw_parts(self.base(), self.data.len() * 64) }
    }
    /// The bytes of tile `t` (columns 16t..16t+16).
    pub(super) fn tile(&self, t: usize) -> &[u8] {
        let tb = self.tile_bytes();
        &self.raw()[t * tb..(t + 1) * tb]
    }

    /// Whether a weight of this type and shape ([n, k], n outputs) can be packed.
    pub fn supports(dt: GgmlDType, n: usize, k: usize) -> bool {
        Kind::of(dt).is_some_and(|kind| Self::fits(kind, n, k))
    }

    fn fits(kind: Kind, n: usize, k: usize) -> bool {
        k > 0 && k.is_multiple_of(kind.block()) && n > 0 && n.is_multiple_of(16)
    }

    /// Pack raw ggml blocks (`n` rows of `k` values, row-major) of type `dt`.
    pub fn new(dt: GgmlDType, n: usize, k: usize, raw: &[u8]) -> Result<Packed, KernelError> {
        let kind = Kind::of(dt)
            .ok_or_else(|| KernelError::Shape(format!("{dt:?} weights have no int8 kernel")))?;
        if !Self::fits(kind, n, k) {
            return Err(KernelError::Shape(format!(
                "a {n}x{k} {dt:?} weight: outputs must be a multiple of 16 and inputs of {}",
                kind.block()
            )));
        }
        let kb = k / kind.block();
        if raw.len() != n * kb * kind.ggml_bytes() {
            return Err(KernelError::Shape(format!(
                "{} bytes for a {n}x{k} {dt:?} weight, which takes {}",
                raw.len(),
                n * kb * kind.ggml_bytes()
            )));
        }
        let mut p = Packed {
            kind,
            n,
            k,
            data: Vec::new(),
        };
        let tb = p.tile_bytes();
        let mut data = lines(tb * (n / 16));
        // SAFETY: the lines are initialised (zeroed); viewing them as bytes is valid.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, data.len() * 64)
        };
        let out = SendPtr::new(bytes);
        let pm = &p;
        // Tiles are independent: pack them in parallel.
        let pack_tile = |t: usize| {
            // SAFETY: tile t's bytes are written by this call only, and `data` outlives
            // the parallel region below.
            let tile = unsafe { out.slice_mut(t * tb, tb) };
            pack_one_tile(pm, raw, t, tile);
        };
        candle_core::utils::barrier_pool().execute_chunked(n / 16, |r| r.for_each(pack_tile));
        p.data = data;
        Ok(p)
    }
}

/// Tile `t` of `p` (whose data is not attached yet) from the ggml blocks in `raw`.
fn pack_one_tile(p: &Packed, raw: &[u8], t: usize, tile: &mut [u8]) {
    let kind = p.kind;
    let kb = p.kb();
    let gb = kind.ggml_bytes();
    let pb = kind.packed_bytes();
    let blk = |c: usize, b: usize| &raw[(c * kb + b) * gb..(c * kb + b + 1) * gb];
    for b in 0..kb {
        let (qo, ho, dof) = (p.qs_off(b), p.hm_off(b), p.d_off(b));
        match kind {
            Kind::Q8_0 => {
                for c in 0..16 {
                    let x = blk(t * 16 + c, b);
                    tile[dof + 2 * c..dof + 2 * c + 2].copy_from_slice(&x[0..2]);
                    for i in 0..32 {
                        let (g, j) = (i / 4, i % 4);
                        tile[qo + (g * 16 + c) * 4 + j] = x[2 + i] ^ 0x80;
                    }
                }
            }
            Kind::Q5_0 => {
                for c in 0..16 {
                    let x = blk(t * 16 + c, b);
                    tile[dof + 2 * c..dof + 2 * c + 2].copy_from_slice(&x[0..2]);
                    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
                    let mut v = [0u8; 32];
                    for j in 0..16 {
                        v[j] = (x[6 + j] & 0xf) | (((qh >> j) & 1) << 4) as u8;
                        v[j + 16] = (x[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                    }
                    put_nibbles(&mut tile[qo..qo + 256], c, &v);
                    for (i, &q) in v.iter().enumerate() {
                        if q & 0x10 != 0 {
                            // mask for k4-group g: bit (c*4 + j)
                            let (g, j) = (i / 4, i % 4);
                            let bit = c * 4 + j;
                            tile[ho + g * 8 + bit / 8] |= 1 << (bit % 8);
                        }
                    }
                }
            }
            Kind::Q4K => {
                let o = &mut tile[b * pb..(b + 1) * pb];
                for c in 0..16 {
                    let x = blk(t * 16 + c, b);
                    o[k_off::Q4K_D + 2 * c..k_off::Q4K_D + 2 * c + 2].copy_from_slice(&x[0..2]);
                    o[k_off::Q4K_DMIN + 2 * c..k_off::Q4K_DMIN + 2 * c + 2]
                        .copy_from_slice(&x[2..4]);
                    let mut scales = [0u8; 12];
                    scales.copy_from_slice(&x[4..16]);
                    let qs = &x[16..144];
                    let mut v = [0u8; 256];
                    for s in 0..8 {
                        let (sc, m) = scale_min_k4(s, &scales);
                        o[k_off::Q4K_SC + s * 16 + c] = sc;
                        // m as i16 pairs: [pair p][col][2]
                        o[k_off::Q4K_M + ((s / 2) * 16 + c) * 2 + s % 2] = m;
                        for l in 0..32 {
                            let byte = qs[32 * (s / 2) + l];
                            v[s * 32 + l] = if s % 2 == 0 { byte & 0xf } else { byte >> 4 };
                        }
                    }
                    put_nibbles(&mut o[0..2048], c, &v);
                }
            }
            Kind::Q6K => {
                let o = &mut tile[b * pb..(b + 1) * pb];
                for c in 0..16 {
                    let x = blk(t * 16 + c, b);
                    let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
                    o[k_off::Q6K_D + 2 * c..k_off::Q6K_D + 2 * c + 2].copy_from_slice(&x[208..210]);
                    for s in 0..16 {
                        o[k_off::Q6K_SC + s * 16 + c] = sc[s];
                    }
                    let mut v = [0u8; 256];
                    for h in 0..2 {
                        let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
                        for l in 0..32 {
                            let n0 = 128 * h;
                            v[n0 + l] = (ql[l] & 0xf) | ((qh[l] & 3) << 4);
                            v[n0 + l + 32] = (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4);
                            v[n0 + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                            v[n0 + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                        }
                    }
                    put_nibbles(&mut o[0..2048], c, &v);
                    // high 2 bits: [k16-group g][col][4 bytes]; byte j holds
                    // k = 16g + j + 4i at bits 2i..2i+2
                    for g in 0..16 {
                        for j in 0..4 {
                            let mut byte = 0u8;
                            for i in 0..4 {
                                byte |= (v[16 * g + j + 4 * i] >> 4) << (2 * i);
                            }
                            o[k_off::Q6K_HI + (g * 16 + c) * 4 + j] = byte;
                        }
                    }
                }
            }
        }
    }
}

/// Nibble layout shared by Q5_0 / Q4_K / Q6_K: [k8-group][col 16][4 bytes], byte j =
/// v[8g + j] | v[8g + j + 4] << 4, so one 64-byte load gives two dpbusd operands.
fn put_nibbles(o: &mut [u8], c: usize, v: &[u8]) {
    for g in 0..v.len() / 8 {
        for j in 0..4 {
            o[(g * 16 + c) * 4 + j] = (v[8 * g + j] & 0xf) | ((v[8 * g + j + 4] & 0xf) << 4);
        }
    }
}

/// Value `i` (0..8·len) of a [`put_nibbles`] run for column `c`.
pub(super) fn get_nibble(o: &[u8], c: usize, i: usize) -> u8 {
    let (g, j) = (i / 8, i % 8);
    let byte = o[(g * 16 + c) * 4 + j % 4];
    if j < 4 {
        byte & 0xf
    } else {
        byte >> 4
    }
}

fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// An IEEE half (as stored in ggml blocks) to f32, exactly (what `vcvtph2ps` does).
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match exp {
        // Zero or subnormal: mant · 2^-24, exact in f32.
        0 => {
            let v = mant as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        31 => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// The f16 at byte `off` of `b`.
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}
