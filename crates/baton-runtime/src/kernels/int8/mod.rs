//! Int8 matmuls `y = epilogue(x Wᵀ + b)` over weights in ggml's Q8_0 / Q5_0 / Q4_K /
//! Q6_K blocks, packed once at load ([`Packed`]).
//!
//! Why own kernels: candle picks a different kernel for the same weights depending on the
//! number of rows (generic vec-dot for one row, repacked tiles or AMX for many), and those
//! round differently, so prefill(A+B) and prefill(A) + decode disagreed in the last bits,
//! which greedy decoding then amplifies. Here every output element is one fixed sequence
//! of operations whatever the row count: integer dot products per block (exact, in any
//! order), then a fixed f32 combination per block in block order. Row grouping, threading
//! and chunking only decide which core does the work. VNNI's `vpdpbusd` does 64 u8×i8 products per instruction into exact i32 sums,
//! which is what makes int8 activations pay (and what ggml's Q8_0/Q8_K activation formats
//! are built for); fused Q/K/V, gate/up with SiLU and residual epilogues save passes over
//! the activations and outputs.
//!
//! Paths: [`KernelPath::Avx512Vnni`], [`KernelPath::Avx2`] (for CPUs without AVX-512:
//! `vpmaddubsw` pair sums where VNNI has `vpdpbusd`) and [`KernelPath::Portable`] (see
//! [`PATHS`]). They quantize activations identically, form identical integer sums per
//! block, and apply the same float steps (one fused multiply-add per block) in the same
//! order, so their outputs agree bit for bit; the tests hold them to that.

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod packed;
mod portable;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use acts::Rows;
pub use packed::{Kind, Packed};

use super::send_ptr::SendPtr;
use super::{choose, portable_forced, KernelError, KernelPath};
use acts::Acts;
use std::mem::MaybeUninit;

/// The paths these kernels have, fastest first.
pub const PATHS: [KernelPath; 3] = [
    KernelPath::Avx512Vnni,
    KernelPath::Avx2,
    KernelPath::Portable,
];

/// The path calls without an explicit one take: AVX-512 VNNI where the CPU has it, else
/// AVX2, else portable (always where `BATON_PORTABLE_KERNELS` says so).
pub fn path() -> KernelPath {
    match choose(KernelPath::Avx512Vnni) {
        KernelPath::Portable => choose(KernelPath::Avx2),
        p => p,
    }
}

/// Whether weights should be packed for these kernels: where they run at SIMD speed, or
/// where the portable path was asked for (elsewhere candle's own kernels are faster).
pub fn enabled() -> bool {
    path() != KernelPath::Portable || portable_forced()
}

/// Output tiles (16 columns each) per work item.
const NT: usize = 2;
/// Rows per work item: accumulators for RB x NT*16 outputs stay in L1.
const RB: usize = 64;

/// What a job writes for its rows and columns.
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'a> {
    /// y = acc + bias
    Plain,
    /// y = acc + bias + residual (same shape as y)
    Residual(&'a [f32]),
    /// Two matrices of equal shape (gate, up): y = silu(acc_gate) * acc_up
    SwiGlu,
}

/// One output of a (possibly fused) matmul.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    /// One matrix, or the gate for [`Epilogue::SwiGlu`].
    pub w: &'a Packed,
    /// The up matrix of [`Epilogue::SwiGlu`].
    pub up: Option<&'a Packed>,
    pub bias: Option<&'a [f32]>,
    pub epilogue: Epilogue<'a>,
}

/// How work items are spread over threads. Results do not depend on it; tests vary it to
/// hold the kernels to that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// candle's barrier pool (what the decoder uses).
    Pool,
    /// `n` scoped threads, each taking one contiguous run of items.
    #[cfg_attr(not(test), allow(dead_code))]
    Threads(usize),
}

/// `[epilogue(x W_iᵀ + b_i) for every job]` on the default [`path`], all sharing the
/// activations `x` ([m, k] row-major): one quantization, one parallel region. Results
/// are [m, n_i] row-major.
pub fn matmul(x: &[f32], m: usize, jobs: &[Job<'_>]) -> Result<Vec<Vec<f32>>, KernelError> {
    matmul_rows(Rows::Whole(x), m, jobs)
}

/// [`matmul`] on activations given as [`Rows`].
pub fn matmul_rows(x: Rows<'_>, m: usize, jobs: &[Job<'_>]) -> Result<Vec<Vec<f32>>, KernelError> {
    matmul_on(path(), x, m, jobs)
}

/// [`matmul_rows`] on an explicit path.
pub fn matmul_on(
    path: KernelPath,
    x: Rows<'_>,
    m: usize,
    jobs: &[Job<'_>],
) -> Result<Vec<Vec<f32>>, KernelError> {
    matmul_split(path, x, m, jobs, Split::Pool)
}

/// Checks everything the kernels rely on before they read memory through raw pointers.
fn validate(path: KernelPath, x: Rows<'_>, m: usize, jobs: &[Job<'_>]) -> Result<(), KernelError> {
    let bad = |s: String| Err(KernelError::Shape(s));
    if !PATHS.contains(&path) {
        return Err(KernelError::Unavailable {
            path,
            reason: "the int8 matmul has no such implementation",
        });
    }
    if !path.available() {
        return Err(KernelError::Unavailable {
            path,
            reason: "this CPU lacks the features it needs",
        });
    }
    let Some(first) = jobs.first() else {
        return bad("a matmul with no weights".into());
    };
    let k = first.w.k();
    let a256 = first.w.kind().a256();
    for j in jobs {
        let (n, w) = (j.w.n(), j.w);
        if w.k() != k || w.kind().a256() != a256 {
            return bad(format!(
                "fused weights {w:?} and {:?} take different inputs",
                first.w
            ));
        }
        if j.bias.is_some_and(|b| b.len() != n) {
            return bad(format!(
                "a bias of {} for {n} outputs",
                j.bias.map_or(0, |b| b.len())
            ));
        }
        match j.epilogue {
            Epilogue::SwiGlu => {
                let Some(up) = j.up else {
                    return bad("SwiGLU without the up matrix".into());
                };
                if up.n() != n || up.k() != k || up.kind() != w.kind() || j.bias.is_some() {
                    return bad(format!("SwiGLU over {w:?} and {up:?} (with no bias)"));
                }
            }
            Epilogue::Residual(r) => {
                if r.len() != m * n {
                    return bad(format!("a residual of {} for {m}x{n} outputs", r.len()));
                }
            }
            Epilogue::Plain => {}
        }
    }
    match x {
        Rows::Whole(x) => {
            if x.len() != m * k {
                return bad(format!("{} activations for {m} rows of {k}", x.len()));
            }
        }
        Rows::Parts { parts, width } => {
            if a256 || !width.is_multiple_of(32) || parts.len() * width != k {
                return bad(format!(
                    "{} parts of {width} for weights of {k} inputs (per-32 formats only)",
                    parts.len()
                ));
            }
            if parts.iter().any(|p| p.len() < m * width) {
                return bad(format!(
                    "an activation part shorter than {m} rows of {width}"
                ));
            }
        }
    }
    Ok(())
}

/// One job as the workers see it.
pub(super) struct JobRef<'a> {
    pub w: &'a Packed,
    pub up: Option<&'a Packed>,
    pub bias: Option<&'a [f32]>,
    pub epilogue: Epilogue<'a>,
    /// [m, n] outputs; every item writes its own rectangle.
    pub dst: SendPtr<MaybeUninit<f32>>,
}

/// One work item: output columns [16*t0, 16*(t0+nt)) of rows [r0, r1). `tiles[j]` is the
/// tile index of column tile j in `w` (for SwiGLU, tile 0 is gate's and tile 1 up's, same
/// columns).
#[derive(Clone, Copy, Debug)]
pub(super) struct Item {
    pub t0: usize,
    pub nt: usize,
    pub swiglu: bool,
    pub r0: usize,
    pub r1: usize,
}

impl JobRef<'_> {
    /// The packed tiles item `it` reads: `nt` of them (the second repeats the first when
    /// there is one).
    pub(super) fn tiles(&self, it: &Item) -> [&Packed; NT] {
        match (it.swiglu, self.up) {
            (true, Some(up)) => [self.w, up],
            _ => [self.w; NT],
        }
    }

    /// Where the packed data of item `it`'s tiles starts: gate's and up's tile t0 for
    /// SwiGLU, else tiles t0 and t0 + 1 (t0 twice when the item has one). Addresses
    /// only: they lie inside the weights for items the dispatcher derives.
    pub(super) fn tile_starts(&self, it: &Item) -> [*const u8; NT] {
        let ts = self.w.tile_bytes();
        let [a, b] = self.tiles(it);
        let second = if !it.swiglu && it.nt == 2 {
            it.t0 + 1
        } else {
            it.t0
        };
        [
            a.base().wrapping_add(it.t0 * ts),
            b.base().wrapping_add(second * ts),
        ]
    }
}

pub(crate) fn matmul_split(
    path: KernelPath,
    x: Rows<'_>,
    m: usize,
    jobs: &[Job<'_>],
    split: Split,
) -> Result<Vec<Vec<f32>>, KernelError> {
    validate(path, x, m, jobs)?;
    let k = jobs[0].w.k();
    let a256 = jobs[0].w.kind().a256();
    let mut outs: Vec<Vec<MaybeUninit<f32>>> = jobs.iter().map(|j| uninit(m * j.w.n())).collect();
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        acts.quantize(path, x, m, k, a256);
        let acts = &*acts;
        let n_rc = m.div_ceil(RB);
        // Items: (column group, row chunk) per job, column-group major.
        let mut starts = Vec::with_capacity(jobs.len());
        let mut total = 0;
        for j in jobs {
            starts.push(total);
            let per = if matches!(j.epilogue, Epilogue::SwiGlu) {
                1
            } else {
                NT
            };
            total += (j.w.n() / 16).div_ceil(per) * n_rc;
        }
        let refs: Vec<JobRef<'_>> = jobs
            .iter()
            .zip(outs.iter_mut())
            .map(|(j, dst)| JobRef {
                w: j.w,
                up: j.up,
                bias: j.bias,
                epilogue: j.epilogue,
                dst: SendPtr::new(dst),
            })
            .collect();
        let item_of = |it: usize| -> (&JobRef<'_>, Item) {
            let ji = starts.partition_point(|&s| s <= it) - 1;
            let r = &refs[ji];
            let local = it - starts[ji];
            let (cg, rc) = (local / n_rc, local % n_rc);
            let swiglu = matches!(r.epilogue, Epilogue::SwiGlu) && r.up.is_some();
            let (t0, nt) = if swiglu {
                (cg, 2)
            } else {
                let t0 = cg * NT;
                (t0, (r.w.n() / 16 - t0).min(NT))
            };
            let r0 = rc * RB;
            let r1 = (r0 + RB).min(m);
            (
                r,
                Item {
                    t0,
                    nt,
                    swiglu,
                    r0,
                    r1,
                },
            )
        };
        let run = |range: std::ops::Range<usize>| match path {
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512Vnni => vnni::with_work(|work| {
                for it in range {
                    let (r, item) = item_of(it);
                    // SAFETY: the path was checked available (validate); the job's
                    // shapes, bias and residual were validated against its weights and
                    // `m`; items partition every job's output, so this item's rectangle
                    // is written by this call alone.
                    unsafe { vnni::item(r, &item, acts, work) };
                }
            }),
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => avx2::with_work(|work| {
                for it in range {
                    let (r, item) = item_of(it);
                    // SAFETY: as for the VNNI path: AVX2, FMA and F16C were checked
                    // available, the shapes validated, and the item's rectangle is its own.
                    unsafe { avx2::item(r, &item, acts, work) };
                }
            }),
            _ => portable::with_work(|work| {
                for it in range {
                    let (r, item) = item_of(it);
                    portable::item(r, &item, acts, work);
                }
            }),
        };
        match split {
            Split::Pool if total == 1 => run(0..1),
            Split::Pool => candle_core::utils::barrier_pool().execute_chunked(total, run),
            Split::Threads(n) => {
                let per = total.div_ceil(n.max(1)).max(1);
                std::thread::scope(|s| {
                    for t in 0..n.max(1) {
                        let range = (t * per).min(total)..((t + 1) * per).min(total);
                        let run = &run;
                        s.spawn(move || run(range));
                    }
                });
            }
        }
    });
    // SAFETY: the items partition [0, m) x [0, n) of every job and each writes its whole
    // rectangle (a panic in a worker propagates before this point).
    Ok(outs
        .into_iter()
        .map(|o| unsafe { assume_init(o) })
        .collect())
}

thread_local! {
    static ACTS: std::cell::RefCell<Acts> = std::cell::RefCell::new(Acts::default());
}

/// An output buffer the kernels fill completely.
fn uninit(len: usize) -> Vec<MaybeUninit<f32>> {
    let mut v = Vec::with_capacity(len);
    v.resize_with(len, MaybeUninit::uninit);
    v
}

/// # Safety
/// Every element of `v` was written.
unsafe fn assume_init(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: MaybeUninit<f32> has f32's layout, the buffer came from a Vec of that
    // length and capacity, and the caller guarantees every element is initialised.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut f32, v.len(), v.capacity()) }
}
