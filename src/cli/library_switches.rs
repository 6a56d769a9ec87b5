//! Switches that a library reads from its process's environment and takes no other
//! way: candle's quantized kernels cap themselves at AVX2 only when `MISTRALRS_FORCE_AVX2`
//! is set where the process starts. Changing one's own environment is not sound once
//! threads may run (and says nothing to the code that read it first), so where
//! `BATON_CPU_LEVEL` caps baton's kernels and candle's switch is not already on, the
//! binary starts itself again with it on, before it does anything else.

use anyhow::{Context, Result};

const CANDLE_AVX2: &str = "MISTRALRS_FORCE_AVX2";

/// Returns when the environment already carries what the libraries need; otherwise
/// replaces the process with the same command in that environment (never returns on
/// success).
pub fn start_with_them() -> Result<()> {
    if !baton::kernels::avx2_only() || std::env::var(CANDLE_AVX2).as_deref() == Ok("1") {
        return Ok(());
    }
    let exe = std::env::current_exe()
        .context("cannot find the running binary to cap candle's kernels at AVX2")?;
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        set_arg0(&mut cmd, arg0);
    }
    cmd.args(args).env(CANDLE_AVX2, "1");
    exec(cmd)
}

#[cfg(unix)]
fn set_arg0(cmd: &mut std::process::Command, arg0: std::ffi::OsString) {
    use std::os::unix::process::CommandExt;
    cmd.arg0(arg0);
}

#[cfg(not(unix))]
fn set_arg0(_: &mut std::process::Command, _: std::ffi::OsString) {}

#[cfg(unix)]
fn exec(mut cmd: std::process::Command) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let e = cmd.exec();
    Err(e).context(format!(
        "cannot start again with {CANDLE_AVX2}=1 (BATON_CPU_LEVEL=avx2 caps candle's kernels through it); set it yourself"
    ))
}

#[cfg(not(unix))]
fn exec(mut cmd: std::process::Command) -> Result<()> {
    // No exec: run the command as a child and pass its exit status on.
    let status = cmd
        .status()
        .context(format!("cannot start again with {CANDLE_AVX2}=1"))?;
    std::process::exit(status.code().unwrap_or(1));
}
