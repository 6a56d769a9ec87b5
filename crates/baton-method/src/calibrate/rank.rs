//! The reduced-rank step: the chosen full maps cut to a lower rank (see
//! [`crate::mapper::low_rank`]), which costs `p·r + r·D_t` per token instead of `p·D_t`,
//! each candidate rank scored on the held-out windows like the full maps were.

use super::heldout::{ScoreMaps, Scored};
use super::{
    check_cancel, CalibrateError, CalibrationProgress, RankChoice, RankPoint, AUTO_RANKS,
    RANK_TOLERANCE,
};
use crate::mapper::low_rank::reduce_rank;
use crate::mapper::{LayerMap, PairStats};
use std::sync::atomic::AtomicBool;

/// The ranks to try for a target layer of key/value width `width`, smallest first.
pub fn candidate_ranks(choice: RankChoice, width: usize) -> Result<Vec<usize>, CalibrateError> {
    match choice {
        RankChoice::Fixed(r) => {
            if r == 0 || !r.is_multiple_of(32) || r >= width {
                return Err(CalibrateError::Options(format!(
                    "--rank {r}: the rank must be a multiple of 32 below the target's \
                     key/value width {width}"
                )));
            }
            Ok(vec![r])
        }
        RankChoice::Auto => Ok(AUTO_RANKS.iter().copied().filter(|&r| r < width).collect()),
    }
}

/// Whether a reduced mapper of held-out cosine `cosine` is taken over the full one's
/// `full`: a fixed rank always is, an automatic one within [`RANK_TOLERANCE`].
pub fn accepts(choice: RankChoice, cosine: f64, full: f64) -> bool {
    match choice {
        RankChoice::Fixed(_) => true,
        RankChoice::Auto => cosine >= full - RANK_TOLERANCE,
    }
}

/// Each of `maps` (fitted on `stats`) cut to rank `r`.
pub fn reduce(
    stats: &PairStats,
    maps: &[LayerMap],
    r: usize,
) -> Result<Vec<LayerMap>, CalibrateError> {
    Ok(maps
        .iter()
        .enumerate()
        .map(|(j, m)| reduce_rank(stats, j, m, r).map(|x| x.0))
        .collect::<Result<_, _>>()?)
}

/// Multiply-adds per mapped token of reduced maps, all layers, keys and values.
fn macs(keys: &[LayerMap], values: &[LayerMap]) -> usize {
    keys.iter()
        .chain(values)
        .filter_map(|m| m.factors.as_ref().map(|f| f.macs()))
        .sum()
}

/// What the step works on besides the full maps.
pub struct RankStep<'a> {
    pub choice: RankChoice,
    /// The calibration statistics the full maps were fitted on.
    pub keys: &'a PairStats,
    pub values: &'a PairStats,
    /// The target's key/value width.
    pub width: usize,
    /// The phase's name on the progress bar.
    pub label: String,
}

/// The maps the step settles on, and every rank it tried.
pub struct RankOutcome {
    pub scored: Scored,
    pub sweep: Vec<RankPoint>,
}

/// Try the step's ranks, smallest first, and take the first it accepts; the full maps
/// stay when none is accepted.
pub fn run(
    step: &RankStep<'_>,
    full: Scored,
    scorer: &dyn ScoreMaps,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<RankOutcome, CalibrateError> {
    let ranks = candidate_ranks(step.choice, step.width)?;
    let full_mean = full.held.mean_cosine();
    progress.phase(&step.label, ranks.len() as u64);
    let mut sweep = Vec::new();
    for &r in &ranks {
        check_cancel(cancel)?;
        let keys = reduce(step.keys, &full.keys, r)?;
        let values = reduce(step.values, &full.values, r)?;
        let held = scorer.score(&keys, &values)?;
        let cos_mean = held.mean_cosine();
        let macs = macs(&keys, &values);
        progress.note(&format!(
            "rank {r:<4} held-out cosine {cos_mean:.4} (full {full_mean:.4}), top-1 {:.4}, \
             {:.1} MFLOP/token",
            held.agreement.top1,
            2.0 * macs as f64 / 1e6
        ));
        sweep.push(RankPoint {
            rank: r,
            cosine: cos_mean,
            agreement: Some(held.agreement),
            macs_per_token: macs,
        });
        progress.advance(1);
        if accepts(step.choice, cos_mean, full_mean) {
            let scored = Scored { keys, values, held };
            return Ok(RankOutcome { scored, sweep });
        }
    }
    progress.note(&format!(
        "no rank in {ranks:?} comes within {RANK_TOLERANCE} of the full mapper's cosine: \
         keeping the full mapper"
    ));
    Ok(RankOutcome {
        scored: full,
        sweep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::heldout::HeldOut;
    use crate::calibrate::NoProgress;
    use crate::mapper::ridge::tests::Synth;
    use crate::mapper::ridge::{fit_layer, RidgeOptions};
    use crate::metrics::NextTokenAgreement;

    #[test]
    fn ranks_are_multiples_of_32_below_the_width() {
        assert_eq!(
            candidate_ranks(RankChoice::Auto, 128).unwrap(),
            vec![32, 64, 96]
        );
        assert_eq!(
            candidate_ranks(RankChoice::Auto, 1024).unwrap(),
            AUTO_RANKS.to_vec()
        );
        assert!(candidate_ranks(RankChoice::Auto, 32).unwrap().is_empty());
        assert_eq!(
            candidate_ranks(RankChoice::Fixed(64), 128).unwrap(),
            vec![64]
        );
        for (r, w) in [(128, 128), (0, 128), (40, 128)] {
            let e = candidate_ranks(RankChoice::Fixed(r), w).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("--rank {r}")), "{msg}");
            assert!(msg.contains(&format!("width {w}")), "{msg}");
        }
    }

    #[test]
    fn an_automatic_rank_must_come_within_the_tolerance_a_fixed_one_need_not() {
        assert!(accepts(RankChoice::Auto, 0.795, 0.80));
        assert!(!accepts(RankChoice::Auto, 0.785, 0.80));
        assert!(accepts(RankChoice::Fixed(32), 0.1, 0.80));
    }

    /// Scores reduced maps by a table of cosines per rank; the full maps score 0.8.
    struct ByRank(fn(usize) -> f64);

    impl ScoreMaps for ByRank {
        fn score(&self, keys: &[LayerMap], _: &[LayerMap]) -> Result<HeldOut, CalibrateError> {
            let cos = keys[0].factors.as_ref().map_or(0.8, |f| (self.0)(f.rank));
            Ok(HeldOut {
                cosine: vec![cos; keys.len()],
                agreement: NextTokenAgreement::default(),
            })
        }
    }

    /// Full maps of one target layer of width 100 from one source layer, on synthetic
    /// statistics, with their held-out score.
    fn full(stats: &PairStats) -> Scored {
        let m = fit_layer(stats, 0, &[0], &RidgeOptions::default()).unwrap();
        Scored {
            keys: vec![m.clone()],
            values: vec![m],
            held: HeldOut {
                cosine: vec![0.8],
                agreement: NextTokenAgreement::default(),
            },
        }
    }

    fn step(choice: RankChoice, stats: &PairStats) -> RankStep<'_> {
        RankStep {
            choice,
            keys: stats,
            values: stats,
            width: 100,
            label: "rank".into(),
        }
    }

    fn synthetic() -> PairStats {
        Synth::new(2, 48, 1, 100, 0.1, 5).stats(400, 6).0
    }

    #[test]
    fn the_smallest_rank_within_the_tolerance_is_taken() {
        let st = synthetic();
        let scorer = ByRank(|r| if r >= 64 { 0.795 } else { 0.70 });
        let no = AtomicBool::new(false);
        let out = run(
            &step(RankChoice::Auto, &st),
            full(&st),
            &scorer,
            &NoProgress,
            &no,
        )
        .unwrap();
        // 32 is tried and refused, 64 is taken, 96 is never tried.
        assert_eq!(
            out.sweep.iter().map(|p| p.rank).collect::<Vec<_>>(),
            vec![32, 64]
        );
        let f = out.scored.keys[0].factors.as_ref().expect("a reduced map");
        assert_eq!(f.rank, 64);
        // p·r + r·D_t per map, keys and values.
        assert_eq!(out.sweep[1].macs_per_token, 2 * (48 * 64 + 64 * 100));
        assert!((out.scored.held.mean_cosine() - 0.795).abs() < 1e-12);
    }

    #[test]
    fn without_a_rank_close_enough_the_full_maps_stay() {
        let st = synthetic();
        let scorer = ByRank(|_| 0.5);
        let no = AtomicBool::new(false);
        let out = run(
            &step(RankChoice::Auto, &st),
            full(&st),
            &scorer,
            &NoProgress,
            &no,
        )
        .unwrap();
        assert_eq!(out.sweep.len(), 3);
        assert!(out.scored.keys[0].factors.is_none());
        assert_eq!(out.scored.held.mean_cosine(), 0.8);
    }

    #[test]
    fn a_fixed_rank_is_taken_whatever_it_scores() {
        let st = synthetic();
        let scorer = ByRank(|_| 0.1);
        let no = AtomicBool::new(false);
        let s = step(RankChoice::Fixed(32), &st);
        let out = run(&s, full(&st), &scorer, &NoProgress, &no).unwrap();
        assert_eq!(out.sweep.len(), 1);
        assert_eq!(
            out.scored.values[0].factors.as_ref().map(|f| f.rank),
            Some(32)
        );
        // A reduced map predicts the same thing at lower rank: its weight is no longer
        // the full one.
        assert_ne!(out.scored.keys[0].weight, full(&st).keys[0].weight);
    }
}
