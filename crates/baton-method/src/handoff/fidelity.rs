//! How close a mapped cache is to the target's own, layer by layer: the numbers the
//! workbench shows after a switch and `baton eval` averages over held-out text, computed
//! by one function so the two can never disagree on what they mean.
//!
//! For target layer `l`, with `K, V` the true keys and values (RoPE stripped for the
//! regression measures) and `K̂, V̂` the mapped ones over positions `0..n`:
//! - attention-output cosine: the cosine between `softmax(q Kᵀ/√d) V` and
//!   `softmax(q K̂ᵀ/√d) V̂` for the target's own queries `q` at the probe positions,
//!   averaged over heads and probes — what the next layer actually receives;
//! - R² of K and of V: `1 − Σ‖K − K̂‖² / Σ‖K − mean(K)‖²` (and the same for V);
//! - key-error concentration: how much of the key error lies in the directions the
//!   layer's query projection reads, from its Gram `W_qᵀ W_q` (1 = as much as chance).

use crate::mapper::features::{layer_features, rows_to_heads, LayerFeatures};
use crate::metrics::{self, QueryGram};
use baton_runtime::model::{KvCache, Model, ModelError};
use candle_core::Tensor;

/// A measure that could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Metric(#[from] metrics::MetricError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// One layer's fidelity measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerFidelity {
    /// NaN when no queries were probed for the layer.
    pub attention_cosine: f64,
    pub r2_k: f64,
    pub r2_v: f64,
    pub key_error_concentration: f64,
}

/// Query-projection Grams of every layer of `model`, for key-error concentration.
pub fn query_grams(model: &Model) -> Result<Vec<QueryGram>, FidelityError> {
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

/// Compares positions `0..n` of `mapped` with `truth` at layer `l` of `model`. `queries`
/// are the layer's queries at `probes` ([n_head, probes, head_dim]); either cache may
/// hold more than `n` positions.
#[allow(clippy::too_many_arguments)]
pub fn layer_fidelity(
    model: &Model,
    gram: &QueryGram,
    truth: &KvCache,
    mapped: &KvCache,
    n: usize,
    queries: Option<&Tensor>,
    probes: &[usize],
    l: usize,
) -> Result<LayerFidelity, FidelityError> {
    let cfg = model.config();
    let rope = model.decoder.rope();
    let ft = layer_features(truth, rope, l, 0, n, 1)?;
    let fm = layer_features(mapped, rope, l, 0, n, 1)?;
    // A dropped position's slot holds nothing attention reads: the fit is measured on
    // the positions the handed cache keeps.
    let (ft, fm) = match kept_rows(mapped, n)? {
        None => (ft, fm),
        Some(idx) => {
            let pick = |f: LayerFeatures| -> candle_core::Result<LayerFeatures> {
                Ok(LayerFeatures {
                    k: f.k.index_select(&idx, 0)?,
                    v: f.v.index_select(&idx, 0)?,
                })
            };
            (pick(ft)?, pick(fm)?)
        }
    };
    let err = rows_to_heads(&(&ft.k - &fm.k)?, cfg.n_kv_head)?;
    let key_error_concentration = gram.concentration(&err)?;
    let r = metrics::r2_per_layer(&[ft.k, ft.v], &[fm.k, fm.v])?;
    let attention_cosine = match queries {
        Some(q) if !probes.is_empty() => {
            let (a, b) = (truth.layer_range(l, 0, n)?, mapped.layer_range(l, 0, n)?);
            let hidden = mapped.dropped();
            metrics::attention_output_cosine_hiding(q, probes, &a.k, &a.v, &b.k, &b.v, hidden)?
        }
        _ => f64::NAN,
    };
    Ok(LayerFidelity {
        attention_cosine,
        r2_k: r[0],
        r2_v: r[1],
        key_error_concentration,
    })
}

/// The rows of positions `0..n` that `cache` does not drop, as an index tensor; None
/// when it drops none of them.
fn kept_rows(cache: &KvCache, n: usize) -> Result<Option<Tensor>, FidelityError> {
    let dropped = cache.dropped();
    if !dropped.iter().any(|r| r.start < n) {
        return Ok(None);
    }
    let kept: Vec<u32> = (0..n)
        .filter(|p| !dropped.iter().any(|r| r.contains(p)))
        .map(|p| p as u32)
        .collect();
    Ok(Some(Tensor::new(kept.as_slice(), cache.device())?))
}
