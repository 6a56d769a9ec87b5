//! Running a fitted mapper: source cache positions in, target cache layers out. Each
//! source layer is un-rotated once however many target layers read it; each target layer
//! then costs one product for K and one for V (all heads at once), and the keys get the
//! target's RoPE at the same absolute positions.
//!
//! [`CacheMapper`] holds the maps and chooses the arithmetic: [`dense`] runs them as
//! tensor products in the target's dtype, [`int8`] on the CPU's int8 kernels with the
//! features conditioned by the source's [`SourceScales`].

mod batched;
pub mod dense;
pub mod int8;
mod packed_head;
mod packing;
mod scales;

pub use dense::TargetLayerMap;
pub use int8::PackedMapper;
pub use scales::SourceScales;

use crate::mapper::nonlinear::Heads;
use baton_runtime::model::rope::Rope;
use baton_runtime::model::{KvCache, KvShape, LayerKv, LayerZero, ModelError};
use candle_core::DType;
use std::collections::BTreeSet;
use std::sync::Arc;

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
    /// (AVX-512 VNNI or AVX2); elsewhere the same as `F32`.
    #[default]
    Int8,
    /// Dense products in the target's dtype.
    F32,
}

/// Everything needed to turn source cache positions into target cache layers. The fields
/// are private: the int8 form is derived from the maps and the source's scales, and is
/// rebuilt whenever those change.
#[derive(Debug, Clone)]
pub struct CacheMapper {
    source: KvShape,
    target: KvShape,
    keys: Vec<TargetLayerMap>,
    values: Vec<TargetLayerMap>,
    /// The source's feature statistics, which the int8 form needs.
    scales: Option<Arc<SourceScales>>,
    /// The precision asked for; [`Self::precision`] is the one the maps run in.
    requested: MapPrecision,
    /// The int8 form, when it runs here and was asked for.
    int8: Option<Arc<PackedMapper>>,
    /// The dense maps stacked for one product each across target layers, where they can
    /// be (ridge maps of one k).
    batched: Option<Arc<batched::BatchedMaps>>,
    /// The target's layer 0, when the maps read the token block
    /// ([`crate::mapper::token_block`]): source layers from `source.n_layer` on are its
    /// pieces.
    layer_zero: Option<LayerZero>,
}

impl CacheMapper {
    /// Tensors on the target's device from fitted or loaded maps.
    pub fn from_layer_maps(
        src: &baton_runtime::model::Model,
        tgt: &baton_runtime::model::Model,
        keys: &[crate::mapper::LayerMap],
        values: &[crate::mapper::LayerMap],
        scales: Option<&SourceScales>,
    ) -> Result<Self, ModelError> {
        let d_s = src.config().kv_width();
        let (dev, dtype) = (tgt.decoder.device(), tgt.decoder.dtype());
        let widest = keys
            .iter()
            .chain(values)
            .flat_map(|m| m.sources.iter().copied())
            .max()
            .unwrap_or(0);
        let layer_zero = Self::layer_zero_for(src, tgt, widest)?;
        let conv = |m: &crate::mapper::LayerMap| {
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
            requested: MapPrecision::default(),
            int8: None,
            batched: None,
            layer_zero,
        }
        .with_precision(MapPrecision::default())
    }

    /// The target's layer 0 when a map reads source layer `widest` past the source's own
    /// layers (a piece of the token block); an error when no piece has that index.
    fn layer_zero_for(
        src: &baton_runtime::model::Model,
        tgt: &baton_runtime::model::Model,
        widest: usize,
    ) -> Result<Option<LayerZero>, ModelError> {
        let l_s = src.config().n_layer;
        if widest < l_s {
            return Ok(None);
        }
        let m = crate::mapper::token_block::block_layers(
            src.config().kv_width(),
            tgt.config().kv_width(),
        )
        .map_err(|e| ModelError::Cache(e.to_string()))?;
        if widest >= l_s + m {
            return Err(ModelError::Cache(format!(
                "a map reads source layer {widest}, but the source has {l_s} layers and \
                 the token block {m} pieces"
            )));
        }
        Ok(Some(LayerZero::of(&tgt.decoder)?))
    }

    /// The same maps run in `precision`. Int8 falls back to f32 where its kernels do not
    /// run here, or when the mapper has no source scales (artifacts made before them).
    pub fn with_precision(mut self, precision: MapPrecision) -> Result<Self, ModelError> {
        self.requested = precision;
        self.rebuild_forms()?;
        Ok(self)
    }

    /// The same maps with trained heads (one per target layer, keys and values), packed
    /// beside the maps for the int8 kernels where those run.
    pub fn with_heads(mut self, heads: &Heads) -> Result<Self, ModelError> {
        if heads.keys.len() != self.keys.len() || heads.values.len() != self.values.len() {
            return Err(ModelError::Cache(format!(
                "{} key and {} value heads for a mapper of {} target layers",
                heads.keys.len(),
                heads.values.len(),
                self.keys.len()
            )));
        }
        for (maps, list) in [
            (&mut self.keys, &heads.keys),
            (&mut self.values, &heads.values),
        ] {
            for (m, h) in maps.iter_mut().zip(list) {
                let (rows, cols) = m.weight.dims2()?;
                h.check(rows, cols).map_err(ModelError::Cache)?;
                m.head = Some(h.tensors(m.weight.device(), m.weight.dtype())?);
            }
        }
        self.rebuild_forms()?;
        Ok(self)
    }

    /// The same maps without their heads: the ridge map a residual head corrects.
    pub fn without_heads(mut self) -> Result<Self, ModelError> {
        for m in self.keys.iter_mut().chain(self.values.iter_mut()) {
            m.head = None;
        }
        self.rebuild_forms()?;
        Ok(self)
    }

    /// Whether the maps carry trained heads.
    pub fn has_heads(&self) -> bool {
        self.keys
            .iter()
            .chain(&self.values)
            .any(|m| m.head.is_some())
    }

    /// Derives the form the maps run in from the maps, the scales and the precision
    /// asked for: int8 where its kernels run, else the dense maps, stacked across layers
    /// where they can be (a copy of every weight, so only where the dense path runs).
    fn rebuild_forms(&mut self) -> Result<(), ModelError> {
        self.int8 = match (self.requested, &self.scales) {
            (MapPrecision::Int8, Some(sc)) => {
                int8::pack(&self.keys, &self.values, sc, self.source)?.map(Arc::new)
            }
            _ => None,
        };
        self.batched = match self.int8 {
            Some(_) => None,
            None => batched::BatchedMaps::new(&self.keys, &self.values)?.map(Arc::new),
        };
        Ok(())
    }

    /// The source cache's shape the maps read.
    pub fn source(&self) -> KvShape {
        self.source
    }

    /// The target cache's shape the maps write.
    pub fn target(&self) -> KvShape {
        self.target
    }

    /// The key maps, one per target layer.
    pub fn keys(&self) -> &[TargetLayerMap] {
        &self.keys
    }

    /// The value maps, one per target layer.
    pub fn values(&self) -> &[TargetLayerMap] {
        &self.values
    }

    /// The calibration's means and spreads of the source features, when the artifact
    /// holds them.
    pub fn source_scales(&self) -> Option<&SourceScales> {
        self.scales.as_deref()
    }

    /// The precision maps actually run in.
    pub fn precision(&self) -> MapPrecision {
        if self.int8.is_some() {
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
        self.check_range(src, tokens, start, end)?;
        let input = self.input(src, tokens, src_rope, tgt_rope);
        match &self.int8 {
            Some(p) => int8::map_layers(p, &input, start, end),
            None => dense::map_layers(&input, start, end),
        }
    }

    /// What each target layer's key and value maps read at positions `start..end` of
    /// `src` (whose positions hold `tokens`): the input a trained head learns from.
    pub fn layer_inputs(
        &self,
        src: &KvCache,
        tokens: &[u32],
        src_rope: &Rope,
        start: usize,
        end: usize,
    ) -> Result<Vec<(candle_core::Tensor, candle_core::Tensor)>, ModelError> {
        self.check_range(src, tokens, start, end)?;
        dense::layer_inputs(&self.input(src, tokens, src_rope, src_rope), start, end)
    }

    /// A whole target cache from a whole source cache whose positions hold `tokens`;
    /// every position of it is foreign to the target.
    pub fn map_cache(
        &self,
        src: &KvCache,
        tokens: &[u32],
        src_rope: &Rope,
        tgt_rope: &Rope,
    ) -> Result<KvCache, ModelError> {
        let mut cache = self.map_cache_entries(src, tokens, src_rope, tgt_rope)?;
        cache.mark_foreign(0..cache.len())?;
        Ok(cache)
    }

    fn map_cache_entries(
        &self,
        src: &KvCache,
        tokens: &[u32],
        src_rope: &Rope,
        tgt_rope: &Rope,
    ) -> Result<KvCache, ModelError> {
        if let Some(p) = &self.int8 {
            if src.dtype() == DType::F32 && src.device().is_cpu() {
                self.check_source(src)?;
                self.check_tokens(tokens, src.len())?;
                return int8::map_into_cache(p, &self.input(src, tokens, src_rope, tgt_rope));
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

    /// The source cache, its tokens and positions `start..end` of it fit the maps.
    fn check_range(
        &self,
        src: &KvCache,
        tokens: &[u32],
        start: usize,
        end: usize,
    ) -> Result<(), ModelError> {
        self.check_source(src)?;
        self.check_tokens(tokens, end)?;
        if end > src.len() || start > end {
            return Err(ModelError::Cache(format!(
                "range {start}..{end} is outside a source cache of {} positions",
                src.len()
            )));
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

    fn input<'a>(
        &'a self,
        src: &'a KvCache,
        tokens: &'a [u32],
        src_rope: &'a Rope,
        tgt_rope: &'a Rope,
    ) -> MapInput<'a> {
        MapInput {
            maps: (&self.keys, &self.values),
            batched: self.batched.as_deref(),
            target: self.target,
            layer_zero: self.layer_zero.as_ref(),
            tokens,
            src,
            src_rope,
            tgt_rope,
        }
    }
}

/// The mapped positions' context: what every target layer's product reads, whichever
/// arithmetic runs it.
pub struct MapInput<'a> {
    pub maps: (&'a [TargetLayerMap], &'a [TargetLayerMap]),
    /// The same maps stacked across layers, where they could be.
    pub batched: Option<&'a batched::BatchedMaps>,
    pub target: KvShape,
    /// The target's layer 0 when the maps read the token block, and the tokens of every
    /// source position.
    pub layer_zero: Option<&'a LayerZero>,
    pub tokens: &'a [u32],
    pub src: &'a KvCache,
    pub src_rope: &'a Rope,
    pub tgt_rope: &'a Rope,
}

impl MapInput<'_> {
    /// Every source layer any map reads, in order, once (token block pieces included).
    pub fn source_layers(&self) -> Vec<usize> {
        let (keys, values) = self.maps;
        let needed: BTreeSet<usize> = keys
            .iter()
            .chain(values)
            .flat_map(|m| m.sources.iter().copied())
            .collect();
        needed.into_iter().collect()
    }
}
