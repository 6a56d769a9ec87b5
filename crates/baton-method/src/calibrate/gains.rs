//! The gain step of a calibration: a fixed gain around the mean prediction on all key
//! (or value) maps, or per head the gain that gives the mapped keys the spread of the
//! true ones on the held-out windows (`matched`), folded into the chosen maps and
//! scored again (see [`crate::mapper::gain`]).

use super::heldout::{ScoreMaps, Scored};
use super::{CalibrateError, CalibrateOptions, CalibrationProgress};
use crate::mapper::gain::{apply_column_gains, apply_gain, matched_gains, Half};
use crate::mapper::ridge::{self, LayerMap};
use crate::mapper::PairStats;
use crate::mapper::SourceScales;

/// How one half's gain is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GainRule {
    Fixed(f32),
    /// Per head, from held-out statistics: see [`matched_gains`].
    Matched,
}

impl GainRule {
    pub fn of(opts: &CalibrateOptions, half: Half) -> Self {
        let (matched, fixed) = match half {
            Half::Keys => (opts.key_gain_matched, opts.key_gain),
            Half::Values => (opts.value_gain_matched, opts.value_gain),
        };
        if matched {
            GainRule::Matched
        } else {
            GainRule::Fixed(fixed)
        }
    }

    fn is_unit(self) -> bool {
        self == GainRule::Fixed(1.0)
    }
}

/// The geometry and statistics the gain step reads.
pub struct GainInputs<'a> {
    pub scales: &'a SourceScales,
    /// Key/value width of one source layer.
    pub source_width: usize,
    pub target_head_dim: usize,
    /// Held-out statistics of keys and values.
    pub held_keys: &'a PairStats,
    pub held_values: &'a PairStats,
}

/// Gains applied per target layer and head, for the report (empty for a fixed gain).
#[derive(Debug, Default)]
pub struct AppliedGains {
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

/// Applies the rules of `opts` to `full` and scores the result; unchanged when both are
/// a gain of 1.
pub fn apply(
    full: Scored,
    opts: &CalibrateOptions,
    inputs: &GainInputs<'_>,
    scorer: &dyn ScoreMaps,
    progress: &dyn CalibrationProgress,
) -> Result<(Scored, AppliedGains), CalibrateError> {
    let (kr, vr) = (
        GainRule::of(opts, Half::Keys),
        GainRule::of(opts, Half::Values),
    );
    if kr.is_unit() && vr.is_unit() {
        return Ok((full, AppliedGains::default()));
    }
    let Scored {
        mut keys,
        mut values,
        ..
    } = full;
    let k = one_half(&mut keys, Half::Keys, kr, inputs.held_keys, inputs)?;
    let v = one_half(&mut values, Half::Values, vr, inputs.held_values, inputs)?;
    let held = scorer.score(&keys, &values)?;
    progress.note(&format!(
        "gains K {} V {}: held-out cosine {:.4}, top-1 {:.4}",
        describe(kr, &k),
        describe(vr, &v),
        held.mean_cosine(),
        held.agreement.top1
    ));
    Ok((
        Scored { keys, values, held },
        AppliedGains { keys: k, values: v },
    ))
}

fn describe(rule: GainRule, applied: &[Vec<f32>]) -> String {
    match rule {
        GainRule::Fixed(g) => g.to_string(),
        GainRule::Matched => {
            let all: Vec<f32> = applied.iter().flatten().copied().collect();
            let mean = all.iter().sum::<f32>() / all.len().max(1) as f32;
            let max = all.iter().copied().fold(0.0f32, f32::max);
            format!("matched (mean {mean:.3}, max {max:.3})")
        }
    }
}

/// One half's gains, applied; per layer and head where matched.
fn one_half(
    maps: &mut [LayerMap],
    half: Half,
    rule: GainRule,
    held: &PairStats,
    inputs: &GainInputs<'_>,
) -> Result<Vec<Vec<f32>>, CalibrateError> {
    match rule {
        GainRule::Fixed(g) => {
            apply_gain(maps, half, inputs.scales, inputs.source_width, g)?;
            Ok(Vec::new())
        }
        GainRule::Matched => {
            let (mut truth, mut mapped) = (Vec::new(), Vec::new());
            for (l, m) in maps.iter().enumerate() {
                let r = ridge::residuals(held, l, m)?;
                truth.push(r.sst);
                mapped.push(r.spread);
            }
            let hd = inputs.target_head_dim;
            let gains = matched_gains(&truth, &mapped, hd);
            apply_column_gains(maps, half, inputs.scales, inputs.source_width, &gains)?;
            Ok(gains
                .iter()
                .map(|l| l.iter().step_by(hd.max(1)).copied().collect())
                .collect())
        }
    }
}
