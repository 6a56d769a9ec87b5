//! The map as dense tensor products in the target's dtype, on the target's device: one
//! matrix product for K and one for V per target layer (all heads at once), the keys then
//! rotated by the target's RoPE at the same absolute positions.

use super::MapInput;
use crate::mapper::features::{layer_features, rows_to_heads, LayerFeatures};
use crate::mapper::nonlinear::HeadTensors;
use crate::mapper::ridge::Factors;
use crate::mapper::token_block;
use baton_runtime::model::{LayerKv, ModelError};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;

/// One target layer's map for K or V: y = [x_{s1} | … | x_{sk}] · W + b.
#[derive(Debug, Clone)]
pub struct TargetLayerMap {
    pub sources: Vec<usize>,
    /// [k·D_s, D_t]
    pub weight: Tensor,
    /// [D_t]
    pub bias: Tensor,
    /// A reduced map's factors ([k·D_s, r], [r, D_t]) whose product is `weight`.
    pub factors: Option<(Tensor, Tensor)>,
    /// A trained head on the same input, added to the product or in its place.
    pub head: Option<HeadTensors>,
}

impl TargetLayerMap {
    pub fn from_parts(
        sources: Vec<usize>,
        weight: &[f32],
        bias: &[f32],
        factors: Option<&Factors>,
        source_width: usize,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, ModelError> {
        let rows = sources.len() * source_width;
        let cols = bias.len();
        if weight.len() != rows * cols {
            return Err(ModelError::Cache(format!(
                "mapper weight has {} values, expected {rows}×{cols}",
                weight.len()
            )));
        }
        let factors = match factors {
            None => None,
            Some(f) => {
                if f.left.len() != rows * f.rank || f.right.len() != f.rank * cols {
                    return Err(ModelError::Cache(format!(
                        "rank-{} factors of {} and {} values do not make a {rows}×{cols} map",
                        f.rank,
                        f.left.len(),
                        f.right.len()
                    )));
                }
                Some((
                    Tensor::from_slice(&f.left, (rows, f.rank), device)?.to_dtype(dtype)?,
                    Tensor::from_slice(&f.right, (f.rank, cols), device)?.to_dtype(dtype)?,
                ))
            }
        };
        Ok(Self {
            sources,
            weight: Tensor::from_slice(weight, (rows, cols), device)?.to_dtype(dtype)?,
            bias: Tensor::from_slice(bias, cols, device)?.to_dtype(dtype)?,
            factors,
            head: None,
        })
    }
}

/// Positions `start..end` of the source mapped into per-layer target K/V
/// ([n_kv_head_t, end − start, hd_t]), in the source cache's dtype.
pub fn map_layers(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<LayerKv>, ModelError> {
    if let Some(b) = input.batched {
        return b.map(input, start, end);
    }
    map_layers_one_by_one(input, start, end)
}

/// [`map_layers`] a target layer at a time: for maps that cannot be stacked.
pub fn map_layers_one_by_one(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<LayerKv>, ModelError> {
    let feats = source_features(input, start, end)?;
    let (keys, values) = input.maps;
    let dtype = keys[0].weight.dtype();
    let heads = input.target.n_kv_head;
    let src_dtype = input.src.dtype();
    let mut out = Vec::with_capacity(input.target.n_layer);
    for (km, vm) in keys.iter().zip(values) {
        let k = rows_to_heads(&product(km, &feats, true, dtype)?, heads)?.to_dtype(src_dtype)?;
        let k = input.tgt_rope.rotate(&k, start)?;
        let v = rows_to_heads(&product(vm, &feats, false, dtype)?, heads)?.to_dtype(src_dtype)?;
        out.push(LayerKv { k, v });
    }
    Ok(out)
}

/// What each target layer's maps read at positions `start..end`: its source layers' keys
/// and values side by side, `([n, k·D_s], [n, k·D_s])` in the maps' dtype.
pub fn layer_inputs(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<(Tensor, Tensor)>, ModelError> {
    let feats = source_features(input, start, end)?;
    let (keys, values) = input.maps;
    let dtype = keys[0].weight.dtype();
    keys.iter()
        .zip(values)
        .map(|(km, vm)| {
            Ok((
                stacked(km, &feats, true, dtype)?,
                stacked(vm, &feats, false, dtype)?,
            ))
        })
        .collect()
}

/// Every source layer that any target layer reads, un-rotated once, and the token block's
/// pieces when the maps read them.
fn source_features(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<BTreeMap<usize, LayerFeatures>, ModelError> {
    let src = input.src;
    let l_s = src.shape().n_layer;
    let mut feats = BTreeMap::new();
    for s in input.source_layers().into_iter().filter(|&s| s < l_s) {
        feats.insert(s, layer_features(src, input.src_rope, s, start, end, 1)?);
    }
    for (i, p) in token_pieces(input, start, end)?.into_iter().enumerate() {
        feats.insert(l_s + i, LayerFeatures { k: p.clone(), v: p });
    }
    Ok(feats)
}

/// The token block's pieces at positions `start..end` ([n, D_s] each, on the source's
/// device), which the maps read as source layers `n_layer..`; none when they read no
/// token block.
pub(super) fn token_pieces(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<Tensor>, ModelError> {
    let Some(lz) = input.layer_zero else {
        return Ok(Vec::new());
    };
    let (k0, v0) = lz.features(&input.tokens[start..end])?;
    let src = input.src;
    let d_s = src.shape().n_kv_head * src.shape().head_dim;
    Ok(token_block::pieces(&k0, &v0, d_s)?
        .into_iter()
        .map(|p| p.to_device(src.device()))
        .collect::<candle_core::Result<_>>()?)
}

/// One map's product: its source layers' keys or values side by side, times W, plus b,
/// with the head's output added, or the head's output alone.
fn product(
    m: &TargetLayerMap,
    feats: &BTreeMap<usize, LayerFeatures>,
    keys: bool,
    dtype: DType,
) -> Result<Tensor, ModelError> {
    let x = stacked(m, feats, keys, dtype)?;
    let linear = |x: &Tensor| x.matmul(&m.weight)?.broadcast_add(&m.bias);
    Ok(match &m.head {
        None => linear(&x)?,
        Some(h) => h.used.output(&x, linear, |x| h.forward(x))?,
    })
}

/// A map's input: its source layers' keys or values side by side.
fn stacked(
    m: &TargetLayerMap,
    feats: &BTreeMap<usize, LayerFeatures>,
    keys: bool,
    dtype: DType,
) -> Result<Tensor, ModelError> {
    let parts: Vec<Tensor> = m
        .sources
        .iter()
        .map(|s| {
            let f = &feats[s];
            let t = if keys { &f.k } else { &f.v };
            t.to_dtype(dtype)
        })
        .collect::<Result<_, _>>()?;
    Ok(if parts.len() == 1 {
        parts[0].clone()
    } else {
        Tensor::cat(&parts, 1)?
    })
}
