//! Solving a mapper again from statistics with the structure its calibration chose: the
//! same source layers for every target layer, the same λ and the same gains, so that
//! only what the data says changes. On the calibration's own statistics it gives back
//! the calibrated maps.

use super::LearnError;
use crate::calibrate::{CalibrationReport, DirectionStats};
use crate::mapper::gain::{apply_column_gains, Half};
use crate::mapper::ridge::{self, LayerMap, RidgeOptions};
use crate::mapper::SourceScales;

/// What a calibration chose, all a re-solve keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Structure {
    pub key_sources: Vec<Vec<usize>>,
    pub value_sources: Vec<Vec<usize>>,
    pub lambda: f64,
    pub standardize: bool,
    /// Per target layer, one gain per column.
    pub key_gains: Vec<Vec<f32>>,
    pub value_gains: Vec<Vec<f32>>,
    /// Key/value width of one source layer.
    pub source_width: usize,
}

/// Maps solved again, with the source scales of the statistics they came from.
pub struct Refitted {
    pub keys: Vec<LayerMap>,
    pub values: Vec<LayerMap>,
    pub scales: SourceScales,
}

impl Structure {
    /// The structure of calibrated maps. A reduced-rank mapper is refused: its factors
    /// come from a step a re-solve does not repeat.
    pub fn of(
        keys: &[LayerMap],
        values: &[LayerMap],
        lambda: f64,
        standardize: bool,
        report: &CalibrationReport,
        source_width: usize,
        target_head_dim: usize,
    ) -> Result<Self, LearnError> {
        if keys.iter().chain(values).any(|m| m.factors.is_some()) {
            return Err(LearnError::Unsupported(
                "this mapper is reduced in rank (--rank), and learning solves full maps: \
                 calibrate without --rank to learn from conversations"
                    .into(),
            ));
        }
        let gains = |maps: &[LayerMap], matched: &[Vec<f32>], fixed: f32| {
            maps.iter()
                .enumerate()
                .map(|(l, m)| match matched.get(l) {
                    Some(heads) if !heads.is_empty() => heads
                        .iter()
                        .flat_map(|&g| std::iter::repeat_n(g, target_head_dim))
                        .take(m.d_t())
                        .collect(),
                    _ => vec![fixed; m.d_t()],
                })
                .collect::<Vec<Vec<f32>>>()
        };
        Ok(Self {
            key_sources: keys.iter().map(|m| m.sources.clone()).collect(),
            value_sources: values.iter().map(|m| m.sources.clone()).collect(),
            lambda,
            standardize,
            key_gains: gains(keys, &report.matched_key_gains, report.key_gain),
            value_gains: gains(values, &report.matched_value_gains, report.value_gain),
            source_width,
        })
    }

    /// Every target layer solved again from `stats`.
    pub fn refit(&self, stats: &DirectionStats) -> Result<Refitted, LearnError> {
        let ro = RidgeOptions {
            lambda: self.lambda,
            standardize: self.standardize,
            lambda_fallback: true,
        };
        let fit = |st, sources: &[Vec<usize>]| -> Result<Vec<LayerMap>, LearnError> {
            sources
                .iter()
                .enumerate()
                .map(|(l, s)| Ok(ridge::fit_layer(st, l, s, &ro)?))
                .collect()
        };
        let mut keys = fit(&stats.keys, &self.key_sources)?;
        let mut values = fit(&stats.values, &self.value_sources)?;
        let scales = SourceScales::from_stats(&stats.keys, &stats.values);
        let w = self.source_width;
        apply_column_gains(&mut keys, Half::Keys, &scales, w, &self.key_gains)?;
        apply_column_gains(&mut values, Half::Values, &scales, w, &self.value_gains)?;
        Ok(Refitted {
            keys,
            values,
            scales,
        })
    }
}
