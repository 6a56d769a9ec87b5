//! `baton workbench` (and `baton` with no arguments): the terminal workbench on a pair;
//! `baton demo`: the same, playing the built-in demo script.

use super::common::{record_path, ConversationArgs};
use anyhow::Result;
use baton::headless::Script;
use baton::model::Placement;
use clap::{Args, Parser};

#[derive(Debug, Args, Clone)]
pub struct WorkbenchArgs {
    #[command(flatten)]
    pub conversation: ConversationArgs,
    /// Do not record the session.
    #[arg(long, conflicts_with = "record")]
    pub no_record: bool,
    /// Do not read further calibration text while the workbench is idle. By default a
    /// mapper fitted on less text than the full calibration (a first run's) reads more,
    /// a window at a time, giving way to every message and switch, takes each window
    /// that does not lower its held-out cosine, and stops at the full calibration's
    /// size. It learns as the mappers learn from conversations, so --no-learn stops it
    /// too.
    #[arg(long)]
    pub no_background_calibration: bool,
}

impl WorkbenchArgs {
    /// The options `baton` with no arguments runs with: every flag at its default.
    pub fn defaults() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            args: WorkbenchArgs,
        }
        Only::parse_from(["baton"]).args
    }
}

/// The workbench on a pair (the default pair unless told otherwise). Models are fetched
/// and missing mappers calibrated by the engine, with progress on screen; a first run
/// gets a quick mapper and a note saying how to fit the full one. With `demo`, the demo
/// script's settings come under the command line's and its steps are played.
pub fn workbench(a: WorkbenchArgs, on: &Placement, demo: bool) -> Result<()> {
    let script = demo.then(Script::demo).transpose()?;
    let c = &a.conversation;
    let mut cfg = c.engine_config(on, script.as_ref().map(|s| &s.settings));
    cfg.calibrate_missing = Some(baton::calibrate::CalibrateOptions::quick());
    cfg.learning.background_calibration = !a.no_background_calibration;
    cfg.record = match a.no_record {
        true => None,
        false => Some(record_path(c.record.as_deref())?),
    };
    let record = cfg.record.clone();
    let result = baton::workbench::run(baton::workbench::WorkbenchOptions {
        engine: cfg,
        loading_note: Some(
            "A first run calibrates a quick mapper on a small sample (a few minutes); \
             `baton calibrate` fits the full one."
                .into(),
        ),
        demo: script.map(|s| s.steps),
    });
    if let Some(p) = record.filter(|p| p.exists()) {
        eprintln!("session recorded to {}", p.display());
    }
    Ok(result?)
}
