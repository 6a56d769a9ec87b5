//! The (k, λ) sweep: for every candidate k and λ, each target layer is fitted from its
//! k best-ranked source layers and the maps are scored on the held-out windows. Only the
//! maps of the best point the cap allows are kept; every point's numbers are reported.

use super::choice::ChoiceRule;
use super::choice::Merit;
use super::heldout::{ScoreMaps, Scored};
use super::{check_cancel, CalibrateError, CalibrationProgress, SkippedK, SweepPoint};
use crate::mapper::ridge::{self, LayerMap, RidgeOptions};
use crate::mapper::select::top_k;
use crate::mapper::PairStats;
use std::sync::atomic::AtomicBool;

/// The candidate k to sweep, and those left out.
#[derive(Debug, Clone)]
pub struct KPlan {
    /// Ascending, without repeats, each at most the source's layer count.
    pub ks: Vec<usize>,
    pub skipped: Vec<SkippedK>,
    /// Every candidate was too wide for the observations, and k = 1 is swept instead.
    pub fell_back: bool,
}

/// The k of `k_sweep` worth fitting on `count` observations of `l_s` source layers of
/// width `d_s`, each map also reading `extra` source layers (the token block).
pub fn plan_ks(k_sweep: &[usize], l_s: usize, d_s: usize, extra: usize, count: u64) -> KPlan {
    let mut ks: Vec<usize> = k_sweep.iter().map(|&k| k.min(l_s)).collect();
    ks.sort_unstable();
    ks.dedup();
    // With more features than about half the observations a ridge at small λ learns
    // the noise (held-out R² far below zero), so such k are not tried at all.
    let max_features = (count / 2) as usize;
    let (ks, skipped): (Vec<usize>, Vec<usize>) = ks
        .into_iter()
        .partition(|&k| k == 1 || (k + extra) * d_s <= max_features);
    let skipped = skipped
        .into_iter()
        .map(|k| SkippedK {
            k,
            reason: format!("{} features for {count} observations", (k + extra) * d_s),
        })
        .collect();
    // With every candidate too wide for the data, one source layer per target layer
    // is still well posed; better that than nothing after the expensive capture.
    let fell_back = ks.is_empty();
    KPlan {
        ks: if fell_back { vec![1] } else { ks },
        skipped,
        fell_back,
    }
}

/// The calibration statistics of one direction and the single-layer ranking of its
/// source layers: all a (k, λ) fit needs.
pub struct FitInputs<'a> {
    pub keys: &'a PairStats,
    pub values: &'a PairStats,
    /// Single-layer R², [target layer][source layer], keys and values.
    pub rank_k: &'a [Vec<f64>],
    pub rank_v: &'a [Vec<f64>],
    /// Ridge options of every fit but λ.
    pub base: RidgeOptions,
    /// The last source layers of the statistics that are the token block, which every
    /// map reads besides its top k (0: none).
    pub token_layers: usize,
}

impl FitInputs<'_> {
    /// Every target layer fitted from its top-k source layers at `lambda` (and the token
    /// block, when the statistics hold one).
    pub fn fit(
        &self,
        k: usize,
        lambda: f64,
    ) -> Result<(Vec<LayerMap>, Vec<LayerMap>), CalibrateError> {
        self.fit_with_block(k, lambda, true)
    }

    /// [`FitInputs::fit`], reading the token block only if `block`.
    pub fn fit_with_block(
        &self,
        k: usize,
        lambda: f64,
        block: bool,
    ) -> Result<(Vec<LayerMap>, Vec<LayerMap>), CalibrateError> {
        let ro = RidgeOptions {
            lambda,
            ..self.base
        };
        let fit_all = |st: &PairStats, rank: &[Vec<f64>]| {
            let own = st.l_s() - self.token_layers;
            rank.iter()
                .enumerate()
                .map(|(j, row)| {
                    // The token block's pieces are not ranked: a map reads all or none.
                    let mut sources = top_k(&row[..own.min(row.len())], k);
                    if block {
                        sources.extend(own..st.l_s());
                    }
                    ridge::fit_layer(st, j, &sources, &ro)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok((
            fit_all(self.keys, self.rank_k)?,
            fit_all(self.values, self.rank_v)?,
        ))
    }

    /// [`FitInputs::fit`], then scored.
    pub fn fit_and_score(
        &self,
        k: usize,
        lambda: f64,
        scorer: &dyn ScoreMaps,
    ) -> Result<Scored, CalibrateError> {
        let (keys, values) = self.fit(k, lambda)?;
        let held = scorer.score(&keys, &values)?;
        Ok(Scored { keys, values, held })
    }
}

/// R² of each of `maps` on `stats`, by target layer.
pub fn layer_r2(stats: &PairStats, maps: &[LayerMap]) -> Result<Vec<f64>, CalibrateError> {
    Ok(maps
        .iter()
        .enumerate()
        .map(|(j, m)| ridge::r2(stats, j, m))
        .collect::<Result<_, _>>()?)
}

fn mean_r2(stats: &PairStats, maps: &[LayerMap]) -> Result<f64, CalibrateError> {
    Ok(layer_r2(stats, maps)?.iter().sum::<f64>() / maps.len() as f64)
}

/// What the sweep measured, and the maps of the best allowed point.
pub struct SweepOutcome {
    pub points: Vec<SweepPoint>,
    /// The index into `points` of the best point [`ChoiceRule`] allows, and its maps.
    pub kept: Option<(usize, Scored)>,
}

/// Everything a sweep runs over besides the statistics and the scorer.
pub struct SweepPlan<'a> {
    pub ks: &'a [usize],
    pub lambdas: &'a [f64],
    pub rule: ChoiceRule,
    /// The phase's name on the progress bar.
    pub label: String,
}

/// Fit and score every (k, λ) of `plan`; `held_k` and `held_v` are the held-out
/// statistics the points' R² are measured on.
pub fn run(
    fit: &FitInputs<'_>,
    held_k: &PairStats,
    held_v: &PairStats,
    plan: &SweepPlan<'_>,
    scorer: &dyn ScoreMaps,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<SweepOutcome, CalibrateError> {
    let total = (plan.ks.len() * plan.lambdas.len()) as u64;
    progress.phase(&plan.label, total);
    let smallest_k = plan.ks.iter().copied().min().unwrap_or(1);
    let mut points: Vec<SweepPoint> = Vec::new();
    let mut kept: Option<(usize, Scored)> = None;
    let mut kept_merit: Option<f64> = None;
    for &k in plan.ks {
        check_cancel(cancel)?;
        for &lambda in plan.lambdas {
            let scored = fit.fit_and_score(k, lambda, scorer)?;
            let held = &scored.held;
            let point = SweepPoint {
                k,
                lambda,
                cosine: held.mean_cosine(),
                r2_k: mean_r2(held_k, &scored.keys)?,
                r2_v: mean_r2(held_v, &scored.values)?,
                agreement: Some(held.agreement),
            };
            tracing::info!(?point, "sweep point");
            progress.note(&format!(
                "k={k:<3} λ={lambda:<8} held-out cosine {:.4}  top-1 {:.4}  KL {:.3}  R² K {:.3} V {:.3}",
                point.cosine, held.agreement.top1, held.agreement.kl, point.r2_k, point.r2_v
            ));
            if plan.rule.improves(&point, smallest_k, kept_merit) {
                kept_merit = Some(point.merit(plan.rule.by));
                kept = Some((points.len(), scored));
            }
            points.push(point);
            progress.advance(1);
        }
    }
    Ok(SweepOutcome { points, kept })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::heldout::HeldOut;
    use crate::calibrate::{choice, NoProgress, SelectBy};
    use crate::mapper::ridge::tests::{truth_sources, Synth};
    use crate::mapper::select::single_layer_r2;
    use crate::metrics::NextTokenAgreement;

    /// Scores maps by their held-out R² on independent samples of the same relation, in
    /// place of the models' attention cosine: higher when the map is closer to the truth.
    struct R2Scorer<'a> {
        keys: &'a PairStats,
        values: &'a PairStats,
    }

    impl ScoreMaps for R2Scorer<'_> {
        fn score(&self, keys: &[LayerMap], values: &[LayerMap]) -> Result<HeldOut, CalibrateError> {
            let (rk, rv) = (layer_r2(self.keys, keys)?, layer_r2(self.values, values)?);
            Ok(HeldOut {
                cosine: rk.iter().zip(&rv).map(|(a, b)| (a + b) / 2.0).collect(),
                agreement: NextTokenAgreement {
                    top1: keys.iter().map(|m| m.sources.len()).sum::<usize>() as f64,
                    kl: 0.0,
                    positions: 1,
                },
            })
        }
    }

    /// Statistics where every target layer is a linear function of two source layers
    /// plus noise (keys and values alike, from different draws): fit and held-out.
    fn synthetic(noise: f64) -> (Synth, [PairStats; 4]) {
        let syn = Synth::new(5, 4, 3, 3, noise, 7);
        let s = |rows, seed| syn.stats(rows, seed).0;
        let stats = [s(600, 1), s(600, 2), s(300, 3), s(300, 4)];
        (syn, stats)
    }

    fn inputs<'a>(st: &'a [PairStats; 4], rank: &'a [Vec<Vec<f64>>; 2]) -> FitInputs<'a> {
        FitInputs {
            keys: &st[0],
            values: &st[1],
            rank_k: &rank[0],
            rank_v: &rank[1],
            base: RidgeOptions::default(),
            token_layers: 0,
        }
    }

    fn ranking(st: &[PairStats; 4]) -> [Vec<Vec<f64>>; 2] {
        let o = RidgeOptions::default();
        [
            single_layer_r2(&st[0], &o).unwrap(),
            single_layer_r2(&st[1], &o).unwrap(),
        ]
    }

    fn plan(ks: &[usize], rule: ChoiceRule) -> SweepPlan<'_> {
        SweepPlan {
            ks,
            lambdas: &[0.01, 100.0],
            rule,
            label: "sweep".into(),
        }
    }

    const COSINE: ChoiceRule = ChoiceRule {
        by: SelectBy::Cosine,
        max_k: usize::MAX,
        k_tolerance: 0.0,
    };

    #[test]
    fn the_true_number_of_sources_is_where_held_out_r2_stops_rising() {
        let (syn, st) = synthetic(0.05);
        let rank = ranking(&st);
        let fit = inputs(&st, &rank);
        let scorer = R2Scorer {
            keys: &st[2],
            values: &st[3],
        };
        let ks = [1, 2, 5];
        let out = run(
            &fit,
            &st[2],
            &st[3],
            &plan(&ks, COSINE),
            &scorer,
            &NoProgress,
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(out.points.len(), 6);
        let at = |k: usize| {
            out.points
                .iter()
                .find(|p| p.k == k && p.lambda == 0.01)
                .unwrap()
        };
        let (one, two, all) = (at(1), at(2), at(5));
        // One of two true sources explains part of the target; both explain all but the
        // noise (variance 0.0025 against targets of variance about 1).
        assert!(one.r2_k < 0.9 && one.r2_v < 0.9, "{one:?}");
        assert!(two.r2_k > 0.99 && two.r2_v > 0.99, "{two:?}");
        assert!(two.cosine > one.cosine + 0.05, "{one:?} {two:?}");
        // Extra layers cannot explain more than the truth; the fit to noise costs little.
        assert!(
            all.r2_k < two.r2_k + 1e-3 && all.r2_k > two.r2_k - 0.01,
            "{all:?}"
        );
        // The ranking found the true sources.
        for j in 0..syn.l_t {
            assert_eq!(
                crate::mapper::select::select_layers(&rank[0], 2)[j],
                truth_sources(j, syn.l_s)
            );
        }
        // The kept maps are those of the best point by cosine, and score as reported.
        let (i, kept) = out.kept.as_ref().unwrap();
        let best = out
            .points
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.cosine.total_cmp(&b.1.cosine))
            .unwrap();
        assert!(out.points[*i].cosine >= best.1.cosine);
        assert_eq!(kept.held.mean_cosine(), out.points[*i].cosine);
        assert_eq!(kept.keys.len(), syn.l_t);
        assert!(kept
            .keys
            .iter()
            .all(|m| m.sources.len() == out.points[*i].k));
        assert!(out.points.iter().all(|p| p.agreement.is_some()));
    }

    #[test]
    fn a_large_lambda_shrinks_the_fit_and_scores_lower() {
        let (_syn, st) = synthetic(0.05);
        let rank = ranking(&st);
        let fit = inputs(&st, &rank);
        let scorer = R2Scorer {
            keys: &st[2],
            values: &st[3],
        };
        let out = run(
            &fit,
            &st[2],
            &st[3],
            &SweepPlan {
                ks: &[2],
                lambdas: &[0.01, 1e5],
                rule: COSINE,
                label: "sweep".into(),
            },
            &scorer,
            &NoProgress,
            &AtomicBool::new(false),
        )
        .unwrap();
        // λ = 1e5 against a standardised Gram of diagonal 600 shrinks the maps to the mean.
        assert!(
            out.points[1].r2_k < out.points[0].r2_k - 0.5,
            "{:?}",
            out.points
        );
        assert_eq!(out.kept.as_ref().unwrap().0, 0);
    }

    #[test]
    fn the_kept_maps_are_those_the_choice_would_pick() {
        let (_syn, st) = synthetic(0.05);
        let rank = ranking(&st);
        let fit = inputs(&st, &rank);
        let scorer = R2Scorer {
            keys: &st[2],
            values: &st[3],
        };
        // Capped at k = 1 the best allowed point is the best k = 1 point, though k = 2
        // scores higher; by "agreement" (here: the source count) the last point wins.
        for rule in [
            ChoiceRule { max_k: 1, ..COSINE },
            ChoiceRule {
                by: SelectBy::Agreement,
                ..COSINE
            },
        ] {
            let ks = [1, 2, 5];
            let out = run(
                &fit,
                &st[2],
                &st[3],
                &plan(&ks, rule),
                &scorer,
                &NoProgress,
                &AtomicBool::new(false),
            )
            .unwrap();
            let c = choice::choose(&out.points, &rule).unwrap();
            let (i, kept) = out.kept.unwrap();
            assert_eq!(i, c.best, "{rule:?}");
            assert!(kept.keys.iter().all(|m| m.sources.len() == out.points[i].k));
        }
    }

    #[test]
    fn a_cancelled_sweep_fits_nothing() {
        let (_syn, st) = synthetic(0.05);
        let rank = ranking(&st);
        let scorer = R2Scorer {
            keys: &st[2],
            values: &st[3],
        };
        let r = run(
            &inputs(&st, &rank),
            &st[2],
            &st[3],
            &plan(&[1], COSINE),
            &scorer,
            &NoProgress,
            &AtomicBool::new(true),
        );
        assert!(matches!(r, Err(CalibrateError::Cancelled)));
    }

    #[test]
    fn k_too_wide_for_the_observations_is_skipped_with_its_reason() {
        // 10 layers of width 64 on 300 observations: at most 150 features.
        let p = plan_ks(&[1, 2, 4, usize::MAX, 2], 10, 64, 0, 300);
        assert_eq!(p.ks, vec![1, 2]);
        assert_eq!(
            p.skipped.iter().map(|s| s.k).collect::<Vec<_>>(),
            vec![4, 10]
        );
        assert_eq!(p.skipped[0].reason, "256 features for 300 observations");
        assert!(!p.fell_back);
        // Nothing fits: one source layer per target layer is swept instead.
        let none = plan_ks(&[4, 8], 10, 64, 0, 300);
        assert_eq!((none.ks, none.fell_back), (vec![1], true));
        assert_eq!(none.skipped.len(), 2);
        // k = 1 is always tried, however few the observations, and is no fallback then.
        let few = plan_ks(&[1, 2], 10, 64, 0, 2);
        assert_eq!((few.ks, few.fell_back), (vec![1], false));
        assert_eq!(few.skipped.iter().map(|s| s.k).collect::<Vec<_>>(), vec![2]);
    }
}
