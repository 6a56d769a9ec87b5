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
    let w = map.weight_column_major(p, m);
    let (u, sigma, keep) = prediction_directions(stats, &idx, &w, m, rank)?;
    let (left, right) = factors_of(&w, &u, &sigma, &keep, p, m);
    let weight = product(&left, &right, p, m, rank);
    let bias = intercept(stats, &idx, &stats.mean_y()[cols], &weight, m);
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

/// The directions of the map's predictions with the most variance over the calibration
/// features: the eigenvectors of `Wᵀ C W` (column-major `m × m`), the spread `σ` of each
/// kept one (1 where it vanishes), and which `rank` of them are kept, largest first.
fn prediction_directions(
    stats: &PairStats,
    idx: &[usize],
    w: &[f64],
    m: usize,
    rank: usize,
) -> Result<(Vec<f64>, Vec<f64>, Vec<usize>)> {
    let p = idx.len();
    let n = stats.count().max(1) as f64;
    let mut c = vec![0.0; p * p];
    for (j, &gj) in idx.iter().enumerate() {
        for (i, &gi) in idx.iter().enumerate().skip(j) {
            let v = stats.cxx_at(gi, gj) / n;
            c[i + j * p] = v;
            c[j + i * p] = v;
        }
    }
    let mut cw = vec![0.0; p * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut cw, p, m),
        Accum::Replace,
        MatRef::from_column_major_slice(&c, p, p),
        MatRef::from_column_major_slice(w, p, m),
        1.0,
        Par::rayon(0),
    );
    // Covariance of the predictions, m × m.
    let mut s = vec![0.0; m * m];
    matmul(
        MatMut::from_column_major_slice_mut(&mut s, m, m),
        Accum::Replace,
        MatRef::from_column_major_slice(w, p, m).transpose(),
        MatRef::from_column_major_slice(&cw, p, m),
        1.0,
        Par::rayon(0),
    );
    let eig = MatRef::from_column_major_slice(&s, m, m)
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| MapperError::Eigen(format!("{e:?}")))?;
    let ev: Vec<f64> = eig.S().column_vector().iter().copied().collect();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| ev[b].total_cmp(&ev[a]));
    let keep = order[..rank].to_vec();
    let sigma: Vec<f64> = keep.iter().map(|&i| ev[i].max(0.0).sqrt()).collect();
    let sigma_max = sigma.iter().fold(0.0f64, |a, &b| a.max(b));
    let sigma = sigma
        .iter()
        .map(|&v| {
            if v > 1e-12 * sigma_max && v > 0.0 {
                v
            } else {
                1.0
            }
        })
        .collect();
    let u = eig.U();
    let mut u_cols = vec![0.0; m * m];
    for col in 0..m {
        for i in 0..m {
            u_cols[col + i * m] = *u.get(col, i);
        }
    }
    Ok((u_cols, sigma, keep))
}

/// left = W v_i / σ_i (row-major `p × rank`), right row i = σ_i v_iᵀ (`rank × m`).
fn factors_of(
    w: &[f64],
    u: &[f64],
    sigma: &[f64],
    keep: &[usize],
    p: usize,
    m: usize,
) -> (Vec<f32>, Vec<f32>) {
    let rank = keep.len();
    let mut left = vec![0f32; p * rank];
    for (slot, &i) in keep.iter().enumerate() {
        for r in 0..p {
            let mut acc = 0.0;
            for col in 0..m {
                acc += w[r + col * p] * u[col + i * m];
            }
            left[r * rank + slot] = (acc / sigma[slot]) as f32;
        }
    }
    let mut right = vec![0f32; rank * m];
    for (slot, &i) in keep.iter().enumerate() {
        for col in 0..m {
            right[slot * m + col] = (sigma[slot] * u[col + i * m]) as f32;
        }
    }
    (left, right)
}

/// W_r in f64 from the f32 factors, so the dense and factored paths agree.
fn product(left: &[f32], right: &[f32], p: usize, m: usize, rank: usize) -> Vec<f32> {
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
    weight
}

/// Same intercept rule as the full fit: exact at the means for the shipped weights.
fn intercept(
    stats: &PairStats,
    idx: &[usize],
    mean_y: &[f64],
    weight: &[f32],
    m: usize,
) -> Vec<f64> {
    let mut bias: Vec<f64> = mean_y.to_vec();
    for (r, &g) in idx.iter().enumerate() {
        let mx = stats.mean_x()[g];
        for (b, &wv) in bias.iter_mut().zip(&weight[r * m..(r + 1) * m]) {
            *b -= mx * f64::from(wv);
        }
    }
    bias
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
