//! One head under training: its layers as variables, initialised from a seed, run with
//! the same arithmetic the map runs ([`forward_layers`]), and copied out as a plain
//! [`Head`] when it scores best.

use crate::mapper::nonlinear::head::forward_layers;
use crate::mapper::nonlinear::{Activation, Dense, Head, HeadUse};
use candle_core::{Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};

/// A head's shape and scales.
pub struct NetShape<'a> {
    pub hidden: &'a [usize],
    pub activation: Activation,
    pub used: HeadUse,
    pub in_mean: Vec<f32>,
    pub in_scale: Vec<f32>,
    pub out_scale: Vec<f32>,
    pub out_mean: Vec<f32>,
}

pub struct Net {
    activation: Activation,
    used: HeadUse,
    in_mean: Tensor,
    in_scale: Tensor,
    layers: Vec<(Var, Var)>,
    out_scale: Tensor,
    out_mean: Tensor,
}

/// Normal deviates from a seeded generator (Box–Muller), so an initialisation is the same
/// on every machine.
fn normals(rng: &mut rand_chacha::ChaCha8Rng, n: usize, std: f64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

impl Net {
    /// He-initialised hidden layers; the last layer starts at zero for a head added to a
    /// map (so training starts from that map exactly), at the fan-in scale otherwise.
    pub fn new(shape: NetShape<'_>, seed: u64, device: &Device) -> Result<Self> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let input = shape.in_mean.len();
        let output = shape.out_mean.len();
        let mut widths = vec![input];
        widths.extend_from_slice(shape.hidden);
        widths.push(output);
        let mut layers = Vec::new();
        for (i, pair) in widths.windows(2).enumerate() {
            let (rows, cols) = (pair[0], pair[1]);
            let last = i + 2 == widths.len();
            let w = if last && shape.used == HeadUse::Added {
                vec![0f32; rows * cols]
            } else if last {
                normals(&mut rng, rows * cols, (1.0 / rows as f64).sqrt())
            } else {
                normals(&mut rng, rows * cols, (2.0 / rows as f64).sqrt())
            };
            layers.push((
                Var::from_vec(w, (rows, cols), device)?,
                Var::from_vec(vec![0f32; cols], cols, device)?,
            ));
        }
        let vec = |v: Vec<f32>| -> Result<Tensor> {
            let n = v.len();
            Tensor::from_vec(v, n, device)
        };
        Ok(Self {
            activation: shape.activation,
            used: shape.used,
            in_mean: vec(shape.in_mean)?,
            in_scale: vec(shape.in_scale)?,
            layers,
            out_scale: vec(shape.out_scale)?,
            out_mean: vec(shape.out_mean)?,
        })
    }

    pub fn used(&self) -> HeadUse {
        self.used
    }

    pub fn vars(&self) -> Vec<Var> {
        self.layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let layers: Vec<(Tensor, Tensor)> = self
            .layers
            .iter()
            .map(|(w, b)| (w.as_tensor().clone(), b.as_tensor().clone()))
            .collect();
        forward_layers(
            x,
            (&self.in_mean, &self.in_scale),
            &layers,
            self.activation,
            (&self.out_scale, &self.out_mean),
        )
    }

    /// The head as it stands, in plain f32.
    pub fn snapshot(&self) -> Result<Head> {
        let v = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
        let layers = self
            .layers
            .iter()
            .map(|(w, b)| {
                let (rows, cols) = w.as_tensor().dims2()?;
                Ok(Dense {
                    rows,
                    cols,
                    weight: v(w.as_tensor())?,
                    bias: v(b.as_tensor())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Head {
            activation: self.activation,
            used: self.used,
            in_mean: v(&self.in_mean)?,
            in_scale: v(&self.in_scale)?,
            layers,
            out_scale: v(&self.out_scale)?,
            out_mean: v(&self.out_mean)?,
        })
    }
}
