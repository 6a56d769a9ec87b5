//! The fidelity of a mapped cache against the target's own cache of the same tokens:
//! per-layer attention-output cosine (the target's true queries at probe positions),
//! R² of keys and values, and key-error concentration.

use crate::mapper::features::{layer_features, rows_to_heads};
use crate::mapper::CacheMapper;
use crate::metrics::{self, QueryGram};
use crate::model::{KvCache, Model};
use crate::protocol::SwitchMetrics;
use candle_core::Tensor;

use super::EngineError;

/// Compare `mapped` with `truth` (same length) for `model`, whose queries at `probes`
/// are `queries` (one [n_head, probes, hd] tensor per layer).
pub fn cache_metrics(
    model: &Model,
    grams: &[QueryGram],
    truth: &KvCache,
    mapped: &KvCache,
    queries: &[Tensor],
    probes: &[usize],
) -> Result<SwitchMetrics, EngineError> {
    let cfg = model.config();
    let rope = model.decoder.rope();
    let n = truth.len().min(mapped.len());
    let mut out = SwitchMetrics {
        attention_cosine: Vec::with_capacity(cfg.n_layer),
        r2_k: Vec::with_capacity(cfg.n_layer),
        r2_v: Vec::with_capacity(cfg.n_layer),
        key_error_concentration: Vec::with_capacity(cfg.n_layer),
        top1_agreement: None,
        kl: None,
    };
    for (l, gram) in grams.iter().enumerate().take(cfg.n_layer) {
        let ft = layer_features(truth, rope, l, 0, n, 1)?;
        let fm = layer_features(mapped, rope, l, 0, n, 1)?;
        let err = rows_to_heads(&(&ft.k - &fm.k)?, cfg.n_kv_head)?;
        out.key_error_concentration.push(gram.concentration(&err)?);
        let r = metrics::r2_per_layer(&[ft.k, ft.v], &[fm.k, fm.v])?;
        out.r2_k.push(r[0]);
        out.r2_v.push(r[1]);
        let (a, b) = (truth.layer(l)?, mapped.layer(l)?);
        let cos = match queries.get(l) {
            Some(q) if !probes.is_empty() => {
                metrics::attention_output_cosine(q, probes, &a.k, &a.v, &b.k, &b.v)?
            }
            _ => f64::NAN,
        };
        out.attention_cosine.push(cos);
    }
    Ok(out)
}

/// Query-projection Grams of every layer, for key-error concentration.
pub fn query_grams(model: &Model) -> Result<Vec<QueryGram>, EngineError> {
    let cfg = model.config();
    model
        .decoder
        .weights()
        .layers
        .iter()
        .map(|w| {
            let wq = w.q.dense_weight(cfg.hidden, model.decoder.device())?;
            Ok(QueryGram::new(&wq, cfg.n_head, cfg.head_dim)?)
        })
        .collect()
}

/// Map positions `from..to` of `src_cache` onto the end of `dst` (which must hold
/// exactly `from` positions).
pub fn map_onto(
    mapper: &CacheMapper,
    src: &Model,
    src_cache: &KvCache,
    tgt: &Model,
    dst: &mut KvCache,
    from: usize,
    to: usize,
) -> Result<(), EngineError> {
    if dst.len() != from {
        return Err(EngineError::Internal(format!(
            "the target cache holds {} positions, expected {from}",
            dst.len()
        )));
    }
    if to > from {
        let layers =
            mapper.map_range(src_cache, src.decoder.rope(), tgt.decoder.rope(), from, to)?;
        dst.extend_with(&layers)?;
    }
    Ok(())
}
