//! The whole `baton bench` sweep: for each direction, its mapper found and timed at each
//! context length against a re-prefill, the table lines handed out as they are measured
//! (a sweep takes minutes) and the document returned at the end.

use super::bench_json::{self, BenchReport, DirectionBench};
use super::switch::{bench_point, mapper_cost, BenchOptions};
use crate::mapper::artifact::{self, ArtifactError};
use crate::mapper::MapPrecision;
use crate::model::{Model, ModelError};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--lengths: {tokens} tokens is outside 2..{max} (the models' context)")]
    Length { tokens: usize, max: usize },
    #[error("--repeats 0 times nothing: use --repeats 1 or more")]
    NoRepeats,
    #[error("--suffix {suffix} must be at least 1 and shorter than every length (here {tokens}): the suffix is the new part of a longer context")]
    Suffix { suffix: usize, tokens: usize },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// What to sweep.
pub struct SweepPlan<'a> {
    pub lengths: &'a [usize],
    pub options: BenchOptions,
    /// Where the mappers are (the cache dir's mappers/ when `None`).
    pub mapper_dir: Option<&'a Path>,
    pub precision: MapPrecision,
    /// Where it runs, as the report names it.
    pub device: String,
}

/// Times each (source, target) of `directions` at every length of `plan`; each line of
/// the tables goes to `on_line` as soon as it is known.
pub fn sweep(
    directions: &[(&Model, &Model)],
    plan: &SweepPlan<'_>,
    on_line: &mut dyn FnMut(&str),
) -> Result<BenchReport, BenchError> {
    let max = directions
        .iter()
        .map(|(s, t)| s.config().context_length.min(t.config().context_length))
        .min()
        .unwrap_or(0);
    check_lengths(plan.lengths, max)?;
    check_options(plan.lengths, &plan.options)?;
    let opts = plan.options;
    let mut results = Vec::new();
    for &(s, t) in directions {
        let (art, mapper) = artifact::open_for(plan.mapper_dir, s, t)?;
        let mapper = mapper.with_precision(plan.precision)?;
        let direction = format!("{} -> {}", s.identity.name, t.identity.name);
        let cost = mapper_cost(&mapper);
        on_line(&bench_json::cost_line(&direction, art.meta.k, &cost));
        on_line(&bench_json::table_header());
        let mut points = Vec::new();
        for &n in plan.lengths {
            let p = bench_point(s, t, &mapper, n, &opts)?;
            on_line(&bench_json::table_row(&p));
            points.push(p);
        }
        let d = DirectionBench::new(direction, art.path, art.meta.k, cost, points);
        if let Some(line) = d.growth_line() {
            on_line(&line);
        }
        results.push(d);
    }
    Ok(BenchReport {
        format: bench_json::FORMAT.into(),
        version: bench_json::VERSION,
        device: plan.device.clone(),
        repeats: opts.repeats,
        suffix: opts.suffix,
        results,
    })
}

/// Every length must leave room for a suffix and fit both models' context.
fn check_lengths(lengths: &[usize], max: usize) -> Result<(), BenchError> {
    match lengths.iter().find(|&&l| l >= max || l < 2) {
        Some(&tokens) => Err(BenchError::Length { tokens, max }),
        None => Ok(()),
    }
}

/// What the options ask for must be what is timed: nothing is quietly changed.
fn check_options(lengths: &[usize], opts: &BenchOptions) -> Result<(), BenchError> {
    if opts.repeats == 0 {
        return Err(BenchError::NoRepeats);
    }
    match lengths
        .iter()
        .find(|&&l| opts.suffix == 0 || opts.suffix >= l)
    {
        Some(&tokens) => Err(BenchError::Suffix {
            suffix: opts.suffix,
            tokens,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_repeats_and_a_suffix_outside_every_length_are_refused_not_clamped() {
        let o = |repeats, suffix| BenchOptions {
            repeats,
            suffix,
            reread: None,
        };
        assert!(check_options(&[128, 1024], &o(3, 64)).is_ok());
        assert!(matches!(
            check_options(&[128], &o(0, 64)),
            Err(BenchError::NoRepeats)
        ));
        let e = check_options(&[1024, 128], &o(3, 128))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--suffix 128") && e.contains("here 128"), "{e}");
        assert!(check_options(&[128], &o(3, 0)).is_err());
    }

    #[test]
    fn a_length_past_the_context_or_below_two_is_refused_by_value() {
        assert!(check_lengths(&[2, 512, 2047], 2048).is_ok());
        let e = check_lengths(&[512, 2048], 2048).unwrap_err().to_string();
        assert!(e.contains("2048 tokens is outside 2..2048"), "{e}");
        let e = check_lengths(&[1], 2048).unwrap_err().to_string();
        assert!(e.contains("1 tokens"), "{e}");
    }
}
