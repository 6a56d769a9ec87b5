//! What the operating system gives that Rust cannot check: files mapped into memory, the
//! user's id, a thread's scheduling priority. Beside `kernels/`, the only place with
//! `unsafe`; each use says here why it holds.

use std::fs::File;
use std::path::PathBuf;

/// `file` mapped read-only into memory.
///
/// Every file baton maps is its own and is never changed in place: model weights are
/// fetched whole and checksummed, statistics, shards and artifacts are written aside and
/// renamed into place, so a reader's map never sees a write. A file another program
/// truncates meanwhile can still fault a read: the same trade every mmap-based
/// safetensors reader makes, to avoid holding a second copy of a file that can be over
/// half a gigabyte.
pub fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: see above; the map is only read.
    unsafe { memmap2::Mmap::map(file) }
}

/// The safetensors `files` mapped read-only as the tensors of one model (see
/// [`map_file`] for why that holds).
pub fn mapped_safetensors(
    files: &[PathBuf],
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    // SAFETY: see `map_file`; baton never writes a model's files once fetched.
    unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(files, dtype, device) }
}

/// The user's id as text, for a directory of this user's own; the user's name where
/// there are no numeric ids to ask for.
pub fn user_id() -> String {
    #[cfg(target_os = "linux")]
    // SAFETY: getuid has no preconditions and cannot fail.
    let user = unsafe { libc::getuid() }.to_string();
    #[cfg(not(target_os = "linux"))]
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    user
}

/// Makes the calling thread the last to get a core (Linux keeps a nice value per
/// thread); false where that failed or is not supported.
pub fn lower_thread_priority() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id; nothing is shared.
        let done = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19)
        };
        done == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}
