//! The whole `baton bench` sweep: for each direction, its mapper found and timed at each
//! context length against a re-prefill, the table lines handed out as they are measured
//! (a sweep takes minutes) and the document returned at the end.

use super::bench_json::{self, BenchReport, DirectionBench};
use super::switch::{bench_point, mapper_cost, BenchOptions};
use baton_method::mapper::artifact::ArtifactError;
use baton_method::mapper::MapPrecision;
use baton_runtime::model::{Model, ModelError};
use candle_core::Device;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--lengths: {tokens} tokens is outside 2..{max} (the models' context)")]
    Length { tokens: usize, max: usize },
    #[error("--lengths: a context of {tokens} tokens is too short to hand over a suffix: the smallest length is {MIN_LENGTH} (one token before a one-token suffix)")]
    TooShort { tokens: usize },
    #[error("--lengths is empty: give one or more context lengths, e.g. --lengths 128,1024")]
    NoLengths,
    #[error("--repeats 0 times nothing: use --repeats 1 or more")]
    NoRepeats,
    #[error("--suffix 0 hands over nothing: use --suffix 1 or more")]
    NoSuffix,
    #[error("--suffix {suffix} is not shorter than the length {tokens} in --lengths: the suffix is the new part of a longer context; give a smaller --suffix or longer --lengths")]
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
    pub mapper_dir: &'a baton_method::mapper::dir::MapperDir,
    pub precision: MapPrecision,
    /// Where the models run (the report names it; off the CPU the sweep says what its
    /// speedups are against).
    pub device: &'a Device,
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
    let lengths = check_plan(plan.lengths, &plan.options)?;
    check_lengths(&lengths, max)?;
    let opts = plan.options;
    if let Some(caveat) = baton_protocol::unverified_baseline(plan.device.is_cpu()) {
        on_line(&format!("note: {caveat}"));
    }
    let mut results = Vec::new();
    for &(s, t) in directions {
        let (art, mapper) = plan.mapper_dir.open_for(s, t)?;
        let mapper = mapper.with_precision(plan.precision)?;
        let direction = format!("{} -> {}", s.identity.name, t.identity.name);
        let cost = mapper_cost(&mapper);
        on_line(&bench_json::cost_line(&direction, art.meta.k, &cost));
        on_line(&bench_json::table_header());
        let mut points = Vec::new();
        for &n in &lengths {
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
        device: match directions.first() {
            Some((s, _)) => s.decoder.device_label(),
            None => format!("{:?}", plan.device.location()).to_lowercase(),
        },
        repeats: opts.repeats,
        suffix: opts.suffix,
        results,
    })
}

/// The shortest context a suffix can be handed over in: one token before a one-token
/// suffix.
pub const MIN_LENGTH: usize = 2;

/// The lengths to time, each once in the order given, once they and the options are
/// known to ask for what can be timed: nothing is quietly changed. Needs no model, so a
/// command checks its flags with it before loading any.
pub fn check_plan(lengths: &[usize], opts: &BenchOptions) -> Result<Vec<usize>, BenchError> {
    if lengths.is_empty() {
        return Err(BenchError::NoLengths);
    }
    if let Some(&tokens) = lengths.iter().find(|&&l| l < MIN_LENGTH) {
        return Err(BenchError::TooShort { tokens });
    }
    if opts.repeats == 0 {
        return Err(BenchError::NoRepeats);
    }
    if opts.suffix == 0 {
        return Err(BenchError::NoSuffix);
    }
    if let Some(&tokens) = lengths.iter().find(|&&l| opts.suffix >= l) {
        return Err(BenchError::Suffix {
            suffix: opts.suffix,
            tokens,
        });
    }
    // A length given twice would be timed twice and drawn as two points.
    let mut distinct = Vec::with_capacity(lengths.len());
    for &l in lengths {
        if !distinct.contains(&l) {
            distinct.push(l);
        }
    }
    Ok(distinct)
}

/// Every length must fit both models' context.
fn check_lengths(lengths: &[usize], max: usize) -> Result<(), BenchError> {
    match lengths.iter().find(|&&l| l >= max) {
        Some(&tokens) => Err(BenchError::Length { tokens, max }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(repeats: usize, suffix: usize) -> BenchOptions {
        BenchOptions {
            repeats,
            suffix,
            reread: None,
        }
    }

    #[test]
    fn zero_repeats_and_a_suffix_outside_every_length_are_refused_not_clamped() {
        assert_eq!(check_plan(&[128, 1024], &o(3, 64)).unwrap(), [128, 1024]);
        assert!(matches!(
            check_plan(&[128], &o(0, 64)),
            Err(BenchError::NoRepeats)
        ));
        let e = check_plan(&[1024, 128], &o(3, 128))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--suffix 128")
                && e.contains("length 128")
                && e.contains("smaller --suffix"),
            "{e}"
        );
        assert!(matches!(
            check_plan(&[128], &o(3, 0)),
            Err(BenchError::NoSuffix)
        ));
    }

    #[test]
    fn a_length_too_short_for_any_suffix_is_refused_for_itself() {
        for short in [0, 1] {
            let e = check_plan(&[128, short], &o(3, 1)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{short} tokens is too short"))
                    && e.contains("smallest length is 2"),
                "{e}"
            );
            assert!(!e.contains("--suffix"), "{e}");
        }
        // The length is named even when the suffix is too long for it as well.
        let e = check_plan(&[1], &o(3, 64)).unwrap_err().to_string();
        assert!(e.contains("1 tokens is too short"), "{e}");
        assert_eq!(check_plan(&[2], &o(3, 1)).unwrap(), [2]);
        assert!(matches!(
            check_plan(&[], &o(3, 1)),
            Err(BenchError::NoLengths)
        ));
    }

    #[test]
    fn a_length_given_twice_is_timed_once_in_the_order_given() {
        assert_eq!(
            check_plan(&[512, 128, 512, 256, 128], &o(3, 64)).unwrap(),
            [512, 128, 256]
        );
    }

    #[test]
    fn a_length_past_the_context_is_refused_by_value() {
        assert!(check_lengths(&[2, 512, 2047], 2048).is_ok());
        let e = check_lengths(&[512, 2048], 2048).unwrap_err().to_string();
        assert!(e.contains("2048 tokens is outside 2..2048"), "{e}");
    }
}
