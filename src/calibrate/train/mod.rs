//! Training the heads of a `residual` or `mlp` mapper after the ridge fit, on CPU with
//! candle's autograd and AdamW.
//!
//! - **Data, streamed.** Each epoch both models prefill the training windows again, one
//!   window at a time, and every direction's heads take one step per window: no window's
//!   features outlive its step. The input of a target layer's head is what its ridge map
//!   reads (the selected source layers' RoPE-stripped features side by side).
//! - **Loss.** By default the error of the target's attention output under its own queries
//!   at probe positions, `‖o(K̂, V̂) − o(K, V)‖² / ‖o(K, V)‖²` per target layer, the mapped
//!   keys rotated by the target's RoPE and the anchor positions the target's own, as a
//!   handoff uses them. `kv-mse` minimises the keys' and values' error in the target's
//!   standardized units instead.
//! - **Each target layer on its own.** Every layer's heads (keys and values) have their own
//!   optimiser and loss, so a layer's training never moves another's.
//! - **Early stopping** on the held-out windows calibration already reads: after every
//!   epoch each layer's held-out loss is measured and its best weights kept; a direction
//!   stops training when its mean held-out loss over the layers has not improved for
//!   `patience` epochs. (Waiting for every layer to stop improving ran to epoch 7 on the
//!   default pair while the mean had been best at epoch 1 or 2: a few layers' noise kept
//!   the whole direction training past where it overfit.)
//! - **Seeded**: the initial weights come from the seed and the windows are read in a
//!   fixed order, so the same inputs and seed give the same heads.

mod attention;
mod net;

use super::capture::{capture, Captured, HeldOutCaptures};
use super::heldout::HeldOutScorer;
use super::saved_stats::SavedStats;
use super::{check_cancel, CalibrateError, CalibrationProgress, Direction, Fitted};
use crate::mapper::features::{heads_to_rows, rows_to_heads};
use crate::mapper::nonlinear::{Head, HeadUse, Heads, MapperKind, TrainLoss, TrainingReport};
use crate::mapper::CacheMapper;
use crate::metrics::probe_positions;
use crate::metrics::{attention_output, probe_mask};
use crate::model::Model;
use attention::{relative_error, Rotation};
use candle_core::{Device, Tensor};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use net::{Net, NetShape};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// How heads are trained (`baton calibrate --mapper residual|mlp` and its `--train-*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    pub kind: MapperKind,
    pub loss: TrainLoss,
    /// Training windows read each epoch (the first of the fit split).
    pub windows: usize,
    /// Epochs at most; early stopping usually ends sooner.
    pub epochs: usize,
    /// Epochs without a gain in a direction's mean held-out loss before it stops.
    pub patience: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// Hidden widths in place of the kind's own.
    pub hidden: Option<Vec<usize>>,
    /// Query positions per training window the attention loss reads.
    pub probes: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            kind: MapperKind::Ridge,
            loss: TrainLoss::Attention,
            windows: 64,
            epochs: 4,
            patience: 1,
            learning_rate: 1e-3,
            seed: 0,
            hidden: None,
            probes: 64,
        }
    }
}

impl TrainOptions {
    /// Refuses settings that would train nothing or diverge before any model loads.
    pub fn validate(&self) -> Result<(), String> {
        if self.kind == MapperKind::Ridge {
            return Ok(());
        }
        let kind = self.kind;
        if self.windows == 0 || self.epochs == 0 {
            return Err(format!(
                "--train-windows {} --train-epochs {}: a {kind} mapper needs at least one \
                 window and one epoch to train on",
                self.windows, self.epochs
            ));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0 && self.learning_rate < 1.0)
        {
            return Err(format!(
                "--train-lr {}: a learning rate above 0 and below 1, e.g. 0.001",
                self.learning_rate
            ));
        }
        if let Some(h) = &self.hidden {
            if h.is_empty() || h.contains(&0) {
                return Err(format!(
                    "--train-hidden {h:?}: give one or more hidden widths above 0, e.g. 256 or 512,512"
                ));
            }
        }
        if self.probes == 0 {
            return Err("a trained mapper's loss needs at least one probe position".into());
        }
        Ok(())
    }
}

/// One window as both sides of a direction read it, ready for every layer's loss.
struct Sample {
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
struct EarlyStop {
    best: f64,
    stale: usize,
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
    fn observe(&mut self, mean: f64) {
        if mean < self.best {
            self.best = mean;
            self.stale = 0;
        } else {
            self.stale += 1;
        }
    }
}

/// The heads of one target layer under training.
struct LayerNets {
    keys: Net,
    values: Net,
    opt: AdamW,
    best: Option<(Head, Head)>,
    best_loss: f64,
    best_epoch: usize,
}

/// One direction's training.
struct Trainer<'a> {
    direction: Direction,
    src: &'a Model,
    tgt: &'a Model,
    ridge: CacheMapper,
    layers: Vec<LayerNets>,
    anchor: usize,
    loss: TrainLoss,
    /// The target's feature deviations per layer, keys and values, for kv-mse.
    inv_std: Vec<(Tensor, Tensor)>,
    ridge_loss: Vec<f64>,
    stop: EarlyStop,
    /// Whether this direction has stopped (its steps are no longer taken).
    done: bool,
    epochs: usize,
}

fn err(e: impl std::fmt::Display) -> CalibrateError {
    CalibrateError::Options(format!("training the heads: {e}"))
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
    fn new(
        src: &'a Model,
        tgt: &'a Model,
        fitted: &Fitted,
        stats: &SavedStats,
        opts: &TrainOptions,
        anchor: usize,
    ) -> Result<Self, CalibrateError> {
        let (hidden, activation, used) = opts
            .kind
            .architecture()
            .ok_or_else(|| err("a ridge mapper has no heads to train"))?;
        let hidden = opts.hidden.clone().unwrap_or(hidden);
        let device = Device::Cpu;
        let ridge = fitted
            .cache_mapper(src, tgt)?
            .with_precision(crate::mapper::MapPrecision::F32)?;
        let scales = &fitted.source_scales;
        let d_s = src.config().kv_width();
        let mut layers = Vec::new();
        let mut inv_std = Vec::new();
        for (j, (km, vm)) in fitted.keys.iter().zip(&fitted.values).enumerate() {
            let mut pair = Vec::new();
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
                let shape = NetShape {
                    hidden: &hidden,
                    activation,
                    used,
                    in_mean: pick(mean),
                    in_scale: pick(std).iter().map(|s| 1.0 / s.max(1e-6)).collect(),
                    out_scale: t_std,
                    out_mean: if used == HeadUse::Added {
                        vec![0.0; m.bias.len()]
                    } else {
                        t_mean
                    },
                };
                // A seed per (direction, layer, side): layers train the same whichever
                // runs first, and the directions differ.
                let seed = opts.seed ^ ((fitted.direction_tag() << 32) | ((j as u64) << 1) | side);
                pair.push(Net::new(shape, seed, &device)?);
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
            layers.push(LayerNets {
                keys,
                values,
                opt,
                best: None,
                best_loss: f64::INFINITY,
                best_epoch: 0,
            });
            let v = inv.pop().ok_or_else(|| err("no value scale"))?;
            let k = inv.pop().ok_or_else(|| err("no key scale"))?;
            inv_std.push((k, v));
        }
        Ok(Self {
            direction: stats.stats.direction,
            src,
            tgt,
            ridge,
            layers,
            anchor,
            loss: opts.loss,
            inv_std,
            ridge_loss: Vec::new(),
            stop: EarlyStop::default(),
            done: false,
            epochs: 0,
        })
    }

    fn sample(
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

    /// Target layer `j`'s mapped keys and values as rows: the ridge map's alone, or with
    /// its heads.
    fn mapped(&self, j: usize, x: &Sample, heads: bool) -> candle_core::Result<(Tensor, Tensor)> {
        let (xk, xv) = &x.inputs[j];
        let one = |input: &Tensor, m: &crate::mapper::TargetLayerMap, net: &Net| {
            let linear = |x: &Tensor| x.matmul(&m.weight)?.broadcast_add(&m.bias);
            if heads {
                net.used().output(input, linear, |x| net.forward(x))
            } else {
                linear(input)
            }
        };
        let l = &self.layers[j];
        Ok((
            one(xk, &self.ridge.keys()[j], &l.keys)?,
            one(xv, &self.ridge.values()[j], &l.values)?,
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

    /// One optimiser step for every layer on one window.
    fn step(&mut self, x: &Sample) -> Result<(), CalibrateError> {
        for j in 0..self.layers.len() {
            let (k, v) = self.mapped(j, x, true)?;
            let loss = self.loss(j, x, &k, &v)?;
            self.layers[j].opt.backward_step(&loss)?;
        }
        Ok(())
    }

    /// Per layer, the mean held-out loss of the ridge map alone and of the map with its
    /// heads, one held-out window at a time.
    fn heldout(
        &self,
        held: &HeldOutCaptures,
        ridge_too: bool,
    ) -> Result<(Vec<f64>, Vec<f64>), CalibrateError> {
        let view = held.view(self.direction);
        let layers = self.layers.len();
        let (mut ridge, mut trained) = (vec![0f64; layers], vec![0f64; layers]);
        let windows = view.windows.iter().zip(view.src.iter().zip(view.tgt));
        for (w, (s, g)) in windows {
            let x = self.sample(s, g, w, view.probes)?;
            for j in 0..layers {
                let modes: &[bool] = if ridge_too { &[false, true] } else { &[true] };
                for &heads in modes {
                    let (k, v) = self.mapped(j, &x, heads)?;
                    let l = f64::from(
                        self.loss(j, &x, &k.detach(), &v.detach())?
                            .to_scalar::<f32>()?,
                    );
                    if heads {
                        trained[j] += l;
                    } else {
                        ridge[j] += l;
                    }
                }
            }
        }
        let n = view.windows.len().max(1) as f64;
        let mean = |v: Vec<f64>| v.into_iter().map(|s| s / n).collect();
        Ok((mean(ridge), mean(trained)))
    }

    /// Keeps each layer's weights where they beat its best, and counts the epochs since
    /// the mean over the layers last improved.
    fn keep_best(&mut self, losses: &[f64], epoch: usize) -> Result<(), CalibrateError> {
        for (l, &loss) in self.layers.iter_mut().zip(losses) {
            if loss < l.best_loss {
                l.best_loss = loss;
                l.best_epoch = epoch;
                l.best = Some((l.keys.snapshot()?, l.values.snapshot()?));
            }
        }
        self.stop.observe(crate::metrics::mean(losses));
        Ok(())
    }
}

impl Fitted {
    /// A number per direction for seeding.
    fn direction_tag(&self) -> u64 {
        u64::from(
            self.source
                .sha256
                .bytes()
                .take(4)
                .fold(0u32, |a, b| a.rotate_left(8) ^ u32::from(b)),
        )
    }
}

/// Trains the heads of every direction in `fitted` (whose statistics are `stats`, in the
/// same order) on `windows`, stopping early on the held-out windows, and puts them with
/// their training report into each `Fitted`.
#[allow(clippy::too_many_arguments)]
pub(super) fn train_heads(
    a: &Model,
    b: &Model,
    fitted: &mut [Fitted],
    stats: &[SavedStats],
    windows: &[Vec<u32>],
    held: &HeldOutCaptures,
    opts: &TrainOptions,
    anchor: usize,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<(), CalibrateError> {
    let started = Instant::now();
    let mut trainers = Vec::new();
    for (f, st) in fitted.iter().zip(stats) {
        let (src, tgt) = st.stats.direction.pick(a, b);
        trainers.push(Trainer::new(src, tgt, f, st, opts, anchor)?);
    }
    // The starting point: the ridge map, and the heads as initialised.
    for t in &mut trainers {
        let (ridge, start) = t.heldout(held, true)?;
        t.ridge_loss = ridge;
        t.keep_best(&start, 0)?;
    }
    progress.phase(
        "training the heads (windows)",
        (opts.epochs * windows.len()) as u64,
    );
    for epoch in 1..=opts.epochs {
        for ids in windows {
            check_cancel(cancel)?;
            let probes = probe_positions(ids.len(), opts.probes);
            let (ca, cb) = (capture(a, ids, &probes)?, capture(b, ids, &probes)?);
            for t in trainers.iter_mut().filter(|t| !t.done) {
                let (s, g) = t.direction.pick(&ca, &cb);
                let x = t.sample(s, g, ids, &probes)?;
                t.step(&x)?;
            }
            progress.advance(1);
        }
        for t in trainers.iter_mut().filter(|t| !t.done) {
            let (_, losses) = t.heldout(held, false)?;
            t.keep_best(&losses, epoch)?;
            t.epochs = epoch;
            t.done = t.stop.stale >= opts.patience;
            progress.note(&format!(
                "epoch {epoch}: held-out loss {:.4} (ridge {:.4}){}",
                crate::metrics::mean(&losses),
                crate::metrics::mean(&t.ridge_loss),
                if t.done { ", stopping" } else { "" }
            ));
        }
        if trainers.iter().all(|t| t.done) {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let (hidden, activation, _) = opts.kind.architecture().ok_or_else(|| err("ridge"))?;
    let directions: Vec<Direction> = trainers.iter().map(|t| t.direction).collect();
    for (f, t) in fitted.iter_mut().zip(trainers) {
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut best_epoch = Vec::new();
        let mut trained = Vec::new();
        for l in t.layers {
            let (k, v) = l.best.ok_or_else(|| err("no weights were kept"))?;
            keys.push(k);
            values.push(v);
            best_epoch.push(l.best_epoch);
            trained.push(l.best_loss);
        }
        f.heads = Some(Heads {
            kind: opts.kind,
            keys,
            values,
        });
        f.training = Some(TrainingReport {
            loss: opts.loss,
            hidden: opts.hidden.clone().unwrap_or(hidden.clone()),
            activation,
            seed: opts.seed,
            learning_rate: opts.learning_rate,
            windows: windows.len(),
            seq_len: windows.first().map_or(0, Vec::len),
            epochs: t.epochs,
            best_epoch,
            heldout_ridge: t.ridge_loss,
            heldout_trained: trained,
            ridge_cosine: crate::metrics::mean(&f.report.cosine),
            ridge_top1: f.report.agreement.map_or(f64::NAN, |a| a.top1),
            seconds,
        });
    }
    // The report's held-out cosine and agreement are the map's as it will run: the
    // trained one's (the ridge map's stay in the training report).
    progress.phase("scoring the trained maps", directions.len() as u64);
    for (f, d) in fitted.iter_mut().zip(directions) {
        let (src, tgt) = d.pick(a, b);
        let scorer = HeldOutScorer::new(src, tgt, held.view(d), anchor, &f.source_scales)?;
        let scored = scorer.score_mapper(&f.cache_mapper(src, tgt)?)?;
        f.report.cosine = scored.cosine;
        f.report.agreement = Some(scored.agreement);
        progress.advance(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direction_stops_once_its_mean_held_out_loss_stops_improving() {
        let mut stop = EarlyStop::default();
        // The starting map, then a gain, then a mean no better: one stale epoch.
        for (mean, stale) in [(0.47, 0), (0.46, 0), (0.461, 1), (0.459, 0), (0.459, 1)] {
            stop.observe(mean);
            assert_eq!(stop.stale, stale, "after {mean}");
        }
        assert_eq!(stop.best, 0.459);
    }

    #[test]
    fn training_settings_that_cannot_train_are_refused_naming_the_flag() {
        let trained = |f: &dyn Fn(&mut TrainOptions)| {
            let mut o = TrainOptions {
                kind: MapperKind::Residual,
                ..TrainOptions::default()
            };
            f(&mut o);
            o.validate()
        };
        assert!(trained(&|_| {}).is_ok());
        for (change, flag) in [
            (
                &(|o: &mut TrainOptions| o.epochs = 0) as &dyn Fn(&mut TrainOptions),
                "--train-epochs 0",
            ),
            (&|o: &mut TrainOptions| o.windows = 0, "--train-windows 0"),
            (
                &|o: &mut TrainOptions| o.learning_rate = f64::NAN,
                "--train-lr NaN",
            ),
            (
                &|o: &mut TrainOptions| o.learning_rate = 0.0,
                "--train-lr 0",
            ),
            (
                &|o: &mut TrainOptions| o.hidden = Some(vec![256, 0]),
                "--train-hidden [256, 0]",
            ),
        ] {
            let e = trained(change).unwrap_err();
            assert!(e.contains(flag), "{flag:?} not in {e}");
        }
        // A ridge mapper trains nothing, so its training settings do not matter.
        let ridge = TrainOptions {
            epochs: 0,
            ..TrainOptions::default()
        };
        assert!(ridge.validate().is_ok());
    }
}
