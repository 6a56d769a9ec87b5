//! Capture: both models prefill the same windows, and the paired key and value features
//! of every kept position are folded into [`PairStats`], one pair per direction. Each
//! window is read once by each model whatever the number of directions: the prefill is
//! the expensive part of a calibration.

use super::{check_cancel, CalibrateError, CalibrateOptions, CalibrationProgress, Direction};
use crate::mapper::features::all_layer_features;
use crate::mapper::token_block::{block_layers, with_block};
use crate::mapper::PairStats;
use crate::metrics::probe_positions;
use baton_runtime::model::rope::Rope;
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use candle_core::Tensor;
use std::borrow::Cow;
use std::sync::atomic::AtomicBool;

/// A window as one model read it.
pub struct Captured {
    pub cache: KvCache,
    /// Per layer [n_head, probes, hd], the model's own queries at the probe positions.
    pub queries: Vec<Tensor>,
}

/// Prefill `ids` into a fresh cache, keeping the queries at `probes`.
pub fn capture(m: &Model, ids: &[u32], probes: &[usize]) -> Result<Captured, CalibrateError> {
    capture_until(m, ids, probes, &|| false)
}

/// [`capture`] that gives up as soon as `stop` says so, for work that gives way to
/// someone waiting (a window read while the workbench is idle).
pub fn capture_until(
    m: &Model,
    ids: &[u32],
    probes: &[usize],
    stop: &dyn Fn() -> bool,
) -> Result<Captured, CalibrateError> {
    let mut cache = m.decoder.new_cache();
    let out = m.decoder.forward_until(
        ids,
        &mut cache,
        &ForwardOptions {
            logits: Logits::None,
            probe_positions: probes.to_vec(),
        },
        stop,
    )?;
    Ok(Captured {
        cache,
        queries: out.queries,
    })
}

/// One window's features of one model, as [`PairStats::update`] takes them: `rows`
/// observations of every layer's keys and of every layer's values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowFeatures {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub rows: usize,
}

impl WindowFeatures {
    /// Positions `skip_first..len` of `cache`, every `stride`-th.
    pub fn of(
        cache: &KvCache,
        rope: &Rope,
        skip_first: usize,
        len: usize,
        stride: usize,
    ) -> Result<Self, CalibrateError> {
        let (k, v) = all_layer_features(cache, rope, skip_first, len, stride)?;
        Ok(Self {
            rows: k.dim(0)?,
            keys: flat(&k)?,
            values: flat(&v)?,
        })
    }
}

fn flat(t: &Tensor) -> Result<Vec<f32>, CalibrateError> {
    // Activations may be bf16 (a GPU's); statistics are accumulated in f32 all the same.
    Ok(t.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?)
}

/// Source-side key and value rows, borrowed when there is nothing to append.
type SourceRows<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>);

/// Source-side rows of one window: the source's own features, with the target's layer-0
/// block appended to every row when the statistics hold `block` more source layers.
fn source_rows<'a>(
    s: &'a WindowFeatures,
    t: &WindowFeatures,
    like: &PairStats,
    block: usize,
) -> Result<SourceRows<'a>, CalibrateError> {
    if block == 0 {
        return Ok((Cow::Borrowed(&s.keys), Cow::Borrowed(&s.values)));
    }
    let own = (like.l_s() - block) * like.d_s();
    let (tw, dt) = (like.dy(), like.d_t());
    Ok((
        Cow::Owned(with_block(
            &s.keys, own, &t.keys, &t.values, tw, dt, s.rows,
        )?),
        Cow::Owned(with_block(
            &s.values, own, &t.keys, &t.values, tw, dt, s.rows,
        )?),
    ))
}

/// One window's rows as they enter the key and value statistics (see
/// [`PairStats::update`]): source rows with the token block where the statistics hold it.
pub struct StatsRows<'a> {
    pub keys_x: Cow<'a, [f32]>,
    pub values_x: Cow<'a, [f32]>,
    pub keys_y: &'a [f32],
    pub values_y: &'a [f32],
    pub rows: usize,
}

/// Key and value statistics of one direction.
#[derive(Debug, Clone)]
pub struct DirectionStats {
    pub direction: Direction,
    pub keys: PairStats,
    pub values: PairStats,
    /// Source layers past the source's own: the pieces of the target's layer-0 block.
    pub token_layers: usize,
}

impl DirectionStats {
    /// Empty statistics for `direction` between models of these (layers, key/value
    /// width) geometries, `a` the first model and `b` the second; with `token_features`
    /// the source side also holds the target's layer-0 block.
    pub fn new(
        direction: Direction,
        a: (usize, usize),
        b: (usize, usize),
        token_features: bool,
    ) -> Result<Self, CalibrateError> {
        let ((ls, ds), (lt, dt)) = direction.pick(a, b);
        let token_layers = if token_features {
            block_layers(ds, dt)?
        } else {
            0
        };
        Ok(Self {
            direction,
            keys: PairStats::new(ls + token_layers, ds, lt, dt)?,
            values: PairStats::new(ls + token_layers, ds, lt, dt)?,
            token_layers,
        })
    }

    /// Add one window read by both models, the first model's features in `a`.
    pub fn add(&mut self, a: &WindowFeatures, b: &WindowFeatures) -> Result<(), CalibrateError> {
        self.add_weighted(a, b, None)
    }

    /// [`Self::add`] with a weight per kept position.
    pub fn add_weighted(
        &mut self,
        a: &WindowFeatures,
        b: &WindowFeatures,
        weights: Option<&[f32]>,
    ) -> Result<(), CalibrateError> {
        let r = self.rows(a, b)?;
        self.keys
            .update_weighted(&r.keys_x, r.keys_y, r.rows, weights)?;
        self.values
            .update_weighted(&r.values_x, r.values_y, r.rows, weights)?;
        Ok(())
    }

    /// The rows [`Self::add`] would put into the key and value statistics for one window,
    /// without adding them: a caller can weigh an update before taking it.
    pub fn rows<'a>(
        &self,
        a: &'a WindowFeatures,
        b: &'a WindowFeatures,
    ) -> Result<StatsRows<'a>, CalibrateError> {
        let (s, t) = self.direction.pick(a, b);
        let (keys_x, values_x) = source_rows(s, t, &self.keys, self.token_layers)?;
        Ok(StatsRows {
            keys_x,
            values_x,
            keys_y: &t.keys,
            values_y: &t.values,
            rows: s.rows,
        })
    }

    pub fn memory_bytes(&self) -> usize {
        self.keys.memory_bytes() + self.values.memory_bytes()
    }
}

pub fn geometry(m: &Model) -> (usize, usize) {
    (m.config().n_layer, m.config().kv_width())
}

/// Statistics for each of `directions` between `a` and `b`, allocated up front so that
/// a geometry too large for memory fails before the capture.
pub fn allocate(
    a: &Model,
    b: &Model,
    directions: &[Direction],
    token_features: bool,
) -> Result<Vec<DirectionStats>, CalibrateError> {
    directions
        .iter()
        .map(|&d| DirectionStats::new(d, geometry(a), geometry(b), token_features))
        .collect()
}

/// Both models read every fitting window; every direction's statistics take the pair.
pub fn capture_fit(
    a: &Model,
    b: &Model,
    windows: &[Vec<u32>],
    opts: &CalibrateOptions,
    stats: &mut [DirectionStats],
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<(), CalibrateError> {
    progress.phase("capture", windows.len() as u64);
    let weighted = opts.attention_weight > 0.0;
    // A model's own queries at every position, when it is a direction's target and the
    // fit is weighted by where they read.
    let all = |w: &[u32], is_target: bool| -> Vec<usize> {
        if weighted && is_target {
            (0..w.len()).collect()
        } else {
            Vec::new()
        }
    };
    let a_target = stats.iter().any(|s| s.direction == Direction::Backward);
    let b_target = stats.iter().any(|s| s.direction == Direction::Forward);
    for w in windows {
        check_cancel(cancel)?;
        let ca = capture(a, w, &all(w, a_target))?;
        let cb = capture(b, w, &all(w, b_target))?;
        let fa = WindowFeatures::of(
            &ca.cache,
            a.decoder.rope(),
            opts.skip_first,
            w.len(),
            opts.stride,
        )?;
        let fb = WindowFeatures::of(
            &cb.cache,
            b.decoder.rope(),
            opts.skip_first,
            w.len(),
            opts.stride,
        )?;
        let weights_of = |c: &Captured| -> Result<Option<Vec<f32>>, CalibrateError> {
            if c.queries.is_empty() {
                return Ok(None);
            }
            Ok(Some(attention_weights(c, opts)?))
        };
        let (wa, wb) = (weights_of(&ca)?, weights_of(&cb)?);
        for s in stats.iter_mut() {
            let w = match s.direction {
                Direction::Forward => wb.as_deref(),
                Direction::Backward => wa.as_deref(),
            };
            s.add_weighted(&fa, &fb, w)?;
        }
        progress.advance(1);
    }
    Ok(())
}

/// The weight of every kept position of a window (`skip_first..len`, every `stride`-th)
/// from the attention the model's own queries give it, summed over its layers and
/// heads, relative to even attention: clipped to [1/8, 8] so that no position (the
/// attention sink above all) outweighs the rest, then raised to the chosen power.
fn attention_weights(c: &Captured, opts: &CalibrateOptions) -> Result<Vec<f32>, CalibrateError> {
    use crate::metrics::attention_mass::{received_by_position, relative_to_even};
    let mut total: Vec<f64> = Vec::new();
    let mut heads = 0;
    for (l, q) in c.queries.iter().enumerate() {
        let got = received_by_position(q, &c.cache.layer(l)?.k)?;
        if total.is_empty() {
            total = vec![0.0; got.len()];
        }
        for (t, g) in total.iter_mut().zip(&got) {
            *t += g;
        }
        heads += q.dim(0)?;
    }
    let rel = relative_to_even(&total, heads);
    Ok(rel
        .iter()
        .skip(opts.skip_first)
        .step_by(opts.stride)
        .map(|r| (r.clamp(0.125, 8.0) as f32).powf(opts.attention_weight))
        .collect())
}

/// The held-out windows as both models read them, with each model's own queries at the
/// probe positions.
pub struct HeldOutCaptures {
    pub windows: Vec<Vec<u32>>,
    pub a: Vec<Captured>,
    pub b: Vec<Captured>,
    pub probes: Vec<usize>,
}

/// The held-out windows of one direction: source and target captures in that order.
#[derive(Clone, Copy)]
pub struct HeldOutView<'a> {
    pub windows: &'a [Vec<u32>],
    pub src: &'a [Captured],
    pub tgt: &'a [Captured],
    pub probes: &'a [usize],
}

impl HeldOutCaptures {
    pub fn view(&self, d: Direction) -> HeldOutView<'_> {
        let (src, tgt) = d.pick(&self.a, &self.b);
        HeldOutView {
            windows: &self.windows,
            src,
            tgt,
            probes: &self.probes,
        }
    }
}

/// Both models read every held-out window, keeping their queries at the probes.
pub fn capture_heldout(
    a: &Model,
    b: &Model,
    windows: Vec<Vec<u32>>,
    opts: &CalibrateOptions,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<HeldOutCaptures, CalibrateError> {
    let probes = probe_positions(opts.seq_len, opts.probes);
    progress.phase("held-out", windows.len() as u64);
    let (mut held_a, mut held_b) = (Vec::new(), Vec::new());
    for w in &windows {
        check_cancel(cancel)?;
        held_a.push(capture(a, w, &probes)?);
        held_b.push(capture(b, w, &probes)?);
        progress.advance(1);
    }
    Ok(HeldOutCaptures {
        windows,
        a: held_a,
        b: held_b,
        probes,
    })
}

/// Statistics of the held-out windows in the geometry of `like`, whose last
/// `token_layers` source layers are the token block: they give held-out R² per layer
/// from the statistics alone, without touching raw rows again.
pub fn heldout_stats(
    src: &Model,
    tgt: &Model,
    held: HeldOutView<'_>,
    like: &PairStats,
    token_layers: usize,
    opts: &CalibrateOptions,
) -> Result<(PairStats, PairStats), CalibrateError> {
    let (ls, ds, lt, dt) = (like.l_s(), like.d_s(), like.l_t(), like.d_t());
    let mut hk = PairStats::new(ls, ds, lt, dt)?;
    let mut hv = PairStats::new(ls, ds, lt, dt)?;
    for (s, t) in held.src.iter().zip(held.tgt) {
        let fs = WindowFeatures::of(
            &s.cache,
            src.decoder.rope(),
            opts.skip_first,
            s.cache.len(),
            opts.stride,
        )?;
        let ft = WindowFeatures::of(
            &t.cache,
            tgt.decoder.rope(),
            opts.skip_first,
            t.cache.len(),
            opts.stride,
        )?;
        let (xk, xv) = source_rows(&fs, &ft, like, token_layers)?;
        hk.update(&xk, &ft.keys, fs.rows)?;
        hv.update(&xv, &ft.values, fs.rows)?;
    }
    Ok((hk, hv))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows` observations of `layers × width` features, each value `base + row`.
    fn feats(layers: usize, width: usize, rows: usize, base: f32) -> WindowFeatures {
        let row = |r: usize| (0..layers * width).map(move |c| base + r as f32 + c as f32);
        let all: Vec<f32> = (0..rows).flat_map(row).collect();
        WindowFeatures {
            keys: all.clone(),
            values: all.iter().map(|x| -x).collect(),
            rows,
        }
    }

    #[test]
    fn each_direction_reads_the_pair_its_own_way_round() {
        // Models of different geometry: 2 layers of width 3 and 3 layers of width 3.
        let (a_geo, b_geo) = ((2, 3), (3, 3));
        let mut fwd = DirectionStats::new(Direction::Forward, a_geo, b_geo, false).unwrap();
        let mut bwd = DirectionStats::new(Direction::Backward, a_geo, b_geo, false).unwrap();
        assert_eq!((fwd.keys.l_s(), fwd.keys.d_s()), (2, 3));
        assert_eq!((bwd.keys.l_s(), bwd.keys.d_s(), bwd.keys.l_t()), (3, 3, 2));
        let (fa, fb) = (feats(2, 3, 5, 0.0), feats(3, 3, 5, 100.0));
        fwd.add(&fa, &fb).unwrap();
        bwd.add(&fa, &fb).unwrap();
        assert_eq!((fwd.keys.count(), bwd.values.count()), (5, 5));
        // The mean of column 0 over rows 0..5 is base + 2.
        assert!((fwd.keys.mean_x()[0] - 2.0).abs() < 1e-9);
        assert!((fwd.keys.mean_y()[0] - 102.0).abs() < 1e-9);
        assert!((bwd.keys.mean_x()[0] - 102.0).abs() < 1e-9);
        assert!((bwd.values.mean_y()[0] + 2.0).abs() < 1e-9);
        // The other model's features do not fit a direction's source side.
        assert!(fwd.add(&fb, &fa).is_err());
        assert_eq!(fwd.memory_bytes(), 2 * fwd.keys.memory_bytes());
    }

    #[test]
    fn a_window_with_no_kept_rows_adds_nothing() {
        let mut s = DirectionStats::new(Direction::Forward, (1, 2), (1, 2), false).unwrap();
        s.add(&feats(1, 2, 0, 0.0), &feats(1, 2, 0, 0.0)).unwrap();
        assert_eq!(s.keys.count(), 0);
    }
}
