//! The training loss's arithmetic in differentiable tensor operations: the target's RoPE
//! applied to mapped keys, and the attention output of the target's own queries at probe
//! positions over a cache. The decoder's kernels compute the same functions without
//! gradients; the tests hold the two to each other.

use crate::model::config::RopeLayout;
use crate::model::rope::Rope;
use candle_core::{Result, Tensor, D};

/// The target's rotation at positions `0..n`, as tensors a differentiable rotation reads.
#[derive(Debug, Clone)]
pub struct Rotation {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
}

impl Rotation {
    pub fn new(rope: &Rope, n: usize, device: &candle_core::Device) -> Result<Self> {
        let (cos, sin) = rope
            .tables(0, n)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let half = rope.half_width();
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, half), device)?,
            sin: Tensor::from_vec(sin, (n, half), device)?,
            layout: rope.layout(),
        })
    }

    /// `x` [heads, n, head_dim] rotated at positions `0..n`.
    pub fn rotate(&self, x: &Tensor) -> Result<Tensor> {
        let (h, n, hd) = x.dims3()?;
        let half = hd / 2;
        let (cos, sin) = (self.cos.narrow(0, 0, n)?, self.sin.narrow(0, 0, n)?);
        match self.layout {
            RopeLayout::RotateHalf => {
                let x1 = x.narrow(2, 0, half)?;
                let x2 = x.narrow(2, half, half)?;
                let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
                let b = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
                Tensor::cat(&[a, b], 2)
            }
            RopeLayout::Interleaved => {
                let pairs = x.reshape((h, n, half, 2))?;
                let x1 = pairs.narrow(3, 0, 1)?.squeeze(3)?;
                let x2 = pairs.narrow(3, 1, 1)?.squeeze(3)?;
                let a = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
                let b = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
                Tensor::stack(&[a, b], 3)?.reshape((h, n, hd))
            }
        }
    }
}

/// The causal mask of probes over `len` positions: probe `i` sees keys `0..=probes[i]`.
pub fn probe_mask(probes: &[usize], len: usize, device: &candle_core::Device) -> Result<Tensor> {
    let mut mask = vec![0f32; probes.len() * len];
    for (i, &pos) in probes.iter().enumerate() {
        for j in pos + 1..len {
            // Large but finite: a softmax's gradient through -inf is NaN.
            mask[i * len + j] = -1e9;
        }
    }
    Tensor::from_vec(mask, (probes.len(), len), device)
}

/// The attention output of `queries` [n_head, P, hd] (after RoPE) over keys and values
/// [n_kv_head, len, hd] under `mask` [P, len]: [n_kv_head, group·P, hd].
pub fn attention_output(queries: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
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

/// The squared error of `mapped` against `truth` relative to the truth's size.
pub fn relative_error(mapped: &Tensor, truth: &Tensor) -> Result<Tensor> {
    let err = (mapped - truth)?.sqr()?.sum_all()?;
    let size = truth.sqr()?.sum_all()?.to_scalar::<f32>()?.max(1e-12);
    err / f64::from(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::attention_output_cosine;
    use crate::model::config::RopeConfig;
    use candle_core::{DType, Device, Var};

    fn rope(layout: RopeLayout) -> Rope {
        let cfg = RopeConfig {
            theta: 10_000.0,
            layout,
            dim: 8,
            llama3_scaling: None,
            freq_factors: None,
        };
        Rope::new(&cfg, 64, DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_differentiable_rotation_is_the_decoders() -> Result<()> {
        for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
            let r = rope(layout);
            let x = Tensor::randn(0f32, 1.0, (2, 12, 8), &Device::Cpu)?;
            let mine = Rotation::new(&r, 12, &Device::Cpu)?.rotate(&x)?;
            let theirs = r
                .rotate(&x, 0)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let err = (mine - theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{layout:?}: {err}");
        }
        Ok(())
    }

    #[test]
    fn the_attention_output_matches_the_metric_and_carries_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (4, 3, 8), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (2, 10, 8), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (2, 10, 8), &dev)?;
        let k2 = (&k + Tensor::randn(0f32, 0.3, (2, 10, 8), &dev)?)?;
        let probes = [2, 6, 9];
        let mask = probe_mask(&probes, 10, &dev)?;
        let (a, b) = (
            attention_output(&q, &k, &v, &mask)?,
            attention_output(&q, &k2, &v, &mask)?,
        );
        // The metric's cosine, recomputed from these outputs.
        let dot = (&a * &b)?.sum(D::Minus1)?;
        let na = a.sqr()?.sum(D::Minus1)?.sqrt()?;
        let nb = b.sqr()?.sum(D::Minus1)?.sqrt()?;
        let mine = (dot / (na * nb)?)?.mean_all()?.to_scalar::<f32>()?;
        let theirs = attention_output_cosine(&q, &probes, &k, &v, &k2, &v).unwrap();
        assert!(
            (f64::from(mine) - theirs).abs() < 1e-5,
            "{mine} vs {theirs}"
        );

        // A gradient step on the mapped keys lowers the error of the output.
        let var = Var::from_tensor(&k2)?;
        let loss = |kk: &Tensor| relative_error(&attention_output(&q, kk, &v, &mask)?, &a);
        let before = loss(var.as_tensor())?;
        let grads = before.backward()?;
        let g = grads.get(var.as_tensor()).expect("a gradient for the keys");
        var.set(&(var.as_tensor() - (g * 0.05)?)?)?;
        let after = loss(var.as_tensor())?.to_scalar::<f32>()?;
        assert!(after < before.to_scalar::<f32>()?, "{after}");
        Ok(())
    }
}
