//! The dense map of every target layer at once: one batched product for all the keys and
//! one for all the values, instead of a product (and its stacking, bias, reshape and RoPE)
//! per layer. On a GPU the per-layer form is bound by kernel launches (some twenty a
//! layer, about 8.5 ms for the 1.5B target at any length); this one launches a fixed few
//! per chunk of positions. Ridge maps only: every target layer must read the same number
//! of source layers, with no trained head.

use super::dense::{token_pieces, TargetLayerMap};
use super::MapInput;
use baton_runtime::model::{LayerKv, ModelError};
use candle_core::{DType, Tensor, D};

/// How many bytes of stacked input one chunk may hold: the batched input is every target
/// layer's k source layers side by side, [L_t, n, k·D_s], so long contexts are mapped a
/// chunk of positions at a time.
const CHUNK_BYTES: usize = 512 << 20;

/// Every target layer's key and value maps, stacked.
#[derive(Debug, Clone)]
pub struct BatchedMaps {
    /// Source layers each target layer reads, layer after layer ([L_t·k] indices).
    key_sources: Tensor,
    value_sources: Tensor,
    k: usize,
    /// [L_t, k·D_s, D_t] and [L_t, 1, D_t].
    key_weight: Tensor,
    key_bias: Tensor,
    value_weight: Tensor,
    value_bias: Tensor,
}

impl BatchedMaps {
    /// The stacked form of `keys` and `values`, or None where they cannot be stacked.
    pub fn new(
        keys: &[TargetLayerMap],
        values: &[TargetLayerMap],
    ) -> Result<Option<Self>, ModelError> {
        let Some(first) = keys.first() else {
            return Ok(None);
        };
        let k = first.sources.len();
        let shape = first.weight.dims().to_vec();
        let same = keys.iter().chain(values).all(|m| {
            m.head.is_none() && m.sources.len() == k && m.weight.dims() == shape.as_slice()
        });
        if !same || keys.len() != values.len() || k == 0 {
            return Ok(None);
        }
        let device = first.weight.device();
        let sources = |maps: &[TargetLayerMap]| -> candle_core::Result<Tensor> {
            let idx: Vec<u32> = maps
                .iter()
                .flat_map(|m| m.sources.iter().map(|&s| s as u32))
                .collect();
            Tensor::new(idx.as_slice(), device)
        };
        let weights = |maps: &[TargetLayerMap]| -> candle_core::Result<(Tensor, Tensor)> {
            let w: Vec<&Tensor> = maps.iter().map(|m| &m.weight).collect();
            let b: Vec<Tensor> = maps
                .iter()
                .map(|m| m.bias.unsqueeze(0))
                .collect::<candle_core::Result<_>>()?;
            Ok((Tensor::stack(&w, 0)?, Tensor::stack(&b, 0)?))
        };
        let (key_weight, key_bias) = weights(keys)?;
        let (value_weight, value_bias) = weights(values)?;
        Ok(Some(Self {
            key_sources: sources(keys)?,
            value_sources: sources(values)?,
            k,
            key_weight,
            key_bias,
            value_weight,
            value_bias,
        }))
    }

    /// Positions `start..end` mapped into every target layer's K/V, as
    /// [`super::dense::map_layers`] maps them.
    pub fn map(
        &self,
        input: &MapInput<'_>,
        start: usize,
        end: usize,
    ) -> Result<Vec<LayerKv>, ModelError> {
        self.map_in_chunks(input, start, end, CHUNK_BYTES)
    }

    /// [`Self::map`] with at most `budget` bytes of stacked input a chunk.
    fn map_in_chunks(
        &self,
        input: &MapInput<'_>,
        start: usize,
        end: usize,
        budget: usize,
    ) -> Result<Vec<LayerKv>, ModelError> {
        let dtype = self.key_weight.dtype();
        let (l_t, kd, _) = self.key_weight.dims3()?;
        let per_position = l_t * kd * dtype.size_in_bytes();
        let chunk = (budget / per_position.max(1)).max(1);
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut at = start;
        while at < end {
            let to = (at + chunk).min(end);
            let (k, v) = self.map_chunk(input, at, to)?;
            ks.push(k);
            vs.push(v);
            at = to;
        }
        let join = |parts: Vec<Tensor>| -> candle_core::Result<Tensor> {
            if parts.len() == 1 {
                Ok(parts.into_iter().next().expect("one part"))
            } else {
                Tensor::cat(&parts, 2)
            }
        };
        let (k, v) = (join(ks)?, join(vs)?);
        (0..l_t)
            .map(|l| {
                Ok(LayerKv {
                    k: k.get(l)?,
                    v: v.get(l)?,
                })
            })
            .collect()
    }

    /// One chunk: ([L_t, nkv_t, n, hd_t] keys rotated at their positions, values).
    fn map_chunk(
        &self,
        input: &MapInput<'_>,
        start: usize,
        end: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (feat_k, feat_v) = source_features(input, start, end, self.key_weight.dtype())?;
        let n = end - start;
        let (l_t, _, d_t) = self.key_weight.dims3()?;
        let heads = input.target.n_kv_head;
        let hd = d_t / heads;
        let src_dtype = input.src.dtype();
        let product = |feats: &Tensor, idx: &Tensor, w: &Tensor, b: &Tensor| {
            let d_s = feats.dim(D::Minus1)?;
            // [L_t·k, n, D_s] → [L_t, n, k·D_s]: each row's k source blocks side by side,
            // in the order the per-layer map stacks them.
            let x = feats
                .index_select(idx, 0)?
                .reshape((l_t, self.k, n, d_s))?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((l_t, n, self.k * d_s))?;
            x.matmul(w)?
                .broadcast_add(b)?
                .to_dtype(src_dtype)?
                .reshape((l_t, n, heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let k = product(&feat_k, &self.key_sources, &self.key_weight, &self.key_bias)?;
        let v = product(
            &feat_v,
            &self.value_sources,
            &self.value_weight,
            &self.value_bias,
        )?;
        let k = input
            .tgt_rope
            .rotate(&k.reshape((l_t * heads, n, hd))?, start)?
            .reshape((l_t, heads, n, hd))?;
        Ok((k, v))
    }
}

/// Every source layer's keys (RoPE stripped at their positions) and values at positions
/// `start..end` as rows, [S, n, D_s] each in `dtype`, the token block's pieces after the
/// source's own layers when the maps read them.
fn source_features(
    input: &MapInput<'_>,
    start: usize,
    end: usize,
    dtype: DType,
) -> Result<(Tensor, Tensor), ModelError> {
    let src = input.src;
    let shape = src.shape();
    let (l_s, heads, hd) = (shape.n_layer, shape.n_kv_head, shape.head_dim);
    let n = end - start;
    let mut ks = Vec::with_capacity(l_s);
    let mut vs = Vec::with_capacity(l_s);
    for l in 0..l_s {
        let kv = src.layer_range(l, start, end)?;
        ks.push(kv.k);
        vs.push(kv.v);
    }
    // [L_s·nkv, n, hd]: one RoPE strip for every layer.
    let k = input
        .src_rope
        .unrotate(&Tensor::cat(&ks, 0)?, start)?
        .reshape((l_s, heads, n, hd))?;
    let v = Tensor::cat(&vs, 0)?.reshape((l_s, heads, n, hd))?;
    let rows = |x: Tensor| -> candle_core::Result<Tensor> {
        x.transpose(1, 2)?
            .contiguous()?
            .reshape((l_s, n, heads * hd))?
            .to_dtype(dtype)
    };
    let (mut k, mut v) = (rows(k)?, rows(v)?);
    let pieces = token_pieces(input, start, end)?;
    if !pieces.is_empty() {
        let p: Vec<Tensor> = pieces
            .into_iter()
            .map(|p| p.to_dtype(dtype)?.unsqueeze(0))
            .collect::<candle_core::Result<_>>()?;
        let p = Tensor::cat(&p, 0)?;
        k = Tensor::cat(&[k, p.clone()], 0)?;
        v = Tensor::cat(&[v, p], 0)?;
    }
    Ok((k, v))
}

#[cfg(test)]
mod tests {
    use super::super::dense::{map_layers, map_layers_one_by_one};
    use super::*;
    use baton_runtime::model::config::{RopeConfig, RopeLayout};
    use baton_runtime::model::rope::Rope;
    use baton_runtime::model::{KvCache, KvShape};
    use candle_core::Device;

    fn rope(hd: usize) -> Rope {
        let cfg = RopeConfig {
            theta: 10_000.0,
            layout: RopeLayout::RotateHalf,
            dim: hd,
            llama3_scaling: None,
            freq_factors: None,
        };
        Rope::new(&cfg, 256, DType::F32, &Device::Cpu).unwrap()
    }

    fn maps(sources: &[[usize; 2]], d_s: usize, d_t: usize, seed: f32) -> Vec<TargetLayerMap> {
        sources
            .iter()
            .enumerate()
            .map(|(i, s)| TargetLayerMap {
                sources: s.to_vec(),
                weight: (Tensor::randn(0f32, 1.0, (2 * d_s, d_t), &Device::Cpu).unwrap()
                    * (0.1 * seed as f64 + i as f64 * 0.01))
                    .unwrap(),
                bias: Tensor::randn(0f32, 1.0, d_t, &Device::Cpu).unwrap(),
                factors: None,
                head: None,
            })
            .collect()
    }

    /// Stacked across layers, chunked or not, the map gives what it gives a layer at a
    /// time: the same products, summed in the same order.
    #[test]
    fn the_batched_map_is_the_per_layer_map() {
        let (src, tgt) = (
            KvShape {
                n_layer: 3,
                n_kv_head: 2,
                head_dim: 8,
            },
            KvShape {
                n_layer: 4,
                n_kv_head: 2,
                head_dim: 4,
            },
        );
        let (d_s, d_t) = (16, 8);
        let layers: Vec<LayerKv> = (0..3)
            .map(|_| LayerKv {
                k: Tensor::randn(0f32, 1.0, (2, 40, 8), &Device::Cpu).unwrap(),
                v: Tensor::randn(0f32, 1.0, (2, 40, 8), &Device::Cpu).unwrap(),
            })
            .collect();
        let cache = KvCache::import(src, layers, DType::F32, &Device::Cpu).unwrap();
        let keys = maps(&[[0, 1], [2, 0], [1, 1], [2, 1]], d_s, d_t, 1.0);
        let values = maps(&[[1, 2], [0, 0], [2, 1], [0, 2]], d_s, d_t, 2.0);
        let b = BatchedMaps::new(&keys, &values)
            .unwrap()
            .expect("stackable");
        let (rs, rt) = (rope(8), rope(4));
        let input = MapInput {
            maps: (&keys, &values),
            batched: Some(&b),
            target: tgt,
            layer_zero: None,
            tokens: &[],
            src: &cache,
            src_rope: &rs,
            tgt_rope: &rt,
        };
        let (start, end) = (5, 37);
        let one = map_layers_one_by_one(&input, start, end).unwrap();
        let all = map_layers(&input, start, end).unwrap();
        // Two positions a chunk: sixteen chunks joined.
        let per = 4 * 2 * d_s * 4;
        let chunked = b.map_in_chunks(&input, start, end, 2 * per).unwrap();
        for (l, a) in one.iter().enumerate() {
            for (what, got) in [("batched", &all[l]), ("chunked", &chunked[l])] {
                assert_eq!(got.k.dims(), &[2, end - start, 4]);
                let dk = (&a.k - &got.k).unwrap().abs().unwrap().max_all().unwrap();
                let dv = (&a.v - &got.v).unwrap().abs().unwrap().max_all().unwrap();
                let (dk, dv) = (
                    dk.to_scalar::<f32>().unwrap(),
                    dv.to_scalar::<f32>().unwrap(),
                );
                assert!(dk < 1e-5 && dv < 1e-5, "{what} layer {l}: {dk} {dv}");
            }
        }
        // A trained head or another k cannot be stacked: the layer-by-layer map runs.
        let mut odd = keys.clone();
        odd[1].sources = vec![0];
        odd[1].weight = odd[1].weight.narrow(0, 0, d_s).unwrap();
        assert!(BatchedMaps::new(&odd, &values).unwrap().is_none());
    }
}
