//! Streaming, mergeable sufficient statistics of paired source/target features.
//!
//! # What is kept
//!
//! For `n` paired observations `x` (all source layers concatenated, layer-major, width
//! `D_x = L_s·D_s`) and `y` (all target layers, width `D_y = L_t·D_t`):
//!
//! - the count `n`,
//! - the means `μ_x` (`D_x`) and `μ_y` (`D_y`),
//! - the centred Gram `C_xx = Σ (x−μ_x)(x−μ_x)ᵀ` (`D_x × D_x`, f64),
//! - the centred cross moments `C_xy = Σ (x−μ_x)(y−μ_y)ᵀ` (`D_x × D_y`, f64),
//! - the centred sum of squares of every target column `s_yy = Σ (y−μ_y)²` (`D_y`).
//!
//! These carry exactly the information of the raw sums (Σx, Σy, XᵀX, XᵀY, Σy² per
//! column: `XᵀX = C_xx + n μ_x μ_xᵀ` and so on, see [`PairStats::sum_x`] and friends), but
//! centred moments are what the ridge fit needs, and keeping them centred avoids the
//! cancellation `XᵀX − n μμᵀ` suffers when a feature's mean is large against its spread
//! (RoPE-stripped keys have channels like that). Batches and whole statistics objects are
//! combined with the pairwise update of Chan, Golub and LeVeque, which is exact in exact
//! arithmetic, so streaming in any batching, or merging any split, gives the same
//! statistics up to rounding.
//!
//! # Memory
//!
//! `≈ 8·D_x² + 8·D_x·D_y` bytes (plus a few vectors), independent of `n`:
//!
//! | pair (features K or V)                 | `D_x` | `D_y` | `C_xx`  | `C_xy`  |
//! |----------------------------------------|-------|-------|---------|---------|
//! | Qwen2.5 0.5B → 1.5B (24×128 → 28×256)  | 3072  | 7168  | ~75 MB  | ~176 MB |
//! | Qwen2.5 1.5B → 0.5B (28×256 → 24×128)  | 7168  | 3072  | ~411 MB | ~176 MB |
//!
//! and one object each for K and for V. `C_xx` is stored as a full square of which only the
//! lower triangle is maintained: that saves no memory, but halves the update's arithmetic
//! for `C_xx` (and keeps the matrix a plain column-major buffer for faer).
//!
//! A larger model pair does not fit this way (Qwen3 14B → 32B: `D_x = 40·1024`, so `C_xx`
//! alone is ~13 GB). The scalable calibration is two passes over the corpus: first
//! per-source-layer diagonal blocks `C_{x_i x_i}` with per-layer cross moments (enough for
//! the single-layer R² ranking in [`crate::mapper::select`], memory `L_s·8·D_s² +
//! 8·D_x·D_y`), then, once the top-k source layers of every target layer are known, only
//! the Gram blocks among the union of selected layers. This type covers the models this
//! workbench runs on a CPU, where one pass with everything is simpler and lets k be swept
//! freely afterwards.
//!
//! # Where
//!
//! Adding batches and merging statistics is in `accumulate.rs`; the file format, with
//! [`PairStats::save`] and [`PairStats::load`], in [`file`].

mod accumulate;
pub mod file;
mod restrict;

use std::fmt;

use faer::MatRef;

use super::error::{MapperError, Result};

/// Sufficient statistics of paired observations for the ridge mapper: see the module
/// documentation for what is kept and how memory scales, and [`file`] for the file format.
#[derive(Clone, PartialEq)]
pub struct PairStats {
    l_s: usize,
    d_s: usize,
    l_t: usize,
    d_t: usize,
    count: u64,
    mean_x: Vec<f64>,
    mean_y: Vec<f64>,
    /// `D_x × D_x`, column-major; lower triangle (with diagonal) maintained, strict upper
    /// triangle always zero.
    cxx: Vec<f64>,
    /// `D_x × D_y`, column-major.
    cxy: Vec<f64>,
    syy: Vec<f64>,
}

impl fmt::Debug for PairStats {
    // The matrices run to hundreds of megabytes: print the geometry, never the data.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairStats")
            .field("l_s", &self.l_s)
            .field("d_s", &self.d_s)
            .field("l_t", &self.l_t)
            .field("d_t", &self.d_t)
            .field("count", &self.count)
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

impl PairStats {
    /// Empty statistics for `l_s` source layers of width `d_s` and `l_t` target layers of
    /// width `d_t`. Allocates the full matrices up front (see [`PairStats::estimate_bytes`]).
    pub fn new(l_s: usize, d_s: usize, l_t: usize, d_t: usize) -> Result<Self> {
        Self::estimate_bytes(l_s, d_s, l_t, d_t)?;
        let dx = l_s * d_s;
        let dy = l_t * d_t;
        Ok(Self {
            l_s,
            d_s,
            l_t,
            d_t,
            count: 0,
            mean_x: vec![0.0; dx],
            mean_y: vec![0.0; dy],
            cxx: vec![0.0; dx * dx],
            cxy: vec![0.0; dx * dy],
            syy: vec![0.0; dy],
        })
    }

    /// Bytes that statistics of this geometry hold, without allocating them; errors on a
    /// zero dimension or on a size that overflows.
    pub fn estimate_bytes(l_s: usize, d_s: usize, l_t: usize, d_t: usize) -> Result<usize> {
        if l_s == 0 || d_s == 0 || l_t == 0 || d_t == 0 {
            return Err(MapperError::Geometry(format!(
                "every dimension must be positive (l_s {l_s}, d_s {d_s}, l_t {l_t}, d_t {d_t})"
            )));
        }
        let overflow = || {
            MapperError::Geometry(format!(
                "statistics for {l_s}×{d_s} → {l_t}×{d_t} do not fit in memory"
            ))
        };
        let dx = l_s.checked_mul(d_s).ok_or_else(overflow)?;
        let dy = l_t.checked_mul(d_t).ok_or_else(overflow)?;
        let elems = dx
            .checked_mul(dx)
            .and_then(|a| dx.checked_mul(dy).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(dx + 2 * dy))
            .ok_or_else(overflow)?;
        elems.checked_mul(8).ok_or_else(overflow)
    }

    pub fn l_s(&self) -> usize {
        self.l_s
    }
    pub fn d_s(&self) -> usize {
        self.d_s
    }
    pub fn l_t(&self) -> usize {
        self.l_t
    }
    pub fn d_t(&self) -> usize {
        self.d_t
    }
    /// Total source feature width `L_s·D_s`.
    pub fn dx(&self) -> usize {
        self.l_s * self.d_s
    }
    /// Total target feature width `L_t·D_t`.
    pub fn dy(&self) -> usize {
        self.l_t * self.d_t
    }
    /// Number of observations accumulated.
    pub fn count(&self) -> u64 {
        self.count
    }
    /// Bytes held by the statistics (the heap data; the struct itself is negligible).
    pub fn memory_bytes(&self) -> usize {
        8 * (self.mean_x.len()
            + self.mean_y.len()
            + self.cxx.len()
            + self.cxy.len()
            + self.syy.len())
    }

    pub fn mean_x(&self) -> &[f64] {
        &self.mean_x
    }
    pub fn mean_y(&self) -> &[f64] {
        &self.mean_y
    }
    /// Centred sum of squares of every target column, `Σ (y − μ_y)²`.
    pub fn syy(&self) -> &[f64] {
        &self.syy
    }
    /// Σx over all observations.
    pub fn sum_x(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.mean_x.iter().map(|m| m * n).collect()
    }
    /// Σy over all observations.
    pub fn sum_y(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.mean_y.iter().map(|m| m * n).collect()
    }
    /// Σy² of every target column (uncentred).
    pub fn sum_y2(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.syy
            .iter()
            .zip(&self.mean_y)
            .map(|(s, m)| s + n * m * m)
            .collect()
    }

    /// The centred Gram `C_xx`; only its lower triangle (with the diagonal) is meaningful,
    /// the strict upper triangle reads as zero.
    pub fn cxx_lower(&self) -> MatRef<'_, f64> {
        let dx = self.dx();
        MatRef::from_column_major_slice(&self.cxx, dx, dx)
    }
    /// The centred cross moments `C_xy` (`D_x × D_y`).
    pub fn cxy(&self) -> MatRef<'_, f64> {
        MatRef::from_column_major_slice(&self.cxy, self.dx(), self.dy())
    }

    /// Column `c` of `C_xy` (`D_x` values: the cross moments of target feature `c` with
    /// every source feature).
    pub fn cxy_column(&self, c: usize) -> &[f64] {
        let dx = self.dx();
        &self.cxy[c * dx..(c + 1) * dx]
    }

    /// Entry `(i, j)` of the full symmetric `C_xx`.
    #[inline]
    pub fn cxx_at(&self, i: usize, j: usize) -> f64 {
        let dx = self.dx();
        if i >= j {
            self.cxx[i + j * dx]
        } else {
            self.cxx[j + i * dx]
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random numbers for synthetic data (splitmix64 → uniform →
    /// Box-Muller), so tests need no RNG crate state and always see the same data.
    pub(crate) struct Rng(u64);
    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed)
        }
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub(crate) fn uniform(&mut self) -> f64 {
            ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        pub(crate) fn normal(&mut self) -> f64 {
            let (u, v) = (self.uniform(), self.uniform());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
        pub(crate) fn normals(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f32> {
            (0..n)
                .map(|_| (offset + scale * self.normal()) as f32)
                .collect()
        }
    }

    pub(crate) fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
        let scale = a
            .iter()
            .chain(b)
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(1e-300);
        a.iter()
            .zip(b)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    pub(crate) fn data(rows: usize, dx: usize, dy: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = Rng::new(seed);
        // Large offsets on purpose: centring must not lose the spread to cancellation.
        (
            rng.normals(rows * dx, 1.0, 30.0),
            rng.normals(rows * dy, 2.0, -7.0),
        )
    }

    #[test]
    fn memory_estimates_match_the_documented_figures() {
        let fwd = PairStats::estimate_bytes(24, 128, 28, 256).unwrap();
        let rev = PairStats::estimate_bytes(28, 256, 24, 128).unwrap();
        let mb = |b: usize| b as f64 / 1e6;
        assert!((mb(fwd) - (75.5 + 176.2)).abs() < 1.0, "{}", mb(fwd));
        assert!((mb(rev) - (411.0 + 176.2)).abs() < 1.0, "{}", mb(rev));
    }
}
