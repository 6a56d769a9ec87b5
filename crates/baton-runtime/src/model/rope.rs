//! Rotary position embedding tables: rotate for the forward pass, and the exact inverse
//! (rotation by the negated angle) used to strip positions out of cached keys before
//! mapping them between models.

use super::config::{RopeConfig, RopeLayout};
use super::error::Result;
use candle_core::{DType, Device, Tensor};

#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
    neg_sin: Tensor,
    layout: RopeLayout,
    max_positions: usize,
}

impl Rope {
    pub fn new(
        cfg: &RopeConfig,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv = cfg.inv_freqs();
        let half = inv.len();
        // Angles in f64: at position 32K an f32 product loses ~3 decimal digits of phase.
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let neg: Vec<f32> = sin.iter().map(|s| -s).collect();
        let mk = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (max_positions, half), device)?.to_dtype(dtype)?)
        };
        Ok(Self {
            cos: mk(cos)?,
            sin: mk(sin)?,
            neg_sin: mk(neg)?,
            layout: cfg.layout,
            max_positions,
        })
    }

    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotate `x` of shape [heads, len, head_dim] whose rows sit at absolute positions
    /// `start..start + len`.
    pub fn rotate(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        self.apply(x, start, &self.sin)
    }

    /// The exact inverse of [`Rope::rotate`] at the same positions.
    pub fn unrotate(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        self.apply(x, start, &self.neg_sin)
    }

    /// Cosines and sines for positions `start..start + len` as f32 rows of `head_dim / 2`,
    /// for kernels that rotate while they write.
    pub fn tables(&self, start: usize, len: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        if start + len > self.max_positions {
            return Err(super::error::ModelError::ContextOverflow {
                len: start + len,
                max: self.max_positions,
            });
        }
        let rows = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.narrow(0, start, len)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        Ok((rows(&self.cos)?, rows(&self.sin)?))
    }

    /// Width of the tables: half the rotated dimension.
    pub fn half_width(&self) -> usize {
        self.cos.dims().get(1).copied().unwrap_or(0)
    }

    fn apply(&self, x: &Tensor, start: usize, sin: &Tensor) -> Result<Tensor> {
        let (_h, len, _d) = x.dims3()?;
        if start + len > self.max_positions {
            return Err(super::error::ModelError::ContextOverflow {
                len: start + len,
                max: self.max_positions,
            });
        }
        let cos = self.cos.narrow(0, start, len)?;
        let sin = sin.narrow(0, start, len)?;
        let x4 = x.unsqueeze(0)?.contiguous()?;
        let out = match self.layout {
            RopeLayout::RotateHalf => candle_nn::rotary_emb::rope(&x4, &cos, &sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x4, &cos, &sin)?,
        };
        Ok(out.squeeze(0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(layout: RopeLayout) -> RopeConfig {
        RopeConfig {
            theta: 1_000_000.0,
            layout,
            dim: 64,
            llama3_scaling: None,
            freq_factors: None,
        }
    }

    #[test]
    fn unrotate_after_rotate_is_identity_for_both_layouts() -> Result<()> {
        for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
            let rope = Rope::new(&cfg(layout), 4096, DType::F32, &Device::Cpu)?;
            let x = Tensor::randn(0f32, 1.0, (2, 37, 64), &Device::Cpu)?;
            let back = rope.unrotate(&rope.rotate(&x, 4000)?, 4000)?;
            let err = (back - &x)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{layout:?}: max error {err}");
        }
        Ok(())
    }

    #[test]
    fn rotation_preserves_norm_and_depends_on_position() -> Result<()> {
        let rope = Rope::new(&cfg(RopeLayout::RotateHalf), 64, DType::F32, &Device::Cpu)?;
        let x = Tensor::randn(0f32, 1.0, (1, 1, 64), &Device::Cpu)?;
        let a = rope.rotate(&x, 3)?;
        let b = rope.rotate(&x, 9)?;
        let n = |t: &Tensor| -> Result<f32> { Ok(t.sqr()?.sum_all()?.to_scalar::<f32>()?) };
        assert!((n(&a)? - n(&x)?).abs() < 1e-3);
        let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff > 1e-3, "different positions must rotate differently");
        // Position 0 is the identity rotation.
        let z = rope.rotate(&x, 0)?;
        assert!((z - &x)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);
        Ok(())
    }

    #[test]
    fn rotate_half_pairs_dimension_i_with_i_plus_half() -> Result<()> {
        // A vector with only dim 0 set must, after rotation, spread into dims 0 and 32.
        let rope = Rope::new(&cfg(RopeLayout::RotateHalf), 8, DType::F32, &Device::Cpu)?;
        let mut v = vec![0f32; 64];
        v[0] = 1.0;
        let x = Tensor::from_vec(v, (1, 1, 64), &Device::Cpu)?;
        let r = rope.rotate(&x, 1)?.flatten_all()?.to_vec1::<f32>()?;
        assert!((r[0] - 1f32.cos()).abs() < 1e-6);
        assert!((r[32] - 1f32.sin()).abs() < 1e-6);
        let rest: f32 = r
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 0 && *i != 32)
            .map(|(_, x)| x.abs())
            .sum();
        assert!(rest < 1e-6);
        Ok(())
    }
}

#[cfg(test)]
mod offset_tests {
    use super::*;

    #[test]
    fn rotating_a_suffix_matches_rotating_the_whole() -> Result<()> {
        for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
            let cfg = RopeConfig {
                theta: 10_000.0,
                layout,
                dim: 8,
                llama3_scaling: None,
                freq_factors: None,
            };
            let rope = Rope::new(&cfg, 64, DType::F32, &Device::Cpu)?;
            let x = Tensor::randn(0f32, 1.0, (2, 10, 8), &Device::Cpu)?;
            let whole = rope.rotate(&x, 0)?.narrow(1, 6, 4)?;
            let part = rope.rotate(&x.narrow(1, 6, 4)?, 6)?;
            let err = (whole - part)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-6, "{layout:?}: {err}");
        }
        Ok(())
    }
}
