//! The crate's hand-written CPU kernels, and with them all of its `unsafe` code: int8
//! matmuls over Q8_0-style packed weights ([`int8`]) and a causal attention whose result
//! does not depend on how its input was chunked ([`attention`]).
//!
//! Each kernel has a SIMD path for the CPUs the decoder is tuned for and a portable path
//! in plain Rust that computes the same integer sums in the same float order. The SIMD
//! path is chosen at run time when the CPU has the features it needs;
//! `BATON_PORTABLE_KERNELS=1` forces the portable one everywhere (to check a result
//! against the SIMD code, or to run the packed kernels on a CPU without AVX2). Tests
//! pick a path explicitly through [`KernelPath`].
//!
//! Nothing here knows about models or mappers: inputs are slices, shapes and strides,
//! checked before any raw-pointer access, and failures are [`KernelError`]s.

// The unsafe contract of every `unsafe fn` below is stated in its `# Safety` section; an
// operation inside one still needs its own block, so each use of the contract is visible.
#![deny(unsafe_op_in_unsafe_fn)]
// The SIMD kernels index several parallel lane arrays with one counter; iterator chains
// would hide which lanes pair up.
#![allow(clippy::needless_range_loop, clippy::type_complexity)]

pub mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2_exp;
#[cfg(target_arch = "x86_64")]
mod avx2_lanes;
#[cfg(target_arch = "x86_64")]
mod avx512_exp;
pub mod int8;
pub mod par;
mod send_ptr;

use std::sync::OnceLock;

/// What a kernel call can refuse. Shapes are checked before any memory is read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("the {path:?} kernel path cannot run here: {reason}")]
    Unavailable {
        path: KernelPath,
        reason: &'static str,
    },
    #[error("kernel input mismatch: {0}")]
    Shape(String),
    #[error(
        "{CPU_LEVEL_ENV}=`{value}` is not a CPU level: set it to `avx2` (run an AVX-512 CPU \
         as one without AVX-512) or `avx512` (every instruction the CPU has, the default), \
         or unset {CPU_LEVEL_ENV}"
    )]
    CpuLevel { value: String },
}

/// An implementation a kernel can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    /// AVX-512 F/BW/VL with VNNI (Ice Lake, Zen 4 and later): the int8 matmuls.
    Avx512Vnni,
    /// AVX-512 F: the attention kernel.
    Avx512,
    /// AVX2 with FMA and F16C (Haswell on, Zen 1 to 3): the attention kernel and the int8
    /// matmuls where AVX-512 is not.
    Avx2,
    /// Plain Rust, every CPU.
    Portable,
}

impl KernelPath {
    /// Whether this CPU has what the path needs.
    pub fn available(self) -> bool {
        match self {
            KernelPath::Portable => true,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => {
                static OK: OnceLock<bool> = OnceLock::new();
                *OK.get_or_init(|| !avx2_only() && is_x86_feature_detected!("avx512f"))
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512Vnni => {
                static OK: OnceLock<bool> = OnceLock::new();
                *OK.get_or_init(|| {
                    !avx2_only()
                        && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                })
            }
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => {
                static OK: OnceLock<bool> = OnceLock::new();
                *OK.get_or_init(|| {
                    is_x86_feature_detected!("avx2")
                        && is_x86_feature_detected!("fma")
                        && is_x86_feature_detected!("f16c")
                })
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The path's name, as `baton info` prints it.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Avx512Vnni => "avx512vnni",
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx2 => "avx2",
            KernelPath::Portable => "portable",
        }
    }

    /// The CPU features the path needs, for messages.
    pub fn needs(self) -> &'static str {
        match self {
            KernelPath::Avx512Vnni => "avx512f, avx512bw, avx512vl and avx512vnni",
            KernelPath::Avx512 => "avx512f",
            KernelPath::Avx2 => "avx2, fma and f16c",
            KernelPath::Portable => "nothing",
        }
    }
}

/// The environment variable that forces [`KernelPath::Portable`].
pub const PORTABLE_ENV: &str = "BATON_PORTABLE_KERNELS";

/// The environment variable that caps the CPU instructions the kernels use (`avx2`, or
/// `avx512`: all of them, as unset; anything else is refused): `avx2` runs
/// an AVX-512 machine as a machine without AVX-512 runs (baton's kernels, and candle's
/// through its own switch, which the binary sets), so that both kinds can be measured
/// on one. Read once.
pub const CPU_LEVEL_ENV: &str = "BATON_CPU_LEVEL";

/// Whether [`CPU_LEVEL_ENV`] caps the kernels at AVX2. A value [`check_cpu_level`]
/// refuses caps nothing; the binary refuses it before any kernel runs.
pub fn avx2_only() -> bool {
    static CAPPED: OnceLock<bool> = OnceLock::new();
    *CAPPED.get_or_init(|| check_cpu_level() == Ok(true))
}

/// Reads [`CPU_LEVEL_ENV`]: whether it caps the kernels at AVX2 (`avx2`), or not
/// (`avx512`, empty or unset), or an error naming a value it cannot mean, so that a typo
/// is never a run measured at the wrong level.
pub fn check_cpu_level() -> Result<bool, KernelError> {
    let Some(raw) = std::env::var_os(CPU_LEVEL_ENV) else {
        return Ok(false);
    };
    let value = raw.to_string_lossy();
    match value.trim().to_ascii_lowercase().as_str() {
        "avx2" => Ok(true),
        "avx512" | "" => Ok(false),
        _ => Err(KernelError::CpuLevel {
            value: value.into_owned(),
        }),
    }
}

/// Whether `BATON_PORTABLE_KERNELS` asks for the portable path (any value but empty or
/// `0`). Read once: a path must not change under a running model, or a decode step would
/// stop reproducing its prefill's bits.
pub fn portable_forced() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED
        .get_or_init(|| std::env::var_os(PORTABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0"))
}

/// The fastest of `simd` and the portable path that may run here.
fn choose(simd: KernelPath) -> KernelPath {
    if !portable_forced() && simd.available() {
        simd
    } else {
        KernelPath::Portable
    }
}
