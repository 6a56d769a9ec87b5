//! Safe parallel writes into disjoint parts of one buffer, on candle's barrier pool (the
//! pool the kernels run on, so callers do not oversubscribe the cores with a second one).
//! The pool hands out work by index, so the disjointness a `chunks_mut` would prove is
//! checked here instead, once, and each worker gets its own `&mut` part.

use super::send_ptr::SendPtr;

/// `f(i, part)` for every `i < n`, where part `i` is `buf[i * len..(i + 1) * len]`; in
/// parallel when `parallel`. Panics when `buf` is shorter than `n * len`.
pub fn for_each_chunk<T: Send>(
    buf: &mut [T],
    len: usize,
    n: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(
        n.checked_mul(len).is_some_and(|total| total <= buf.len()),
        "buffer too short"
    );
    let out = SendPtr::new(buf);
    let one = |i: usize| {
        // SAFETY: distinct i give disjoint parts inside `buf` (checked above), each handed
        // to one call; `buf` stays borrowed until the region ends.
        f(i, unsafe { out.slice_mut(i * len, len) })
    };
    if parallel {
        candle_core::utils::barrier_pool().execute_chunked(n, |r| r.for_each(one));
    } else {
        (0..n).for_each(one);
    }
}

/// `f(r, h, seg)` for every row `r < rows` and head `h < heads` of a [heads, cap, hd]
/// buffer, where `seg` is row r of head h (`hd` values); rows are spread over the pool
/// when `parallel`, and one call of the pool's covers all heads of a row. Panics when
/// `rows > cap` or `buf` is shorter than `heads * cap * hd`.
pub fn for_each_row_of_heads<T: Send>(
    buf: &mut [T],
    (heads, cap, hd): (usize, usize, usize),
    rows: usize,
    parallel: bool,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    assert!(rows <= cap, "{rows} rows in a capacity of {cap}");
    assert!(
        heads
            .checked_mul(cap)
            .and_then(|x| x.checked_mul(hd))
            .is_some_and(|total| total <= buf.len()),
        "buffer too short"
    );
    let out = SendPtr::new(buf);
    let one = |r: usize| {
        for h in 0..heads {
            // SAFETY: (h, r) with r < cap name disjoint segments inside `buf` (checked
            // above), and each pair is visited once.
            f(r, h, unsafe { out.slice_mut((h * cap + r) * hd, hd) })
        }
    };
    if parallel {
        candle_core::utils::barrier_pool().execute_chunked(rows, |r| r.for_each(one));
    } else {
        (0..rows).for_each(one);
    }
}
