//! The line from an estimate to the attention cosine, fitted by the gate study on half of
//! its switches and checked on the other half, kept beside the artifact as
//! `<mapper dir>/gate/<artifact name>.json`.

use super::GateError;
use crate::mapper::artifact::{self, ModelRef};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "baton-gate";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateFit {
    pub format: String,
    pub version: u32,
    pub source: ModelRef,
    pub target: ModelRef,
    /// Which estimate the line reads (`feature_distance`).
    pub estimator: String,
    pub intercept: f64,
    pub slope: f64,
    /// Switches the line was fitted on, and those it was checked on.
    pub fitted_on: usize,
    pub checked_on: usize,
    /// Pearson correlation of the estimate with the measured cosine on the checked half,
    /// and the mean absolute error of the line's prediction there.
    pub held_out_r: f64,
    pub held_out_mae: f64,
}

impl GateFit {
    /// The attention cosine the line predicts for an estimate.
    pub fn predict(&self, estimate: f64) -> f64 {
        (self.intercept + self.slope * estimate).clamp(-1.0, 1.0)
    }
}

/// Least-squares line `y ≈ a + b x`; `None` for fewer than two distinct x.
pub fn line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 1e-12).then(|| {
        let b = sxy / sxx;
        (my - b * mx, b)
    })
}

/// Pearson correlation; `None` when either side does not vary.
pub fn pearson(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 1e-12 && syy > 1e-12).then(|| sxy / (sxx * syy).sqrt())
}

/// Spearman's rank correlation (ties share their mean rank).
pub fn spearman(points: &[(f64, f64)]) -> Option<f64> {
    let ranks = |v: Vec<f64>| -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let mut r = vec![0.0; v.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
                j += 1;
            }
            for k in i..=j {
                r[idx[k]] = (i + j) as f64 / 2.0;
            }
            i = j + 1;
        }
        r
    };
    let xs = ranks(points.iter().map(|p| p.0).collect());
    let ys = ranks(points.iter().map(|p| p.1).collect());
    pearson(&xs.into_iter().zip(ys).collect::<Vec<_>>())
}

/// Where the fit for `source → target` lives under `mapper_dir`.
pub fn path_in(mapper_dir: &Path, source: &ModelRef, target: &ModelRef) -> PathBuf {
    artifact::beside_artifact(mapper_dir, "gate", source, target).with_extension("json")
}

pub fn save(path: &Path, fit: &GateFit) -> Result<(), GateError> {
    let bad = |reason: String| GateError::Fit {
        path: path.to_path_buf(),
        reason,
    };
    let json = serde_json::to_string_pretty(fit).map_err(|e| bad(e.to_string()))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
    }
    // Written whole next to it, then renamed over: a reader never sees half a file.
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).map_err(|e| bad(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| bad(e.to_string()))
}

/// The fit kept for `source → target`, if any; one for other models is refused.
pub fn load(
    mapper_dir: &Path,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<Option<GateFit>, GateError> {
    let path = path_in(mapper_dir, source, target);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(GateError::Fit {
                path,
                reason: e.to_string(),
            })
        }
    };
    let bad = |reason: String| GateError::Fit {
        path: path.clone(),
        reason: format!("{reason}; `baton eval --gate-study N` writes it again"),
    };
    let fit: GateFit = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if fit.format != FORMAT || fit.version != VERSION {
        return Err(bad(format!(
            "format {} version {}, this baton reads {FORMAT} {VERSION}",
            fit.format, fit.version
        )));
    }
    if fit.source.sha256 != source.sha256 || fit.target.sha256 != target.sha256 {
        return Err(bad("it was fitted for other models".into()));
    }
    Ok(Some(fit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_through_exact_points_is_found_and_correlations_are_signed() {
        let pts: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 0.9 - 0.1 * i as f64)).collect();
        let (a, b) = line(&pts).unwrap();
        assert!((a - 0.9).abs() < 1e-12 && (b + 0.1).abs() < 1e-12);
        assert!((pearson(&pts).unwrap() + 1.0).abs() < 1e-12);
        assert!((spearman(&pts).unwrap() + 1.0).abs() < 1e-12);
        assert!(line(&[(1.0, 2.0), (1.0, 3.0)]).is_none());
        assert!(pearson(&[(1.0, 2.0), (2.0, 2.0)]).is_none());
    }

    #[test]
    fn spearman_gives_ties_their_mean_rank() {
        let pts = [(1.0, 1.0), (2.0, 2.0), (2.0, 2.0), (3.0, 3.0)];
        assert!((spearman(&pts).unwrap() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_prediction_stays_a_cosine() {
        let f = GateFit {
            format: FORMAT.into(),
            version: VERSION,
            source: ModelRef {
                name: "a".into(),
                sha256: "x".into(),
                architecture: "qwen2".into(),
                layers: 1,
                kv_heads: 1,
                head_dim: 1,
                tokenizer_fingerprint: "t".into(),
            },
            target: ModelRef {
                name: "b".into(),
                sha256: "y".into(),
                architecture: "qwen2".into(),
                layers: 1,
                kv_heads: 1,
                head_dim: 1,
                tokenizer_fingerprint: "t".into(),
            },
            estimator: "feature_distance".into(),
            intercept: 0.9,
            slope: -0.5,
            fitted_on: 2,
            checked_on: 2,
            held_out_r: -0.5,
            held_out_mae: 0.1,
        };
        assert!((f.predict(0.2) - 0.8).abs() < 1e-12);
        assert_eq!(f.predict(10.0), -1.0);
        assert_eq!(f.predict(-10.0), 1.0);
    }
}
