//! Layer selection: rank source layers for each target layer by the in-sample R² of a
//! single-layer ridge fit, then keep the best k.
//!
//! The scores only rank; the design notes say calibration R² does not predict handoff
//! quality, so k (and λ) are chosen on held-out data with [`crate::mapper::ridge::r2`].

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use super::error::{MapperError, Result};
use super::ridge::{check_fit_count, check_lambda, Problem, RidgeOptions};
use super::stats::PairStats;

/// In-sample R² of the single-source-layer ridge fit for every (target layer j, source
/// layer i): `result[j][i]`, `L_t` rows of `L_s`. Fitted with `opts` exactly as
/// [`crate::mapper::ridge::fit_layer`] would with `sources = [i]`.
///
/// One Cholesky factorisation per source layer serves all target layers at once (the
/// target columns are just more right-hand sides), so this is `L_s` factorisations of
/// `D_s × D_s` and `L_s` products of `D_s × D_s × L_t·D_t`, not `L_s·L_t` fits.
pub fn single_layer_r2(stats: &PairStats, opts: &RidgeOptions) -> Result<Vec<Vec<f64>>> {
    check_lambda(opts.lambda)?;
    check_fit_count(stats)?;
    let (l_s, l_t, d_t, dy) = (stats.l_s(), stats.l_t(), stats.d_t(), stats.dy());
    let syy = stats.syy();
    let sst: Vec<f64> = (0..l_t)
        .map(|j| syy[j * d_t..(j + 1) * d_t].iter().sum())
        .collect();
    if let Some(j) = sst.iter().position(|&s| s <= 0.0) {
        return Err(MapperError::ZeroVariance { layer: j });
    }
    let mut out = vec![vec![0.0; l_s]; l_t];
    for i in 0..l_s {
        let prob = Problem::new(stats, &[i], 0..dy, opts.standardize)?;
        let (p, m) = (prob.p, prob.m);
        let (w, lambda) = prob.solve_cholesky(opts.lambda, opts.lambda_fallback)?;
        if lambda > opts.lambda {
            tracing::warn!(
                source_layer = i,
                requested = opts.lambda,
                used = lambda,
                "single-layer Gram ill-conditioned: raised λ"
            );
        }
        let mut aw = vec![0.0; p * m];
        matmul(
            MatMut::from_column_major_slice_mut(&mut aw, p, m),
            Accum::Replace,
            MatRef::from_column_major_slice(&prob.a, p, p),
            MatRef::from_column_major_slice(&w, p, m),
            1.0,
            Par::rayon(0),
        );
        for (j, row) in out.iter_mut().enumerate() {
            // In-sample with an intercept, the offset term vanishes: SSE = s_yy − 2 tr(WᵀB)
            // + tr(WᵀAW), in whatever space A and B were scaled into.
            let cols = j * d_t..(j + 1) * d_t;
            let sse: f64 = syy[cols.clone()]
                .iter()
                .zip(w[cols.start * p..cols.end * p].chunks_exact(p))
                .zip(prob.b[cols.start * p..cols.end * p].chunks_exact(p))
                .zip(aw[cols.start * p..cols.end * p].chunks_exact(p))
                .map(|(((s, wc), bc), awc)| {
                    let cross: f64 = wc.iter().zip(bc).map(|(a, b)| a * b).sum();
                    let quad: f64 = wc.iter().zip(awc).map(|(a, b)| a * b).sum();
                    s - 2.0 * cross + quad
                })
                .sum();
            row[i] = 1.0 - sse.max(0.0) / sst[j];
        }
    }
    Ok(out)
}

/// The `k` source layers with the highest R² in `r2_row` (one row of
/// [`single_layer_r2`]), returned in ascending layer order. Ties go to the lower layer; a
/// NaN score ranks last; `k ≥ r2_row.len()` returns every layer.
pub fn top_k(r2_row: &[f64], k: usize) -> Vec<usize> {
    let key = |v: f64| if v.is_nan() { f64::NEG_INFINITY } else { v };
    let mut order: Vec<usize> = (0..r2_row.len()).collect();
    order.sort_by(|&a, &b| key(r2_row[b]).total_cmp(&key(r2_row[a])).then(a.cmp(&b)));
    order.truncate(k);
    order.sort_unstable();
    order
}

/// [`top_k`] for every target layer of a [`single_layer_r2`] matrix.
pub fn select_layers(r2: &[Vec<f64>], k: usize) -> Vec<Vec<usize>> {
    r2.iter().map(|row| top_k(row, k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapper::ridge::tests::{truth_sources, Synth};
    use crate::mapper::ridge::{fit_layer, r2};
    use std::time::Instant;

    #[test]
    fn true_sources_rank_first_and_scores_match_single_fits() {
        let syn = Synth::new(5, 6, 3, 4, 0.0, 91);
        let (stats, _, _) = syn.stats(400, 92);
        for standardize in [true, false] {
            let opts = RidgeOptions {
                standardize,
                ..RidgeOptions::default()
            };
            let m = single_layer_r2(&stats, &opts).unwrap();
            assert_eq!((m.len(), m[0].len()), (3, 5));
            for (j, row) in m.iter().enumerate() {
                assert_eq!(top_k(row, 2), truth_sources(j, 5), "target {j}: {row:?}");
                for (i, &v) in row.iter().enumerate() {
                    let map = fit_layer(&stats, j, &[i], &opts).unwrap();
                    let direct = r2(&stats, j, &map).unwrap();
                    // The stats path scores the f64 solution, the map its f32 rounding.
                    assert!((v - direct).abs() < 1e-6, "({j}, {i}): {v} vs {direct}");
                }
            }
            assert_eq!(select_layers(&m, 9)[0], vec![0, 1, 2, 3, 4]);
        }
    }

    fn bench_pair(l_s: usize, d_s: usize, l_t: usize, d_t: usize) {
        let (dx, dy) = (l_s * d_s, l_t * d_t);
        let t = Instant::now();
        let mut stats = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        println!(
            "{l_s}×{d_s} → {l_t}×{d_t}: stats {:.1} MB, new {:.2?}",
            stats.memory_bytes() as f64 / 1e6,
            t.elapsed()
        );
        let mut rng = crate::mapper::stats::tests::Rng::new(1);
        let rows = 1024;
        let x = rng.normals(rows * dx, 1.0, 0.5);
        let y = rng.normals(rows * dy, 1.0, -0.5);
        for batch in [128usize, 128, 128, 1024, 1024] {
            let t = Instant::now();
            stats
                .update(&x[..batch * dx], &y[..batch * dy], batch)
                .unwrap();
            println!("  update {batch:>4} rows: {:.3?}", t.elapsed());
        }
        let opts = RidgeOptions::default();
        let t = Instant::now();
        let m = single_layer_r2(&stats, &opts).unwrap();
        println!("  single_layer_r2 ({l_t}×{l_s} fits): {:.3?}", t.elapsed());
        let sel = select_layers(&m, 8);
        let t = Instant::now();
        let map = fit_layer(&stats, 0, &sel[0], &opts).unwrap();
        println!("  fit_layer k=8 (p={}): {:.3?}", 8 * d_s, t.elapsed());
        let t = Instant::now();
        let r = r2(&stats, 0, &map).unwrap();
        println!("  r2 from stats: {:.3?} (in-sample {r:.3})", t.elapsed());
        let t = Instant::now();
        crate::mapper::ridge::fit_layer_lambdas(
            &stats,
            0,
            &sel[0],
            &opts,
            &[0.01, 0.1, 1.0, 10.0, 100.0],
        )
        .unwrap();
        println!("  fit_layer_lambdas k=8, 5 λ: {:.3?}", t.elapsed());
        let all: Vec<usize> = (0..l_s).collect();
        let t = Instant::now();
        fit_layer(&stats, 0, &all, &opts).unwrap();
        println!("  fit_layer k=all (p={dx}): {:.3?}", t.elapsed());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.safetensors");
        let t = Instant::now();
        stats.save(&path).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        println!("  save: {:.3?} ({:.1} MB)", t.elapsed(), size as f64 / 1e6);
        let t = Instant::now();
        let back = PairStats::load(&path).unwrap();
        println!("  load: {:.3?}", t.elapsed());
        assert!(back == stats);
        let t = Instant::now();
        let other = stats.clone();
        stats.merge(&other).unwrap();
        println!("  merge: {:.3?} (with clone)", t.elapsed());
    }

    /// Timings at the default pair's shapes: `cargo test --release --lib mapper::select::
    /// tests::bench -- --ignored --nocapture --test-threads=1`.
    #[test]
    #[ignore = "benchmark: needs ~1.5 GB and tens of seconds"]
    fn bench_default_pair_shapes() {
        bench_pair(24, 128, 28, 256);
        bench_pair(28, 256, 24, 128);
    }

    #[test]
    fn top_k_orders_and_clamps() {
        let row = [0.1, 0.9, f64::NAN, 0.5, 0.9, -2.0];
        assert_eq!(top_k(&row, 1), vec![1]);
        assert_eq!(top_k(&row, 2), vec![1, 4]);
        assert_eq!(top_k(&row, 3), vec![1, 3, 4]);
        assert_eq!(top_k(&row, 5), vec![0, 1, 3, 4, 5]);
        assert_eq!(top_k(&row, 99), vec![0, 1, 2, 3, 4, 5]);
        assert!(top_k(&row, 0).is_empty());
    }
}
