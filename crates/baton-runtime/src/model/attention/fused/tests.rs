use super::*;
use crate::model::attention::{batched, AttentionPath};

/// The fused kernel's contract written with plain tensor ops, checking what
/// candle-flash-attn checks of its inputs (rank 4, last dim contiguous, kv heads
/// dividing heads), so that the path around the kernel can be tested on any device.
fn reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    causal: bool,
) -> candle_core::Result<Tensor> {
    for x in [q, k, v] {
        if x.rank() != 4 || x.stride()[3] != 1 {
            candle_core::bail!("rank 4 with a contiguous last dim, got {:?}", x.stride());
        }
    }
    let (b, t, nh, hd) = q.dims4()?;
    let (_, n, nkv, _) = k.dims4()?;
    if b != 1 || nh % nkv != 0 {
        candle_core::bail!("batch {b}, {nh} heads over {nkv}");
    }
    let group = nh / nkv;
    let heads: Vec<u32> = (0..nh).map(|h| (h / group) as u32).collect();
    let heads = Tensor::new(heads.as_slice(), q.device())?;
    let per_head = |x: &Tensor| -> candle_core::Result<Tensor> {
        x.squeeze(0)?
            .transpose(0, 1)?
            .contiguous()?
            .index_select(&heads, 0)
    };
    let q = q.squeeze(0)?.transpose(0, 1)?.contiguous()?;
    let (k, v) = (per_head(k)?, per_head(v)?);
    let mut scores = (q.matmul(&k.t()?)? * scale as f64)?;
    if causal {
        // Row i sits at position i + n - t of the keys: aligned at the end.
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| {
                (0..n).map(move |j| {
                    if j <= i + n - t {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, n), q.device())?.to_dtype(scores.dtype())?;
        scores = scores.broadcast_add(&mask)?;
    }
    let p = candle_nn::ops::softmax_last_dim(&scores)?;
    p.matmul(&v)?
        .transpose(0, 1)?
        .unsqueeze(0)?
        .reshape((1, t, nh, hd))
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?)
}

/// Around the kernel, the fused path attends as the batched one does: for a prefill, an
/// extension and a decode step, with dropped positions left out, over the cache's views
/// of a buffer larger than the positions written, for the supported models' head shapes.
#[test]
fn the_fused_path_attends_as_the_batched_one() -> Result<()> {
    let dev = Device::Cpu;
    let cap = 64;
    for (nh, nkv, hd) in [(14, 2, 64), (12, 2, 128), (4, 4, 64)] {
        let kb = Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev)?;
        let vb = Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev)?;
        for (start, t, hidden) in [
            (0, 40, vec![]),
            (30, 10, vec![]),
            (39, 1, vec![]),
            (30, 10, vec![0..3, 11..20]),
            (39, 1, vec![5..6, 12..14, 20..39]),
            (45, 3, vec![0..45]),
        ] {
            let n = start + t;
            let q = Tensor::randn(0f32, 1.0, (nh, t, hd), &dev)?;
            let (k, v) = (kb.narrow(1, 0, n)?, vb.narrow(1, 0, n)?);
            let mut masks = Masks::default();
            let fused = attend_with(reference, &q, &k, &v, start, &hidden, &mut masks)?;
            let want = batched(&q, &k, &v, start, &hidden, &mut Masks::default())?;
            assert_eq!(fused.dims(), &[t, nh * hd]);
            let err = max_diff(&fused, &want)?;
            assert!(
                err < 1e-5,
                "{nh}/{nkv}/{hd} {start}+{t} hiding {hidden:?}: {err}"
            );
        }
    }
    Ok(())
}

/// Leaving a position out changes what the rows read: the gather is not a no-op.
#[test]
fn hidden_positions_are_gathered_out() -> Result<()> {
    let dev = Device::Cpu;
    let (nh, nkv, hd, start, t) = (4, 2, 64, 20, 4);
    let q = Tensor::randn(0f32, 1.0, (nh, t, hd), &dev)?;
    let k = Tensor::randn(0f32, 1.0, (nkv, start + t, hd), &dev)?;
    let v = Tensor::randn(0f32, 1.0, (nkv, start + t, hd), &dev)?;
    let all = attend_with(reference, &q, &k, &v, start, &[], &mut Masks::default())?;
    let some = attend_with(reference, &q, &k, &v, start, &[2..9], &mut Masks::default())?;
    assert!(max_diff(&all, &some)? > 1e-3);
    Ok(())
}

/// In bf16, the GPU's arithmetic, both paths stay within bf16's rounding of each other.
#[test]
fn in_bf16_the_paths_agree_within_rounding() -> Result<()> {
    let dev = Device::Cpu;
    let (nh, nkv, hd, start, t) = (12, 2, 128, 24, 8);
    let b = |x: Tensor| x.to_dtype(DType::BF16);
    let q = b(Tensor::randn(0f32, 1.0, (nh, t, hd), &dev)?)?;
    let k = b(Tensor::randn(0f32, 1.0, (nkv, start + t, hd), &dev)?)?;
    let v = b(Tensor::randn(0f32, 1.0, (nkv, start + t, hd), &dev)?)?;
    let hidden = [3..7];
    let fused = attend_with(reference, &q, &k, &v, start, &hidden, &mut Masks::default())?;
    let want = batched(&q, &k, &v, start, &hidden, &mut Masks::default())?;
    assert_eq!(fused.dtype(), DType::BF16);
    let err = max_diff(&fused, &want)?;
    assert!(err < 0.05, "{err}");
    Ok(())
}

/// Shapes that disagree are an error before the kernel is called.
#[test]
fn misshaped_inputs_are_errors() -> Result<()> {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1.0, (4, 3, 64), &dev)?;
    let k = Tensor::randn(0f32, 1.0, (2, 10, 64), &dev)?;
    let short = Tensor::randn(0f32, 1.0, (2, 9, 64), &dev)?;
    let mut m = Masks::default();
    assert!(attend_with(reference, &q, &k, &short, 7, &[], &mut m).is_err());
    assert!(attend_with(reference, &q, &k, &k, 6, &[], &mut m).is_err());
    assert!(attend_with(reference, &q, &k, &k, 7, &[], &mut m).is_ok());
    Ok(())
}

/// The fused path is refused where it cannot run, with the way out named: on the CPU,
/// in f32, for a head width the kernels do not cover, or (first) in a build without them.
#[test]
fn the_fused_path_is_refused_where_it_cannot_run() {
    let e = check(&Device::Cpu, DType::BF16, 64)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("--attention batched"), "{e}");
    if coverage().is_none() {
        assert!(e.contains("scripts/check-cuda --flash"), "{e}");
    } else {
        assert!(e.contains("--device cuda"), "{e}");
    }
    assert_eq!(AttentionPath::parse(" Fused"), Ok(AttentionPath::Fused));
    assert!(AttentionPath::parse("flash").is_err());
}
