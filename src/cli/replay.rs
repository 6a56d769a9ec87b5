//! `baton replay`: a recorded session's commands again on this build, and where the new
//! run differs from the recording.

use super::common::{print_json, record_path, MapperDirArgs};
use anyhow::{bail, Result};
use baton::headless::replay;
use baton::model::Placement;
use baton::session;
use clap::Args;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The recorded session file; its header names the models.
    pub session: std::path::PathBuf,
    #[command(flatten)]
    pub mappers: MapperDirArgs,
    /// Where to record the new run (default: sessions/<start time>.jsonl).
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn replay(a: ReplayArgs, on: &Placement) -> Result<()> {
    let recorded = session::read_session(&a.session)?;
    for w in &recorded.warnings {
        eprintln!("warning: {w}");
    }
    let mut cfg = replay::replay_config(&recorded, &a.session, on.device.clone())?;
    cfg.compute = on.compute;
    cfg.mapper_dir = a.mappers.dir();
    // A replay learns as the recording did, but keeps nothing: it is a measurement.
    cfg.learning.keep = false;
    let record = record_path(a.record.as_deref())?;
    cfg.record = Some(record.clone());
    let recorded_commands = replay::replay_commands(&recorded);
    for u in &recorded_commands.unapplied {
        eprintln!("warning: {u}");
    }
    let steps = recorded_commands.commands;
    eprintln!(
        "replaying {} commands from {}",
        steps.len(),
        a.session.display()
    );
    let ran = replay::run_headless(cfg, &steps, &mut |e| {
        if let baton::protocol::Event::Error { message, .. } = e {
            eprintln!("error: {message}");
        }
    })?;
    let replayed = session::read_session(&record)?;
    let mut diff = session::diff_sessions(&recorded, &replayed, &session::DiffOptions::default());
    // A change the replay could not make is a setting the two ran under apart.
    diff.settings
        .splice(0..0, recorded_commands.unapplied.iter().cloned());
    if a.json {
        print_json(&diff)?;
    } else {
        print!("{diff}");
    }
    eprintln!("new run recorded to {}", record.display());
    if ran.failed() {
        bail!("{} error(s) during the replay", ran.errors.len());
    }
    if !diff.is_identical() {
        bail!("the replay differs from the recording (see above)");
    }
    Ok(())
}
