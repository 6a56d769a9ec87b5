//! The training loss's arithmetic in differentiable tensor operations: the target's RoPE
//! applied to mapped keys (the decoder's rotation has no gradient; the test holds the two
//! to each other), and the error relative to the truth's size. The attention output
//! itself is the metric's ([`crate::metrics::attention_output`]).

use baton_runtime::model::config::RopeLayout;
use baton_runtime::model::rope::Rope;
use candle_core::{Result, Tensor};

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

/// The squared error of `mapped` against `truth` relative to the truth's size.
pub fn relative_error(mapped: &Tensor, truth: &Tensor) -> Result<Tensor> {
    let err = (mapped - truth)?.sqr()?.sum_all()?;
    let size = truth.sqr()?.sum_all()?.to_scalar::<f32>()?.max(1e-12);
    err / f64::from(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_runtime::model::config::RopeConfig;
    use candle_core::{DType, Device};

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
}
