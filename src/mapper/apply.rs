//! Applying a fitted mapper: source cache positions in, target cache layers out.
//! Each source layer is un-rotated once however many target layers read it; each target
//! layer then costs one matrix product for K and one for V (all heads at once), and the
//! keys get the target's RoPE at the same absolute positions.

use super::features::{layer_features, rows_to_heads};
use super::packed::{PackedMapper, SourceScales};
use crate::model::rope::Rope;
use crate::model::{KvCache, KvShape, LayerKv, LayerZero, ModelError};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

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
}

impl TargetLayerMap {
    pub fn from_parts(
        sources: Vec<usize>,
        weight: &[f32],
        bias: &[f32],
        factors: Option<&super::low_rank::Factors>,
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
        })
    }
}

/// Leading positions the target computes itself at a switch by default, in the workbench,
/// `baton run`, eval and calibration's held-out scoring alike. Position 0 is the
/// attention sink, whose keys and values are outliers the map fits worst, and a gain on
/// the mapped keys stretches its error further; one token's prefill costs almost nothing.
/// Measured on held-out code (`baton eval --anchor 1`): top-1 agreement 0.848 → 0.864
/// (0.5B→1.5B) and 0.855 → 0.859 (1.5B→0.5B).
pub const DEFAULT_ANCHOR: usize = 1;

/// Arithmetic a map runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapPrecision {
    /// Q8_0 weights and features on the CPU's int8 kernels, where the CPU has them
    /// (AVX-512 VNNI); elsewhere the same as `F32`.
    #[default]
    Int8,
    /// Dense products in the target's dtype.
    F32,
}

/// Everything needed to turn source cache positions into target cache layers.
#[derive(Debug, Clone)]
pub struct CacheMapper {
    pub source: KvShape,
    pub target: KvShape,
    pub keys: Vec<TargetLayerMap>,
    pub values: Vec<TargetLayerMap>,
    /// The source's feature statistics, which the int8 form needs.
    scales: Option<Arc<SourceScales>>,
    /// The int8 form, when it runs here and was asked for.
    packed: Option<Arc<PackedMapper>>,
    /// The target's layer 0, when the maps read the token block
    /// ([`super::token_block`]): source layers from `source.n_layer` on are its pieces.
    layer_zero: Option<LayerZero>,
}

impl CacheMapper {
    /// Tensors on the target's device from fitted or loaded maps.
    pub fn from_layer_maps(
        src: &crate::model::Model,
        tgt: &crate::model::Model,
        keys: &[super::ridge::LayerMap],
        values: &[super::ridge::LayerMap],
        scales: Option<&SourceScales>,
    ) -> Result<Self, ModelError> {
        let d_s = src.config().kv_width();
        let (dev, dtype) = (tgt.decoder.device(), tgt.decoder.dtype());
        let l_s = src.config().n_layer;
        let widest = keys
            .iter()
            .chain(values)
            .flat_map(|m| m.sources.iter().copied())
            .max()
            .unwrap_or(0);
        let layer_zero = if widest >= l_s {
            let m = super::token_block::block_layers(d_s, tgt.config().kv_width())
                .map_err(|e| ModelError::Cache(e.to_string()))?;
            if widest >= l_s + m {
                return Err(ModelError::Cache(format!(
                    "a map reads source layer {widest}, but the source has {l_s} layers and \
                     the token block {m} pieces"
                )));
            }
            Some(LayerZero::of(&tgt.decoder)?)
        } else {
            None
        };
        let conv = |m: &super::ridge::LayerMap| {
            TargetLayerMap::from_parts(
                m.sources.clone(),
                &m.weight,
                &m.bias,
                m.factors.as_ref(),
                d_s,
                dev,
                dtype,
            )
        };
        Self {
            source: src.decoder.kv_shape(),
            target: tgt.decoder.kv_shape(),
            keys: keys.iter().map(conv).collect::<Result<_, _>>()?,
            values: values.iter().map(conv).collect::<Result<_, _>>()?,
            scales: scales.cloned().map(Arc::new),
            packed: None,
            layer_zero,
        }
        .with_precision(MapPrecision::default())
    }

    /// The same maps run in `precision`. Int8 falls back to f32 where its kernels do not
    /// run here, or when the mapper has no source scales (artifacts made before them).
    pub fn with_precision(mut self, precision: MapPrecision) -> Result<Self, ModelError> {
        self.packed = match (precision, &self.scales) {
            (MapPrecision::Int8, Some(sc)) => {
                super::packed::pack(&self.keys, &self.values, sc, self.source)?.map(Arc::new)
            }
            _ => None,
        };
        Ok(self)
    }

    /// The precision maps actually run in.
    /// The calibration's means and spreads of the source features, when the artifact
    /// holds them.
    pub fn source_scales(&self) -> Option<&SourceScales> {
        self.scales.as_deref()
    }

    pub fn precision(&self) -> MapPrecision {
        if self.packed.is_some() {
            MapPrecision::Int8
        } else {
            MapPrecision::F32
        }
    }

    /// Whether the maps read the target's own layer 0 of the tokens (the token block).
    pub fn reads_tokens(&self) -> bool {
        self.layer_zero.is_some()
    }

    /// The target's layer 0 the maps read, if they read the token block.
    pub fn layer_zero(&self) -> Option<&LayerZero> {
        self.layer_zero.as_ref()
    }

    /// Map positions `start..end` of `src`, whose positions hold `tokens`, into per-layer
    /// target K/V ([n_kv_head_t, end − start, hd_t]), ready for [`KvCache::extend_with`].
    pub fn map_range(
        &self,
        src: &KvCache,
        tokens: &[u32],
        src_rope: &Rope,
        tgt_rope: &Rope,
        start: usize,
        end: usize,
    ) -> Result<Vec<LayerKv>, ModelError> {
        self.check_source(src)?;
        self.check_tokens(tokens, end)?;
        if end > src.len() || start > end {
            return Err(ModelError::Cache(format!(
                "range {start}..{end} is outside a source cache of {} positions",
                src.len()
            )));
        }
        if let Some(p) = &self.packed {
            return super::packed::map_range(
                p,
                &self.packed_input(src, tokens, src_rope, tgt_rope),
                start,
                end,
            );
        }
        // Un-rotate each source layer that any target layer reads, once.
        let mut needed: BTreeMap<usize, ()> = BTreeMap::new();
        for m in self.keys.iter().chain(&self.values) {
            for &s in &m.sources {
                needed.insert(s, ());
            }
        }
        let l_s = self.source.n_layer;
        let mut feats = BTreeMap::new();
        for &s in needed.keys().filter(|&&s| s < l_s) {
            feats.insert(s, layer_features(src, src_rope, s, start, end, 1)?);
        }
        if let Some(lz) = &self.layer_zero {
            let (k0, v0) = lz.features(&tokens[start..end])?;
            let d_s = self.source.n_kv_head * self.source.head_dim;
            let dev = src.device();
            for (i, p) in super::token_block::pieces(&k0, &v0, d_s)?
                .into_iter()
                .enumerate()
            {
                let p = p.to_device(dev)?;
                feats.insert(
                    l_s + i,
                    super::features::LayerFeatures { k: p.clone(), v: p },
                );
            }
        }
        let dtype = self.keys[0].weight.dtype();
        let gather = |m: &TargetLayerMap, keys: bool| -> Result<Tensor, ModelError> {
            let parts: Vec<Tensor> = m
                .sources
                .iter()
                .map(|s| {
                    let f = &feats[s];
                    let t = if keys { &f.k } else { &f.v };
                    t.to_dtype(dtype)
                })
                .collect::<Result<_, _>>()?;
            let x = if parts.len() == 1 {
                parts[0].clone()
            } else {
                Tensor::cat(&parts, 1)?
            };
            Ok(x.matmul(&m.weight)?.broadcast_add(&m.bias)?)
        };
        let heads = self.target.n_kv_head;
        let mut out = Vec::with_capacity(self.target.n_layer);
        for (km, vm) in self.keys.iter().zip(&self.values) {
            let k = rows_to_heads(&gather(km, true)?, heads)?.to_dtype(src.dtype())?;
            let k = tgt_rope.rotate(&k, start)?;
            let v = rows_to_heads(&gather(vm, false)?, heads)?.to_dtype(src.dtype())?;
            out.push(LayerKv { k, v });
        }
        Ok(out)
    }

    /// A whole target cache from a whole source cache whose positions hold `tokens`.
    pub fn map_cache(
        &self,
        src: &KvCache,
        tokens: &[u32],
        src_rope: &Rope,
        tgt_rope: &Rope,
    ) -> Result<KvCache, ModelError> {
        if let Some(p) = &self.packed {
            if src.dtype() == DType::F32 && src.device().is_cpu() {
                self.check_source(src)?;
                self.check_tokens(tokens, src.len())?;
                return super::packed::map_cache(
                    p,
                    &self.packed_input(src, tokens, src_rope, tgt_rope),
                );
            }
        }
        let layers = self.map_range(src, tokens, src_rope, tgt_rope, 0, src.len())?;
        KvCache::import(self.target, layers, src.dtype(), src.device())
    }

    fn check_source(&self, src: &KvCache) -> Result<(), ModelError> {
        if src.shape() != self.source {
            return Err(ModelError::Cache(format!(
                "source cache {:?} does not match the mapper's source {:?}",
                src.shape(),
                self.source
            )));
        }
        if self.keys.len() != self.target.n_layer || self.values.len() != self.target.n_layer {
            return Err(ModelError::Cache(
                "mapper has the wrong number of target layers".into(),
            ));
        }
        Ok(())
    }

    /// A map that reads the token block needs the token of every mapped position:
    /// `tokens[i]` is the token at position `i`, up to `end`.
    fn check_tokens(&self, tokens: &[u32], end: usize) -> Result<(), ModelError> {
        if self.layer_zero.is_some() && tokens.len() < end {
            return Err(ModelError::Cache(format!(
                "this mapper reads the tokens of the mapped positions: {} tokens for \
                 positions up to {end}",
                tokens.len()
            )));
        }
        Ok(())
    }

    fn packed_input<'a>(
        &'a self,
        src: &'a KvCache,
        tokens: &'a [u32],
        src_rope: &'a Rope,
        tgt_rope: &'a Rope,
    ) -> super::packed::MapInput<'a> {
        super::packed::MapInput {
            maps: (&self.keys, &self.values),
            target: self.target,
            layer_zero: self.layer_zero.as_ref(),
            tokens,
            src,
            src_rope,
            tgt_rope,
        }
    }
}
