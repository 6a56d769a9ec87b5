//! Closed-form ridge fits of one target layer from a selection of source layers, and their
//! evaluation, all from [`PairStats`] alone.
//!
//! # The fit
//!
//! For target layer `j` and source layers `s_1..s_k`, with `x` the concatenated source
//! features (`p = k·D_s` wide) and `y` the target layer's features (`D_t` wide):
//!
//! 1. centre with the statistics' means (this is the intercept);
//! 2. optionally standardise: `z = (x − μ) / σ` per feature, `σ² = C_ff / n` (population
//!    variance, as scikit-learn's `StandardScaler`); a feature with no spread (σ ≤ 1e-10 of
//!    the largest in the selection) is left unscaled and simply ends up with a zero weight;
//! 3. solve `(ZᵀZ + λI) W_z = ZᵀY_c` in f64 by Cholesky (faer). λ is absolute, on the Gram
//!    being solved: with standardisation its diagonal is `n`, so λ = 0.01 is a light touch
//!    at thousands of observations; sweep it on held-out data (see
//!    [`fit_layer_lambdas`]) when features outnumber observations;
//! 4. fold the scaling back, `W = diag(1/σ) W_z`, and the intercept
//!    `b = μ_y − μ_xᵀ W`, so the [`LayerMap`] applies to raw features.
//!
//! # Ill-conditioning
//!
//! A regularised Gram whose condition number exceeds [`MAX_CONDITION`] (a rank-deficient
//! `X` with λ = 0, duplicated features, more features than observations with a tiny λ) is
//! not solved as is: with [`RidgeOptions::lambda_fallback`] (the default) λ is raised to the
//! smallest value that brings the condition number to that bound, computed from the
//! Gram's eigenvalues, and [`FitInfo::lambda`] reports the λ actually used; without it the
//! fit fails with [`MapperError::NotPositiveDefinite`]. The Cholesky path detects trouble
//! from a failed factorisation or from its pivots (whose spread bounds the condition number
//! from below), so it can accept a Gram the eigenvalue path would have regularised when
//! the pivots do not show how bad it is; both land on the same λ when they do raise it.
//!
//! # Where
//!
//! The regression read out of the statistics and its solve are in `solve.rs`; a map's
//! residuals and R² on any statistics, held-out ones included, in `score.rs`.

mod score;
mod solve;

pub use score::{r2, residuals, Residuals};
pub(crate) use solve::Problem;
pub use solve::MAX_CONDITION;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par, Side};
use serde::{Deserialize, Serialize};

use super::error::{MapperError, Result};
use super::stats::PairStats;
use solve::{conditioned_lambda, not_pd};

/// How to fit one ridge mapper.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RidgeOptions {
    /// Ridge penalty added to the diagonal of the Gram being solved (the standardised one
    /// when `standardize`). Must be finite and ≥ 0.
    pub lambda: f64,
    /// Divide centred features by their standard deviation before solving, so λ treats
    /// every feature alike whatever its scale (keys and values differ by orders of
    /// magnitude between channels).
    pub standardize: bool,
    /// Raise λ on an ill-conditioned Gram (and report it) instead of failing.
    pub lambda_fallback: bool,
}

impl Default for RidgeOptions {
    fn default() -> Self {
        Self {
            lambda: 0.01,
            standardize: true,
            lambda_fallback: true,
        }
    }
}

/// How a [`LayerMap`] was fitted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FitInfo {
    /// The λ asked for.
    pub lambda_requested: f64,
    /// The λ the solve used: larger than `lambda_requested` when the fallback raised it.
    pub lambda: f64,
    pub standardized: bool,
    /// Selected features with no spread in the calibration data (they get zero weight).
    pub constant_features: usize,
    /// Observations in the statistics the map was fitted on.
    pub observations: u64,
}

impl FitInfo {
    /// Whether the ill-conditioning fallback raised λ.
    pub fn lambda_raised(&self) -> bool {
        self.lambda > self.lambda_requested
    }
}

/// `W_r = left · right`. The columns of `left` are scaled to unit variance over the
/// calibration features, so the middle product has even columns for int8.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Factors {
    pub rank: usize,
    /// `p × r`, row-major.
    pub left: Vec<f32>,
    /// `r × D_t`, row-major.
    pub right: Vec<f32>,
}

impl Factors {
    /// Multiply-adds per mapped row.
    pub fn macs(&self) -> usize {
        self.left.len() + self.right.len()
    }
}

/// A fitted map for one target layer: `y ≈ [x_{s1} | … | x_{sk}] · W + b` on raw
/// (unstandardised, uncentred, RoPE-stripped) features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerMap {
    /// Source layers, in the order their features are stacked in the rows of `weight`.
    pub sources: Vec<usize>,
    /// `(k·D_s) × D_t`, row-major.
    pub weight: Vec<f32>,
    /// `D_t`.
    pub bias: Vec<f32>,
    pub info: FitInfo,
    /// For a reduced mapper, `weight` as a low-rank product (see [`super::low_rank`]).
    #[serde(default)]
    pub factors: Option<Factors>,
}

impl LayerMap {
    /// `weight` (row-major `p × m` f32, as shipped) as a column-major f64 matrix, the
    /// form faer's products take.
    pub(crate) fn weight_column_major(&self, p: usize, m: usize) -> Vec<f64> {
        let mut w = vec![0.0; p * m];
        for r in 0..p {
            for c in 0..m {
                w[r + c * p] = f64::from(self.weight[r * m + c]);
            }
        }
        w
    }

    /// Target feature width `D_t`.
    pub fn d_t(&self) -> usize {
        self.bias.len()
    }

    /// Input width `k·D_s` (rows of `weight`).
    pub fn in_width(&self) -> usize {
        self.weight.len().checked_div(self.bias.len()).unwrap_or(0)
    }

    /// Straightforward reference prediction for `rows` observations `x` laid out as in
    /// [`PairStats::update`] (all `l_s` source layers of width `d_s`, row-major): the
    /// caller-facing fast path belongs to the apply step; this one exists to check it.
    pub fn predict(&self, x: &[f32], rows: usize, d_s: usize) -> Result<Vec<f32>> {
        let d_t = self.d_t();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let width = x.len() / rows;
        let fits = d_s > 0
            && x.len() == rows * width
            && self.in_width() == self.sources.len() * d_s
            && self.sources.iter().all(|&s| (s + 1) * d_s <= width);
        if !fits {
            return Err(MapperError::MapShape(format!(
                "map takes {} inputs from source layers {:?}; given d_s {d_s} and {} values for {rows} rows",
                self.in_width(),
                self.sources,
                x.len()
            )));
        }
        let mut out = Vec::with_capacity(rows * d_t);
        for row in x.chunks_exact(width) {
            let mut acc: Vec<f64> = self.bias.iter().map(|&b| f64::from(b)).collect();
            for (slot, &s) in self.sources.iter().enumerate() {
                for f in 0..d_s {
                    let xv = f64::from(row[s * d_s + f]);
                    let wrow = &self.weight[(slot * d_s + f) * d_t..(slot * d_s + f + 1) * d_t];
                    for (a, &w) in acc.iter_mut().zip(wrow) {
                        *a += xv * f64::from(w);
                    }
                }
            }
            out.extend(acc.iter().map(|&a| a as f32));
        }
        Ok(out)
    }
}

/// Fits target layer `target_layer` from the source layers `sources` (any order, no
/// repeats; the order is the row order of the result's weight).
pub fn fit_layer(
    stats: &PairStats,
    target_layer: usize,
    sources: &[usize],
    opts: &RidgeOptions,
) -> Result<LayerMap> {
    check_lambda(opts.lambda)?;
    check_fit_count(stats)?;
    let cols = target_columns(stats, target_layer)?;
    let prob = Problem::new(stats, sources, cols, opts.standardize)?;
    let (w, lambda) = prob.solve_cholesky(opts.lambda, opts.lambda_fallback)?;
    if lambda > opts.lambda {
        tracing::warn!(
            target_layer,
            requested = opts.lambda,
            used = lambda,
            "ridge Gram ill-conditioned: raised λ"
        );
    }
    Ok(prob.to_map(stats, sources, &w, opts, lambda))
}

/// Fits the same selection at several λ values. The (standardised) Gram is
/// eigendecomposed once, `A = Q Λ Qᵀ`, and `QᵀB` formed once; each λ is then the diagonal
/// rescale `W = Q (Λ + λ)⁻¹ QᵀB`, one `p × p × D_t` product, instead of a fresh
/// factorisation. `opts.lambda` is ignored; the maps come back in the order of `lambdas`.
pub fn fit_layer_lambdas(
    stats: &PairStats,
    target_layer: usize,
    sources: &[usize],
    opts: &RidgeOptions,
    lambdas: &[f64],
) -> Result<Vec<LayerMap>> {
    for &l in lambdas {
        check_lambda(l)?;
    }
    check_fit_count(stats)?;
    if lambdas.is_empty() {
        return Ok(Vec::new());
    }
    let cols = target_columns(stats, target_layer)?;
    let prob = Problem::new(stats, sources, cols, opts.standardize)?;
    let p = prob.p;
    let m = prob.m;
    let eig = MatRef::from_column_major_slice(&prob.a, p, p)
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| MapperError::Eigen(format!("{e:?}")))?;
    let q = eig.U();
    let ev: Vec<f64> = eig
        .S()
        .column_vector()
        .iter()
        .map(|&v| v.max(0.0))
        .collect();
    let (ev_min, ev_max) = ev.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    let mut qtb = vec![0.0; p * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut qtb, p, m),
        Accum::Replace,
        q.transpose(),
        MatRef::from_column_major_slice(&prob.b, p, m),
        1.0,
        Par::rayon(0),
    );
    let mut out = Vec::with_capacity(lambdas.len());
    let mut scaled = vec![0.0; p * m];
    for &requested in lambdas {
        let lambda = conditioned_lambda(requested, ev_min, ev_max);
        if lambda > requested && !opts.lambda_fallback {
            return Err(not_pd(requested, ev_min, ev_max));
        }
        for c in 0..m {
            for r in 0..p {
                scaled[r + c * p] = qtb[r + c * p] / (ev[r] + lambda);
            }
        }
        let mut w = vec![0.0; p * m];
        matmul(
            MatMut::from_column_major_slice_mut(&mut w, p, m),
            Accum::Replace,
            q,
            MatRef::from_column_major_slice(&scaled, p, m),
            1.0,
            Par::rayon(0),
        );
        let mut o = opts.clone();
        o.lambda = requested;
        out.push(prob.to_map(stats, sources, &w, &o, lambda));
    }
    Ok(out)
}

/// A fit needs spread: at least two observations.
pub(crate) fn check_fit_count(stats: &PairStats) -> Result<()> {
    if stats.count() < 2 {
        return Err(MapperError::TooFewObservations {
            count: stats.count(),
            needed: 2,
        });
    }
    Ok(())
}

pub(crate) fn check_lambda(lambda: f64) -> Result<()> {
    if !(lambda.is_finite() && lambda >= 0.0) {
        return Err(MapperError::Options(format!(
            "λ must be finite and ≥ 0, got {lambda}"
        )));
    }
    Ok(())
}

pub(crate) fn target_columns(
    stats: &PairStats,
    target_layer: usize,
) -> Result<std::ops::Range<usize>> {
    if target_layer >= stats.l_t() {
        return Err(MapperError::LayerOutOfRange {
            what: "target",
            layer: target_layer,
            layers: stats.l_t(),
        });
    }
    let d_t = stats.d_t();
    Ok(target_layer * d_t..(target_layer + 1) * d_t)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mapper::stats::tests::Rng;

    /// Synthetic paired data: source features with varied offsets and scales; target layer
    /// `j` is an exact linear function (plus intercept, plus `noise`) of the source layers
    /// `truth_sources(j)`.
    pub(crate) struct Synth {
        pub(crate) l_s: usize,
        pub(crate) d_s: usize,
        pub(crate) l_t: usize,
        pub(crate) d_t: usize,
        pub(crate) weights: Vec<Vec<f64>>,
        pub(crate) biases: Vec<Vec<f64>>,
        col_offset: Vec<f64>,
        col_scale: Vec<f64>,
        noise: f64,
    }

    pub(crate) fn truth_sources(j: usize, l_s: usize) -> Vec<usize> {
        let mut s = vec![j % l_s, (j + 2) % l_s];
        s.sort_unstable();
        s
    }

    impl Synth {
        pub(crate) fn new(
            l_s: usize,
            d_s: usize,
            l_t: usize,
            d_t: usize,
            noise: f64,
            seed: u64,
        ) -> Self {
            let mut rng = Rng::new(seed);
            let p = 2 * d_s;
            let weights = (0..l_t)
                .map(|_| {
                    (0..p * d_t)
                        .map(|_| rng.normal() / (p as f64).sqrt())
                        .collect()
                })
                .collect();
            let biases = (0..l_t)
                .map(|_| (0..d_t).map(|_| 5.0 * rng.normal()).collect())
                .collect();
            let dx = l_s * d_s;
            let col_offset = (0..dx).map(|_| 10.0 * rng.normal()).collect();
            let col_scale = (0..dx).map(|_| (1.5 * rng.normal()).exp()).collect();
            Self {
                l_s,
                d_s,
                l_t,
                d_t,
                weights,
                biases,
                col_offset,
                col_scale,
                noise,
            }
        }

        /// `rows` observations: (x, y) row-major as `PairStats::update` takes them.
        pub(crate) fn sample(&self, rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
            let mut rng = Rng::new(seed);
            let (dx, dy) = (self.l_s * self.d_s, self.l_t * self.d_t);
            let mut x = Vec::with_capacity(rows * dx);
            let mut y = Vec::with_capacity(rows * dy);
            for _ in 0..rows {
                let xr: Vec<f32> = (0..dx)
                    .map(|c| (self.col_offset[c] + self.col_scale[c] * rng.normal()) as f32)
                    .collect();
                for j in 0..self.l_t {
                    let src = truth_sources(j, self.l_s);
                    for c in 0..self.d_t {
                        let mut v = self.biases[j][c];
                        for (slot, &s) in src.iter().enumerate() {
                            for f in 0..self.d_s {
                                let w = self.weights[j][(slot * self.d_s + f) * self.d_t + c];
                                // Scale-free weights: features of every scale matter.
                                v += f64::from(xr[s * self.d_s + f])
                                    / self.col_scale[s * self.d_s + f]
                                    * w;
                            }
                        }
                        v += self.noise * rng.normal();
                        y.push(v as f32);
                    }
                }
                x.extend(xr);
            }
            (x, y)
        }

        /// The true raw-feature weight of target layer `j` (row-major `(2·d_s) × d_t`).
        pub(crate) fn raw_weight(&self, j: usize) -> Vec<f64> {
            let src = truth_sources(j, self.l_s);
            let mut w = self.weights[j].clone();
            for (slot, &s) in src.iter().enumerate() {
                for f in 0..self.d_s {
                    for c in 0..self.d_t {
                        w[(slot * self.d_s + f) * self.d_t + c] /= self.col_scale[s * self.d_s + f];
                    }
                }
            }
            w
        }

        pub(crate) fn stats(&self, rows: usize, seed: u64) -> (PairStats, Vec<f32>, Vec<f32>) {
            let (x, y) = self.sample(rows, seed);
            let mut s = PairStats::new(self.l_s, self.d_s, self.l_t, self.d_t).unwrap();
            s.update(&x, &y, rows).unwrap();
            (s, x, y)
        }
    }

    /// R² computed directly from raw rows, in f64, with the map's f32 parameters.
    fn direct_r2(map: &LayerMap, x: &[f32], y: &[f32], rows: usize, syn: &Synth, j: usize) -> f64 {
        let (dx, dy, d_s, d_t) = (syn.l_s * syn.d_s, syn.l_t * syn.d_t, syn.d_s, syn.d_t);
        let mut mean = vec![0.0; d_t];
        for r in 0..rows {
            for c in 0..d_t {
                mean[c] += f64::from(y[r * dy + j * d_t + c]) / rows as f64;
            }
        }
        let (mut sse, mut sst) = (0.0, 0.0);
        for r in 0..rows {
            for c in 0..d_t {
                let mut pred = f64::from(map.bias[c]);
                for (slot, &s) in map.sources.iter().enumerate() {
                    for f in 0..d_s {
                        pred += f64::from(x[r * dx + s * d_s + f])
                            * f64::from(map.weight[(slot * d_s + f) * d_t + c]);
                    }
                }
                let t = f64::from(y[r * dy + j * d_t + c]);
                sse += (t - pred).powi(2);
                sst += (t - mean[c]).powi(2);
            }
        }
        1.0 - sse / sst
    }

    fn exact() -> RidgeOptions {
        RidgeOptions {
            lambda: 0.0,
            ..RidgeOptions::default()
        }
    }

    #[test]
    fn exact_linear_target_is_recovered() {
        let syn = Synth::new(5, 6, 3, 4, 0.0, 11);
        let (stats, _, _) = syn.stats(400, 12);
        for j in 0..3 {
            let src = truth_sources(j, 5);
            for standardize in [true, false] {
                let opts = RidgeOptions {
                    standardize,
                    ..exact()
                };
                let map = fit_layer(&stats, j, &src, &opts).unwrap();
                assert!(!map.info.lambda_raised());
                let truth = syn.raw_weight(j);
                let werr = map
                    .weight
                    .iter()
                    .zip(&truth)
                    .map(|(a, b)| (f64::from(*a) - b).abs())
                    .fold(0.0, f64::max);
                let berr = map
                    .bias
                    .iter()
                    .zip(&syn.biases[j])
                    .map(|(a, b)| (f64::from(*a) - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    werr < 1e-4 && berr < 1e-4,
                    "layer {j} std {standardize}: weight err {werr:e}, bias err {berr:e}"
                );
                let r2 = r2(&stats, j, &map).unwrap();
                assert!(r2 > 0.9999, "{r2}");
            }
            // The default light ridge changes nothing that matters here.
            let map = fit_layer(&stats, j, &src, &RidgeOptions::default()).unwrap();
            assert!(r2(&stats, j, &map).unwrap() > 0.9999);
        }
    }

    #[test]
    fn held_out_r2_from_stats_matches_raw_rows() {
        let syn = Synth::new(4, 5, 2, 3, 0.7, 21);
        let (train, _, _) = syn.stats(300, 22);
        let rows = 250;
        let (held, x, y) = syn.stats(rows, 23);
        for j in 0..2 {
            // A wrong selection too, so the held-out intercept offset term is exercised.
            for src in [truth_sources(j, 4), vec![3, 1], vec![0, 1, 2, 3]] {
                let map = fit_layer(
                    &train,
                    j,
                    &src,
                    &RidgeOptions {
                        lambda: 3.0,
                        ..Default::default()
                    },
                )
                .unwrap();
                let from_stats = r2(&held, j, &map).unwrap();
                let direct = direct_r2(&map, &x, &y, rows, &syn, j);
                assert!(
                    (from_stats - direct).abs() < 1e-9,
                    "{from_stats} vs {direct}"
                );
                let res = residuals(&held, j, &map).unwrap();
                assert_eq!(res.sse.len(), 3);
                assert_eq!(res.count, rows as u64);
            }
        }
    }

    #[test]
    fn standardisation_does_not_change_the_unregularised_fit() {
        let syn = Synth::new(3, 4, 2, 3, 0.5, 31);
        let (stats, x, _) = syn.stats(200, 32);
        let src = [0, 2, 1];
        let on = fit_layer(
            &stats,
            1,
            &src,
            &RidgeOptions {
                standardize: true,
                ..exact()
            },
        )
        .unwrap();
        let off = fit_layer(
            &stats,
            1,
            &src,
            &RidgeOptions {
                standardize: false,
                ..exact()
            },
        )
        .unwrap();
        let (po, pf) = (
            on.predict(&x, 200, 4).unwrap(),
            off.predict(&x, 200, 4).unwrap(),
        );
        let scale = pf.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = po
            .iter()
            .zip(&pf)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff / scale < 1e-5, "{diff} of {scale}");
    }

    #[test]
    fn lambda_sweep_matches_separate_fits() {
        let syn = Synth::new(3, 4, 2, 3, 0.5, 41);
        let (stats, _, _) = syn.stats(60, 42);
        let lambdas = [0.0, 0.01, 1.0, 100.0];
        for standardize in [true, false] {
            let opts = RidgeOptions {
                standardize,
                ..Default::default()
            };
            let sweep = fit_layer_lambdas(&stats, 0, &[2, 0, 1], &opts, &lambdas).unwrap();
            assert_eq!(sweep.len(), 4);
            for (map, &l) in sweep.iter().zip(&lambdas) {
                let one = fit_layer(
                    &stats,
                    0,
                    &[2, 0, 1],
                    &RidgeOptions {
                        lambda: l,
                        ..opts.clone()
                    },
                )
                .unwrap();
                assert_eq!(map.info, one.info);
                let scale = one.weight.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let diff = map
                    .weight
                    .iter()
                    .zip(&one.weight)
                    .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(diff / scale < 1e-5, "λ {l}: {diff} of {scale}");
                let (a, b) = (r2(&stats, 0, map).unwrap(), r2(&stats, 0, &one).unwrap());
                assert!((a - b).abs() < 1e-9);
            }
            // More λ means a worse in-sample fit.
            let r: Vec<f64> = sweep.iter().map(|m| r2(&stats, 0, m).unwrap()).collect();
            assert!(r.windows(2).all(|w| w[0] >= w[1] - 1e-12), "{r:?}");
        }
    }

    #[test]
    fn rank_deficient_gram_is_regularised_and_reported() {
        let syn = Synth::new(3, 4, 2, 3, 0.0, 51);
        let rows = 100;
        let (mut x, y) = syn.sample(rows, 52);
        // Source layer 1 duplicates layer 0 (target 0 depends on layers 0 and 2).
        for r in 0..rows {
            let (a, b) = x.split_at_mut(r * 12 + 4);
            b[..4].copy_from_slice(&a[r * 12..r * 12 + 4]);
        }
        let mut stats = PairStats::new(3, 4, 2, 3).unwrap();
        stats.update(&x, &y, rows).unwrap();
        for standardize in [true, false] {
            let opts = RidgeOptions {
                standardize,
                ..exact()
            };
            let map = fit_layer(&stats, 0, &[0, 1, 2], &opts).unwrap();
            assert!(map.info.lambda_raised(), "{:?}", map.info);
            assert!(map.weight.iter().chain(&map.bias).all(|v| v.is_finite()));
            assert!(r2(&stats, 0, &map).unwrap() > 0.9999);
            let sweep = fit_layer_lambdas(&stats, 0, &[0, 1, 2], &opts, &[0.0, 1.0]).unwrap();
            assert!(sweep[0].info.lambda_raised() && !sweep[1].info.lambda_raised());
            assert!(r2(&stats, 0, &sweep[0]).unwrap() > 0.9999);

            let strict = RidgeOptions {
                lambda_fallback: false,
                ..opts
            };
            let err = fit_layer(&stats, 0, &[0, 1, 2], &strict).unwrap_err();
            assert!(
                matches!(err, MapperError::NotPositiveDefinite { .. }),
                "{err}"
            );
            assert!(fit_layer_lambdas(&stats, 0, &[0, 1, 2], &strict, &[0.0]).is_err());
        }
    }

    #[test]
    fn more_features_than_rows_and_constant_features_stay_finite() {
        let syn = Synth::new(4, 5, 2, 3, 0.3, 61);
        let rows = 9; // 20 features
        let (mut x, y) = syn.sample(rows, 62);
        for r in 0..rows {
            x[r * 20 + 7] = 3.5; // a feature that never moves
        }
        let mut stats = PairStats::new(4, 5, 2, 3).unwrap();
        stats.update(&x, &y, rows).unwrap();
        for standardize in [true, false] {
            let map = fit_layer(
                &stats,
                1,
                &[0, 1, 2, 3],
                &RidgeOptions {
                    standardize,
                    ..exact()
                },
            )
            .unwrap();
            assert!(map.info.lambda_raised());
            assert_eq!(map.info.constant_features, 1);
            assert!(map.weight.iter().chain(&map.bias).all(|v| v.is_finite()));
            let r = r2(&stats, 1, &map).unwrap();
            assert!(r.is_finite() && r > 0.99, "{r}");
            // The default λ is enough on its own here.
            let map = fit_layer(
                &stats,
                1,
                &[0, 1, 2, 3],
                &RidgeOptions {
                    standardize,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(!map.info.lambda_raised());
            assert!(map.weight.iter().all(|v| v.is_finite()));
        }
        let m = single_layer_r2_ok(&stats);
        assert!(m.iter().flatten().all(|v| v.is_finite()));
    }

    fn single_layer_r2_ok(stats: &PairStats) -> Vec<Vec<f64>> {
        crate::mapper::select::single_layer_r2(stats, &RidgeOptions::default()).unwrap()
    }

    #[test]
    fn identity_map_with_all_layers() {
        let (l, d, rows) = (4, 6, 300);
        let mut rng = Rng::new(71);
        // Correlated layers, as a model's are: each layer mixes the previous one.
        let mut x = Vec::with_capacity(rows * l * d);
        for _ in 0..rows {
            let mut prev: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
            for _ in 0..l {
                let cur: Vec<f64> = prev
                    .iter()
                    .map(|p| 0.8 * p + 0.6 * rng.normal() + 2.0)
                    .collect();
                x.extend(cur.iter().map(|&v| v as f32));
                prev = cur;
            }
        }
        let mut stats = PairStats::new(l, d, l, d).unwrap();
        stats.update(&x, &x, rows).unwrap();
        let all: Vec<usize> = (0..l).collect();
        for j in 0..l {
            let map = fit_layer(&stats, j, &all, &RidgeOptions::default()).unwrap();
            let r = r2(&stats, j, &map).unwrap();
            assert!(r > 0.999, "layer {j}: {r}");
        }
    }

    #[test]
    fn bad_requests_are_errors() {
        let syn = Synth::new(3, 4, 2, 3, 0.5, 81);
        let (stats, _, _) = syn.stats(50, 82);
        let o = RidgeOptions::default();
        assert!(matches!(
            fit_layer(&stats, 2, &[0], &o),
            Err(MapperError::LayerOutOfRange { what: "target", .. })
        ));
        assert!(matches!(
            fit_layer(&stats, 0, &[3], &o),
            Err(MapperError::LayerOutOfRange { what: "source", .. })
        ));
        assert!(matches!(
            fit_layer(&stats, 0, &[1, 1], &o),
            Err(MapperError::Sources(_))
        ));
        assert!(matches!(
            fit_layer(&stats, 0, &[], &o),
            Err(MapperError::Sources(_))
        ));
        let neg = RidgeOptions {
            lambda: -1.0,
            ..o.clone()
        };
        assert!(matches!(
            fit_layer(&stats, 0, &[0], &neg),
            Err(MapperError::Options(_))
        ));
        assert!(fit_layer_lambdas(&stats, 0, &[0], &o, &[f64::NAN]).is_err());
        let empty = PairStats::new(3, 4, 2, 3).unwrap();
        assert!(matches!(
            fit_layer(&empty, 0, &[0], &o),
            Err(MapperError::TooFewObservations { .. })
        ));
        let map = fit_layer(&stats, 0, &[0], &o).unwrap();
        let other = PairStats::new(3, 5, 2, 3).unwrap();
        assert!(matches!(r2(&other, 0, &map), Err(MapperError::MapShape(_))));
        assert!(r2(&empty, 0, &map).is_err());
    }
}
