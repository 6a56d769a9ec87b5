//! One direction's training: the windows' samples, the map with and without heads, the
//! loss, the optimiser steps and the held-out scores of every candidate width.

use super::attention::{relative_error, Rotation};
use super::net::{Net, NetShape};
use super::{err, TrainOptions};
use crate::calibrate::capture::{Captured, HeldOutCaptures};
use crate::calibrate::saved_stats::SavedStats;
use crate::calibrate::{CalibrateError, Direction, Fitted};
use crate::mapper::features::{heads_to_rows, rows_to_heads};
use crate::mapper::nonlinear::{Head, HeadUse, TrainLoss};
use crate::mapper::CacheMapper;
use crate::metrics::{attention_output, probe_mask};
use baton_runtime::model::Model;
use candle_core::{Device, Tensor};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};

/// One window as both sides of a direction read it, ready for every layer's loss.
pub(super) struct Sample {
    /// Per target layer, the key and value maps' input.
    inputs: Vec<(Tensor, Tensor)>,
    truth: Truth,
    n: usize,
}

/// What the loss compares the mapped cache with: only what that loss reads is computed.
enum Truth {
    Attention {
        /// Per target layer, the target's own keys (rotated) and values [n_kv, n, hd].
        keys: Vec<Tensor>,
        values: Vec<Tensor>,
        /// Per target layer, the target's queries at the probes and their output.
        queries: Vec<Tensor>,
        outputs: Vec<Tensor>,
        mask: Tensor,
        rotation: Rotation,
    },
    /// Per target layer, its own keys (un-rotated) and values as rows [n, D_t].
    KvMse { rows: Vec<(Tensor, Tensor)> },
}

/// The best mean held-out loss a direction has reached, and the epochs since.
#[derive(Debug)]
pub(super) struct EarlyStop {
    pub(super) best: f64,
    pub(super) stale: usize,
}

impl Default for EarlyStop {
    fn default() -> Self {
        Self {
            best: f64::INFINITY,
            stale: 0,
        }
    }
}

impl EarlyStop {
    pub(super) fn observe(&mut self, mean: f64) {
        if mean < self.best {
            self.best = mean;
            self.stale = 0;
        } else {
            self.stale += 1;
        }
    }
}

/// The heads of one target layer under training.
pub(super) struct LayerNets {
    keys: Net,
    values: Net,
    opt: AdamW,
    pub(super) best: Option<(Head, Head)>,
    pub(super) best_loss: f64,
    pub(super) best_epoch: usize,
}

/// One width's heads for every target layer of a direction, with its own early stop.
pub(super) struct Candidate {
    pub(super) hidden: Vec<usize>,
    pub(super) layers: Vec<LayerNets>,
    stop: EarlyStop,
    /// Whether it has stopped (its steps are no longer taken).
    pub(super) done: bool,
    pub(super) epochs: usize,
}

impl Candidate {
    /// The mean over the layers of each layer's best held-out loss: what keeping its
    /// best weights gives.
    pub(super) fn kept_loss(&self) -> f64 {
        crate::metrics::mean(&self.layers.iter().map(|l| l.best_loss).collect::<Vec<_>>())
    }
}

/// One direction's training: the samples its windows give, shared by every candidate
/// width, since reading a window costs more than a step.
pub(super) struct Trainer<'a> {
    pub(super) direction: Direction,
    src: &'a Model,
    tgt: &'a Model,
    ridge: CacheMapper,
    pub(super) candidates: Vec<Candidate>,
    anchor: usize,
    loss: TrainLoss,
    /// The target's feature deviations per layer, keys and values, for kv-mse.
    inv_std: Vec<(Tensor, Tensor)>,
    pub(super) ridge_loss: Vec<f64>,
}

/// The mean and deviation of the target features of each layer, from the statistics.
fn target_moments(stats: &crate::mapper::PairStats, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let d = stats.d_t();
    let n = stats.count().max(1) as f64;
    let cols = layer * d..(layer + 1) * d;
    let mean = stats.mean_y()[cols.clone()]
        .iter()
        .map(|&m| m as f32)
        .collect();
    let std = stats.syy()[cols]
        .iter()
        .map(|&s| (s / n).max(1e-12).sqrt() as f32)
        .collect();
    (mean, std)
}

impl<'a> Trainer<'a> {
    pub(super) fn new(
        src: &'a Model,
        tgt: &'a Model,
        fitted: &Fitted,
        stats: &SavedStats,
        opts: &TrainOptions,
        anchor: usize,
    ) -> Result<Self, CalibrateError> {
        let (default_hidden, activation, used) = opts
            .kind
            .architecture()
            .ok_or_else(|| err("a ridge mapper has no heads to train"))?;
        let widths = if opts.hidden.is_empty() {
            vec![default_hidden]
        } else {
            opts.hidden.clone()
        };
        let device = Device::Cpu;
        let ridge = fitted
            .cache_mapper(src, tgt)?
            .with_precision(crate::mapper::MapPrecision::F32)?;
        let scales = &fitted.source_scales;
        let d_s = src.config().kv_width();
        let mut candidates: Vec<Candidate> = widths
            .into_iter()
            .map(|hidden| Candidate {
                hidden,
                layers: Vec::new(),
                stop: EarlyStop::default(),
                done: false,
                epochs: 0,
            })
            .collect();
        let mut inv_std = Vec::new();
        for (j, (km, vm)) in fitted.keys.iter().zip(&fitted.values).enumerate() {
            let mut shapes = Vec::new();
            let mut inv = Vec::new();
            for (side, m, st, mean, std) in [
                (
                    0u64,
                    km,
                    &stats.stats.keys,
                    &scales.key_mean,
                    &scales.key_std,
                ),
                (
                    1,
                    vm,
                    &stats.stats.values,
                    &scales.value_mean,
                    &scales.value_std,
                ),
            ] {
                let pick = |v: &[f32]| -> Vec<f32> {
                    m.sources
                        .iter()
                        .flat_map(|&s| v[s * d_s..(s + 1) * d_s].iter().copied())
                        .collect()
                };
                let (t_mean, t_std) = target_moments(st, j);
                inv.push(Tensor::new(
                    t_std
                        .iter()
                        .map(|s| 1.0 / s)
                        .collect::<Vec<f32>>()
                        .as_slice(),
                    &device,
                )?);
                let out_mean = if used == HeadUse::Added {
                    vec![0.0; m.bias.len()]
                } else {
                    t_mean
                };
                // A seed per (direction, layer, side): layers train the same whichever
                // runs first, and the directions differ.
                let seed = opts.seed ^ ((fitted.direction_tag() << 32) | ((j as u64) << 1) | side);
                shapes.push((pick(mean), pick(std), t_std, out_mean, seed));
            }
            for c in &mut candidates {
                let mut pair = Vec::new();
                for (in_mean, in_std, out_scale, out_mean, seed) in &shapes {
                    let shape = NetShape {
                        hidden: &c.hidden,
                        activation,
                        used,
                        in_mean: in_mean.clone(),
                        in_scale: in_std.iter().map(|s| 1.0 / s.max(1e-6)).collect(),
                        out_scale: out_scale.clone(),
                        out_mean: out_mean.clone(),
                    };
                    pair.push(Net::new(shape, *seed, &device)?);
                }
                let values = pair.pop().ok_or_else(|| err("no value head"))?;
                let keys = pair.pop().ok_or_else(|| err("no key head"))?;
                let mut vars = keys.vars();
                vars.extend(values.vars());
                let opt = AdamW::new(
                    vars,
                    ParamsAdamW {
                        lr: opts.learning_rate,
                        weight_decay: 0.0,
                        ..ParamsAdamW::default()
                    },
                )?;
                c.layers.push(LayerNets {
                    keys,
                    values,
                    opt,
                    best: None,
                    best_loss: f64::INFINITY,
                    best_epoch: 0,
                });
            }
            let v = inv.pop().ok_or_else(|| err("no value scale"))?;
            let k = inv.pop().ok_or_else(|| err("no key scale"))?;
            inv_std.push((k, v));
        }
        Ok(Self {
            direction: stats.stats.direction,
            src,
            tgt,
            ridge,
            candidates,
            anchor,
            loss: opts.loss,
            inv_std,
            ridge_loss: Vec::new(),
        })
    }

    /// "source -> target", for the progress notes.
    pub(super) fn direction_name(&self) -> String {
        format!("{} -> {}", self.src.identity.name, self.tgt.identity.name)
    }

    /// Whether every candidate has stopped.
    pub(super) fn done(&self) -> bool {
        self.candidates.iter().all(|c| c.done)
    }

    pub(super) fn sample(
        &self,
        s: &Captured,
        t: &Captured,
        tokens: &[u32],
        probes: &[usize],
    ) -> Result<Sample, CalibrateError> {
        let n = tokens.len().min(s.cache.len()).min(t.cache.len());
        let device = Device::Cpu;
        let inputs = self
            .ridge
            .layer_inputs(&s.cache, tokens, self.src.decoder.rope(), 0, n)?;
        let rope = self.tgt.decoder.rope();
        let layers = (0..t.queries.len()).map(|j| -> Result<(Tensor, Tensor), CalibrateError> {
            let kv = t.cache.layer_range(j, 0, n)?;
            Ok((kv.k.contiguous()?, kv.v.contiguous()?))
        });
        let truth = match self.loss {
            TrainLoss::KvMse => Truth::KvMse {
                rows: layers
                    .map(|kv| {
                        let (k, v) = kv?;
                        Ok((heads_to_rows(&rope.unrotate(&k, 0)?)?, heads_to_rows(&v)?))
                    })
                    .collect::<Result<_, CalibrateError>>()?,
            },
            TrainLoss::Attention => {
                let mask = probe_mask(probes, n, &device)?;
                let (mut keys, mut values, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
                for (kv, q) in layers.zip(&t.queries) {
                    let (k, v) = kv?;
                    outputs.push(attention_output(q, &k, &v, &mask)?);
                    keys.push(k);
                    values.push(v);
                }
                Truth::Attention {
                    keys,
                    values,
                    queries: t.queries.clone(),
                    outputs,
                    mask,
                    rotation: Rotation::new(rope, n, &device)?,
                }
            }
        };
        Ok(Sample { inputs, truth, n })
    }

    /// Target layer `j`'s mapped keys and values as rows: the ridge map's alone (no
    /// nets), or with the heads `nets`.
    fn mapped(
        &self,
        j: usize,
        x: &Sample,
        nets: Option<&LayerNets>,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (xk, xv) = &x.inputs[j];
        let one = |input: &Tensor, m: &crate::mapper::TargetLayerMap, net: Option<&Net>| {
            let linear = |x: &Tensor| x.matmul(&m.weight)?.broadcast_add(&m.bias);
            match net {
                Some(net) => net.used().output(input, linear, |x| net.forward(x)),
                None => linear(input),
            }
        };
        Ok((
            one(xk, &self.ridge.keys()[j], nets.map(|l| &l.keys))?,
            one(xv, &self.ridge.values()[j], nets.map(|l| &l.values))?,
        ))
    }

    fn loss(&self, j: usize, x: &Sample, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
        let a = self.anchor.min(x.n);
        let rest = x.n - a;
        match &x.truth {
            Truth::KvMse { rows } => {
                let (ik, iv) = &self.inv_std[j];
                let (kt, vt) = &rows[j];
                let error = |m: &Tensor, t: &Tensor, inv: &Tensor| {
                    (m.narrow(0, a, rest)? - t.narrow(0, a, rest)?)?
                        .broadcast_mul(inv)?
                        .sqr()?
                        .mean_all()
                };
                error(k, kt, ik)? + error(v, vt, iv)?
            }
            Truth::Attention {
                keys,
                values,
                queries,
                outputs,
                mask,
                rotation,
            } => {
                let heads = self.tgt.decoder.kv_shape().n_kv_head;
                let to_heads = |t: &Tensor| {
                    rows_to_heads(t, heads).map_err(|e| candle_core::Error::Msg(e.to_string()))
                };
                // The anchor positions are the target's own, as a handoff builds them.
                let keep = |mapped: Tensor, truth: &Tensor| -> candle_core::Result<Tensor> {
                    if a == 0 {
                        return Ok(mapped);
                    }
                    Tensor::cat(&[truth.narrow(1, 0, a)?, mapped.narrow(1, a, rest)?], 1)
                };
                let kh = keep(rotation.rotate(&to_heads(k)?)?, &keys[j])?;
                let vh = keep(to_heads(v)?, &values[j])?;
                let out = attention_output(&queries[j], &kh, &vh, mask)?;
                relative_error(&out, &outputs[j])
            }
        }
    }

    /// One optimiser step for every layer of every candidate still training, on one
    /// window.
    pub(super) fn step(&mut self, x: &Sample) -> Result<(), CalibrateError> {
        let mut candidates = std::mem::take(&mut self.candidates);
        let stepped = candidates.iter_mut().filter(|c| !c.done).try_for_each(
            |c| -> Result<(), CalibrateError> {
                for (j, l) in c.layers.iter_mut().enumerate() {
                    let (k, v) = self.mapped(j, x, Some(l))?;
                    let loss = self.loss(j, x, &k, &v)?;
                    l.opt.backward_step(&loss)?;
                }
                Ok(())
            },
        );
        self.candidates = candidates;
        stepped
    }

    /// Per layer, the mean held-out loss of the ridge map alone (with `ridge_too`) and of
    /// each candidate still training, one held-out window at a time (a window's sample is
    /// built once for all of them).
    pub(super) fn heldout(
        &self,
        held: &HeldOutCaptures,
        ridge_too: bool,
    ) -> Result<(Vec<f64>, Vec<Vec<f64>>), CalibrateError> {
        let view = held.view(self.direction);
        let layers = self.ridge.keys().len();
        let mut ridge = vec![0f64; layers];
        let mut trained = vec![vec![0f64; layers]; self.candidates.len()];
        let windows = view.windows.iter().zip(view.src.iter().zip(view.tgt));
        for (w, (s, g)) in windows {
            let x = self.sample(s, g, w, view.probes)?;
            for j in 0..layers {
                let score = |nets: Option<&LayerNets>| -> Result<f64, CalibrateError> {
                    let (k, v) = self.mapped(j, &x, nets)?;
                    let l = self.loss(j, &x, &k.detach(), &v.detach())?;
                    Ok(f64::from(l.to_scalar::<f32>()?))
                };
                if ridge_too {
                    ridge[j] += score(None)?;
                }
                for (c, sums) in self.candidates.iter().zip(&mut trained) {
                    if !c.done {
                        sums[j] += score(Some(&c.layers[j]))?;
                    }
                }
            }
        }
        let n = view.windows.len().max(1) as f64;
        let mean = |v: Vec<f64>| -> Vec<f64> { v.into_iter().map(|s| s / n).collect() };
        Ok((mean(ridge), trained.into_iter().map(mean).collect()))
    }

    /// Keeps each layer's weights, for every candidate still training, where they beat
    /// its best; a candidate stops once its mean over the layers has not improved for
    /// `patience` epochs. Returns a line per candidate for the progress notes.
    pub(super) fn keep_best(
        &mut self,
        losses: &[Vec<f64>],
        epoch: usize,
        patience: usize,
    ) -> Result<Vec<String>, CalibrateError> {
        let mut lines = Vec::new();
        for (c, losses) in self.candidates.iter_mut().zip(losses) {
            if c.done {
                continue;
            }
            for (l, &loss) in c.layers.iter_mut().zip(losses) {
                if loss < l.best_loss {
                    l.best_loss = loss;
                    l.best_epoch = epoch;
                    l.best = Some((l.keys.snapshot()?, l.values.snapshot()?));
                }
            }
            let mean = crate::metrics::mean(losses);
            c.stop.observe(mean);
            c.epochs = epoch;
            c.done = epoch > 0 && c.stop.stale >= patience;
            lines.push(format!(
                "{:?}: held-out loss {mean:.4}{}",
                c.hidden,
                if c.done { ", stopping" } else { "" }
            ));
        }
        Ok(lines)
    }
}
