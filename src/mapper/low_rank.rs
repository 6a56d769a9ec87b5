//! The reduced mapper: a fitted map cut to rank `r` by reduced-rank regression. The
//! ridge predictions `ŷ = (x − μ_x)W` are projected onto their `r` leading principal
//! directions over the calibration statistics, `W_r = W V_r V_rᵀ`, the best rank-`r`
//! approximation of what the full map predicts (not of `W` itself, whose unused
//! directions cost nothing to drop). Applying it costs `p·r + r·D_t` per token instead
//! of `p·D_t`.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par, Side};

use super::error::{MapperError, Result};
use super::ridge::{target_columns, Factors, LayerMap};
use super::stats::PairStats;

/// `map` reduced to `rank` (at most `D_t`): a map with the rank-`rank` weight and bias,
/// and its factors.
pub fn reduce_rank(
    stats: &PairStats,
    target_layer: usize,
    map: &LayerMap,
    rank: usize,
) -> Result<(LayerMap, Factors)> {
    let cols = target_columns(stats, target_layer)?;
    let d_s = stats.d_s();
    let m = cols.len();
    let idx: Vec<usize> = map
        .sources
        .iter()
        .flat_map(|&s| s * d_s..(s + 1) * d_s)
        .collect();
    let p = idx.len();
    if map.weight.len() != p * m || map.bias.len() != m {
        return Err(MapperError::Sources(format!(
            "map of {} weights and {} biases for {p} features and {m} outputs",
            map.weight.len(),
            map.bias.len()
        )));
    }
    if rank == 0 || rank > m {
        return Err(MapperError::Sources(format!(
            "rank {rank} is outside 1..={m} (the target layer's width)"
        )));
    }
    let n = stats.count().max(1) as f64;
    let mut c = vec![0.0; p * p];
    for (j, &gj) in idx.iter().enumerate() {
        for (i, &gi) in idx.iter().enumerate().skip(j) {
            let v = stats.cxx_at(gi, gj) / n;
            c[i + j * p] = v;
            c[j + i * p] = v;
        }
    }
    // W column-major p × m.
    let mut w = vec![0.0; p * m];
    for r in 0..p {
        for col in 0..m {
            w[r + col * p] = f64::from(map.weight[r * m + col]);
        }
    }
    let mut cw = vec![0.0; p * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut cw, p, m),
        Accum::Replace,
        MatRef::from_column_major_slice(&c, p, p),
        MatRef::from_column_major_slice(&w, p, m),
        1.0,
        Par::rayon(0),
    );
    // Covariance of the predictions, m × m.
    let mut s = vec![0.0; m * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut s, m, m),
        Accum::Replace,
        MatRef::from_column_major_slice(&w, p, m).transpose(),
        MatRef::from_column_major_slice(&cw, p, m),
        1.0,
        Par::rayon(0),
    );
    let eig = MatRef::from_column_major_slice(&s, m, m)
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| MapperError::Eigen(format!("{e:?}")))?;
    let u = eig.U();
    let ev: Vec<f64> = eig.S().column_vector().iter().copied().collect();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| ev[b].total_cmp(&ev[a]));
    let keep = &order[..rank];
    // left = W v_i / σ_i, right row i = σ_i v_iᵀ, σ_i the spread of that prediction.
    let sigma: Vec<f64> = keep.iter().map(|&i| ev[i].max(0.0).sqrt()).collect();
    let sigma_max = sigma.iter().fold(0.0f64, |a, &b| a.max(b));
    let sigma: Vec<f64> = sigma
        .iter()
        .map(|&v| {
            if v > 1e-12 * sigma_max && v > 0.0 {
                v
            } else {
                1.0
            }
        })
        .collect();
    let mut left = vec![0f32; p * rank];
    for (slot, &i) in keep.iter().enumerate() {
        for r in 0..p {
            let mut acc = 0.0;
            for col in 0..m {
                acc += w[r + col * p] * u.get(col, i);
            }
            left[r * rank + slot] = (acc / sigma[slot]) as f32;
        }
    }
    let mut right = vec![0f32; rank * m];
    for (slot, &i) in keep.iter().enumerate() {
        for col in 0..m {
            right[slot * m + col] = (sigma[slot] * u.get(col, i)) as f32;
        }
    }
    // W_r in f64 from the f32 factors, so the dense and factored paths agree.
    let mut weight = vec![0f32; p * m];
    for r in 0..p {
        for col in 0..m {
            let mut acc = 0.0f64;
            for slot in 0..rank {
                acc += f64::from(left[r * rank + slot]) * f64::from(right[slot * m + col]);
            }
            weight[r * m + col] = acc as f32;
        }
    }
    // Same intercept rule as the full fit: exact at the means for the shipped weights.
    let mean_x: Vec<f64> = idx.iter().map(|&g| stats.mean_x()[g]).collect();
    let mean_y = &stats.mean_y()[cols];
    let mut bias: Vec<f64> = mean_y.to_vec();
    for (r, mx) in mean_x.iter().enumerate() {
        for (b, &wv) in bias.iter_mut().zip(&weight[r * m..(r + 1) * m]) {
            *b -= mx * f64::from(wv);
        }
    }
    Ok((
        LayerMap {
            sources: map.sources.clone(),
            weight,
            bias: bias.iter().map(|&b| b as f32).collect(),
            info: map.info.clone(),
            factors: Some(Factors {
                rank,
                left: left.clone(),
                right: right.clone(),
            }),
        },
        Factors { rank, left, right },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapper::ridge::{fit_layer, r2, RidgeOptions};

    /// Deterministic pseudo-random values in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 20_000) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    /// One source layer of 8 features, one target layer of 6 that is a rank-2 function
    /// of them plus an offset and a little noise.
    fn rank_two_stats() -> PairStats {
        let (rows, ds, dt) = (400, 8, 6);
        let x = noise(rows * ds, 3);
        let a = noise(ds * 2, 5);
        let b = noise(2 * dt, 7);
        let e = noise(rows * dt, 11);
        let mut y = vec![0f32; rows * dt];
        for r in 0..rows {
            for c in 0..dt {
                let mut v = 0.5 + 0.01 * e[r * dt + c];
                for h in 0..2 {
                    let z: f32 = (0..ds).map(|i| x[r * ds + i] * a[i * 2 + h]).sum();
                    v += z * b[h * dt + c];
                }
                y[r * dt + c] = v;
            }
        }
        let mut st = PairStats::new(1, ds, 1, dt).unwrap();
        st.update(&x, &y, rows).unwrap();
        st
    }

    #[test]
    fn full_rank_keeps_the_map_and_its_factors_multiply_to_the_weight() {
        let st = rank_two_stats();
        let full = fit_layer(&st, 0, &[0], &RidgeOptions::default()).unwrap();
        let (m, f) = reduce_rank(&st, 0, &full, 6).unwrap();
        for (a, b) in m.weight.iter().zip(&full.weight) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        for (a, b) in m.bias.iter().zip(&full.bias) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        assert_eq!(m.factors.as_ref(), Some(&f));
        assert_eq!(f.macs(), 8 * 6 + 6 * 6);
    }

    #[test]
    fn the_true_rank_loses_nothing_and_a_lower_one_does() {
        let st = rank_two_stats();
        let full = fit_layer(&st, 0, &[0], &RidgeOptions::default()).unwrap();
        let r2_full = r2(&st, 0, &full).unwrap();
        let (two, _) = reduce_rank(&st, 0, &full, 2).unwrap();
        let (one, _) = reduce_rank(&st, 0, &full, 1).unwrap();
        let (r2_two, r2_one) = (r2(&st, 0, &two).unwrap(), r2(&st, 0, &one).unwrap());
        assert!(r2_full > 0.99, "{r2_full}");
        // The data is rank two up to noise: rank two keeps the fit, rank one cannot.
        assert!(r2_full - r2_two < 1e-3, "{r2_full} vs {r2_two}");
        assert!(r2_one < r2_two - 0.05, "rank one {r2_one} vs two {r2_two}");
    }

    #[test]
    fn a_rank_outside_the_target_width_is_refused() {
        let st = rank_two_stats();
        let full = fit_layer(&st, 0, &[0], &RidgeOptions::default()).unwrap();
        assert!(reduce_rank(&st, 0, &full, 0).is_err());
        assert!(reduce_rank(&st, 0, &full, 7).is_err());
    }
}
