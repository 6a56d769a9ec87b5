//! Adding observations to [`PairStats`]: batches (weighted or not) and whole statistics,
//! both by the pairwise update of Chan, Golub and LeVeque.

use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use super::PairStats;
use crate::mapper::error::{MapperError, Result};

impl PairStats {
    /// Adds a batch of `rows` paired observations: `x` is `rows × L_s·D_s` row-major, `y` is
    /// `rows × L_t·D_t` row-major (the layouts the caller captures in). A batch with a NaN or
    /// infinite value is rejected whole, before anything is added: one would poison the
    /// statistics for good, and they are kept and merged for a long time.
    pub fn update(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<()> {
        self.update_weighted(x, y, rows, None)
    }

    /// [`Self::update`] with a weight per observation: the moments become weighted sums
    /// (`C_xx = Σ wᵢ (xᵢ−μ)(xᵢ−μ)ᵀ` about the weighted mean), so the ridge fit from them is
    /// the weighted least-squares fit. The weights are rescaled to sum to `rows`, so the
    /// batch still counts as `rows` observations and merges with unweighted batches as
    /// one of that size would; only their proportions matter.
    pub fn update_weighted(
        &mut self,
        x: &[f32],
        y: &[f32],
        rows: usize,
        weights: Option<&[f32]>,
    ) -> Result<()> {
        let dx = self.dx();
        let dy = self.dy();
        check_batch("x", x, rows, dx)?;
        check_batch("y", y, rows, dy)?;
        if rows == 0 {
            return Ok(());
        }
        let weights = match weights {
            None => None,
            Some(w) => Some(normalised_weights(w, rows)?),
        };
        let weights = weights.as_deref();
        let na = self.count as f64;
        let nb = rows as f64;
        let n = na + nb;
        let batch_mean_x = column_means(x, rows, dx, weights);
        let batch_mean_y = column_means(y, rows, dy, weights);

        // The Chan merge term (na·nb/n)·δδᵀ is folded into the product as one extra row
        // sqrt(na·nb/n)·δ, so the big matrices are swept once per batch, not twice.
        let extra = usize::from(self.count > 0);
        let w = if self.count > 0 {
            (na * nb / n).sqrt()
        } else {
            0.0
        };
        let xc = centred_columns(x, rows, dx, &batch_mean_x, &self.mean_x, w, extra, weights);
        let yc = centred_columns(y, rows, dy, &batch_mean_y, &self.mean_y, w, extra, weights);
        let k = rows + extra;
        let xc_ref = MatRef::from_column_major_slice(&xc, k, dx);
        let yc_ref = MatRef::from_column_major_slice(&yc, k, dy);

        let par = Par::rayon(0);
        triangular::matmul(
            MatMut::from_column_major_slice_mut(&mut self.cxx, dx, dx),
            BlockStructure::TriangularLower,
            Accum::Add,
            xc_ref.transpose(),
            BlockStructure::Rectangular,
            xc_ref,
            BlockStructure::Rectangular,
            1.0,
            par,
        );
        matmul(
            MatMut::from_column_major_slice_mut(&mut self.cxy, dx, dy),
            Accum::Add,
            xc_ref.transpose(),
            yc_ref,
            1.0,
            par,
        );
        for (s, col) in self.syy.iter_mut().zip(yc.chunks_exact(k)) {
            *s += col.iter().map(|v| v * v).sum::<f64>();
        }
        let f = nb / n;
        for (m, b) in self.mean_x.iter_mut().zip(&batch_mean_x) {
            *m += (b - *m) * f;
        }
        for (m, b) in self.mean_y.iter_mut().zip(&batch_mean_y) {
            *m += (b - *m) * f;
        }
        self.count += rows as u64;
        Ok(())
    }

    /// Adds everything `other` holds, as if its observations had been streamed into `self`.
    pub fn merge(&mut self, other: &PairStats) -> Result<()> {
        if (self.l_s, self.d_s, self.l_t, self.d_t) != (other.l_s, other.d_s, other.l_t, other.d_t)
        {
            return Err(MapperError::MergeMismatch(format!(
                "{}×{} → {}×{} vs {}×{} → {}×{}",
                self.l_s, self.d_s, self.l_t, self.d_t, other.l_s, other.d_s, other.l_t, other.d_t
            )));
        }
        if other.count == 0 {
            return Ok(());
        }
        if self.count == 0 {
            self.clone_from(other);
            return Ok(());
        }
        let dx = self.dx();
        let na = self.count as f64;
        let nb = other.count as f64;
        let n = na + nb;
        let c = na * nb / n;
        let dmx: Vec<f64> = other
            .mean_x
            .iter()
            .zip(&self.mean_x)
            .map(|(b, a)| b - a)
            .collect();
        let dmy: Vec<f64> = other
            .mean_y
            .iter()
            .zip(&self.mean_y)
            .map(|(b, a)| b - a)
            .collect();
        // Column by column in parallel: the matrices are hundreds of megabytes and this is a
        // plain memory sweep.
        self.cxx
            .par_chunks_mut(dx)
            .zip(other.cxx.par_chunks(dx))
            .zip(dmx.par_iter())
            .enumerate()
            .for_each(|(j, ((col, ocol), &dj))| {
                let cj = c * dj;
                for ((a, o), d) in col[j..].iter_mut().zip(&ocol[j..]).zip(&dmx[j..]) {
                    *a += o + cj * d;
                }
            });
        self.cxy
            .par_chunks_mut(dx)
            .zip(other.cxy.par_chunks(dx))
            .zip(dmy.par_iter())
            .for_each(|((col, ocol), &dj)| {
                let cj = c * dj;
                for ((a, o), d) in col.iter_mut().zip(ocol).zip(&dmx) {
                    *a += o + cj * d;
                }
            });
        for ((s, o), d) in self.syy.iter_mut().zip(&other.syy).zip(&dmy) {
            *s += o + c * d * d;
        }
        let f = nb / n;
        for (m, d) in self.mean_x.iter_mut().zip(&dmx) {
            *m += d * f;
        }
        for (m, d) in self.mean_y.iter_mut().zip(&dmy) {
            *m += d * f;
        }
        self.count += other.count;
        Ok(())
    }
}

pub(super) fn check_batch(
    what: &'static str,
    data: &[f32],
    rows: usize,
    width: usize,
) -> Result<()> {
    let expected = rows.saturating_mul(width);
    if data.len() != expected {
        return Err(MapperError::BatchShape {
            what,
            got: data.len(),
            expected,
            rows,
            width,
        });
    }
    if let Some(k) = data.iter().position(|v| !v.is_finite()) {
        return Err(MapperError::NonFinite {
            what,
            row: k / width,
            col: k % width,
        });
    }
    Ok(())
}

/// `w` (one per row, non-negative, finite, not all zero) scaled to sum to `rows`.
fn normalised_weights(w: &[f32], rows: usize) -> Result<Vec<f64>> {
    if w.len() != rows {
        return Err(MapperError::BatchShape {
            what: "weights",
            got: w.len(),
            expected: rows,
            rows,
            width: 1,
        });
    }
    if let Some(r) = w.iter().position(|v| !v.is_finite() || *v < 0.0) {
        return Err(MapperError::NonFinite {
            what: "weights",
            row: r,
            col: 0,
        });
    }
    let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
    if total <= 0.0 {
        return Err(MapperError::NonFinite {
            what: "weights (all zero)",
            row: 0,
            col: 0,
        });
    }
    let f = rows as f64 / total;
    Ok(w.iter().map(|&v| f64::from(v) * f).collect())
}

/// Column means of the batch, weighted by `weights` (which sum to `rows`) when given.
fn column_means(data: &[f32], rows: usize, width: usize, weights: Option<&[f64]>) -> Vec<f64> {
    let mut m = vec![0.0f64; width];
    for (r, row) in data.chunks_exact(width).enumerate() {
        let w = weights.map_or(1.0, |w| w[r]);
        for (a, v) in m.iter_mut().zip(row) {
            *a += w * f64::from(*v);
        }
    }
    let inv = 1.0 / rows as f64;
    m.iter_mut().for_each(|a| *a *= inv);
    m
}

/// The batch centred on its own mean as a column-major f64 matrix (`rows + extra` ×
/// `width`), plus (when `extra` is 1) the last row `w·(batch mean − running mean)` that
/// carries the Chan merge term. Column-major because faer's product runs about twice as
/// fast with both operands laid out that way than with the row-major input as is.
#[allow(clippy::too_many_arguments)] // one batch's layout, means, merge row and weights
fn centred_columns(
    data: &[f32],
    rows: usize,
    width: usize,
    batch_mean: &[f64],
    running_mean: &[f64],
    w: f64,
    extra: usize,
    weights: Option<&[f64]>,
) -> Vec<f64> {
    let k = rows + extra;
    let mut out = vec![0.0f64; k * width];
    for (r, row) in data.chunks_exact(width).enumerate() {
        // A row of weight w enters the products as √w·(x − μ): Σ √w·√w = Σ w.
        let s = weights.map_or(1.0, |w| w[r].sqrt());
        for (c, (v, m)) in row.iter().zip(batch_mean).enumerate() {
            out[c * k + r] = s * (f64::from(*v) - m);
        }
    }
    if extra == 1 {
        for (c, (b, a)) in batch_mean.iter().zip(running_mean).enumerate() {
            out[c * k + rows] = w * (b - a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{data, max_rel_diff};
    use super::*;

    fn assert_close(a: &PairStats, b: &PairStats, tol: f64) {
        assert_eq!(a.count, b.count);
        assert!(max_rel_diff(&a.mean_x, &b.mean_x) <= tol, "mean_x");
        assert!(max_rel_diff(&a.mean_y, &b.mean_y) <= tol, "mean_y");
        assert!(max_rel_diff(&a.cxx, &b.cxx) <= tol, "cxx");
        assert!(max_rel_diff(&a.cxy, &b.cxy) <= tol, "cxy");
        assert!(max_rel_diff(&a.syy, &b.syy) <= tol, "syy");
    }

    #[test]
    fn a_weighted_batch_is_the_batch_with_rows_repeated_as_often_as_their_weight() {
        // Multiplicities summing to the row count, so both count four observations.
        let (dx, dy) = (3, 2);
        let (x, y) = data(4, dx, dy, 7);
        let repeat = [2usize, 1, 1, 0];
        let (mut rx, mut ry) = (Vec::new(), Vec::new());
        for (r, &m) in repeat.iter().enumerate() {
            for _ in 0..m {
                rx.extend_from_slice(&x[r * dx..(r + 1) * dx]);
                ry.extend_from_slice(&y[r * dy..(r + 1) * dy]);
            }
        }
        let (x2, y2) = data(5, dx, dy, 8);
        let mut repeated = PairStats::new(1, dx, 1, dy).unwrap();
        repeated.update(&x2, &y2, 5).unwrap();
        repeated.update(&rx, &ry, 4).unwrap();
        let mut weighted = PairStats::new(1, dx, 1, dy).unwrap();
        weighted.update(&x2, &y2, 5).unwrap();
        // Scaled by 3: only the proportions of the weights count.
        let w: Vec<f32> = repeat.iter().map(|&m| 3.0 * m as f32).collect();
        weighted.update_weighted(&x, &y, 4, Some(&w)).unwrap();
        assert_close(&weighted, &repeated, 1e-9);
        let mut plain = PairStats::new(1, dx, 1, dy).unwrap();
        plain.update(&x2, &y2, 5).unwrap();
        plain.update(&x, &y, 4).unwrap();
        assert!(max_rel_diff(&plain.cxx, &weighted.cxx) > 1e-3);
    }

    #[test]
    fn weights_that_are_negative_missing_or_all_zero_are_refused() {
        let (x, y) = data(2, 1, 1, 3);
        let mut s = PairStats::new(1, 1, 1, 1).unwrap();
        for w in [&[1.0f32, -1.0][..], &[1.0], &[0.0, 0.0], &[f32::NAN, 1.0]] {
            assert!(s.update_weighted(&x, &y, 2, Some(w)).is_err(), "{w:?}");
        }
        assert_eq!(s.count(), 0);
    }

    /// Straightforward f64 reference: raw sums, then centre.
    fn naive(
        x: &[f32],
        y: &[f32],
        rows: usize,
        dx: usize,
        dy: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mx = column_means(x, rows, dx, None);
        let my = column_means(y, rows, dy, None);
        let mut cxx = vec![0.0; dx * dx];
        let mut cxy = vec![0.0; dx * dy];
        let mut syy = vec![0.0; dy];
        for r in 0..rows {
            let xr: Vec<f64> = (0..dx).map(|i| f64::from(x[r * dx + i]) - mx[i]).collect();
            let yr: Vec<f64> = (0..dy).map(|j| f64::from(y[r * dy + j]) - my[j]).collect();
            for j in 0..dx {
                for i in j..dx {
                    cxx[i + j * dx] += xr[i] * xr[j];
                }
            }
            for j in 0..dy {
                for i in 0..dx {
                    cxy[i + j * dx] += xr[i] * yr[j];
                }
                syy[j] += yr[j] * yr[j];
            }
        }
        (cxx, cxy, syy)
    }

    #[test]
    fn one_batch_matches_naive() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 57);
        let (x, y) = data(rows, l_s * d_s, l_t * d_t, 1);
        let mut s = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        s.update(&x, &y, rows).unwrap();
        let (cxx, cxy, syy) = naive(&x, &y, rows, l_s * d_s, l_t * d_t);
        assert!(max_rel_diff(&s.cxx, &cxx) < 1e-12);
        assert!(max_rel_diff(&s.cxy, &cxy) < 1e-12);
        assert!(max_rel_diff(&s.syy, &syy) < 1e-12);
        let sum_y2: Vec<f64> = (0..l_t * d_t)
            .map(|j| {
                (0..rows)
                    .map(|r| f64::from(y[r * l_t * d_t + j]).powi(2))
                    .sum()
            })
            .collect();
        assert!(max_rel_diff(&s.sum_y2(), &sum_y2) < 1e-12);
    }

    #[test]
    fn streaming_and_merge_match_one_batch() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 300);
        let (dx, dy) = (l_s * d_s, l_t * d_t);
        let (mut x, mut y) = data(rows, dx, dy, 2);
        // Drift, so batches have different means and the merge terms carry real weight.
        for (k, v) in x.iter_mut().enumerate() {
            *v += 0.3 * (k / dx) as f32;
        }
        for (k, v) in y.iter_mut().enumerate() {
            *v -= 0.2 * (k / dy) as f32;
        }
        let mut whole = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        whole.update(&x, &y, rows).unwrap();

        let mut streamed = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        let mut start = 0;
        for len in [1, 7, 100, 0, 64, 128] {
            streamed
                .update(
                    &x[start * dx..(start + len) * dx],
                    &y[start * dy..(start + len) * dy],
                    len,
                )
                .unwrap();
            start += len;
        }
        assert_eq!(start, rows);
        assert_close(&streamed, &whole, 1e-9);

        let split = 123;
        let mut a = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        let mut b = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        a.update(&x[..split * dx], &y[..split * dy], split).unwrap();
        b.update(&x[split * dx..], &y[split * dy..], rows - split)
            .unwrap();
        a.merge(&b).unwrap();
        assert_close(&a, &whole, 1e-9);

        let mut empty = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        empty.merge(&whole).unwrap();
        assert_close(&empty, &whole, 0.0);
        let other_shape = PairStats::new(l_s, d_s, l_t, d_t + 1).unwrap();
        assert!(matches!(
            whole.merge(&other_shape),
            Err(MapperError::MergeMismatch(_))
        ));
    }

    #[test]
    fn bad_batches_are_rejected_untouched() {
        let mut s = PairStats::new(2, 3, 1, 2).unwrap();
        let x = vec![1.0f32; 2 * 6];
        let mut y = vec![1.0f32; 2 * 2];
        assert!(matches!(
            s.update(&x, &y, 3),
            Err(MapperError::BatchShape { .. })
        ));
        y[3] = f32::NAN;
        let err = s.update(&x, &y, 2).unwrap_err();
        assert!(
            matches!(
                err,
                MapperError::NonFinite {
                    what: "y",
                    row: 1,
                    col: 1
                }
            ),
            "{err}"
        );
        assert_eq!(s.count(), 0);
        assert!(PairStats::new(0, 3, 1, 2).is_err());
    }
}
