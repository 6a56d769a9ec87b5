//! `baton mappers`: the mapper artifacts in the cache dir (or `--mapper-dir`), or forget
//! what they learned.

use super::common::{print_json, MapperDirArgs};
use anyhow::Result;
use baton::console::mappers::{reset_learned, MapperListing};
use clap::Args;

#[derive(Debug, Args)]
pub struct MappersArgs {
    /// Print the listing as JSON (format `baton.mappers`).
    #[arg(long)]
    pub json: bool,
    /// Forget what the mappers learned from conversations, returning each to its
    /// calibration (the calibration's own statistics stay).
    #[arg(long)]
    pub reset_learned: bool,
    #[command(flatten)]
    pub mappers: MapperDirArgs,
}

pub fn mappers(a: MappersArgs) -> Result<()> {
    let dir = a.mappers.dir();
    if a.reset_learned {
        let forgot = reset_learned(&dir, &mut |direction| {
            println!("{direction}: back to its calibration")
        })?;
        if forgot == 0 {
            println!("no mapper has learned anything: nothing to reset");
        }
        return Ok(());
    }
    let listing = MapperListing::read(&dir)?;
    if a.json {
        print_json(&listing)?;
    } else {
        print!("{listing}");
    }
    Ok(())
}
