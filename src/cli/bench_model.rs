//! `baton bench-model`: prefill and decode of baton's decoder, beside candle-transformers'
//! quantized model on the same file where the build has it.

use super::common::{at_least_one, human, print_json};
use anyhow::Result;
use baton::fetch::{self, BarProgress};
use baton::lab::bench::decoder;
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Models to time (default: both models of the default pair).
    #[arg(long, short)]
    pub model: Vec<String>,
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    pub decode_len: usize,
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub repeats: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn bench_model(a: BenchModelArgs) -> Result<()> {
    // Nothing named: both models of the default pair.
    let names = fetch::Manifest::builtin()?.selection(false, None, &a.model)?;
    if !decoder::PEER_BUILT {
        eprintln!("timing baton alone: this build has no peer to compare with (cargo run --release --features peer-bench -- bench-model)");
    }
    let mut all = Vec::new();
    for name in &names {
        let progress = BarProgress::new();
        let resolved = fetch::resolve_model(name, &progress)?;
        drop(progress);
        eprintln!(
            "timing {name} ({} prompt tokens, {} decode steps, {} repeats)...",
            a.prompt_len, a.decode_len, a.repeats
        );
        let rows = decoder::bench_model(&resolved.path, a.prompt_len, a.decode_len, a.repeats)?;
        let bench = decoder::ModelBench {
            model: name.clone(),
            rows,
        };
        for line in bench.lines() {
            human(a.json, &line);
        }
        all.push(bench);
    }
    if a.json {
        print_json(&all)?;
    }
    Ok(())
}
