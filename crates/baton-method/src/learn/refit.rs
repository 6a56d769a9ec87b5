//! Solving a mapper again from statistics with the structure its calibration chose: the
//! same source layers for every target layer, the same λ and the same gains, so that
//! only what the data says changes. On the calibration's own statistics it gives back
//! the calibrated maps.

use super::LearnError;
use crate::calibrate::{CalibrationReport, DirectionStats, StatsRows};
use crate::mapper::gain::{apply_column_gains, Half};
use crate::mapper::ridge::{self, LayerMap, RidgeOptions};
use crate::mapper::{PairStats, SourceScales};

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
        self.refit_with(stats, None)
    }

    /// Every target layer solved again from `stats` with `batch` added, as if it had been
    /// added to them, but without a copy of the whole: each layer is solved from the
    /// blocks it reads with the batch added to those alone (see
    /// [`PairStats::restricted`]), so weighing an update costs a layer's blocks, not the
    /// hundreds of megabytes of the statistics.
    pub fn refit_with(
        &self,
        stats: &DirectionStats,
        batch: Option<&StatsRows<'_>>,
    ) -> Result<Refitted, LearnError> {
        let ro = RidgeOptions {
            lambda: self.lambda,
            standardize: self.standardize,
            lambda_fallback: true,
        };
        let fit = |st: &PairStats,
                   rows: Option<(&[f32], &[f32])>,
                   sources: &[Vec<usize>]|
         -> Result<Vec<LayerMap>, LearnError> {
            sources
                .iter()
                .enumerate()
                .map(|(l, s)| match (rows, batch) {
                    (Some((x, y)), Some(b)) => fit_piece(st, l, s, x, y, b.rows, &ro),
                    _ => Ok(ridge::fit_layer(st, l, s, &ro)?),
                })
                .collect()
        };
        let (key_rows, value_rows) = match batch {
            Some(b) => (
                Some((&*b.keys_x, b.keys_y)),
                Some((&*b.values_x, b.values_y)),
            ),
            None => (None, None),
        };
        let mut keys = fit(&stats.keys, key_rows, &self.key_sources)?;
        let mut values = fit(&stats.values, value_rows, &self.value_sources)?;
        let scales = match batch {
            None => SourceScales::from_stats(&stats.keys, &stats.values),
            Some(b) => {
                let (km, kd, kn) = stats.keys.x_moments_with(&b.keys_x, b.rows)?;
                let (vm, vd, vn) = stats.values.x_moments_with(&b.values_x, b.rows)?;
                SourceScales::from_moments((&km, &kd, kn), (&vm, &vd, vn))
            }
        };
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

/// Target layer `l` solved from source layers `sources` of `st` with the batch `x`, `y`
/// (`rows` rows as [`PairStats::update`] takes them) added to those blocks alone.
fn fit_piece(
    st: &PairStats,
    l: usize,
    sources: &[usize],
    x: &[f32],
    y: &[f32],
    rows: usize,
    ro: &RidgeOptions,
) -> Result<LayerMap, LearnError> {
    let mut piece = st.restricted(sources, l)?;
    let (d_s, d_t) = (st.d_s(), st.d_t());
    let (dx, dy) = (st.dx(), st.dy());
    if x.len() != rows * dx || y.len() != rows * dy {
        return Err(LearnError::Unsupported(format!(
            "an update of {rows} rows holds {} source and {} target values, not rows of \
             {dx} and {dy}",
            x.len(),
            y.len()
        )));
    }
    let px: Vec<f32> = x
        .chunks_exact(dx)
        .flat_map(|row| {
            sources
                .iter()
                .flat_map(move |&s| &row[s * d_s..(s + 1) * d_s])
        })
        .copied()
        .collect();
    let py: Vec<f32> = y
        .chunks_exact(dy)
        .flat_map(|row| &row[l * d_t..(l + 1) * d_t])
        .copied()
        .collect();
    piece.update(&px, &py, rows)?;
    let order: Vec<usize> = (0..sources.len()).collect();
    let mut map = ridge::fit_layer(&piece, 0, &order, ro)?;
    map.sources = sources.to_vec();
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::{Direction, WindowFeatures};

    fn features(rows: usize, width: usize, seed: u64) -> WindowFeatures {
        let v = |k: u64| -> Vec<f32> {
            (0..rows * width)
                .map(|i| {
                    let t = (i as u64 * 2654435761 + seed * 97 + k) % 10007;
                    (t as f32 / 10007.0 - 0.5) * 3.0 + (i % width) as f32 * 0.1
                })
                .collect()
        };
        WindowFeatures {
            keys: v(1),
            values: v(2),
            rows,
        }
    }

    #[test]
    fn weighing_a_batch_gives_the_maps_the_statistics_with_it_added_give() {
        let mut stats = DirectionStats::new(Direction::Forward, (3, 4), (2, 4), true).unwrap();
        stats
            .add(&features(60, 12, 1), &features(60, 8, 2))
            .unwrap();
        let ls = stats.keys.l_s();
        let structure = Structure {
            key_sources: vec![vec![2, 0], vec![ls - 1]],
            value_sources: vec![vec![1], vec![0, 1, 2]],
            lambda: 0.01,
            standardize: true,
            key_gains: vec![vec![1.5; 4], vec![1.0; 4]],
            value_gains: vec![vec![1.0; 4], vec![0.5; 4]],
            source_width: 4,
        };
        let (a, b) = (features(20, 12, 3), features(20, 8, 4));
        let rows = stats.rows(&a, &b).unwrap();
        let weighed = structure.refit_with(&stats, Some(&rows)).unwrap();
        drop(rows);
        stats.add(&a, &b).unwrap();
        let added = structure.refit(&stats).unwrap();
        let (mut diff, mut scale) = (0f32, 0f32);
        for (m, n) in weighed
            .keys
            .iter()
            .chain(&weighed.values)
            .zip(added.keys.iter().chain(&added.values))
        {
            assert_eq!(m.sources, n.sources);
            assert_eq!(m.info.observations, n.info.observations);
            for (p, q) in m
                .weight
                .iter()
                .chain(&m.bias)
                .zip(n.weight.iter().chain(&n.bias))
            {
                diff = diff.max((p - q).abs());
                scale = scale.max(p.abs());
            }
        }
        // The same f64 solve of the same moments, summed in another order: f32 rounding.
        assert!(diff / scale < 1e-5, "maps differ by {}", diff / scale);
        for (p, q) in [
            (&weighed.scales.key_std, &added.scales.key_std),
            (&weighed.scales.value_mean, &added.scales.value_mean),
        ] {
            for (x, y) in p.iter().zip(q.iter()) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
            }
        }
    }
}
