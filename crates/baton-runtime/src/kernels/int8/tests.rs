//! Every path against a dequantized f64 reference over a shape sweep, the paths against
//! each other bit for bit, and the invariances the decoder relies on.

use super::acts::{quantize_a256, quantize_a32, A256, A32};
use super::{matmul_split, Epilogue, Job, Kind, Packed, Rows, Split, PATHS};
use crate::kernels::{KernelError, KernelPath};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

const KINDS: [GgmlDType; 4] = [
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q4K,
    GgmlDType::Q6K,
];
/// Row counts: one row (the decode kernels), register-block remainders (4 rows per
/// block on the VNNI path, 8 on the AVX2 one), and both sides of the 64-row work item.
const ROWS: [usize; 9] = [1, 2, 3, 5, 7, 14, 64, 65, 130];
/// Output columns: one tile, and an odd tile count (a work item with a single tile).
const COLS: [usize; 2] = [16, 48];
const SPLITS: [Split; 4] = [
    Split::Pool,
    Split::Threads(1),
    Split::Threads(2),
    Split::Threads(7),
];

/// Inputs: one block, two, three (32-value blocks), and the models' widths (qwen2.5's
/// 896 and 1536 hidden sizes, 256-value super-blocks for the K-quants).
fn depths(dt: GgmlDType) -> &'static [usize] {
    match dt {
        GgmlDType::Q4K | GgmlDType::Q6K => &[256, 512, 1536],
        _ => &[32, 64, 96, 256, 896],
    }
}

/// Deterministic values in [-1, 1) with a few outliers ten times larger, the shape of
/// real activations (a handful of channels dominate a block's scale).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            if i % 97 == 13 {
                10.0 * u
            } else {
                u
            }
        })
        .collect()
}

struct Case {
    dt: GgmlDType,
    n: usize,
    k: usize,
    packed: Packed,
    /// The dequantized weight, [n][k].
    deq: Vec<f32>,
}

fn case(dt: GgmlDType, n: usize, k: usize, seed: u64) -> Case {
    let wf = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).expect("tensor");
    let q = QTensor::quantize(&wf, dt).expect("quantize");
    let packed = Packed::new(dt, n, k, &q.data().expect("raw")).expect("packable");
    let deq = q
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("dequantize");
    Case {
        dt,
        n,
        k,
        packed,
        deq,
    }
}

fn run(path: KernelPath, x: &[f32], m: usize, jobs: &[Job<'_>], split: Split) -> Vec<Vec<f32>> {
    matmul_split(path, Rows::Whole(x), m, jobs, split).expect("matmul")
}

fn plain<'a>(w: &'a Packed, bias: Option<&'a [f32]>) -> Job<'a> {
    Job {
        w,
        up: None,
        bias,
        epilogue: Epilogue::Plain,
    }
}

/// `y` against `x · deqᵀ + bias` in f64, within what quantizing the activations can
/// move it. Each activation is rounded to a multiple of its block's step d = amax/127,
/// so it moves by at most d/2, and output j by at most Σ_blocks (d_b/2) Σ_{i∈b} |w_ji|
/// (a bound, not an estimate). On top: f32 rounding of the block products and the
/// running sum, a few ulps of Σ|w x|, for which 1e-5 relative is ample.
fn check_against_reference(c: &Case, x: &[f32], m: usize, bias: &[f32], y: &[f32], what: &str) {
    let bs = if Kind::of(c.dt).is_some_and(|k| k.a256()) {
        256
    } else {
        32
    };
    for r in 0..m {
        let xr = &x[r * c.k..(r + 1) * c.k];
        for j in 0..c.n {
            let wr = &c.deq[j * c.k..(j + 1) * c.k];
            let exact: f64 = xr
                .iter()
                .zip(wr)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                + bias[j] as f64;
            let mut bound = 0f64;
            let mut mag = 0f64;
            for b in 0..c.k / bs {
                let xb = &xr[b * bs..(b + 1) * bs];
                let wb = &wr[b * bs..(b + 1) * bs];
                let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
                bound += step / 2.0 * wb.iter().map(|w| w.abs() as f64).sum::<f64>();
                mag += xb
                    .iter()
                    .zip(wb)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum::<f64>();
            }
            let tol = bound * (1.0 + 1e-4) + 1e-5 * (mag + bias[j].abs() as f64) + 1e-6;
            let got = y[r * c.n + j] as f64;
            assert!(
                (got - exact).abs() <= tol,
                "{what}: {:?} {}x{} m={m} row {r} col {j}: {got} vs {exact} (tolerance {tol})",
                c.dt,
                c.n,
                c.k
            );
        }
    }
}

/// The sweep for one path: every kind, depth, width, row count and thread split, with
/// a bias; every split must give the same bits.
fn sweep(path: KernelPath) {
    let mut seed = 1;
    for dt in KINDS {
        for &k in depths(dt) {
            for n in COLS {
                seed += 1;
                let c = case(dt, n, k, seed);
                let bias = values(n, seed + 1000);
                for m in ROWS {
                    let x = values(m * k, seed * 31 + m as u64);
                    let job = [plain(&c.packed, Some(&bias))];
                    let first = run(path, &x, m, &job, SPLITS[0]).remove(0);
                    check_against_reference(&c, &x, m, &bias, &first, &format!("{path:?}"));
                    for split in &SPLITS[1..] {
                        let again = run(path, &x, m, &job, *split).remove(0);
                        assert_eq!(again, first, "{path:?} {dt:?} {n}x{k} m={m}: {split:?}");
                    }
                }
            }
        }
    }
}

/// Whether `path` runs here; says so loudly when it does not, so a skipped path shows
/// in the test output instead of passing unseen.
fn runs_here(path: KernelPath) -> bool {
    if path.available() {
        return true;
    }
    baton_test_support::skipped(
        &format!("the {path:?} int8 kernel path"),
        &format!("not available on this CPU (needs {})", path.needs()),
    );
    false
}

#[test]
fn portable_path_matches_the_dequantized_reference_over_the_shape_sweep() {
    sweep(KernelPath::Portable);
}

#[test]
fn avx512vnni_path_matches_the_dequantized_reference_over_the_shape_sweep() {
    if runs_here(KernelPath::Avx512Vnni) {
        sweep(KernelPath::Avx512Vnni);
    }
}

#[test]
fn avx2_path_matches_the_dequantized_reference_over_the_shape_sweep() {
    if runs_here(KernelPath::Avx2) {
        sweep(KernelPath::Avx2);
    }
}

/// The paths quantize activations to the same bytes and form the same integer sums
/// with the same float steps in the same order, so they must agree exactly, not within
/// a tolerance: a difference here is a bug in one of them, however small.
#[test]
fn avx512vnni_and_portable_paths_agree_bit_for_bit() {
    if !runs_here(KernelPath::Avx512Vnni) {
        return;
    }
    // SAFETY: AVX-512 VNNI (so F/BW/VL) is available: checked above.
    quantizers_agree(
        |x, o| unsafe { super::acts::avx512::quantize_a32(x, o) },
        |x, o| unsafe { super::acts::avx512::quantize_a256(x, o) },
    );
    agrees_with_portable(KernelPath::Avx512Vnni);
}

#[test]
fn avx2_and_portable_paths_agree_bit_for_bit() {
    if !runs_here(KernelPath::Avx2) {
        return;
    }
    // SAFETY: AVX2 is available: checked above.
    quantizers_agree(
        |x, o| unsafe { super::acts::avx2::quantize_a32(x, o) },
        |x, o| unsafe { super::acts::avx2::quantize_a256(x, o) },
    );
    agrees_with_portable(KernelPath::Avx2);
}

/// SIMD quantizers against the portable ones, on values that hit rounding ties
/// (x·(1/d) = z + 0.5), zero blocks, and a block holding a NaN.
fn quantizers_agree(q32: impl Fn(&[f32], &mut [A32]), q256: impl Fn(&[f32], &mut [A256])) {
    let mut x = values(4096, 7);
    for (i, v) in x.iter_mut().enumerate().take(256) {
        *v = (i % 9) as f32 * 0.5 - 2.0;
    }
    x[256..288].fill(0.0);
    x[1000] = f32::NAN;
    let (mut p32, mut v32) = (vec![A32::default(); 128], vec![A32::default(); 128]);
    quantize_a32(&x, &mut p32);
    q32(&x, &mut v32);
    assert_eq!(format!("{p32:?}"), format!("{v32:?}"));
    let (mut p256, mut v256) = (vec![A256::default(); 16], vec![A256::default(); 16]);
    quantize_a256(&x, &mut p256);
    q256(&x, &mut v256);
    assert_eq!(format!("{p256:?}"), format!("{v256:?}"));
}

/// `path` against the portable path on every kind, depth, width and row count, through
/// all three epilogues.
fn agrees_with_portable(path: KernelPath) {
    let mut seed = 500;
    for dt in KINDS {
        for &k in depths(dt) {
            for n in COLS {
                seed += 1;
                let c = case(dt, n, k, seed);
                let up = case(dt, n, k, seed + 77);
                let bias = values(n, seed + 3);
                for m in ROWS {
                    let x = values(m * k, seed * 17 + m as u64);
                    let res = values(m * n, seed * 19 + m as u64);
                    let jobs = [
                        plain(&c.packed, Some(&bias)),
                        Job {
                            epilogue: Epilogue::Residual(&res),
                            ..plain(&c.packed, None)
                        },
                        Job {
                            w: &c.packed,
                            up: Some(&up.packed),
                            bias: None,
                            epilogue: Epilogue::SwiGlu,
                        },
                    ];
                    let v = run(path, &x, m, &jobs, Split::Pool);
                    let p = run(KernelPath::Portable, &x, m, &jobs, Split::Threads(3));
                    for (i, (a, b)) in v.iter().zip(&p).enumerate() {
                        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{path:?} {dt:?} {n}x{k} m={m} job {i}: paths differ");
                    }
                }
            }
        }
    }
}

/// Every block type against a dequantized f32 matmul, and the row-count invariance
/// the decoder's chunking guarantee rests on: a row computed alone, in a small group or
/// in a big batch gets the same bits. Then the fused epilogues.
fn accurate_and_row_count_invariant(path: KernelPath) -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let (n, k, m) = (48, 512, 70);
    let run = |x: &[f32],
               m: usize,
               w: &Packed,
               up: Option<&Packed>,
               epilogue: Epilogue<'_>,
               bias: Option<&[f32]>| {
        let job = Job {
            w,
            up,
            bias,
            epilogue,
        };
        run(path, x, m, &[job], Split::Pool).remove(0)
    };
    for dt in KINDS {
        let wf = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let q = QTensor::quantize(&wf, dt)?;
        let w = Packed::new(dt, n, k, &q.data()?).expect("packable");
        let deq = q.dequantize(&dev)?;
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
        let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let all = run(&xs, m, &w, None, Epilogue::Plain, Some(&bias));
        let reference: Vec<f32> = x
            .matmul(&deq.t()?)?
            .broadcast_add(&Tensor::new(bias.as_slice(), &dev)?)?
            .flatten_all()?
            .to_vec1()?;
        let e = rel(&all, &reference);
        assert!(e < 0.02, "{dt:?}: relative error {e}");
        for (r0, rows) in [(0, 1), (37, 1), (69, 1), (3, 7), (60, 10)] {
            let part = run(
                &xs[r0 * k..(r0 + rows) * k],
                rows,
                &w,
                None,
                Epilogue::Plain,
                Some(&bias),
            );
            assert_eq!(
                part,
                all[r0 * n..(r0 + rows) * n],
                "{dt:?}: rows {r0}..{}",
                r0 + rows
            );
        }
        // Fused epilogues: residual add and SwiGLU.
        let res: Vec<f32> = (0..m * n).map(|i| (i % 13) as f32 - 6.0).collect();
        let with_res = run(&xs, m, &w, None, Epilogue::Residual(&res), Some(&bias));
        for i in 0..m * n {
            assert_eq!(with_res[i], all[i] + res[i]);
        }
        let q2 = QTensor::quantize(&Tensor::randn(0f32, 1.0, (n, k), &dev)?, dt)?;
        let up = Packed::new(dt, n, k, &q2.data()?).expect("packable");
        let g = run(&xs, m, &w, None, Epilogue::Plain, None);
        let u = run(&xs, m, &up, None, Epilogue::Plain, None);
        let sw = run(&xs, m, &w, Some(&up), Epilogue::SwiGlu, None);
        for i in 0..m * n {
            let want = g[i] / (1.0 + (-g[i]).exp()) * u[i];
            assert!(
                (sw[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{dt:?} swiglu {i}: {} vs {want}",
                sw[i]
            );
        }
        let sw1 = run(&xs[5 * k..6 * k], 1, &w, Some(&up), Epilogue::SwiGlu, None);
        assert_eq!(sw1, sw[5 * n..6 * n]);
    }
    Ok(())
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn portable_packed_kernels_are_accurate_and_row_count_invariant() -> candle_core::Result<()> {
    accurate_and_row_count_invariant(KernelPath::Portable)
}

#[test]
fn avx512vnni_packed_kernels_are_accurate_and_row_count_invariant() -> candle_core::Result<()> {
    if !runs_here(KernelPath::Avx512Vnni) {
        return Ok(());
    }
    accurate_and_row_count_invariant(KernelPath::Avx512Vnni)
}

#[test]
fn avx2_packed_kernels_are_accurate_and_row_count_invariant() -> candle_core::Result<()> {
    if !runs_here(KernelPath::Avx2) {
        return Ok(());
    }
    accurate_and_row_count_invariant(KernelPath::Avx2)
}

/// Parts side by side are the joined row, on every path that runs here.
#[test]
fn parts_side_by_side_equal_the_joined_rows() {
    let (n, k, m, width) = (32, 96, 5, 32);
    let c = case(GgmlDType::Q8_0, n, k, 9);
    let x = values(m * k, 10);
    let parts: Vec<Vec<f32>> = (0..k / width)
        .map(|p| {
            (0..m)
                .flat_map(|r| x[r * k + p * width..r * k + (p + 1) * width].to_vec())
                .collect()
        })
        .collect();
    let refs: Vec<&[f32]> = parts.iter().map(|p| p.as_slice()).collect();
    for path in PATHS.into_iter().filter(|p| runs_here(*p)) {
        let job = [plain(&c.packed, None)];
        let whole = run(path, &x, m, &job, Split::Pool);
        let split = matmul_split(
            path,
            Rows::Parts {
                parts: &refs,
                width,
            },
            m,
            &job,
            Split::Pool,
        )
        .expect("parts");
        assert_eq!(whole, split, "{path:?}");
    }
}

/// Shapes the layout cannot hold, and inputs that disagree with the weights, are errors
/// before anything is read.
#[test]
fn bad_shapes_and_inputs_are_errors() {
    let raw = |dt: GgmlDType, n: usize, k: usize| {
        let t = Tensor::zeros((n, k), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        QTensor::quantize(&t, dt)
            .expect("quantize")
            .data()
            .expect("raw")
            .to_vec()
    };
    // One output column, or outputs not a multiple of 16: not packable.
    assert!(Packed::new(GgmlDType::Q8_0, 1, 32, &raw(GgmlDType::Q8_0, 1, 32)).is_err());
    assert!(Packed::new(GgmlDType::Q8_0, 17, 32, &raw(GgmlDType::Q8_0, 17, 32)).is_err());
    // Inputs around a block boundary: only whole blocks.
    for k in [31, 33, 63, 65] {
        assert!(!Packed::supports(GgmlDType::Q8_0, 16, k), "k = {k}");
    }
    assert!(!Packed::supports(GgmlDType::Q4K, 16, 288));
    assert!(Packed::new(GgmlDType::Q8_0, 16, 64, &raw(GgmlDType::Q8_0, 16, 32)).is_err());
    assert!(Packed::new(GgmlDType::F32, 16, 64, &[]).is_err());

    let c = case(GgmlDType::Q8_0, 16, 64, 3);
    let x = values(2 * 64, 4);
    let p = KernelPath::Portable;
    let err = |r: Result<Vec<Vec<f32>>, KernelError>| r.expect_err("should be refused");
    assert!(matches!(
        err(matmul_split(
            p,
            Rows::Whole(&x[..100]),
            2,
            &[plain(&c.packed, None)],
            Split::Pool
        )),
        KernelError::Shape(_)
    ));
    assert!(matches!(
        err(matmul_split(p, Rows::Whole(&x), 2, &[], Split::Pool)),
        KernelError::Shape(_)
    ));
    let short_bias = [0f32; 8];
    assert!(matches!(
        err(matmul_split(
            p,
            Rows::Whole(&x),
            2,
            &[plain(&c.packed, Some(&short_bias))],
            Split::Pool
        )),
        KernelError::Shape(_)
    ));
    let res = [0f32; 16];
    let job = Job {
        epilogue: Epilogue::Residual(&res),
        ..plain(&c.packed, None)
    };
    assert!(matches!(
        err(matmul_split(p, Rows::Whole(&x), 2, &[job], Split::Pool)),
        KernelError::Shape(_)
    ));
    let job = Job {
        epilogue: Epilogue::SwiGlu,
        ..plain(&c.packed, None)
    };
    assert!(matches!(
        err(matmul_split(p, Rows::Whole(&x), 2, &[job], Split::Pool)),
        KernelError::Shape(_)
    ));
    // The attention path has no int8 matmul.
    assert!(matches!(
        err(matmul_split(
            KernelPath::Avx512,
            Rows::Whole(&x),
            2,
            &[plain(&c.packed, None)],
            Split::Pool
        )),
        KernelError::Unavailable { .. }
    ));
}

/// The portable `silu` is the VNNI one lane for lane, over the whole clamped range and
/// past it.
#[test]
fn portable_silu_matches_the_avx512_one_bit_for_bit() {
    if !runs_here(KernelPath::Avx512Vnni) {
        return;
    }
    let xs: Vec<f32> = (-2000..2000)
        .map(|i| i as f32 * 0.07)
        .chain([0.0, -0.0, 1e-30, -1e-30, 150.0, -150.0, 1e6, -1e6])
        .collect();
    for chunk in xs.chunks(16) {
        let mut lanes = [0f32; 16];
        lanes[..chunk.len()].copy_from_slice(chunk);
        let got = super::vnni::silu_lanes(lanes);
        for (i, &x) in lanes.iter().enumerate() {
            let want = super::portable::silu(x);
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "silu({x}): {} vs {want}",
                got[i]
            );
        }
    }
}

/// The portable `silu` is the AVX2 one lane for lane, over the whole clamped range, past
/// it, and where e^-x is subnormal (the AVX2 exp scales by two powers of two there).
#[test]
fn portable_silu_matches_the_avx2_one_bit_for_bit() {
    if !runs_here(KernelPath::Avx2) {
        return;
    }
    let xs: Vec<f32> = (-2000..2000)
        .map(|i| i as f32 * 0.07)
        .chain((0..200).map(|i| 87.0 + i as f32 * 0.1))
        .chain([0.0, -0.0, 1e-30, -1e-30, 150.0, -150.0, 1e6, -1e6, f32::NAN])
        .collect();
    for chunk in xs.chunks(8) {
        let mut lanes = [0f32; 8];
        lanes[..chunk.len()].copy_from_slice(chunk);
        let got = super::avx2::silu_lanes(lanes);
        for (i, &x) in lanes.iter().enumerate() {
            let want = super::portable::silu(x);
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "silu({x}): {} vs {want}",
                got[i]
            );
        }
    }
}
