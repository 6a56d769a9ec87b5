//! Uncertainty for accuracies and retention ratios over a few hundred benchmark items:
//! a Wilson interval for a single accuracy (well behaved near 0 and 1, unlike the normal
//! approximation) and a paired bootstrap for ratios of two accuracies measured on the
//! same items (the items are shared, so resampling them together keeps the correlation).
//! Where items come in groups that are not independent (the turns of one conversation),
//! [`cluster_bootstrap`] resamples whole groups.
//!
//! The resampling generator is ChaCha12 by name, not the rand crate's `StdRng`, whose
//! algorithm may change between versions: a seeded report stays reproducible.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::{Deserialize, Serialize};

/// A value with its 95% interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub value: f64,
    pub ci95: [f64; 2],
}

/// Accuracy `k / n` with a 95% Wilson score interval.
pub fn wilson(k: usize, n: usize) -> Estimate {
    if n == 0 {
        return Estimate {
            value: f64::NAN,
            ci95: [f64::NAN, f64::NAN],
        };
    }
    let z = 1.959_963_984_540_054f64;
    let (nf, p) = (n as f64, k as f64 / n as f64);
    let denom = 1.0 + z * z / nf;
    let centre = (p + z * z / (2.0 * nf)) / denom;
    let half = z * ((p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt()) / denom;
    Estimate {
        value: p,
        ci95: [(centre - half).max(0.0), (centre + half).min(1.0)],
    }
}

/// Per item: (reference correct, candidate correct, floor correct).
pub type PairedOutcome = (bool, bool, bool);

/// `statistic(ref_acc, cand_acc, floor_acc)` on the items and its 95% percentile
/// bootstrap interval from `resamples` paired resamples (seeded: the report is
/// reproducible). Resamples where the statistic is undefined are dropped.
pub fn paired_bootstrap(
    items: &[PairedOutcome],
    statistic: impl Fn(f64, f64, f64) -> Option<f64>,
    resamples: usize,
    seed: u64,
) -> Estimate {
    let accs = |idx: &mut dyn Iterator<Item = usize>| {
        let (mut r, mut c, mut f, mut n) = (0usize, 0usize, 0usize, 0usize);
        for i in idx {
            let (a, b, fl) = items[i];
            r += a as usize;
            c += b as usize;
            f += fl as usize;
            n += 1;
        }
        let n = n.max(1) as f64;
        (r as f64 / n, c as f64 / n, f as f64 / n)
    };
    let (r, c, f) = accs(&mut (0..items.len()));
    let value = statistic(r, c, f).unwrap_or(f64::NAN);
    if items.is_empty() {
        return Estimate {
            value,
            ci95: [f64::NAN, f64::NAN],
        };
    }
    let mut rng = ChaCha12Rng::seed_from_u64(seed);
    let mut samples = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let n = items.len();
        let mut it = (0..n).map(|_| rng.random_range(0..n));
        let (r, c, f) = accs(&mut it);
        if let Some(s) = statistic(r, c, f).filter(|s| s.is_finite()) {
            samples.push(s);
        }
    }
    percentile_interval(value, samples)
}

/// `statistic` of the column means of `rows`, with a 95% percentile interval from
/// `resamples` resamples of whole clusters (`cluster[i]` names row i's). Resamples where
/// the statistic is undefined are dropped.
pub fn cluster_bootstrap<const N: usize>(
    rows: &[[f64; N]],
    cluster: &[usize],
    statistic: impl Fn(&[f64; N]) -> Option<f64>,
    resamples: usize,
    seed: u64,
) -> Estimate {
    let means = |members: &mut dyn Iterator<Item = usize>| {
        let mut sum = [0f64; N];
        let mut n = 0usize;
        for i in members {
            for (s, v) in sum.iter_mut().zip(rows[i]) {
                *s += v;
            }
            n += 1;
        }
        sum.map(|s| s / n.max(1) as f64)
    };
    let value = statistic(&means(&mut (0..rows.len()))).unwrap_or(f64::NAN);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: std::collections::HashMap<usize, usize> = Default::default();
    for (row, &c) in cluster.iter().enumerate().take(rows.len()) {
        let g = *index.entry(c).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(row);
    }
    if groups.is_empty() {
        return Estimate {
            value,
            ci95: [f64::NAN, f64::NAN],
        };
    }
    let mut rng = ChaCha12Rng::seed_from_u64(seed);
    let mut samples = Vec::with_capacity(resamples);
    for _ in 0..resamples {
        let picks: Vec<usize> = (0..groups.len())
            .map(|_| rng.random_range(0..groups.len()))
            .collect();
        let mut members = picks.iter().flat_map(|&g| groups[g].iter().copied());
        if let Some(s) = statistic(&means(&mut members)).filter(|s| s.is_finite()) {
            samples.push(s);
        }
    }
    percentile_interval(value, samples)
}

/// `value` with the 2.5% and 97.5% percentiles of the bootstrap `samples` (NaN without
/// samples).
fn percentile_interval(value: f64, mut samples: Vec<f64>) -> Estimate {
    samples.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| -> f64 {
        if samples.is_empty() {
            return f64::NAN;
        }
        samples[((samples.len() - 1) as f64 * p).round() as usize]
    };
    Estimate {
        value,
        ci95: [q(0.025), q(0.975)],
    }
}

/// Candidate accuracy over reference accuracy.
pub fn raw_retention(reference: f64, candidate: f64, _floor: f64) -> Option<f64> {
    (reference > 0.0).then(|| candidate / reference)
}

/// The share of the reference's gain over the floor that the candidate keeps.
pub fn floor_normalised_retention(reference: f64, candidate: f64, floor: f64) -> Option<f64> {
    let gain = reference - floor;
    (gain.abs() > 1e-12).then(|| (candidate - floor) / gain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_a_worked_example() {
        // 81 of 263: the interval from the score formula is [0.2553, 0.3662].
        let e = wilson(81, 263);
        assert!((e.value - 0.30798).abs() < 1e-4);
        assert!((e.ci95[0] - 0.2553).abs() < 1e-3, "{:?}", e);
        assert!((e.ci95[1] - 0.3662).abs() < 1e-3, "{:?}", e);
        let all = wilson(10, 10);
        assert!((all.ci95[1] - 1.0).abs() < 1e-12);
        assert!(all.ci95[0] > 0.6 && all.ci95[0] < 0.75);
    }

    #[test]
    fn bootstrap_interval_contains_the_value_and_narrows_with_more_items() {
        let make = |n: usize| -> Vec<PairedOutcome> {
            (0..n)
                .map(|i| (i % 4 != 0, i % 5 != 0, i % 2 == 0))
                .collect()
        };
        let small = paired_bootstrap(&make(40), raw_retention, 2000, 7);
        let large = paired_bootstrap(&make(400), raw_retention, 2000, 7);
        for e in [small, large] {
            assert!(e.ci95[0] <= e.value && e.value <= e.ci95[1], "{e:?}");
        }
        assert!(large.ci95[1] - large.ci95[0] < small.ci95[1] - small.ci95[0]);
        // Identical outcomes retain everything, with no spread at all.
        let same: Vec<PairedOutcome> = (0..50).map(|i| (i % 3 == 0, i % 3 == 0, false)).collect();
        let e = paired_bootstrap(&same, raw_retention, 500, 1);
        assert_eq!(e.value, 1.0);
        assert_eq!(e.ci95, [1.0, 1.0]);
    }

    #[test]
    fn resampling_whole_clusters_widens_the_interval_of_correlated_rows() {
        // Ten conversations of four turns; every turn of a conversation scores alike.
        let rows: Vec<[f64; 1]> = (0..40).map(|i| [((i / 4) % 3) as f64 / 2.0]).collect();
        let by_conversation: Vec<usize> = (0..40).map(|i| i / 4).collect();
        let each_alone: Vec<usize> = (0..40).collect();
        let mean = |m: &[f64; 1]| Some(m[0]);
        let clustered = cluster_bootstrap(&rows, &by_conversation, mean, 2000, 3);
        let independent = cluster_bootstrap(&rows, &each_alone, mean, 2000, 3);
        let plain = rows.iter().map(|r| r[0]).sum::<f64>() / 40.0;
        assert!((clustered.value - plain).abs() < 1e-12);
        assert_eq!(clustered.value, independent.value);
        for e in [clustered, independent] {
            assert!(e.ci95[0] <= e.value && e.value <= e.ci95[1], "{e:?}");
        }
        let width = |e: Estimate| e.ci95[1] - e.ci95[0];
        assert!(
            width(clustered) > 1.3 * width(independent),
            "{clustered:?} vs {independent:?}"
        );
        // The same seed gives the same interval.
        assert_eq!(
            cluster_bootstrap(&rows, &by_conversation, mean, 2000, 3),
            clustered
        );
    }

    #[test]
    fn floor_normalised_retention_is_zero_at_the_floor_and_one_at_the_reference() {
        assert_eq!(floor_normalised_retention(0.6, 0.6, 0.25), Some(1.0));
        assert_eq!(floor_normalised_retention(0.6, 0.25, 0.25), Some(0.0));
        assert_eq!(floor_normalised_retention(0.25, 0.3, 0.25), None);
    }
}
