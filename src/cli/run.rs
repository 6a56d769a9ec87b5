//! `baton run`: a scripted conversation without the terminal UI, recorded as a session.

use super::common::{record_path, ConversationArgs};
use anyhow::{bail, Result};
use baton::headless::{run_headless, Script};
use baton::model::Placement;
use clap::Args;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script (see assets/demo.toml); the command line's settings go over its own.
    #[arg(long)]
    pub script: std::path::PathBuf,
    #[command(flatten)]
    pub conversation: ConversationArgs,
}

pub fn run(a: RunArgs, on: &Placement) -> Result<()> {
    let script = Script::load(&a.script)?;
    let mut cfg = a.conversation.engine_config(on, Some(&script.settings));
    let record = record_path(a.conversation.record.as_deref())?;
    cfg.record = Some(record.clone());
    let mut printer = baton::console::EventPrinter::new();
    let ran = run_headless(cfg, &script.steps, &mut |e| printer.print(e))?;
    eprintln!("session recorded to {}", record.display());
    if ran.failed() {
        bail!(
            "{} error(s) during the run (the first: {}); the session keeps everything up to them",
            ran.errors.len(),
            ran.errors[0]
        );
    }
    Ok(())
}
