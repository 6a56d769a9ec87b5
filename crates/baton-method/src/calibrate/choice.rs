//! Choosing the mapper from the swept points: the best held-out merit among the k the
//! cap allows, then the cheapest k within the tolerance of it. Pure: it reads the sweep's
//! numbers only, so the sweep can keep one point's maps and the choice can be tested
//! without models.

use super::{CalibrateOptions, SelectBy, SweepPoint};

/// The number the choice of k and λ maximises.
pub trait Merit {
    fn merit(&self, by: SelectBy) -> f64;
}

impl Merit for SweepPoint {
    fn merit(&self, by: SelectBy) -> f64 {
        match by {
            SelectBy::Cosine => self.cosine,
            // A point saved before agreement was measured can never win on it.
            SelectBy::Agreement => self.agreement.map_or(f64::NEG_INFINITY, |a| a.top1),
        }
    }
}

/// How a point is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChoiceRule {
    pub by: SelectBy,
    /// The largest k the chosen mapper may use; the smallest swept k is allowed anyway,
    /// so that a cap below every candidate still yields a mapper.
    pub max_k: usize,
    /// Merit a smaller k may give up against the best allowed point.
    pub k_tolerance: f64,
}

impl From<&CalibrateOptions> for ChoiceRule {
    fn from(o: &CalibrateOptions) -> Self {
        Self {
            by: o.select_by,
            max_k: o.max_k,
            k_tolerance: o.k_tolerance,
        }
    }
}

impl ChoiceRule {
    /// Whether `point` replaces `incumbent` (a merit, `None` before any point) as the
    /// best allowed point, with `smallest_k` the smallest k of the sweep. The first of
    /// equal points stays.
    pub fn improves(&self, point: &SweepPoint, smallest_k: usize, incumbent: Option<f64>) -> bool {
        let allowed = point.k <= self.max_k || point.k == smallest_k;
        allowed && incumbent.is_none_or(|best| point.merit(self.by) > best)
    }
}

/// The choice among swept points, by index into the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The best point the cap allows.
    pub best: usize,
    /// The point chosen: `best`, or a smaller k within the tolerance of it.
    pub chosen: usize,
    /// The best point above the cap, when it beats `best`.
    pub best_above_max_k: Option<usize>,
}

/// Chooses among `points`; `None` for an empty sweep.
pub fn choose(points: &[SweepPoint], rule: &ChoiceRule) -> Option<Choice> {
    let smallest_k = points.iter().map(|p| p.k).min()?;
    let by = rule.by;
    let mut best: Option<(usize, f64)> = None;
    for (i, p) in points.iter().enumerate() {
        if rule.improves(p, smallest_k, best.map(|b| b.1)) {
            best = Some((i, p.merit(by)));
        }
    }
    let (best, best_merit) = best?;
    let k = points[best].k;
    let best_above_max_k = points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.k > k && p.k > rule.max_k && p.merit(by) > best_merit)
        .max_by(|(_, a), (_, b)| a.merit(by).total_cmp(&b.merit(by)))
        .map(|(i, _)| i);
    // The cheapest point close enough to the best allowed one: a larger k must buy
    // more than the tolerance to be worth its map time.
    let chosen = points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.k < k && p.merit(by) >= best_merit - rule.k_tolerance)
        .min_by(|(_, a), (_, b)| a.k.cmp(&b.k).then(b.merit(by).total_cmp(&a.merit(by))))
        .map_or(best, |(i, _)| i);
    Some(Choice {
        best,
        chosen,
        best_above_max_k,
    })
}

impl Choice {
    /// What the choice tells the user beyond the sweep itself: that a cheaper point won
    /// within the tolerance, and what a k above the cap would reach.
    pub fn notes(&self, points: &[SweepPoint], rule: &ChoiceRule) -> Vec<String> {
        let by = rule.by;
        let chosen = &points[self.chosen];
        let mut notes = Vec::new();
        if self.chosen != self.best {
            let best = &points[self.best];
            notes.push(format!(
                "k={} λ={} chosen over k={} λ={}: held-out {} {:.4} against {:.4}, \
                 within {} at less map time",
                chosen.k,
                chosen.lambda,
                best.k,
                best.lambda,
                by.name(),
                chosen.merit(by),
                best.merit(by),
                rule.k_tolerance
            ));
        }
        if let Some(p) = self.best_above_max_k.map(|i| &points[i]) {
            notes.push(format!(
                "k={} λ={} would reach a held-out {} of {:.4} (+{:.4}) at {:.1}x the map's \
                 work; calibrate with --max-k {} to choose it",
                p.k,
                p.lambda,
                by.name(),
                p.merit(by),
                p.merit(by) - chosen.merit(by),
                p.k as f64 / chosen.k as f64,
                p.k
            ));
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::NextTokenAgreement;

    fn pt(k: usize, lambda: f64, cosine: f64, top1: f64) -> SweepPoint {
        SweepPoint {
            k,
            lambda,
            cosine,
            r2_k: 0.0,
            r2_v: 0.0,
            agreement: Some(NextTokenAgreement {
                top1,
                kl: 0.0,
                positions: 100,
            }),
        }
    }

    #[test]
    fn merit_is_the_chosen_measure_and_a_missing_agreement_never_wins() {
        let p = pt(1, 0.01, 0.8, 0.6);
        assert_eq!(p.merit(SelectBy::Cosine), 0.8);
        assert_eq!(p.merit(SelectBy::Agreement), 0.6);
        let old = SweepPoint {
            agreement: None,
            ..pt(1, 0.01, 0.9, 0.0)
        };
        assert_eq!(old.merit(SelectBy::Agreement), f64::NEG_INFINITY);
    }

    fn rule(by: SelectBy, max_k: usize, k_tolerance: f64) -> ChoiceRule {
        ChoiceRule {
            by,
            max_k,
            k_tolerance,
        }
    }

    /// Cosine rises with k; agreement peaks at k = 2.
    fn sweep() -> Vec<SweepPoint> {
        vec![
            pt(1, 0.01, 0.70, 0.80),
            pt(2, 0.01, 0.75, 0.90),
            pt(4, 0.01, 0.78, 0.85),
            pt(8, 0.01, 0.80, 0.84),
        ]
    }

    #[test]
    fn the_best_point_by_the_chosen_measure_wins() {
        let s = sweep();
        let c = choose(&s, &rule(SelectBy::Cosine, usize::MAX, 0.0)).unwrap();
        assert_eq!((c.best, c.chosen, c.best_above_max_k), (3, 3, None));
        let a = choose(&s, &rule(SelectBy::Agreement, usize::MAX, 0.0)).unwrap();
        assert_eq!((a.best, a.chosen), (1, 1));
        assert!(a
            .notes(&s, &rule(SelectBy::Agreement, usize::MAX, 0.0))
            .is_empty());
    }

    #[test]
    fn lambda_is_chosen_within_a_k_and_the_first_of_equals_stays() {
        let s = vec![
            pt(2, 0.01, 0.70, 0.9),
            pt(2, 1000.0, 0.76, 0.8),
            pt(2, 10.0, 0.76, 0.8),
        ];
        let c = choose(&s, &rule(SelectBy::Cosine, usize::MAX, 0.0)).unwrap();
        assert_eq!(c.chosen, 1);
    }

    #[test]
    fn the_cap_is_honoured_and_the_better_point_above_it_is_reported() {
        let s = sweep();
        let r = rule(SelectBy::Cosine, 2, 0.0);
        let c = choose(&s, &r).unwrap();
        assert_eq!((c.best, c.chosen), (1, 1));
        // k = 8 beats k = 4, both above the cap: the best of them is reported.
        assert_eq!(c.best_above_max_k, Some(3));
        let notes = c.notes(&s, &r);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(
                "k=8 λ=0.01 would reach a held-out attention cosine of 0.8000 (+0.0500) at 4.0x"
            ),
            "{}",
            notes[0]
        );
        assert!(notes[0].contains("--max-k 8"), "{}", notes[0]);
        // By agreement, nothing above the cap beats k = 2: nothing is reported.
        let a = choose(&s, &rule(SelectBy::Agreement, 2, 0.0)).unwrap();
        assert_eq!((a.chosen, a.best_above_max_k), (1, None));
    }

    #[test]
    fn a_cap_below_every_swept_k_still_allows_the_smallest() {
        let s: Vec<SweepPoint> = sweep().into_iter().skip(1).collect();
        let c = choose(&s, &rule(SelectBy::Cosine, 1, 0.0)).unwrap();
        assert_eq!(s[c.chosen].k, 2);
        assert_eq!(c.best_above_max_k.map(|i| s[i].k), Some(8));
    }

    #[test]
    fn a_cheaper_k_within_the_tolerance_is_chosen_and_not_outside_it() {
        let s = sweep();
        // 0.80 − 0.03 = 0.77: k = 4 (0.78) is within, k = 2 (0.75) is not.
        let r = rule(SelectBy::Cosine, usize::MAX, 0.03);
        let c = choose(&s, &r).unwrap();
        assert_eq!((c.best, c.chosen), (3, 2));
        let notes = c.notes(&s, &r);
        assert_eq!(notes.len(), 1, "{notes:?}");
        let expected = "k=4 λ=0.01 chosen over k=8 λ=0.01: \
                        held-out attention cosine 0.7800 against 0.8000, within 0.03 ";
        assert!(notes[0].starts_with(expected), "{}", notes[0]);
        // A wider tolerance reaches the cheapest k it covers.
        let wide = choose(&s, &rule(SelectBy::Cosine, usize::MAX, 0.06)).unwrap();
        assert_eq!(s[wide.chosen].k, 2);
        // Narrower than every gap: the best stays.
        let narrow = choose(&s, &rule(SelectBy::Cosine, usize::MAX, 0.019)).unwrap();
        assert_eq!(narrow.chosen, 3);
    }

    #[test]
    fn among_cheaper_points_of_one_k_the_better_lambda_is_taken() {
        let s = vec![
            pt(1, 0.01, 0.74, 0.0),
            pt(1, 10.0, 0.76, 0.0),
            pt(4, 0.01, 0.77, 0.0),
        ];
        let c = choose(&s, &rule(SelectBy::Cosine, usize::MAX, 0.05)).unwrap();
        assert_eq!(c.chosen, 1);
    }

    #[test]
    fn the_point_above_the_cap_is_measured_against_the_cheaper_choice() {
        let s = sweep();
        let r = rule(SelectBy::Cosine, 4, 0.035);
        let c = choose(&s, &r).unwrap();
        // Best allowed is k = 4 (0.78); within 0.035 of it, k = 2 (0.75) is cheaper.
        assert_eq!((c.best, c.chosen, c.best_above_max_k), (2, 1, Some(3)));
        let notes = c.notes(&s, &r);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[1].contains("(+0.0500) at 4.0x"), "{}", notes[1]);
    }

    #[test]
    fn points_without_agreement_lose_to_any_measured_one() {
        let mut s = sweep();
        // The agreement's best, k = 2, was not measured: the next best measured one wins.
        s[1].agreement = None;
        let c = choose(&s, &rule(SelectBy::Agreement, usize::MAX, 0.0)).unwrap();
        assert_eq!(c.chosen, 2);
    }

    #[test]
    fn an_empty_sweep_chooses_nothing() {
        assert_eq!(choose(&[], &rule(SelectBy::Cosine, 8, 0.0)), None);
    }
}
