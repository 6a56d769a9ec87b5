//! A piece of the statistics, and the moments a batch would give them, without a second
//! copy of the whole: a learner weighs an update by solving every target layer from the
//! blocks that layer reads with the batch added to those blocks alone, and takes it into
//! the full statistics only once it is accepted.

use super::accumulate::check_batch;
use super::PairStats;
use crate::mapper::error::{MapperError, Result};

impl PairStats {
    /// The statistics of source layers `sources` (in that order) and target layer
    /// `target_layer` alone: geometry `sources.len() × D_s → 1 × D_t`, the same count,
    /// and the very same means and moments as those blocks of `self`.
    pub fn restricted(&self, sources: &[usize], target_layer: usize) -> Result<PairStats> {
        if let Some(&s) = sources.iter().find(|&&s| s >= self.l_s) {
            return Err(MapperError::LayerOutOfRange {
                what: "source",
                layer: s,
                layers: self.l_s,
            });
        }
        if target_layer >= self.l_t {
            return Err(MapperError::LayerOutOfRange {
                what: "target",
                layer: target_layer,
                layers: self.l_t,
            });
        }
        let (d_s, d_t) = (self.d_s, self.d_t);
        let idx: Vec<usize> = sources
            .iter()
            .flat_map(|&s| s * d_s..(s + 1) * d_s)
            .collect();
        let cols = target_layer * d_t..(target_layer + 1) * d_t;
        let mut out = PairStats::new(sources.len(), d_s, 1, d_t)?;
        let p = idx.len();
        out.count = self.count;
        out.mean_x = idx.iter().map(|&i| self.mean_x[i]).collect();
        out.mean_y = self.mean_y[cols.clone()].to_vec();
        out.syy = self.syy[cols.clone()].to_vec();
        for (j, &gj) in idx.iter().enumerate() {
            for (i, &gi) in idx.iter().enumerate().skip(j) {
                out.cxx[i + j * p] = self.cxx_at(gi, gj);
            }
        }
        for (c, gc) in cols.enumerate() {
            let col = self.cxy_column(gc);
            for (i, &gi) in idx.iter().enumerate() {
                out.cxy[i + c * p] = col[gi];
            }
        }
        Ok(out)
    }

    /// The source means and the diagonal of `C_xx` (every source feature's centred sum
    /// of squares) that adding the batch `x` (`rows × D_x`, row-major) would give, with
    /// the count it would give; `self` is left as it is.
    pub fn x_moments_with(&self, x: &[f32], rows: usize) -> Result<(Vec<f64>, Vec<f64>, u64)> {
        let dx = self.dx();
        check_batch("x", x, rows, dx)?;
        let diag: Vec<f64> = (0..dx).map(|i| self.cxx_at(i, i)).collect();
        if rows == 0 {
            return Ok((self.mean_x.clone(), diag, self.count));
        }
        let nb = rows as f64;
        let mut batch_mean = vec![0.0f64; dx];
        for row in x.chunks_exact(dx) {
            for (m, &v) in batch_mean.iter_mut().zip(row) {
                *m += f64::from(v);
            }
        }
        batch_mean.iter_mut().for_each(|m| *m /= nb);
        let mut squares = vec![0.0f64; dx];
        for row in x.chunks_exact(dx) {
            for ((q, &v), m) in squares.iter_mut().zip(row).zip(&batch_mean) {
                let d = f64::from(v) - m;
                *q += d * d;
            }
        }
        // Chan, Golub and LeVeque's pairwise update, diagonal only.
        let na = self.count as f64;
        let n = na + nb;
        let c = na * nb / n;
        let mut mean = self.mean_x.clone();
        let mut out = diag;
        for j in 0..dx {
            let d = batch_mean[j] - mean[j];
            out[j] += squares[j] + c * d * d;
            mean[j] += d * nb / n;
        }
        Ok((mean, out, self.count + rows as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{data, max_rel_diff};
    use super::*;

    #[test]
    fn a_restricted_piece_with_a_batch_equals_that_piece_of_the_whole_with_it() {
        let (l_s, d_s, l_t, d_t) = (4, 3, 3, 2);
        let (x, y) = data(30, l_s * d_s, l_t * d_t, 5);
        let mut whole = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        whole.update(&x, &y, 30).unwrap();
        let (bx, by) = data(9, l_s * d_s, l_t * d_t, 6);

        let (mean, diag, count) = whole.x_moments_with(&bx, 9).unwrap();
        let sources = [3, 1];
        let mut piece = whole.restricted(&sources, 2).unwrap();
        let cols = |data: &[f32], width: usize, ranges: &[std::ops::Range<usize>]| {
            data.chunks_exact(width)
                .flat_map(|row| ranges.iter().flat_map(|r| row[r.clone()].to_vec()))
                .collect::<Vec<f32>>()
        };
        let px = cols(&bx, l_s * d_s, &[9..12, 3..6]);
        let py = cols(&by, l_t * d_t, &[4..6]);
        piece.update(&px, &py, 9).unwrap();

        whole.update(&bx, &by, 9).unwrap();
        let expect = whole.restricted(&sources, 2).unwrap();
        assert_eq!(piece.count(), expect.count());
        assert_eq!(count, whole.count());
        let tol = 1e-12;
        assert!(max_rel_diff(piece.mean_x(), expect.mean_x()) < tol);
        assert!(max_rel_diff(piece.mean_y(), expect.mean_y()) < tol);
        assert!(max_rel_diff(piece.syy(), expect.syy()) < tol);
        let p = 2 * d_s;
        let full = |s: &PairStats| -> Vec<f64> {
            (0..p)
                .flat_map(|i| (0..p).map(move |j| (i, j)))
                .map(|(i, j)| s.cxx_at(i, j))
                .chain((0..d_t).flat_map(|c| s.cxy_column(c).to_vec()))
                .collect()
        };
        assert!(max_rel_diff(&full(&piece), &full(&expect)) < tol);
        let whole_diag: Vec<f64> = (0..l_s * d_s).map(|i| whole.cxx_at(i, i)).collect();
        assert!(max_rel_diff(&diag, &whole_diag) < tol);
        assert!(max_rel_diff(&mean, whole.mean_x()) < tol);
    }

    #[test]
    fn layers_out_of_range_are_refused() {
        let s = PairStats::new(2, 2, 2, 2).unwrap();
        assert!(s.restricted(&[2], 0).is_err());
        assert!(s.restricted(&[0], 2).is_err());
        assert!(s.x_moments_with(&[0.0; 3], 1).is_err());
    }
}
