//! `baton bench`: mapping against re-prefill across context lengths.

use super::common::{at_least_one, human, print_json, DirectionArgs, PairArgs, PrecisionArgs};
use anyhow::{bail, Result};
use baton::bench::{sweep, BenchOptions, SweepPlan};
use candle_core::Device;
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    #[command(flatten)]
    pub direction: DirectionArgs,
    /// Context lengths in tokens.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128,256,512,1024,2048,4096,8192"
    )]
    pub lengths: Vec<usize>,
    /// Timed repeats per length (after one warm-up).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub repeats: usize,
    /// Tokens of the suffix handoff (what a target already holding the rest needs).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub suffix: usize,
    /// Also time the handoff with this re-read (a share, 0.2, or a time, 150ms,
    /// optionally :SELECTOR:SPANS; the round-trip selector is not benched), chosen for a
    /// message of 32 tokens, against the full re-prefill.
    #[arg(long)]
    pub reread: Option<baton::engine::RereadOverride>,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// Also draw map and re-prefill time against context length (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// What the flags cannot ask for together, checked before any model loads.
    pub fn validate(&self) -> Result<()> {
        if let Some(&l) = self.lengths.iter().find(|&&l| l <= self.suffix) {
            bail!(
                "--suffix {} is not shorter than the length {l} in --lengths: the suffix is the new part of a longer context; give a smaller --suffix or longer --lengths",
                self.suffix
            );
        }
        Ok(())
    }
}

pub fn bench(a: BenchArgs, dev: &Device) -> Result<()> {
    a.validate()?;
    let (first, second) = a.pair.open(dev)?;
    let plan = SweepPlan {
        lengths: &a.lengths,
        options: BenchOptions {
            repeats: a.repeats,
            suffix: a.suffix,
            reread: a.reread.and_then(|r| r.0),
        },
        mapper_dir: a.pair.mapper_dir(),
        precision: a.precision.precision.into(),
        device: format!("{:?}", dev.location()).to_lowercase(),
    };
    let directions = a.direction.pairs(&first, &second);
    let doc = sweep(&directions, &plan, &mut |line| human(a.json, line))?;
    if let Some(p) = &a.plot {
        let series: Vec<_> = doc
            .results
            .iter()
            .map(|d| baton::plot::BenchSeries {
                direction: &d.direction,
                points: &d.points,
            })
            .collect();
        baton::plot::write_bench_plot(&series, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        print_json(&doc)?;
    }
    Ok(())
}
