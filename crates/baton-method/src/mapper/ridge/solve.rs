//! One ridge regression read out of the statistics, and its solve: the centred (and
//! optionally standardised) Gram of the selected source features, solved by Cholesky with
//! λ raised on an ill-conditioned Gram.

use faer::linalg::solvers::{Llt, Solve};
use faer::{MatMut, MatRef, Side};

use super::{FitInfo, LayerMap, RidgeOptions};
use crate::mapper::error::{MapperError, Result};
use crate::mapper::stats::PairStats;

/// Largest condition number of the regularised Gram that is solved without raising λ. At
/// 1e12 an f64 solve keeps about four significant digits in its worst direction, which is
/// far more than the noise in calibration data warrants.
pub const MAX_CONDITION: f64 = 1e12;

/// The smallest λ ≥ `lambda` for which `(ev_max + λ) / (ev_min + λ) ≤ MAX_CONDITION`.
pub(super) fn conditioned_lambda(lambda: f64, ev_min: f64, ev_max: f64) -> f64 {
    let ev_min = ev_min.max(0.0);
    if ev_max <= 0.0 {
        // Nothing varies: any positive λ gives the (zero) answer.
        return if lambda > 0.0 { lambda } else { 1.0 };
    }
    if ev_max + lambda <= MAX_CONDITION * (ev_min + lambda) {
        return lambda;
    }
    lambda.max((ev_max - MAX_CONDITION * ev_min) / (MAX_CONDITION - 1.0))
}

pub(super) fn not_pd(lambda: f64, ev_min: f64, ev_max: f64) -> MapperError {
    MapperError::NotPositiveDefinite {
        lambda,
        reason: format!(
            "Gram eigenvalues span {ev_min:.3e} ..= {ev_max:.3e}, condition number above {MAX_CONDITION:e}"
        ),
    }
}

/// One regression problem read out of the statistics: the (optionally standardised)
/// centred Gram of the selected features and their cross moments with some target columns.
pub(crate) struct Problem {
    pub(crate) p: usize,
    pub(crate) m: usize,
    /// `p × p`, column-major, full symmetric, unregularised.
    pub(crate) a: Vec<f64>,
    /// `p × m`, column-major.
    pub(crate) b: Vec<f64>,
    /// Multiplier each centred feature was scaled by (1/σ, or 1).
    pub(crate) scale: Vec<f64>,
    pub(crate) mean_x: Vec<f64>,
    pub(crate) mean_y: Vec<f64>,
    pub(crate) constant: usize,
}

impl Problem {
    pub(crate) fn new(
        stats: &PairStats,
        sources: &[usize],
        cols: std::ops::Range<usize>,
        standardize: bool,
    ) -> Result<Self> {
        check_sources(stats, sources)?;
        if stats.count() == 0 {
            return Err(MapperError::TooFewObservations {
                count: 0,
                needed: 1,
            });
        }
        let d_s = stats.d_s();
        let idx: Vec<usize> = sources
            .iter()
            .flat_map(|&s| s * d_s..(s + 1) * d_s)
            .collect();
        let p = idx.len();
        let m = cols.len();
        let mut a = vec![0.0; p * p];
        for (j, &gj) in idx.iter().enumerate() {
            for (i, &gi) in idx.iter().enumerate().skip(j) {
                let v = stats.cxx_at(gi, gj);
                a[i + j * p] = v;
                a[j + i * p] = v;
            }
        }
        let mut b = vec![0.0; p * m];
        for (c, gc) in cols.clone().enumerate() {
            let col = stats.cxy_column(gc);
            for (i, &gi) in idx.iter().enumerate() {
                b[i + c * p] = col[gi];
            }
        }
        let n = stats.count() as f64;
        let sd: Vec<f64> = (0..p).map(|i| (a[i + i * p].max(0.0) / n).sqrt()).collect();
        let sd_max = sd.iter().fold(0.0f64, |m, &v| m.max(v));
        let is_constant = |s: f64| s <= 1e-10 * sd_max || s == 0.0;
        let constant = sd.iter().filter(|&&s| is_constant(s)).count();
        let scale: Vec<f64> = sd
            .iter()
            .map(|&s| {
                if standardize && !is_constant(s) {
                    1.0 / s
                } else {
                    1.0
                }
            })
            .collect();
        if standardize {
            for j in 0..p {
                for i in 0..p {
                    a[i + j * p] *= scale[i] * scale[j];
                }
                for c in 0..m {
                    b[j + c * p] *= scale[j];
                }
            }
        }
        Ok(Self {
            p,
            m,
            a,
            b,
            scale,
            mean_x: idx.iter().map(|&g| stats.mean_x()[g]).collect(),
            mean_y: stats.mean_y()[cols].to_vec(),
            constant,
        })
    }

    /// Solves `(A + λI) W = B` by Cholesky, raising λ per the module's rule when the
    /// factorisation fails or its pivots show a condition number above [`MAX_CONDITION`].
    /// Returns `W` (`p × m`, column-major, in the problem's scaled space) and the λ used.
    pub(crate) fn solve_cholesky(&self, lambda: f64, fallback: bool) -> Result<(Vec<f64>, f64)> {
        let (p, m) = (self.p, self.m);
        let mut lam = lambda;
        let mut reg = self.a.clone();
        // A few rounds at most: the first raise comes from the eigenvalues and is enough
        // in exact arithmetic; the later ones only cover rounding at the edge.
        for _ in 0..4 {
            for i in 0..p {
                reg[i + i * p] = self.a[i + i * p] + lam;
            }
            let reason = match Llt::new(MatRef::from_column_major_slice(&reg, p, p), Side::Lower) {
                Ok(llt) => {
                    let l = llt.L();
                    let (lo, hi) = (0..p).fold((f64::INFINITY, 0.0f64), |(lo, hi), i| {
                        let d = *l.get(i, i);
                        (lo.min(d), hi.max(d))
                    });
                    let cond_lower_bound = (hi / lo).powi(2);
                    if p == 0 || cond_lower_bound <= MAX_CONDITION {
                        let mut w = self.b.clone();
                        llt.solve_in_place(MatMut::from_column_major_slice_mut(&mut w, p, m));
                        if w.iter().all(|v| v.is_finite()) {
                            return Ok((w, lam));
                        }
                        "the solution is not finite".to_string()
                    } else {
                        format!("Cholesky pivots imply a condition number ≥ {cond_lower_bound:.3e}")
                    }
                }
                Err(e) => format!("Cholesky factorisation failed: {e:?}"),
            };
            if !fallback {
                return Err(MapperError::NotPositiveDefinite {
                    lambda: lam,
                    reason,
                });
            }
            let ev = MatRef::from_column_major_slice(&self.a, p, p)
                .self_adjoint_eigenvalues(Side::Lower)
                .map_err(|e| MapperError::Eigen(format!("{e:?}")))?;
            let (lo, hi) = ev.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
            let next = conditioned_lambda(lam, lo, hi);
            lam = if next > lam {
                next
            } else {
                (lam * 10.0).max(hi * 1e-12).max(f64::MIN_POSITIVE)
            };
        }
        Err(MapperError::NotPositiveDefinite {
            lambda: lam,
            reason: "still not solvable after raising λ".into(),
        })
    }

    /// Folds a scaled-space solution back to raw features and rounds it into a map.
    pub(super) fn to_map(
        &self,
        stats: &PairStats,
        sources: &[usize],
        w_scaled: &[f64],
        opts: &RidgeOptions,
        lambda: f64,
    ) -> LayerMap {
        let (p, m) = (self.p, self.m);
        let mut weight = vec![0.0f32; p * m];
        for r in 0..p {
            for c in 0..m {
                weight[r * m + c] = (w_scaled[r + c * p] * self.scale[r]) as f32;
            }
        }
        // The intercept uses the rounded weights so it is exact for what is shipped.
        let mut bias: Vec<f64> = self.mean_y.clone();
        for r in 0..p {
            let mx = self.mean_x[r];
            for (b, &w) in bias.iter_mut().zip(&weight[r * m..(r + 1) * m]) {
                *b -= mx * f64::from(w);
            }
        }
        LayerMap {
            sources: sources.to_vec(),
            weight,
            bias: bias.iter().map(|&b| b as f32).collect(),
            info: FitInfo {
                lambda_requested: opts.lambda,
                lambda,
                standardized: opts.standardize,
                constant_features: self.constant,
                observations: stats.count(),
            },
            factors: None,
        }
    }
}

fn check_sources(stats: &PairStats, sources: &[usize]) -> Result<()> {
    if sources.is_empty() {
        return Err(MapperError::Sources("no source layers given".into()));
    }
    let mut seen = vec![false; stats.l_s()];
    for &s in sources {
        if s >= stats.l_s() {
            return Err(MapperError::LayerOutOfRange {
                what: "source",
                layer: s,
                layers: stats.l_s(),
            });
        }
        if std::mem::replace(&mut seen[s], true) {
            return Err(MapperError::Sources(format!(
                "source layer {s} is listed twice"
            )));
        }
    }
    Ok(())
}
