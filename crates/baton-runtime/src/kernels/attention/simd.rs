//! What the AVX-512 and AVX2 attention kernels share beside their vector width: the
//! call's arguments, the schedule of (KV head, query row) items with their per-thread
//! buffers, and the softmax over the positions a row may see.

use super::super::send_ptr::SendPtr;
use super::{fill_hidden, Causal};
use std::ops::Range;

/// One call's inputs, unpacked for the loops.
pub(super) struct Args<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub ksh: usize,
    pub ksr: usize,
    pub vsh: usize,
    pub vsr: usize,
    pub nh: usize,
    pub nkv: usize,
    pub t: usize,
    pub hd: usize,
    pub start: usize,
    pub hidden: &'a [Range<usize>],
    pub scale: f32,
}

impl<'a> Args<'a> {
    pub fn of(c: &Causal<'a>) -> Self {
        Self {
            q: c.q,
            k: c.k,
            v: c.v,
            ksh: c.k_stride.0,
            ksr: c.k_stride.1,
            vsh: c.v_stride.0,
            vsr: c.v_stride.1,
            nh: c.n_head,
            nkv: c.n_kv_head,
            t: c.t,
            hd: c.head_dim,
            start: c.start,
            hidden: c.hidden,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        }
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.nh / self.nkv
    }
}

/// A thread's scratch: the scores of one item's heads, and their softmax's 1/sum.
#[derive(Default)]
pub(super) struct Buffers {
    pub scores: Vec<f32>,
    pub inv: Vec<f32>,
}

impl Buffers {
    /// Room for `heads` rows of `stride` scores and `heads` sums.
    pub fn fit(&mut self, heads: usize, stride: usize) {
        if self.scores.len() < heads * stride {
            self.scores.resize(heads * stride, 0.0);
        }
        if self.inv.len() < heads {
            self.inv.resize(heads, 0.0);
        }
    }
}

thread_local! {
    static BUFFERS: std::cell::RefCell<Buffers> = std::cell::RefCell::new(Buffers::default());
}

/// `row(g, i, buffers, out)` for every item (KV head g, query row i), spread over the
/// pool when the call is big enough; `out` is the item's query heads at row i, which are
/// contiguous in the output and written by that item alone.
///
/// # Safety
/// `out` views t * n_head * head_dim floats no one else touches during the call.
pub(super) unsafe fn each_row(
    a: &Args<'_>,
    out: SendPtr<f32>,
    row: impl Fn(usize, usize, &mut Buffers, &mut [f32]) + Sync,
) {
    let items = a.nkv * a.t;
    let group = a.group();
    let run = |range: std::ops::Range<usize>| {
        BUFFERS.with(|cell| {
            let mut bufs = cell.borrow_mut();
            for it in range {
                // Latest (longest) rows first, so the dynamic schedule ends on short ones.
                let i = a.t - 1 - it / a.nkv;
                let g = it % a.nkv;
                // SAFETY: item (g, i) alone writes the heads of group g at row i.
                let o = unsafe { out.slice_mut((i * a.nh + g * group) * a.hd, group * a.hd) };
                row(g, i, &mut bufs, o);
            }
        })
    };
    if items * (a.start + a.t) < 4096 {
        run(0..items);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(items, run);
    }
}

/// `softmax` over the positions of `s[..n]` that are not hidden: a hidden score goes in
/// as -inf, and its numerator is set to exactly 0 after (a clamped exp leaves a tiny one),
/// so its value row, whatever it holds, never reaches the output. With nothing hidden
/// this is `softmax` itself. Returns what `softmax` returns (1 / sum).
///
/// # Safety
/// `s` is valid for writing `n` floats and `softmax(s, n)` may be called; `hidden` lies
/// before the row's own position (validated), so the maximum stays finite.
#[inline(always)]
pub(super) unsafe fn visible(
    s: *mut f32,
    n: usize,
    hidden: &[Range<usize>],
    softmax: impl FnOnce(*mut f32, usize) -> f32,
) -> f32 {
    if hidden.is_empty() {
        return softmax(s, n);
    }
    // SAFETY: the caller's guarantee: `s` holds n floats.
    unsafe {
        fill_hidden(
            std::slice::from_raw_parts_mut(s, n),
            hidden,
            f32::NEG_INFINITY,
        )
    };
    let inv = softmax(s, n);
    // SAFETY: as above.
    unsafe { fill_hidden(std::slice::from_raw_parts_mut(s, n), hidden, 0.0) };
    inv
}
