//! The source features' means and spreads over the calibration text, which condition the
//! features the int8 map quantizes.

use crate::mapper::PairStats;

/// Every source feature's mean and standard deviation over the calibration text, keys
/// and values, layer-major ([L_s·D_s] each, like the calibration statistics' columns).
/// Int8 needs them: un-rotated keys carry a few channels hundreds of times larger than
/// the rest, and one scale per 32 values would flatten the small ones to zero. Centred
/// and scaled features, with the scales folded into the weights, quantize evenly.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceScales {
    pub key_mean: Vec<f32>,
    pub key_std: Vec<f32>,
    pub value_mean: Vec<f32>,
    pub value_std: Vec<f32>,
}

/// Source means, centred sums of squares and the count they are over.
pub type Moments<'a> = (&'a [f64], &'a [f64], u64);

impl SourceScales {
    /// From the calibration statistics of keys and values.
    pub fn from_stats(keys: &PairStats, values: &PairStats) -> Self {
        let diag = |st: &PairStats| (0..st.dx()).map(|i| st.cxx_at(i, i)).collect::<Vec<_>>();
        Self::from_moments(
            (keys.mean_x(), &diag(keys), keys.count()),
            (values.mean_x(), &diag(values), values.count()),
        )
    }

    /// From the source means, centred sums of squares and counts of keys and of values
    /// (what [`PairStats::x_moments_with`] gives).
    pub fn from_moments(keys: Moments<'_>, values: Moments<'_>) -> Self {
        let one = |(mean, diag, count): Moments<'_>| -> (Vec<f32>, Vec<f32>) {
            let n = count.max(1) as f64;
            let m = mean.iter().map(|&m| m as f32).collect();
            let std = diag
                .iter()
                .map(|&d| (d.max(0.0) / n).sqrt() as f32)
                .collect();
            (m, std)
        };
        let (key_mean, key_std) = one(keys);
        let (value_mean, value_std) = one(values);
        Self {
            key_mean,
            key_std,
            value_mean,
            value_std,
        }
    }

    /// Whether the scales cover at least `layers` source layers of `width` features (they
    /// may cover more: the token block's pieces, which a map need not read).
    pub fn fits(&self, layers: usize, width: usize) -> bool {
        let all = [
            &self.key_mean,
            &self.key_std,
            &self.value_mean,
            &self.value_std,
        ];
        let n = self.key_mean.len();
        width > 0
            && n.is_multiple_of(width)
            && n >= layers * width
            && all.iter().all(|v| v.len() == n)
    }

    /// (mean, scale) of layer `l`'s keys or values: scale = 1/σ, or 1 where the feature
    /// is constant (its mean then carries it into the bias).
    pub(super) fn layer(&self, l: usize, width: usize, keys: bool) -> (Vec<f32>, Vec<f32>) {
        let (m, s) = if keys {
            (&self.key_mean, &self.key_std)
        } else {
            (&self.value_mean, &self.value_std)
        };
        let r = l * width..(l + 1) * width;
        let max = s[r.clone()].iter().fold(0f32, |a, &b| a.max(b));
        let scale = s[r.clone()]
            .iter()
            .map(|&v| {
                if v > 1e-6 * max && v > 0.0 {
                    1.0 / v
                } else {
                    1.0
                }
            })
            .collect();
        (m[r].to_vec(), scale)
    }
}
