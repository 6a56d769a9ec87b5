//! The line from an estimate to the attention cosine, fitted by the gate study on half of
//! its switches and checked on the other half, kept beside the artifact as
//! `<mapper dir>/gate/<artifact name>.json`.

use super::GateError;
use crate::mapper::artifact::{self, ModelRef};
use crate::mapper::dir::MapperDir;
use crate::mapper::nonlinear::MapperKind;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// The mapper the switches were measured on: a line read off one mapper's switches
    /// says nothing about another's cosine. Absent in fits written before they named it,
    /// which were all measured on ridge mappers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper: Option<FitMapper>,
    /// The mapper that maps back, for a line that reads the round trip: its estimate
    /// goes through both directions' mappers, so recalibrating either one moves it.
    /// Absent for a line on the feature distance, which reads the forward map only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse_mapper: Option<FitMapper>,
}

/// The estimators a line can read, by the names the line keeps: the feature distance
/// reads the forward map alone; the round trip maps the handed-over cache back with the
/// reverse mapper.
pub const FEATURE_DISTANCE: &str = "feature_distance";
pub const ROUND_TRIP: &str = "round_trip";

/// Which mapper artifact a gate line was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitMapper {
    /// SHA-256 of the artifact file.
    pub sha256: String,
    pub kind: MapperKind,
}

impl FitMapper {
    /// The artifact as a line names it: its file's SHA-256 and its kind.
    pub fn of(art: &artifact::MapperArtifact) -> Result<Self, baton_fetch::FetchError> {
        let (sha256, _) =
            baton_fetch::checksum::sha256_file(&art.path, &baton_fetch::SilentProgress)?;
        Ok(Self {
            sha256,
            kind: art.meta.kind,
        })
    }
}

impl GateFit {
    /// Whether the line's estimate goes through the reverse mapper too.
    pub fn reads_the_reverse(&self) -> bool {
        self.estimator == ROUND_TRIP
    }

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

/// Keeps `fit` in `mapper_dir` as the line of its pair; where it went.
pub fn save(mapper_dir: &MapperDir, fit: &GateFit) -> Result<PathBuf, GateError> {
    let path = mapper_dir.pair(&fit.source, &fit.target).gate();
    let bad = |reason: String| GateError::Fit {
        path: path.clone(),
        reason,
    };
    let json = serde_json::to_string_pretty(fit).map_err(|e| bad(e.to_string()))?;
    let mut staging = mapper_dir.stage().map_err(|e| bad(e.to_string()))?;
    let staged = staging.new_root().pair(&fit.source, &fit.target).gate();
    staging
        .write(&staged, json.as_bytes())
        .and_then(|_| staging.commit())
        .map_err(|e| bad(e.to_string()))?;
    Ok(path)
}

/// The fit kept for `source → target`, if any; one for other models, or measured on
/// other mappers than `mapper` and `reverse` (the artifacts the engine loaded for the
/// two directions), is refused.
pub fn load(
    mapper_dir: &MapperDir,
    source: &ModelRef,
    target: &ModelRef,
    mapper: &FitMapper,
    reverse: &FitMapper,
) -> Result<Option<GateFit>, GateError> {
    let path = mapper_dir.pair(source, target).gate();
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
        reason: format!("{reason}; `baton gate-study` measures it again"),
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
    match &fit.mapper {
        Some(m) if m.sha256 != mapper.sha256 => {
            return Err(bad(format!(
                "it was measured on another mapper ({}) than the {} mapper now in the directory",
                m.kind.name(),
                mapper.kind.name()
            )))
        }
        None if mapper.kind != MapperKind::Ridge => {
            return Err(bad(format!(
                "it was measured on a ridge mapper and the mapper now is {}",
                mapper.kind.name()
            )))
        }
        _ => {}
    }
    // Lines from before they named the reverse mapper are kept as the forward check
    // allows: nothing in them tells which reverse mapper they read.
    if fit.reads_the_reverse() {
        if let Some(m) = &fit.reverse_mapper {
            if m.sha256 != reverse.sha256 {
                return Err(bad(format!(
                    "it reads the round trip and was measured with another mapper back ({}) \
                     than the {} mapper now in the directory",
                    m.kind.name(),
                    reverse.kind.name()
                )));
            }
        }
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
        let f = a_fit(None);
        assert!((f.predict(0.2) - 0.8).abs() < 1e-12);
        assert_eq!(f.predict(10.0), -1.0);
        assert_eq!(f.predict(-10.0), 1.0);
    }

    fn a_fit(mapper: Option<FitMapper>) -> GateFit {
        let model = |name: &str| ModelRef {
            name: name.into(),
            sha256: format!("{name}-sha"),
            architecture: "qwen2".into(),
            layers: 1,
            kv_heads: 1,
            head_dim: 1,
            tokenizer_fingerprint: "t".into(),
        };
        GateFit {
            format: FORMAT.into(),
            version: VERSION,
            source: model("a"),
            target: model("b"),
            estimator: FEATURE_DISTANCE.into(),
            intercept: 0.9,
            slope: -0.5,
            fitted_on: 30,
            checked_on: 30,
            held_out_r: -0.5,
            held_out_mae: 0.1,
            mapper,
            reverse_mapper: None,
        }
    }

    #[test]
    fn a_line_measured_on_another_mapper_is_refused_naming_both_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let ridge = FitMapper {
            sha256: "r".into(),
            kind: MapperKind::Ridge,
        };
        let residual = FitMapper {
            sha256: "t".into(),
            kind: MapperKind::Residual,
        };
        let f = a_fit(Some(ridge.clone()));
        let dir = MapperDir::named(dir.path());
        save(&dir, &f).unwrap();
        let loaded = load(&dir, &f.source, &f.target, &ridge, &ridge).unwrap();
        assert_eq!(loaded, Some(f.clone()));
        let e = load(&dir, &f.source, &f.target, &residual, &ridge)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another mapper (ridge)") && e.contains("residual"),
            "{e}"
        );
        assert!(e.contains("baton gate-study"), "{e}");
    }

    #[test]
    fn a_line_from_before_fits_named_their_mapper_holds_for_ridge_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = a_fit(None);
        let dir = MapperDir::named(dir.path());
        let path = save(&dir, &f).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("mapper"), "an old fit's JSON: {text}");
        let on = |kind| FitMapper {
            sha256: "any".into(),
            kind,
        };
        assert!(load(
            &dir,
            &f.source,
            &f.target,
            &on(MapperKind::Ridge),
            &on(MapperKind::Ridge)
        )
        .unwrap()
        .is_some());
        let e = load(
            &dir,
            &f.source,
            &f.target,
            &on(MapperKind::Mlp),
            &on(MapperKind::Ridge),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("mapper now is mlp"), "{e}");
    }

    #[test]
    fn a_round_trip_line_is_refused_after_the_reverse_mapper_changes_and_a_distance_line_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mapper = |sha: &str, kind| FitMapper {
            sha256: sha.into(),
            kind,
        };
        let forward = mapper("f", MapperKind::Ridge);
        let (back, back_again) = (
            mapper("b", MapperKind::Ridge),
            mapper("b2", MapperKind::Residual),
        );
        let mut f = a_fit(Some(forward.clone()));
        f.estimator = ROUND_TRIP.into();
        f.reverse_mapper = Some(back.clone());
        let dir = MapperDir::named(dir.path());
        save(&dir, &f).unwrap();
        assert!(load(&dir, &f.source, &f.target, &forward, &back)
            .unwrap()
            .is_some());
        let e = load(&dir, &f.source, &f.target, &forward, &back_again)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("another mapper back (ridge)") && e.contains("residual mapper now"),
            "{e}"
        );
        // The feature distance reads the forward map alone: the reverse does not matter.
        f.estimator = FEATURE_DISTANCE.into();
        save(&dir, &f).unwrap();
        assert!(load(&dir, &f.source, &f.target, &forward, &back_again)
            .unwrap()
            .is_some());
    }
}
