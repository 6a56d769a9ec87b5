//! Gain around the mean: ridge predictions are shrunk toward the mean of what they
//! predict (a key R² of 0.65 leaves the mapped keys with about two thirds of the true
//! keys' variance), so the target's attention logits q·k̂ come out smaller and its
//! attention flatter than on its own keys, which blurs the retrieval of one exact
//! token. A gain `g` stretches each prediction away from the mean prediction ȳ:
//!
//! ```text
//! ŷ' = ȳ + g·(ŷ − ȳ) = x·(g·W) + (g·b + (1 − g)·ȳ),   ȳ = μ_x·W + b
//! ```
//!
//! with `μ_x` the calibration mean of the source features the map reads. It is folded
//! into the weights and bias, so it costs nothing when mapping.

use super::ridge::LayerMap;
use super::MapperError;
use super::SourceScales;

/// The gain that leaves a map as fitted: the default of every stored gain field.
pub fn unit() -> f32 {
    1.0
}

/// Which of a map's two halves a gain applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    Keys,
    Values,
}

/// Applies `gain` around the mean prediction to every layer map of `maps`, whose source
/// features have width `source_width` per source layer and the calibration means in
/// `scales`.
pub fn apply_gain(
    maps: &mut [LayerMap],
    half: Half,
    scales: &SourceScales,
    source_width: usize,
    gain: f32,
) -> Result<(), MapperError> {
    let gains: Vec<Vec<f32>> = maps.iter().map(|m| vec![gain; m.bias.len()]).collect();
    apply_column_gains(maps, half, scales, source_width, &gains)
}

/// Applies a gain per target column: `gains[l][c]` to column `c` of layer map `l`.
pub fn apply_column_gains(
    maps: &mut [LayerMap],
    half: Half,
    scales: &SourceScales,
    source_width: usize,
    gains: &[Vec<f32>],
) -> Result<(), MapperError> {
    if gains.len() != maps.len() {
        return Err(MapperError::Options(format!(
            "{} layers of gains for {} layer maps",
            gains.len(),
            maps.len()
        )));
    }
    if let Some(&g) = gains
        .iter()
        .flatten()
        .find(|g| !g.is_finite() || **g <= 0.0)
    {
        return Err(MapperError::Options(format!(
            "a gain must be a positive number, got {g}"
        )));
    }
    let means = match half {
        Half::Keys => &scales.key_mean,
        Half::Values => &scales.value_mean,
    };
    for (m, gain) in maps.iter_mut().zip(gains) {
        let mu: Vec<f32> = m
            .sources
            .iter()
            .map(|&s| {
                means
                    .get(s * source_width..(s + 1) * source_width)
                    .ok_or_else(|| {
                        MapperError::MapShape(format!(
                            "source layer {s} has no calibration mean (the scales cover {} values)",
                            means.len()
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let cols = m.bias.len();
        if m.weight.len() != mu.len() * cols || gain.len() != cols {
            return Err(MapperError::MapShape(format!(
                "a {}-value map does not read {} source features into {cols} (with {} gains)",
                m.weight.len(),
                mu.len(),
                gain.len()
            )));
        }
        let mut mean = m.bias.clone();
        for (i, &x) in mu.iter().enumerate() {
            let row = &m.weight[i * cols..(i + 1) * cols];
            for (y, &w) in mean.iter_mut().zip(row) {
                *y += x * w;
            }
        }
        for row in m.weight.chunks_exact_mut(cols) {
            for (w, g) in row.iter_mut().zip(gain) {
                *w *= g;
            }
        }
        for ((b, y), g) in m.bias.iter_mut().zip(&mean).zip(gain) {
            *b = g * *b + (1.0 - g) * y;
        }
        // W = L·R: the columns' gains go on R's columns.
        if let Some(f) = m.factors.as_mut() {
            for row in f.right.chunks_exact_mut(cols) {
                for (w, g) in row.iter_mut().zip(gain) {
                    *w *= g;
                }
            }
        }
    }
    Ok(())
}

/// The gain per head of each layer that gives the mapped keys (or values) the spread of
/// the true ones on held-out statistics: `√(Σ s_yy / Σ spread)` over the head's columns,
/// the inverse of the shrinkage ridge applies, clipped to [1, 2] so that a head the map
/// barely explains is not blown up. Expanded to one gain per column.
pub fn matched_gains(
    true_spread: &[Vec<f64>],
    mapped_spread: &[Vec<f64>],
    head_dim: usize,
) -> Vec<Vec<f32>> {
    true_spread
        .iter()
        .zip(mapped_spread)
        .map(|(t, m)| {
            t.chunks(head_dim.max(1))
                .zip(m.chunks(head_dim.max(1)))
                .flat_map(|(th, mh)| {
                    let (st, sm) = (th.iter().sum::<f64>(), mh.iter().sum::<f64>());
                    let g = if sm > 0.0 { (st / sm).sqrt() } else { 1.0 };
                    std::iter::repeat_n(g.clamp(1.0, 2.0) as f32, th.len())
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapper::ridge::FitInfo;

    fn map() -> LayerMap {
        LayerMap {
            sources: vec![1],
            // 2 source features -> 2 target features
            weight: vec![1.0, 2.0, 3.0, 4.0],
            bias: vec![0.5, -1.0],
            info: FitInfo::default(),
            factors: None,
        }
    }

    fn scales() -> SourceScales {
        SourceScales {
            key_mean: vec![9.0, 9.0, 1.0, -1.0],
            key_std: vec![1.0; 4],
            value_mean: vec![0.0; 4],
            value_std: vec![1.0; 4],
        }
    }

    fn predict(m: &LayerMap, x: [f32; 2]) -> [f32; 2] {
        let c = m.bias.len();
        let mut y = [m.bias[0], m.bias[1]];
        for (i, xi) in x.iter().enumerate() {
            for (j, yj) in y.iter_mut().enumerate() {
                *yj += xi * m.weight[i * c + j];
            }
        }
        y
    }

    #[test]
    fn the_mean_prediction_stays_and_deviations_from_it_scale_by_the_gain() {
        let before = map();
        let mut after = vec![map()];
        apply_gain(&mut after, Half::Keys, &scales(), 2, 1.5).unwrap();
        // Layer 1's features have mean (1, -1).
        let at_mean = predict(&after[0], [1.0, -1.0]);
        let was = predict(&before, [1.0, -1.0]);
        assert_eq!(at_mean, was);
        let x = [3.0, 0.5];
        let (y0, y1) = (predict(&before, x), predict(&after[0], x));
        for j in 0..2 {
            assert!((y1[j] - was[j] - 1.5 * (y0[j] - was[j])).abs() < 1e-5);
        }
    }

    #[test]
    fn a_gain_of_one_changes_nothing_and_a_bad_gain_is_refused() {
        let mut m = vec![map()];
        apply_gain(&mut m, Half::Values, &scales(), 2, 1.0).unwrap();
        assert_eq!(m[0].weight, map().weight);
        assert_eq!(m[0].bias, map().bias);
        for g in [0.0, -1.0, f32::NAN] {
            assert!(apply_gain(&mut m, Half::Keys, &scales(), 2, g).is_err());
        }
    }

    #[test]
    fn column_gains_scale_each_column_around_its_own_mean() {
        let before = map();
        let mut after = vec![map()];
        apply_column_gains(&mut after, Half::Keys, &scales(), 2, &[vec![2.0, 1.0]]).unwrap();
        let was = predict(&before, [1.0, -1.0]);
        assert_eq!(predict(&after[0], [1.0, -1.0]), was);
        let x = [3.0, 0.5];
        let (y0, y1) = (predict(&before, x), predict(&after[0], x));
        assert!((y1[0] - was[0] - 2.0 * (y0[0] - was[0])).abs() < 1e-5);
        assert!((y1[1] - y0[1]).abs() < 1e-6);
        assert!(apply_column_gains(&mut after, Half::Keys, &scales(), 2, &[vec![1.0]]).is_err());
    }

    #[test]
    fn matched_gains_undo_the_shrinkage_per_head_within_their_bounds() {
        // Head 0: the map keeps a quarter of the spread (gain 2); head 1: 0.64 (1.25);
        // head 2: more than the truth (never shrunk below 1).
        let t = vec![vec![4.0, 4.0, 1.0, 1.0, 1.0, 1.0]];
        let m = vec![vec![1.0, 1.0, 0.64, 0.64, 2.0, 2.0]];
        let g = matched_gains(&t, &m, 2);
        assert_eq!(g[0].len(), 6);
        assert!((g[0][0] - 2.0).abs() < 1e-6 && (g[0][1] - 2.0).abs() < 1e-6);
        assert!((g[0][2] - 1.25).abs() < 1e-6);
        assert_eq!(g[0][4], 1.0);
        // A tenth of the spread would ask for 3.16: clipped at 2.
        let g = matched_gains(&[vec![10.0]], &[vec![1.0]], 1);
        assert_eq!(g[0][0], 2.0);
    }
}
