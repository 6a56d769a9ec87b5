//! The residual map: the source's residual stream at one of its layers to the target's at
//! its layer `m`, one ridge over the hidden features (a single "layer" of width
//! `hidden` on each side of [`PairStats`]). With it the target computes its own layers
//! `m..L` over every handed position ([`baton_runtime::model::Decoder::upper_layers`]).
//!
//! A residual stream carries far more of a token than its keys and values do (896
//! features a position at the 0.5B's every layer against 128 of keys), and the token's
//! identity stays in it; the target's upper keys and values computed from it agree with
//! each other, as no per-layer map of keys and values can.

use super::error::{MapperError, Result};
use super::ridge::{fit_layer, r2, RidgeOptions};
use super::stats::PairStats;
use candle_core::{DType, Device, Tensor};

/// The source layer whose residual stream feeds target layer `target_layer`: the one at
/// the same depth, as a share of each model's layers.
pub fn matching_layer(target_layer: usize, target_layers: usize, source_layers: usize) -> usize {
    let share = target_layer as f64 / target_layers.max(1) as f64;
    ((share * source_layers as f64).round() as usize).min(source_layers)
}

/// A fitted residual map.
#[derive(Debug, Clone)]
pub struct ResidualMap {
    /// The source's residual stream entering this layer is the input.
    pub source_layer: usize,
    /// The target's residual stream entering this layer is the output.
    pub target_layer: usize,
    /// R² of the fit on its own observations, pooled over the target's features.
    pub r2: f64,
    pub observations: u64,
    /// [source hidden, target hidden].
    weight: Tensor,
    /// [target hidden].
    bias: Tensor,
}

impl ResidualMap {
    /// Fit from statistics of one source and one target "layer" (the two hidden widths).
    pub fn fit(
        stats: &PairStats,
        source_layer: usize,
        target_layer: usize,
        lambda: f64,
        device: &Device,
    ) -> Result<Self> {
        if stats.l_s() != 1 || stats.l_t() != 1 {
            return Err(MapperError::MapShape(format!(
                "a residual map fits one stream on each side; the statistics hold {} and {}",
                stats.l_s(),
                stats.l_t()
            )));
        }
        let opts = RidgeOptions {
            lambda,
            ..RidgeOptions::default()
        };
        let map = fit_layer(stats, 0, &[0], &opts)?;
        let fitted = r2(stats, 0, &map)?;
        let (d_s, d_t) = (stats.d_s(), stats.d_t());
        let weight = Tensor::from_vec(map.weight.clone(), (d_s, d_t), device)?;
        let bias = Tensor::from_vec(map.bias.clone(), d_t, device)?;
        Ok(Self {
            source_layer,
            target_layer,
            r2: fitted,
            observations: stats.count(),
            weight,
            bias,
        })
    }

    /// A map from its parts: `weight` [source hidden × target hidden] row-major, `bias`
    /// [target hidden].
    pub fn from_parts(
        source_layer: usize,
        target_layer: usize,
        r2: f64,
        observations: u64,
        weight: Vec<f32>,
        bias: Vec<f32>,
        device: &Device,
    ) -> Result<Self> {
        let d_t = bias.len();
        if d_t == 0 || !weight.len().is_multiple_of(d_t) {
            return Err(MapperError::MapShape(format!(
                "a residual map of {} weights and {d_t} biases",
                weight.len()
            )));
        }
        let d_s = weight.len() / d_t;
        Ok(Self {
            source_layer,
            target_layer,
            r2,
            observations,
            weight: Tensor::from_vec(weight, (d_s, d_t), device)?,
            bias: Tensor::from_vec(bias, d_t, device)?,
        })
    }

    /// The weight (row-major, [source hidden × target hidden]) and bias, on the host.
    pub fn parts(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((
            self.weight.flatten_all()?.to_vec1::<f32>()?,
            self.bias.to_vec1::<f32>()?,
        ))
    }

    /// The widths: source hidden, target hidden.
    pub fn widths(&self) -> (usize, usize) {
        let d = self.weight.dims();
        (d[0], d[1])
    }

    /// The target's residual stream for source rows `x` ([rows, source hidden]), in f32.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?.to_device(self.weight.device())?;
        Ok(x.matmul(&self.weight)?.broadcast_add(&self.bias)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_match_by_depth() {
        assert_eq!(matching_layer(14, 28, 24), 12);
        assert_eq!(matching_layer(21, 28, 24), 18);
        assert_eq!(matching_layer(28, 28, 24), 24);
        assert_eq!(matching_layer(0, 28, 24), 0);
    }

    #[test]
    fn a_linear_relation_between_streams_is_found_and_applied() -> Result<()> {
        // y = 2·x0 − x1 + 3, y1 = x2: the fit recovers it (ridge shrinks a little).
        let mut stats = PairStats::new(1, 3, 1, 2)?;
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..200 {
            let a = [
                (i as f32 * 0.37).sin(),
                (i as f32 * 0.11).cos(),
                i as f32 / 200.0,
            ];
            x.extend_from_slice(&a);
            y.extend_from_slice(&[2.0 * a[0] - a[1] + 3.0, a[2]]);
        }
        stats.update(&x, &y, 200)?;
        let m = ResidualMap::fit(&stats, 3, 5, 1e-6, &Device::Cpu)?;
        assert!(m.r2 > 0.999, "{}", m.r2);
        let got = m.apply(&Tensor::new(&[[1.0f32, 0.0, 0.5]], &Device::Cpu)?)?;
        let got = got.to_vec2::<f32>()?;
        assert!((got[0][0] - 5.0).abs() < 1e-2, "{got:?}");
        assert!((got[0][1] - 0.5).abs() < 1e-2, "{got:?}");
        Ok(())
    }
}
