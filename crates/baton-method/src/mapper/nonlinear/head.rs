//! A small multilayer perceptron on one target layer's map input (the selected source
//! layers' features side by side), in plain f32 as an artifact stores it, and as tensors
//! as the map runs it.
//!
//! `y = ((act(… act(z W₁ + b₁) …) W_n + b_n) ⊙ out_scale) + out_mean`, with
//! `z = (x − in_mean) ⊙ in_scale`: the input is standardized with the calibration's own
//! source statistics and the output put back on the target's scale, so the network's
//! weights work at unit scale whatever the features' spread (keys of the attention sink
//! run to the hundreds).

use baton_runtime::model::ModelError;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// The nonlinearity between the hidden layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Gelu,
}

/// How a head's output enters the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeadUse {
    /// Added to the ridge map's output: the ridge map stays, the head corrects it.
    Added,
    /// The map's output: the ridge map beside it is not applied.
    Alone,
}

impl HeadUse {
    /// The map's output on input `x` from its ridge product `linear` and its head `head`:
    /// the map runs the head on constants, training on variables, both through here.
    pub fn output(
        self,
        x: &Tensor,
        linear: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
        head: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        match self {
            HeadUse::Added => linear(x)? + head(x)?,
            HeadUse::Alone => head(x),
        }
    }
}

/// One fully connected layer, `weight` row-major `[rows, cols]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub rows: usize,
    pub cols: usize,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// The head of one map (keys or values of one target layer).
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub activation: Activation,
    pub used: HeadUse,
    pub in_mean: Vec<f32>,
    pub in_scale: Vec<f32>,
    pub layers: Vec<Dense>,
    pub out_scale: Vec<f32>,
    pub out_mean: Vec<f32>,
}

impl Head {
    pub fn input_width(&self) -> usize {
        self.in_mean.len()
    }

    pub fn output_width(&self) -> usize {
        self.out_mean.len()
    }

    /// The widths of the hidden layers, in order.
    pub fn hidden(&self) -> Vec<usize> {
        self.layers
            .iter()
            .take(self.layers.len().saturating_sub(1))
            .map(|l| l.cols)
            .collect()
    }

    /// Refuses a head whose pieces do not chain: each layer's rows the width before it,
    /// the input and output widths those of the map.
    pub fn check(&self, input: usize, output: usize) -> Result<(), String> {
        if self.layers.is_empty() {
            return Err("a head with no layers".into());
        }
        if self.in_mean.len() != input || self.in_scale.len() != input {
            return Err(format!(
                "a head standardizes {} inputs, the map reads {input}",
                self.in_mean.len()
            ));
        }
        if self.out_scale.len() != output || self.out_mean.len() != output {
            return Err(format!(
                "a head scales {} outputs, the map writes {output}",
                self.out_scale.len()
            ));
        }
        let mut width = input;
        for (i, l) in self.layers.iter().enumerate() {
            if l.rows != width || l.weight.len() != l.rows * l.cols || l.bias.len() != l.cols {
                return Err(format!(
                    "head layer {i} is {}×{} with {} weights and {} biases after a width of {width}",
                    l.rows,
                    l.cols,
                    l.weight.len(),
                    l.bias.len()
                ));
            }
            width = l.cols;
        }
        if width != output {
            return Err(format!(
                "a head ends at width {width}, the map writes {output}"
            ));
        }
        Ok(())
    }

    /// Weights and biases in order, for counting and for checks.
    pub fn parameters(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.weight.len() + l.bias.len())
            .sum()
    }

    /// The head as tensors on `device` in `dtype`.
    pub fn tensors(&self, device: &Device, dtype: DType) -> Result<HeadTensors, ModelError> {
        let vec = |v: &[f32]| -> Result<Tensor, ModelError> {
            Ok(Tensor::from_slice(v, v.len(), device)?.to_dtype(dtype)?)
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok((
                    Tensor::from_slice(&l.weight, (l.rows, l.cols), device)?.to_dtype(dtype)?,
                    vec(&l.bias)?,
                ))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(HeadTensors {
            activation: self.activation,
            used: self.used,
            in_mean: vec(&self.in_mean)?,
            in_scale: vec(&self.in_scale)?,
            layers,
            out_scale: vec(&self.out_scale)?,
            out_mean: vec(&self.out_mean)?,
        })
    }
}

/// A head ready to run.
#[derive(Debug, Clone)]
pub struct HeadTensors {
    pub activation: Activation,
    pub used: HeadUse,
    pub in_mean: Tensor,
    pub in_scale: Tensor,
    /// `([rows, cols], [cols])` per layer.
    pub layers: Vec<(Tensor, Tensor)>,
    pub out_scale: Tensor,
    pub out_mean: Tensor,
}

impl HeadTensors {
    /// `x` `[n, input]` → `[n, output]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        forward_layers(
            x,
            (&self.in_mean, &self.in_scale),
            &self.layers,
            self.activation,
            (&self.out_scale, &self.out_mean),
        )
    }
}

/// The head's arithmetic on any tensors: the map runs it on constants, training on
/// variables, so both compute exactly the same function.
pub fn forward_layers(
    x: &Tensor,
    (in_mean, in_scale): (&Tensor, &Tensor),
    layers: &[(Tensor, Tensor)],
    activation: Activation,
    (out_scale, out_mean): (&Tensor, &Tensor),
) -> candle_core::Result<Tensor> {
    let mut h = x.broadcast_sub(in_mean)?.broadcast_mul(in_scale)?;
    for (i, (w, b)) in layers.iter().enumerate() {
        h = h.matmul(w)?.broadcast_add(b)?;
        if i + 1 < layers.len() {
            h = match activation {
                Activation::Relu => h.relu()?,
                Activation::Gelu => h.gelu()?,
            };
        }
    }
    h.broadcast_mul(out_scale)?.broadcast_add(out_mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(activation: Activation) -> Head {
        Head {
            activation,
            used: HeadUse::Added,
            in_mean: vec![1.0, -1.0],
            in_scale: vec![0.5, 2.0],
            layers: vec![
                Dense {
                    rows: 2,
                    cols: 3,
                    weight: vec![1.0, -2.0, 0.5, 0.25, 1.0, -1.0],
                    bias: vec![0.1, 0.2, -0.3],
                },
                Dense {
                    rows: 3,
                    cols: 1,
                    weight: vec![1.0, 0.5, -2.0],
                    bias: vec![0.05],
                },
            ],
            out_scale: vec![3.0],
            out_mean: vec![-0.5],
        }
    }

    /// The same function written out a row at a time, with the activations' definitions.
    fn by_hand(h: &Head, x: &[f32]) -> f32 {
        let mut z: Vec<f64> = x
            .iter()
            .zip(&h.in_mean)
            .zip(&h.in_scale)
            .map(|((x, m), s)| f64::from((x - m) * s))
            .collect();
        for (i, l) in h.layers.iter().enumerate() {
            let mut out = vec![0f64; l.cols];
            for (c, o) in out.iter_mut().enumerate() {
                *o = f64::from(l.bias[c])
                    + (0..l.rows)
                        .map(|r| z[r] * f64::from(l.weight[r * l.cols + c]))
                        .sum::<f64>();
                if i + 1 < h.layers.len() {
                    *o = match h.activation {
                        Activation::Relu => o.max(0.0),
                        // candle's gelu is the tanh approximation.
                        Activation::Gelu => {
                            0.5 * *o
                                * (1.0
                                    + ((2.0 / std::f64::consts::PI).sqrt()
                                        * (*o + 0.044715 * o.powi(3)))
                                    .tanh())
                        }
                    };
                }
            }
            z = out;
        }
        (z[0] * f64::from(h.out_scale[0]) + f64::from(h.out_mean[0])) as f32
    }

    #[test]
    fn the_head_computes_its_layers_on_standardized_input() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let rows = [[3.0f32, 0.5], [-2.0, -1.5], [1.0, -1.0], [0.2, 4.0]];
        for act in [Activation::Relu, Activation::Gelu] {
            let h = head(act);
            h.check(2, 1).unwrap();
            let t = h
                .tensors(&dev, DType::F32)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let flat: Vec<f32> = rows.iter().flatten().copied().collect();
            let x = Tensor::from_slice(&flat, (4, 2), &dev)?;
            let y = t.forward(&x)?.flatten_all()?.to_vec1::<f32>()?;
            for (r, got) in rows.iter().zip(&y) {
                let want = by_hand(&h, r);
                assert!((got - want).abs() < 1e-5, "{act:?} {r:?}: {got} vs {want}");
            }
        }
        Ok(())
    }

    #[test]
    fn a_head_whose_pieces_do_not_chain_is_refused() {
        let mut h = head(Activation::Relu);
        assert!(h.check(3, 1).unwrap_err().contains("standardizes 2 inputs"));
        assert!(h.check(2, 2).unwrap_err().contains("scales 1 outputs"));
        h.layers[1].rows = 4;
        assert!(h.check(2, 1).unwrap_err().contains("head layer 1"));
        assert_eq!(head(Activation::Relu).hidden(), vec![3]);
        assert_eq!(head(Activation::Relu).parameters(), 6 + 3 + 3 + 1);
    }
}
