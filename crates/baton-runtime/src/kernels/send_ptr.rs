//! A pointer to an output buffer that several threads of one parallel region write.
//!
//! The kernels split their output into rectangles (rows × column tiles) and hand them
//! to the thread pool's workers, which take work items by index. Borrowing the buffer
//! mutably per worker is impossible with an index-based schedule, so the buffer travels as
//! this pointer; each write goes through [`SendPtr::slice_mut`], which checks the range
//! against the buffer and makes the caller promise it is theirs alone.

/// A raw view of a `[T]` that may cross threads.
///
/// Invariant (what makes the `Send`/`Sync` impls sound): during the parallel region the
/// pointer is used in, every element is written by at most one thread (each thread owns
/// disjoint row ranges or tiles), nothing reads an element another thread writes, and the
/// buffer outlives the region (it is borrowed mutably for the whole region by the caller
/// that created the pointer).
pub(crate) struct SendPtr<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

// SAFETY: the pointer is only dereferenced through `slice_mut`, whose callers promise the
// disjointness stated on the type; `T: Send` because elements are written from other
// threads.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as for Send: shared copies hand out only disjoint ranges.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// A view of `buf`; the mutable borrow ends here, so the caller must keep `buf` alive
    /// and untouched until the parallel region is over.
    pub(crate) fn new(buf: &mut [T]) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }

    /// Elements `start..start + len` of the buffer.
    ///
    /// Panics when the range leaves the buffer (a kernel's own bookkeeping error, never
    /// an input's: inputs are checked before a region starts).
    ///
    /// # Safety
    /// The buffer is still alive, and for as long as the returned slice lives no other
    /// slice obtained from this pointer or its copies overlaps the range, and nothing else
    /// reads or writes it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.len),
            "kernel output range {start}+{len} past a buffer of {}",
            self.len
        );
        // SAFETY: the range lies inside the buffer (checked above), which is alive, and the
        // caller guarantees nobody else touches it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
