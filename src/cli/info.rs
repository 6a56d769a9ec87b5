//! `baton info`: a model's architecture, KV geometry, tokenizer and checksum.

use super::common::print_json;
use anyhow::Result;
use baton::fetch::{self, BarProgress};
use baton::model::Placement;
use clap::Args;

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// A .gguf file, a safetensors directory, hf:OWNER/REPO/FILE, or a manifest name.
    #[arg(long, short)]
    pub model: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn info(a: InfoArgs, on: &Placement) -> Result<()> {
    let m = fetch::open_model_on(&a.model, on, &BarProgress::new())?;
    let summary = baton::console::info::ModelSummary::of(&m);
    if a.json {
        print_json(&summary)?;
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}
