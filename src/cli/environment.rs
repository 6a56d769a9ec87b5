//! Settings that come from the environment, checked at the edge: a bad value is an error
//! that names the variable it came from, before any work, and never a default taken in
//! silence.

use std::ffi::{OsStr, OsString};

use anyhow::Result;
use clap::error::ErrorKind;
use clap::Command;

/// The settings read from the environment alone, not through a flag: the CPU level and
/// the cache dir (which every command uses, if only for its log).
pub fn check() -> Result<()> {
    baton::kernels::check_cpu_level()?;
    baton::fetch::check_cache_root()?;
    Ok(())
}

/// `err`, a bad value clap read, said again naming the environment variable it came from
/// when it came from one; clap names the flag either way. Whether the variable was the
/// source is asked of clap itself: the same command line without the variable no longer
/// fails this way (a flag given on the command line wins over its variable).
pub fn name_the_source(err: clap::Error, cmd: &Command, args: &[OsString]) -> clap::Error {
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return err;
    }
    let mut vars = Vec::new();
    env_flags(cmd, &mut vars);
    let first = err.to_string();
    for (var, flag) in vars {
        let Some(value) = std::env::var_os(&var) else {
            continue;
        };
        let still = without_env(cmd.clone(), &var).try_get_matches_from(args);
        if still.is_err_and(|e| e.to_string() == first) {
            continue;
        }
        let reason = match std::error::Error::source(&err) {
            Some(inner) => inner.to_string(),
            None => first
                .trim_start_matches("error: ")
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let var = var.to_string_lossy();
        let message = format!(
            "invalid value '{}' in the environment variable {var} (the setting behind \
             {flag}): {reason}; correct {var} or unset it\n",
            value.to_string_lossy()
        );
        return clap::Error::raw(err.kind(), message).with_cmd(cmd);
    }
    err
}

/// Every environment variable a flag of `cmd` or its subcommands reads, with the flag.
fn env_flags(cmd: &Command, out: &mut Vec<(OsString, String)>) {
    for a in cmd.get_arguments() {
        if let Some(var) = a.get_env() {
            let flag = match a.get_long() {
                Some(long) => format!("--{long}"),
                None => a.get_id().to_string(),
            };
            if !out.iter().any(|(v, _)| v == var) {
                out.push((var.to_os_string(), flag));
            }
        }
    }
    for sub in cmd.get_subcommands() {
        env_flags(sub, out);
    }
}

/// `cmd` with no flag reading `var`.
fn without_env(mut cmd: Command, var: &OsStr) -> Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.get_env() == Some(var))
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| a.env(None::<&str>));
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, |c| without_env(c, var));
    }
    cmd
}
