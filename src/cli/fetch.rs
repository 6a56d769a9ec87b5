//! `baton fetch`: models and data into the cache dir; `--verify` hashes them again.

use anyhow::Result;
use baton::fetch::{self, BarProgress, FetchProgress};
use clap::Args;

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Manifest names to fetch (see assets/models.toml); default: the default pair.
    pub names: Vec<String>,
    /// A pair name from the manifest (e.g. `default`).
    #[arg(long)]
    pub pair: Option<String>,
    /// Fetch every entry of the manifest (models and data sets).
    #[arg(long, conflicts_with_all = ["names", "pair"])]
    pub all: bool,
    /// Hash every cached file again, whatever its stamp says (a start-up trusts a file
    /// whose size and modification time are unchanged), and fetch again what no longer
    /// matches; without names, every entry in the cache.
    #[arg(long)]
    pub verify: bool,
}

pub fn fetch(a: FetchArgs) -> Result<()> {
    if a.verify {
        return verify(a);
    }
    let names = fetch::Manifest::builtin()?.selection(a.all, a.pair.as_deref(), &a.names)?;
    for name in names {
        let progress = BarProgress::new();
        progress.message(&format!("{name}: checking"));
        let got = fetch::ensure_by_name(&name, &progress)?;
        drop(progress);
        let how = if got.downloaded {
            format!("fetched from {}", got.source_used)
        } else {
            "already in the cache".to_string()
        };
        eprintln!("{name}: {} ({how})", got.path.display());
    }
    Ok(())
}

fn verify(a: FetchArgs) -> Result<()> {
    let every = a.names.is_empty() && a.pair.is_none();
    let names =
        fetch::Manifest::builtin()?.selection(a.all || every, a.pair.as_deref(), &a.names)?;
    let mut damaged = 0usize;
    for name in names {
        let progress = BarProgress::new();
        let v = fetch::verify_by_name(&name, &progress)?;
        drop(progress);
        match v {
            fetch::Verified::Intact { path } => {
                eprintln!("{name}: {} (every byte checked: intact)", path.display())
            }
            fetch::Verified::Refetched { path, problem } => {
                damaged += 1;
                eprintln!("{name}: {problem}; fetched again to {}", path.display())
            }
            fetch::Verified::Absent { .. } if every => {}
            fetch::Verified::Absent { path } => {
                eprintln!(
                    "{name}: not in the cache ({}); `baton fetch {name}` fetches it",
                    path.display()
                )
            }
        }
    }
    if damaged > 0 {
        let entries = if damaged == 1 {
            "entry was"
        } else {
            "entries were"
        };
        eprintln!("{damaged} damaged {entries} replaced");
    }
    Ok(())
}
