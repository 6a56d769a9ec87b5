//! Held-out scoring: a map is judged as it will run, on windows the fit never saw. Each
//! window is mapped (behind the target's own anchor when the fit skipped the first
//! positions) and compared with the target's true cache twice over: the target's own
//! queries attend over both (attention-output cosine, per layer), and the target
//! continues the last quarter of the window from both (next-token agreement).

use super::capture::{Captured, HeldOutView};
use super::CalibrateError;
use crate::handoff::{HandoffInputs, HandoffPlan};
use crate::mapper::SourceScales;
use crate::mapper::{CacheMapper, LayerMap};
use crate::metrics::{self, attention_output_cosine, NextTokenAgreement};
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use candle_core::Tensor;

/// How a map does on the held-out windows.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldOut {
    /// Attention-output cosine per target layer, mean over windows.
    pub cosine: Vec<f64>,
    /// Next-token agreement of the target continuing from the mapped prefix with the
    /// target continuing from its own, over every window's continuation.
    pub agreement: NextTokenAgreement,
}

impl HeldOut {
    /// The cosine over all target layers, the number the sweep reports and the rank
    /// step holds reduced maps to.
    pub fn mean_cosine(&self) -> f64 {
        self.cosine.iter().sum::<f64>() / self.cosine.len().max(1) as f64
    }
}

/// Key maps, value maps, and how they do on the held-out windows.
pub struct Scored {
    pub keys: Vec<LayerMap>,
    pub values: Vec<LayerMap>,
    pub held: HeldOut,
}

/// Something that scores fitted maps on held-out data. The calibration's scorer runs
/// the models; the phases that only compare scores take any.
pub trait ScoreMaps {
    fn score(&self, keys: &[LayerMap], values: &[LayerMap]) -> Result<HeldOut, CalibrateError>;
}

/// Where a held-out window splits into the mapped prefix and the continuation the target
/// reads on top of it: three quarters in, as eval's 384 + 128 tokens of a 512 window.
pub fn continuation_start(seq_len: usize) -> usize {
    seq_len * 3 / 4
}

/// The target's logits over the continuation of one held-out window, read on top of
/// `cache` cut to the prefix (truncating is free; the cache then holds the window again).
fn continuation_logits(
    tgt: &Model,
    cache: &mut KvCache,
    window: &[u32],
) -> Result<Tensor, CalibrateError> {
    let start = continuation_start(window.len());
    cache.truncate(start);
    logits_after(tgt, cache, &window[start..])
}

/// The target's logits for every token of `ids`, read on top of `cache`.
fn logits_after(tgt: &Model, cache: &mut KvCache, ids: &[u32]) -> Result<Tensor, CalibrateError> {
    let out = tgt.decoder.forward(
        ids,
        cache,
        &ForwardOptions {
            logits: Logits::All,
            probe_positions: vec![],
        },
    )?;
    out.logits
        .ok_or_else(|| CalibrateError::Options("no logits for the continuation".into()))
}

pub(crate) fn to_cache_mapper(
    src: &Model,
    tgt: &Model,
    keys: &[LayerMap],
    values: &[LayerMap],
    scales: &SourceScales,
) -> Result<CacheMapper, CalibrateError> {
    Ok(CacheMapper::from_layer_maps(
        src,
        tgt,
        keys,
        values,
        Some(scales),
    )?)
}

/// Attention-output cosine per layer of `mapped` against the window's true cache, with
/// the target's own queries at `probes`.
pub fn layer_cosines(
    truth: &Captured,
    mapped: &KvCache,
    probes: &[usize],
) -> Result<Vec<f64>, CalibrateError> {
    let layers = truth.cache.shape().n_layer;
    if truth.queries.len() != layers || mapped.shape().n_layer != layers {
        return Err(CalibrateError::Options(format!(
            "held-out window of {layers} layers with queries for {} and a mapped cache of {}",
            truth.queries.len(),
            mapped.shape().n_layer
        )));
    }
    truth
        .queries
        .iter()
        .enumerate()
        .map(|(l, q)| {
            let (tr, mp) = (truth.cache.layer(l)?, mapped.layer(l)?);
            Ok(attention_output_cosine(
                q, probes, &tr.k, &tr.v, &mp.k, &mp.v,
            )?)
        })
        .collect()
}

/// Next-token agreement pooled over windows, each position counting once.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgreementSum {
    top1: f64,
    kl: f64,
    positions: usize,
}

impl AgreementSum {
    pub fn add(&mut self, a: &NextTokenAgreement) {
        self.top1 += a.top1 * a.positions as f64;
        self.kl += a.kl * a.positions as f64;
        self.positions += a.positions;
    }

    pub fn mean(&self) -> NextTokenAgreement {
        let p = self.positions.max(1) as f64;
        NextTokenAgreement {
            top1: self.top1 / p,
            kl: self.kl / p,
            positions: self.positions,
        }
    }
}

/// The held-out windows of one direction, with the target's own continuations computed
/// once, ready to score any maps between the two models.
pub struct HeldOutScorer<'a> {
    src: &'a Model,
    tgt: &'a Model,
    held: HeldOutView<'a>,
    /// The target's logits over each window's continuation from its own cache.
    true_logits: Vec<Tensor>,
    /// Leading positions the maps were fitted without; the target's own cache of them
    /// stands in front of the mapped rest, as the workbench and eval hold it.
    anchor: usize,
    scales: &'a SourceScales,
    /// The target continuing with no prefix at all against its own continuation: the
    /// floor a map must beat to be worth handing over.
    no_context: NextTokenAgreement,
}

impl<'a> HeldOutScorer<'a> {
    pub fn new(
        src: &'a Model,
        tgt: &'a Model,
        held: HeldOutView<'a>,
        anchor: usize,
        scales: &'a SourceScales,
    ) -> Result<Self, CalibrateError> {
        let true_logits = held
            .tgt
            .iter()
            .zip(held.windows)
            .map(|(t, w)| {
                let mut own = t.cache.try_clone_prefix(continuation_start(w.len()))?;
                continuation_logits(tgt, &mut own, w)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut no_context = AgreementSum::default();
        for (w, truth) in held.windows.iter().zip(&true_logits) {
            let mut empty = tgt.decoder.new_cache();
            let logits = logits_after(tgt, &mut empty, &w[continuation_start(w.len())..])?;
            no_context.add(&metrics::logits::agreement(truth, &logits)?);
        }
        Ok(Self {
            src,
            tgt,
            held,
            true_logits,
            anchor,
            scales,
            no_context: no_context.mean(),
        })
    }

    /// How the target continues the held-out windows with no context at all.
    pub fn no_context(&self) -> NextTokenAgreement {
        self.no_context
    }

    /// `mapper`'s image of one window's source cache, behind the anchor if there is one.
    fn mapped(
        &self,
        mapper: &CacheMapper,
        s: &Captured,
        t: &Captured,
        w: &[u32],
    ) -> Result<KvCache, CalibrateError> {
        let plan = HandoffPlan::new(s.cache.len()).anchor(self.anchor);
        let (cache, _) = plan.build_new(&HandoffInputs {
            source: self.src,
            source_cache: &s.cache,
            target: self.tgt,
            mapper,
            tokens: w,
            exact: Some(&t.cache),
        })?;
        Ok(cache)
    }

    /// Map each held-out window with `mapper` and score it against the true target cache.
    pub fn score_mapper(&self, mapper: &CacheMapper) -> Result<HeldOut, CalibrateError> {
        let mut per_layer = vec![0f64; self.tgt.config().n_layer];
        let mut agreement = AgreementSum::default();
        let held = &self.held;
        let windows = held.src.iter().zip(held.tgt).zip(held.windows);
        for (((s, t), w), truth) in windows.zip(&self.true_logits) {
            let mut mapped = self.mapped(mapper, s, t, w)?;
            for (slot, c) in per_layer
                .iter_mut()
                .zip(layer_cosines(t, &mapped, held.probes)?)
            {
                *slot += c;
            }
            // The mapped cache is not needed after this, so it is cut in place, not copied.
            let cont = continuation_logits(self.tgt, &mut mapped, w)?;
            agreement.add(&metrics::logits::agreement(truth, &cont)?);
        }
        let n = held.src.len().max(1) as f64;
        Ok(HeldOut {
            cosine: per_layer.into_iter().map(|c| c / n).collect(),
            agreement: agreement.mean(),
        })
    }
}

impl ScoreMaps for HeldOutScorer<'_> {
    fn score(&self, keys: &[LayerMap], values: &[LayerMap]) -> Result<HeldOut, CalibrateError> {
        let mapper = to_cache_mapper(self.src, self.tgt, keys, values, self.scales)?;
        self.score_mapper(&mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_runtime::model::{KvShape, LayerKv};
    use candle_core::{DType, Device};

    const SHAPE: KvShape = KvShape {
        n_layer: 3,
        n_kv_head: 2,
        head_dim: 8,
    };
    const LEN: usize = 24;

    fn random_cache() -> KvCache {
        let dev = Device::Cpu;
        let dims = (SHAPE.n_kv_head, LEN, SHAPE.head_dim);
        let layers = (0..SHAPE.n_layer)
            .map(|_| LayerKv {
                k: Tensor::randn(0f32, 1.0, dims, &dev).unwrap(),
                v: Tensor::randn(0f32, 1.0, dims, &dev).unwrap(),
            })
            .collect();
        KvCache::import(SHAPE, layers, DType::F32, &dev).unwrap()
    }

    fn window(probes: &[usize]) -> Captured {
        let queries = (0..SHAPE.n_layer)
            .map(|_| Tensor::randn(0f32, 1.0, (4, probes.len(), SHAPE.head_dim), &Device::Cpu))
            .collect::<Result<_, _>>()
            .unwrap();
        Captured {
            cache: random_cache(),
            queries,
        }
    }

    #[test]
    fn an_exact_map_scores_a_cosine_of_one_in_every_layer() {
        let probes = metrics::probe_positions(LEN, 6);
        let truth = window(&probes);
        let exact = truth.cache.try_clone().unwrap();
        let cos = layer_cosines(&truth, &exact, &probes).unwrap();
        assert_eq!(cos.len(), SHAPE.n_layer);
        // f32 softmax and products over 8-wide heads: 1e-5 is well above their rounding.
        assert!(cos.iter().all(|c| (c - 1.0).abs() < 1e-5), "{cos:?}");
    }

    #[test]
    fn a_wrong_layer_lowers_only_that_layers_cosine() {
        let probes = metrics::probe_positions(LEN, 6);
        let truth = window(&probes);
        let mut layers = truth.cache.export().unwrap();
        // Values of unit variance replaced by independent ones: the outputs decorrelate.
        layers[1].v = Tensor::randn(0f32, 1.0, layers[1].v.dims(), &Device::Cpu).unwrap();
        let wrong = KvCache::import(SHAPE, layers, DType::F32, &Device::Cpu).unwrap();
        let cos = layer_cosines(&truth, &wrong, &probes).unwrap();
        assert!(
            (cos[0] - 1.0).abs() < 1e-5 && (cos[2] - 1.0).abs() < 1e-5,
            "{cos:?}"
        );
        assert!(cos[1] < 0.9, "{cos:?}");
    }

    #[test]
    fn a_mapped_cache_of_another_depth_is_an_error_not_a_panic() {
        let probes = metrics::probe_positions(LEN, 4);
        let truth = window(&probes);
        let layers = truth.cache.export().unwrap()[..2].to_vec();
        let shape = KvShape {
            n_layer: 2,
            ..SHAPE
        };
        let short = KvCache::import(shape, layers, DType::F32, &Device::Cpu).unwrap();
        assert!(layer_cosines(&truth, &short, &probes).is_err());
    }

    #[test]
    fn agreement_is_pooled_over_positions_not_windows() {
        let mut sum = AgreementSum::default();
        let a = |top1, kl, positions| NextTokenAgreement {
            top1,
            kl,
            positions,
        };
        sum.add(&a(1.0, 0.0, 10));
        sum.add(&a(0.0, 2.0, 30));
        let m = sum.mean();
        assert_eq!(m.positions, 40);
        assert!((m.top1 - 0.25).abs() < 1e-12, "{m:?}");
        assert!((m.kl - 1.5).abs() < 1e-12, "{m:?}");
        assert_eq!(AgreementSum::default().mean(), a(0.0, 0.0, 0));
    }

    #[test]
    fn the_mean_cosine_is_over_layers_and_empty_is_zero() {
        let h = |cosine: Vec<f64>| HeldOut {
            cosine,
            agreement: NextTokenAgreement::default(),
        };
        assert!((h(vec![0.5, 1.0, 0.0]).mean_cosine() - 0.5).abs() < 1e-12);
        assert_eq!(h(vec![]).mean_cosine(), 0.0);
    }

    #[test]
    fn the_continuation_is_the_last_quarter() {
        assert_eq!(continuation_start(512), 384);
        assert_eq!(continuation_start(64), 48);
        assert_eq!(continuation_start(17), 12);
    }
}
