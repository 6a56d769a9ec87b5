//! Attention-output cosine: the target's own queries attend over the true cache and over
//! the mapped cache; the closer the two outputs, the less the mapping changes what the
//! model reads. This, not calibration R², is what predicts downstream retention.

use super::{MetricError, Result};
use candle_core::{DType, Device, Tensor, D};

/// `queries`: [n_head, P, hd] at absolute positions `probe_positions` (after RoPE);
/// `k_true`, `v_true`, `k_mapped`, `v_mapped`: [n_kv_head, len, hd] with len greater
/// than every probe position. Each probe attends causally over positions 0..=p.
/// Returns the cosine of the two outputs averaged over query heads and probes.
pub fn attention_output_cosine(
    queries: &Tensor,
    probe_positions: &[usize],
    k_true: &Tensor,
    v_true: &Tensor,
    k_mapped: &Tensor,
    v_mapped: &Tensor,
) -> Result<f64> {
    attention_output_cosine_hiding(
        queries,
        probe_positions,
        k_true,
        v_true,
        k_mapped,
        v_mapped,
        &[],
    )
}

/// [`attention_output_cosine`] where the mapped cache keeps `hidden` positions out of
/// attention (a plan dropped them), as every forward over it does: what their slots
/// hold must not count for or against the handoff.
pub fn attention_output_cosine_hiding(
    queries: &Tensor,
    probe_positions: &[usize],
    k_true: &Tensor,
    v_true: &Tensor,
    k_mapped: &Tensor,
    v_mapped: &Tensor,
    hidden: &[std::ops::Range<usize>],
) -> Result<f64> {
    let (nh, p, hd) = queries.dims3()?;
    let (nkv, len, khd) = k_true.dims3()?;
    if p != probe_positions.len() || khd != hd || nh % nkv != 0 {
        return Err(MetricError::Shape(format!(
            "queries {:?}, {} probes, keys {:?}",
            queries.dims(),
            probe_positions.len(),
            k_true.dims()
        )));
    }
    if k_mapped.dims() != k_true.dims() || v_mapped.dims() != v_true.dims() {
        return Err(MetricError::Shape(format!(
            "mapped cache {:?} vs true {:?}",
            k_mapped.dims(),
            k_true.dims()
        )));
    }
    if let Some(&bad) = probe_positions.iter().find(|&&q| q >= len) {
        return Err(MetricError::Shape(format!(
            "probe at {bad} past a cache of {len}"
        )));
    }
    let f = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.contiguous()?) };
    let (q, kt, vt, km, vm) = (
        f(queries)?,
        f(k_true)?,
        f(v_true)?,
        f(k_mapped)?,
        f(v_mapped)?,
    );
    let mask = probe_mask(probe_positions, len, q.device())?;
    let ot = attention_output(&q, &kt, &vt, &mask)?;
    let om = if hidden.is_empty() {
        attention_output(&q, &km, &vm, &mask)?
    } else {
        let hiding = masked(probe_positions, len, hidden, q.device())?;
        attention_output(&q, &km, &vm, &hiding)?
    };
    let dot = (&ot * &om)?.sum(D::Minus1)?;
    let nt = ot.sqr()?.sum(D::Minus1)?.sqrt()?;
    let nm = om.sqr()?.sum(D::Minus1)?.sqrt()?;
    let cos = (dot / (nt * nm)?.clamp(1e-30, f64::MAX)?)?;
    Ok(cos.mean_all()?.to_scalar::<f32>()? as f64)
}

/// The causal mask of probes over `len` positions: probe `i` sees keys `0..=probes[i]`.
pub fn probe_mask(probes: &[usize], len: usize, device: &Device) -> candle_core::Result<Tensor> {
    masked(probes, len, &[], device)
}

/// [`probe_mask`] with the `hidden` positions masked for every probe as well.
fn masked(
    probes: &[usize],
    len: usize,
    hidden: &[std::ops::Range<usize>],
    device: &Device,
) -> candle_core::Result<Tensor> {
    // Large but finite, so the output is differentiable (a softmax's gradient through
    // -inf is NaN); exp of it is exactly 0 in f32 all the same.
    const OUT: f32 = -1e9;
    let mut mask = vec![0f32; probes.len() * len];
    for (i, &pos) in probes.iter().enumerate() {
        let row = &mut mask[i * len..(i + 1) * len];
        row[(pos + 1).min(len)..].fill(OUT);
        for r in hidden {
            row[r.start.min(len)..r.end.min(len)].fill(OUT);
        }
    }
    Tensor::from_vec(mask, (probes.len(), len), device)
}

/// The attention output of `queries` [n_head, P, hd] (after RoPE) over keys and values
/// [n_kv_head, len, hd] under `mask` [P, len]: [n_kv_head, group·P, hd], the query heads
/// of a group side by side. Built of differentiable operations only, so a mapper's
/// training can minimise an error of it.
pub fn attention_output(
    queries: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    let (nh, p, hd) = queries.dims3()?;
    let (nkv, len, _) = k.dims3()?;
    let group = nh / nkv.max(1);
    let q = queries.reshape((nkv, group * p, hd))?;
    let s = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?
        .reshape((nkv, group, p, len))?
        .broadcast_add(mask)?;
    // The max is a constant shift: no gradient needs to flow through it.
    let s = s.broadcast_sub(&s.max_keepdim(D::Minus1)?.detach())?;
    let e = s.exp()?;
    let a = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    a.reshape((nkv, group * p, len))?.matmul(v)
}

/// Probe positions spread over a window, skipping the first few (attention sinks).
pub fn probe_positions(len: usize, count: usize) -> Vec<usize> {
    let lo = (len / 8).min(len.saturating_sub(1));
    let span = len - lo;
    let count = count.min(span).max(1);
    (0..count).map(|i| lo + i * span / count).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// Four query heads at three probes over two KV heads of ten positions, random.
    fn queries_keys_values() -> Result<(Device, Tensor, Tensor, Tensor)> {
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (4, 3, 8), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (2, 10, 8), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (2, 10, 8), &dev)?;
        Ok((dev, q, k, v))
    }

    #[test]
    fn the_attention_output_is_a_causal_softmax_and_carries_gradients() -> Result<()> {
        let (dev, q, k, v) = queries_keys_values()?;
        let probes = [2, 6, 9];
        let mask = probe_mask(&probes, 10, &dev)?;
        let out = attention_output(&q, &k, &v, &mask)?;
        // Written out per query head and probe: softmax over keys 0..=p, times values.
        let (qv, kv, vv) = (
            q.to_vec3::<f32>()?,
            k.to_vec3::<f32>()?,
            v.to_vec3::<f32>()?,
        );
        let got = out.to_vec3::<f32>()?;
        for h in 0..4 {
            let g = h / 2;
            for (i, &p) in probes.iter().enumerate() {
                let s: Vec<f64> = (0..=p)
                    .map(|t| {
                        (0..8)
                            .map(|d| f64::from(qv[h][i][d] * kv[g][t][d]))
                            .sum::<f64>()
                            / 8f64.sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = w.iter().sum();
                for d in 0..8 {
                    let want: f64 = (0..=p).map(|t| w[t] / z * f64::from(vv[g][t][d])).sum();
                    let have = f64::from(got[g][(h % 2) * 3 + i][d]);
                    assert!(
                        (have - want).abs() < 1e-5,
                        "head {h} probe {p}: {have} vs {want}"
                    );
                }
            }
        }
        // A gradient step on the keys lowers the error of the output against another's.
        let var = Var::from_tensor(&(&k + Tensor::randn(0f32, 0.3, (2, 10, 8), &dev)?)?)?;
        let loss = |kk: &Tensor| -> Result<Tensor> {
            Ok((attention_output(&q, kk, &v, &mask)? - &out)?
                .sqr()?
                .sum_all()?)
        };
        let before = loss(var.as_tensor())?;
        let grads = before.backward()?;
        let g = grads.get(var.as_tensor()).expect("a gradient for the keys");
        var.set(&(var.as_tensor() - (g * 0.05)?)?)?;
        let after = loss(var.as_tensor())?.to_scalar::<f32>()?;
        assert!(after < before.to_scalar::<f32>()?, "{after}");
        Ok(())
    }

    #[test]
    fn identical_caches_give_one_and_noise_lowers_it() -> Result<()> {
        let (dev, q, k, v) = queries_keys_values()?;
        let probes = [2, 5, 9];
        let same = attention_output_cosine(&q, &probes, &k, &v, &k, &v)?;
        assert!((same - 1.0).abs() < 1e-5, "{same}");
        let noisy_v = (&v + Tensor::randn(0f32, 1.0, (2, 10, 8), &dev)?)?;
        let lower = attention_output_cosine(&q, &probes, &k, &v, &k, &noisy_v)?;
        assert!(lower < 0.95, "{lower}");
        Ok(())
    }

    #[test]
    fn hidden_positions_of_the_mapped_cache_count_for_nothing() -> Result<()> {
        let (dev, q, k, v) = queries_keys_values()?;
        let probes = [4, 7, 9];
        // What hidden slots hold does not matter: garbage there scores like anything else.
        let garbage = Tensor::randn(0f32, 9.0, (2, 3, 8), &dev)?;
        let put = |t: &Tensor| {
            Tensor::cat(
                &[t.narrow(1, 0, 2)?, garbage.clone(), t.narrow(1, 5, 5)?],
                1,
            )
        };
        let (kg, vg) = (put(&k)?, put(&v)?);
        let hid = [2..5];
        let a = attention_output_cosine_hiding(&q, &probes, &k, &v, &kg, &vg, &hid)?;
        let b = attention_output_cosine_hiding(&q, &probes, &k, &v, &k, &v, &hid)?;
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        // Hiding is a real loss against the truth, which saw those positions.
        assert!(b < 0.9999, "{b}");
        // Not hidden, the garbage is read.
        assert!(attention_output_cosine(&q, &probes, &k, &v, &kg, &vg)? < a);
        Ok(())
    }

    #[test]
    fn a_probe_never_reads_positions_after_it() -> Result<()> {
        // Changing keys/values after every probe must not change the cosine.
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (2, 2, 4), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, 6, 4), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, 6, 4), &dev)?;
        let tail = Tensor::randn(0f32, 5.0, (1, 2, 4), &dev)?;
        let k2 = Tensor::cat(&[k.narrow(1, 0, 4)?, tail.clone()], 1)?;
        let v2 = Tensor::cat(&[v.narrow(1, 0, 4)?, tail], 1)?;
        let c = attention_output_cosine(&q, &[1, 3], &k, &v, &k2, &v2)?;
        assert!((c - 1.0).abs() < 1e-5, "{c}");
        Ok(())
    }

    #[test]
    fn probes_skip_the_first_eighth_and_stay_inside_the_window() {
        assert_eq!(probe_positions(64, 4), vec![8, 22, 36, 50]);
        // More probes than positions past the sinks: one per position, none repeated.
        assert_eq!(probe_positions(16, 100), (2..16).collect::<Vec<_>>());
        // A window too short to skip anything still gets one probe inside it.
        assert_eq!(probe_positions(1, 3), vec![0]);
        assert_eq!(probe_positions(10, 0), vec![1]);
    }
}
