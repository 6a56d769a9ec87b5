//! How well a map fits: residual sums and R² on any statistics, held-out ones included,
//! from the sums alone.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use super::{target_columns, LayerMap, Problem};
use crate::mapper::error::{MapperError, Result};
use crate::mapper::stats::PairStats;

/// Per-column residual and total sums of squares of a map on some statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Residuals {
    /// `Σ (y − ŷ)²` per target column.
    pub sse: Vec<f64>,
    /// `Σ (y − ȳ)²` per target column, around these statistics' own mean.
    pub sst: Vec<f64>,
    /// `Σ (ŷ − mean ŷ)²` per target column: the spread of the predictions, which ridge
    /// shrinks below `sst`.
    pub spread: Vec<f64>,
    pub count: u64,
}

impl Residuals {
    /// Pooled `1 − ΣSSE / ΣSST` over all columns of the layer.
    pub fn r2(&self) -> f64 {
        let sse: f64 = self.sse.iter().sum();
        let sst: f64 = self.sst.iter().sum();
        1.0 - sse / sst
    }
}

/// Pooled R² of `map` for `target_layer` on `stats`, which may be held-out statistics the
/// map never saw: computed from the sums alone (see [`residuals`]).
pub fn r2(stats: &PairStats, target_layer: usize, map: &LayerMap) -> Result<f64> {
    residuals(stats, target_layer, map).map(|r| r.r2())
}

/// Residual sums of `map` on `stats` from the sums alone. With `e = y − xW − b` and the
/// statistics' means `μ_x, μ_y`, split `e = (y − μ_y) − (x − μ_x)W + c` with
/// `c = μ_y − μ_xᵀW − b`; the centred parts sum to zero, so per column
///
/// `SSE = s_yy − 2·(Wᵀ C_xy)_cc + (Wᵀ C_xx W)_cc + n·c_c²`
///
/// and `SST = s_yy`. Rounding can make a near-perfect fit's SSE a hair negative; it is
/// clamped at zero.
pub fn residuals(stats: &PairStats, target_layer: usize, map: &LayerMap) -> Result<Residuals> {
    let cols = target_columns(stats, target_layer)?;
    let d_t = stats.d_t();
    if map.bias.len() != d_t || map.weight.len() != map.sources.len() * stats.d_s() * d_t {
        return Err(MapperError::MapShape(format!(
            "map is {}×{} with {} source layers; these statistics have D_s {} and D_t {d_t}",
            map.in_width(),
            map.d_t(),
            map.sources.len(),
            stats.d_s()
        )));
    }
    let prob = Problem::new(stats, &map.sources, cols.clone(), false)?;
    let (p, m) = (prob.p, prob.m);
    // W from the f32 weights actually shipped.
    let w = map.weight_column_major(p, m);
    let mut aw = vec![0.0; p * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut aw, p, m),
        Accum::Replace,
        MatRef::from_column_major_slice(&prob.a, p, p),
        MatRef::from_column_major_slice(&w, p, m),
        1.0,
        Par::rayon(0),
    );
    let n = stats.count() as f64;
    let syy = &stats.syy()[cols];
    let mut sse = Vec::with_capacity(m);
    let mut spread = Vec::with_capacity(m);
    for c in 0..m {
        let wc = &w[c * p..(c + 1) * p];
        let cross: f64 = wc
            .iter()
            .zip(&prob.b[c * p..(c + 1) * p])
            .map(|(a, b)| a * b)
            .sum();
        let quad: f64 = wc
            .iter()
            .zip(&aw[c * p..(c + 1) * p])
            .map(|(a, b)| a * b)
            .sum();
        let pred_mean: f64 =
            wc.iter().zip(&prob.mean_x).map(|(a, b)| a * b).sum::<f64>() + f64::from(map.bias[c]);
        let offset = prob.mean_y[c] - pred_mean;
        sse.push((syy[c] - 2.0 * cross + quad + n * offset * offset).max(0.0));
        spread.push(quad.max(0.0));
    }
    Ok(Residuals {
        sse,
        sst: syy.to_vec(),
        spread,
        count: stats.count(),
    })
}
