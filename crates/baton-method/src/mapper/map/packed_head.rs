//! A trained head on the int8 kernels, beside the ridge map it corrects or replaces. On
//! f32 products a residual head made the map several times slower than the int8 ridge
//! map it sits on (1,066 ms against 123 ms for 1,024 tokens, 0.5B→1.5B), for about as
//! many multiply-adds again; packed, it costs what its arithmetic costs.
//!
//! The head's input standardization and the int8 path's feature conditioning are both
//! affine in the features, so they fold into the first layer: with
//! `z = (x − μ_x) ⊙ σ_x⁻¹` the head's input and `x W₁' + b₁'` the same layer on raw
//! features, `W₁' = diag(σ_x⁻¹) W₁` and `b₁' = b₁ − (μ_x ⊙ σ_x⁻¹) W₁`; that layer is then
//! packed like a ridge map (rows divided by the conditioning's scale, its mean moved into
//! the bias). The output scaling folds into the last layer:
//! `W_n' = W_n diag(σ_y)`, `b_n' = b_n ⊙ σ_y + μ_y`. The activations between layers are
//! candle's (GELU in its tanh form), with tanh as a rational function within float
//! rounding of the one the dense map and training use.

use super::packing::{mean_into_bias, packed_linear, unscale_rows, vec2};
use super::SourceScales;
use crate::mapper::nonlinear::{Activation, HeadTensors, HeadUse};
use baton_runtime::model::weights::Linear;
use baton_runtime::model::ModelError;
#[cfg(test)]
use candle_core::{Device, Tensor};

/// A head's layers packed, the first on the conditioned features.
#[derive(Debug, Clone)]
pub struct PackedHead {
    /// Each layer with the width of its input.
    layers: Vec<(Linear, usize)>,
    activation: Activation,
    used: HeadUse,
}

/// `head` (on the features of `sources`, `width` each) packed for the int8 kernels, or
/// `None` where they do not take its shapes (a width not a multiple of 32).
pub fn pack_head(
    head: &HeadTensors,
    sources: &[usize],
    scales: &SourceScales,
    width: usize,
    keys: bool,
) -> Result<Option<PackedHead>, ModelError> {
    let (in_mean, in_scale) = (vec2(&head.in_mean)?, vec2(&head.in_scale)?);
    let (out_scale, out_mean) = (vec2(&head.out_scale)?, vec2(&head.out_mean)?);
    let last = head.layers.len().saturating_sub(1);
    let mut layers = Vec::with_capacity(head.layers.len());
    for (i, (w, b)) in head.layers.iter().enumerate() {
        let (rows, cols) = w.dims2()?;
        let (mut w, mut b) = (vec2(w)?, vec2(b)?);
        if i == 0 {
            for (r, (mu, s)) in in_mean.iter().zip(&in_scale).enumerate() {
                for (bc, x) in b.iter_mut().zip(&mut w[r * cols..][..cols]) {
                    *x *= s;
                    *bc -= mu * *x;
                }
            }
        }
        if i == last {
            for row in w.chunks_mut(cols) {
                for (x, s) in row.iter_mut().zip(&out_scale) {
                    *x *= s;
                }
            }
            for ((bc, s), m) in b.iter_mut().zip(&out_scale).zip(&out_mean) {
                *bc = *bc * s + m;
            }
        }
        if i == 0 {
            mean_into_bias(sources, scales, width, keys, &w, &mut b);
            unscale_rows(sources, scales, width, keys, &mut w, cols);
        }
        match packed_linear(w, rows, cols, Some(&b))? {
            Some(l) => layers.push((l, rows)),
            None => return Ok(None),
        }
    }
    if layers.is_empty() {
        return Err(ModelError::Cache("a trained head with no layers".into()));
    }
    Ok(Some(PackedHead {
        layers,
        activation: head.activation,
        used: head.used,
    }))
}

impl PackedHead {
    pub fn used(&self) -> HeadUse {
        self.used
    }

    /// The head's first layer, on the conditioned features: a caller that runs another
    /// product on the same features runs this one beside it, quantizing them once.
    pub fn first(&self) -> &Linear {
        &self.layers[0].0
    }

    /// The head's output for `rows` rows of conditioned features given as `parts` side
    /// by side, `width` each.
    pub fn forward(
        &self,
        parts: &[&[f32]],
        width: usize,
        rows: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let h = self
            .first()
            .forward_parts(parts, width, rows)?
            .ok_or_else(not_packed)?;
        self.forward_after_first(h, rows)
    }

    /// The rest of the head, from its first layer's output `h`.
    pub fn forward_after_first(
        &self,
        mut h: Vec<f32>,
        rows: usize,
    ) -> Result<Vec<f32>, ModelError> {
        for (layer, input) in &self.layers[1..] {
            let a = self.activate(std::mem::take(&mut h), *input);
            h = layer
                .forward_parts(&[&a], *input, rows)?
                .ok_or_else(not_packed)?;
        }
        Ok(h)
    }

    fn activate(&self, mut h: Vec<f32>, cols: usize) -> Vec<f32> {
        use rayon::prelude::*;
        // Rows in parallel: one thread's tanh over every hidden unit of a 1,024-token map
        // took as long as the head's products.
        let f = match self.activation {
            Activation::Relu => |x: &mut f32| *x = x.max(0.0),
            Activation::Gelu => |x: &mut f32| *x = gelu(*x),
        };
        h.par_chunks_mut(cols.max(1) * 64)
            .for_each(|c| c.iter_mut().for_each(f));
        h
    }
}

fn not_packed() -> ModelError {
    ModelError::Cache("a packed head layer is not packed".into())
}

/// GELU as candle computes it (the tanh form), with tanh as a rational function (the
/// one Eigen uses for f32): within a few units in the last place of `f32::tanh`, and
/// several times faster.
fn gelu(x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + fast_tanh(SQRT_TWO_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

#[allow(clippy::excessive_precision)]
fn fast_tanh(x: f32) -> f32 {
    // Past this the rational function leaves [−1, 1]; tanh is 1 in f32 there anyway.
    const CLAMP: f32 = 7.905_311;
    let x = x.clamp(-CLAMP, CLAMP);
    let x2 = x * x;
    let p = -2.760_768_5e-16_f32;
    let p = p * x2 + 2.000_187_9e-13;
    let p = p * x2 - 8.604_671_5e-11;
    let p = p * x2 + 5.122_297e-8;
    let p = p * x2 + 1.485_722_4e-5;
    let p = p * x2 + 6.372_619_3e-4;
    let p = p * x2 + 4.893_524_6e-3;
    let q = 1.198_258_4e-6_f32;
    let q = q * x2 + 1.185_347_1e-4;
    let q = q * x2 + 2.268_434_6e-3;
    let q = q * x2 + 4.893_525e-3;
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_gelu_is_candles_within_float_rounding() {
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 200.0).collect();
        let t = Tensor::from_slice(&xs, xs.len(), &Device::Cpu).unwrap();
        let want = t.gelu().unwrap().to_vec1::<f32>().unwrap();
        for (x, w) in xs.iter().zip(&want) {
            let g = gelu(*x);
            assert!(
                (g - w).abs() <= 2e-6 * (1.0 + w.abs()),
                "gelu({x}) = {g}, candle {w}"
            );
        }
        assert_eq!(fast_tanh(30.0), 1.0);
        assert_eq!(fast_tanh(-30.0), -1.0);
    }
}
