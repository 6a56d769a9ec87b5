//! `baton report`: a recorded session summarised, as tables or JSON, and plotted.

use super::common::print_json;
use anyhow::Result;
use baton::lab::plot;
use baton::session::{read_session, Report};
use clap::Args;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A session file (.jsonl) written by baton.
    pub session: std::path::PathBuf,
    /// Print the report as JSON (format `baton-report`) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also draw the drift across turns to this file (.svg, or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

pub fn report(a: ReportArgs) -> Result<()> {
    let session = read_session(&a.session)?;
    let report = Report::from_session(&session);
    if a.json {
        // The tables carry the reading warnings themselves; JSON keeps stdout parseable.
        for w in &session.warnings {
            eprintln!("warning: {w}");
        }
        print_json(&report)?;
    } else {
        print!("{report}");
    }
    if let Some(path) = &a.plot {
        plot::write_plot(&report, path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}
