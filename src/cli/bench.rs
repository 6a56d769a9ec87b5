//! `baton bench`: mapping against re-prefill across context lengths.

use super::common::{at_least_one, human, print_json, DirectionArgs, PairArgs, PrecisionArgs};
use anyhow::Result;
use baton::lab::bench::{check_plan, sweep, BenchOptions, SweepPlan};
use baton::model::Placement;
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
    fn options(&self) -> BenchOptions {
        BenchOptions {
            repeats: self.repeats,
            suffix: self.suffix,
            reread: self.reread.and_then(|r| r.0),
        }
    }

    /// What the flags cannot ask for together, checked before any model loads; the
    /// lengths to time, each once.
    pub fn validate(&self) -> Result<Vec<usize>> {
        Ok(check_plan(&self.lengths, &self.options())?)
    }
}

pub fn bench(a: BenchArgs, on: &Placement) -> Result<()> {
    let lengths = a.validate()?;
    let (first, second) = a.pair.open(on)?;
    let mapper_dir = a.pair.mapper_dir();
    let plan = SweepPlan {
        lengths: &lengths,
        options: a.options(),
        mapper_dir: &mapper_dir,
        precision: a.precision.precision.into(),
        device: &on.device,
    };
    let directions = a.direction.pairs(&first, &second);
    let doc = sweep(&directions, &plan, &mut |line| human(a.json, line))?;
    if let Some(p) = &a.plot {
        let series: Vec<_> = doc
            .results
            .iter()
            .map(|d| baton::lab::plot::BenchSeries {
                direction: &d.direction,
                points: &d.points,
            })
            .collect();
        baton::lab::plot::write_bench_plot(&series, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        print_json(&doc)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn validate(args: &[&str]) -> Result<Vec<usize>> {
        Cmd::try_parse_from([&["bench"], args].concat())
            .unwrap()
            .bench
            .validate()
    }

    #[test]
    fn a_length_below_two_is_named_and_repeated_lengths_run_once() {
        for l in ["0", "1"] {
            let e = validate(&["--lengths", l, "--suffix", "1"])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("{l} tokens is too short"))
                    && e.contains("smallest length is 2"),
                "{e}"
            );
        }
        assert_eq!(
            validate(&["--lengths", "256,128,256", "--suffix", "8"]).unwrap(),
            [256, 128]
        );
        assert_eq!(validate(&[]).unwrap().len(), 7);
    }
}
