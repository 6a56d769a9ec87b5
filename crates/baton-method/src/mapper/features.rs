//! Per-layer features the mapper reads and writes: keys with RoPE removed and values,
//! positions as rows and all KV heads side by side as columns ([n, heads·head_dim]).

use baton_runtime::model::rope::Rope;
use baton_runtime::model::{KvCache, ModelError};
use candle_core::{Tensor, D};

/// Keys (un-rotated) and values of one layer over a range of positions.
#[derive(Debug, Clone)]
pub struct LayerFeatures {
    pub k: Tensor,
    pub v: Tensor,
}

/// Row indices 0, stride, 2·stride, … below `n`.
pub fn strided(n: usize, stride: usize) -> Vec<u32> {
    (0..n).step_by(stride.max(1)).map(|i| i as u32).collect()
}

/// [heads, n, hd] → [n, heads·hd].
pub fn heads_to_rows(x: &Tensor) -> Result<Tensor, ModelError> {
    let (h, n, d) = x.dims3()?;
    Ok(x.transpose(0, 1)?.contiguous()?.reshape((n, h * d))?)
}

/// [n, heads·hd] → [heads, n, hd].
pub fn rows_to_heads(x: &Tensor, heads: usize) -> Result<Tensor, ModelError> {
    let (n, w) = x.dims2()?;
    Ok(x.reshape((n, heads, w / heads))?
        .transpose(0, 1)?
        .contiguous()?)
}

/// Features of layer `layer` for positions `start..end` of `cache`, keeping every
/// `stride`-th position (1 keeps all). RoPE is removed at each key's own absolute
/// position with the model's own table.
pub fn layer_features(
    cache: &KvCache,
    rope: &Rope,
    layer: usize,
    start: usize,
    end: usize,
    stride: usize,
) -> Result<LayerFeatures, ModelError> {
    let kv = cache.layer_range(layer, start, end)?;
    let k = rope.unrotate(&kv.k.contiguous()?, start)?;
    let (k, v) = if stride > 1 {
        let idx = Tensor::new(strided(end - start, stride).as_slice(), k.device())?;
        (
            k.index_select(&idx, 1)?,
            kv.v.contiguous()?.index_select(&idx, 1)?,
        )
    } else {
        (k, kv.v)
    };
    Ok(LayerFeatures {
        k: heads_to_rows(&k)?,
        v: heads_to_rows(&v)?,
    })
}

/// Every layer's features side by side: ([n, L·D] keys, [n, L·D] values), layer-major
/// columns, as the calibration statistics expect them.
pub fn all_layer_features(
    cache: &KvCache,
    rope: &Rope,
    start: usize,
    end: usize,
    stride: usize,
) -> Result<(Tensor, Tensor), ModelError> {
    let n_layer = cache.shape().n_layer;
    let mut ks = Vec::with_capacity(n_layer);
    let mut vs = Vec::with_capacity(n_layer);
    for l in 0..n_layer {
        let f = layer_features(cache, rope, l, start, end, stride)?;
        ks.push(f.k);
        vs.push(f.v);
    }
    Ok((Tensor::cat(&ks, D::Minus1)?, Tensor::cat(&vs, D::Minus1)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_runtime::model::config::{RopeConfig, RopeLayout};
    use baton_runtime::model::{KvShape, LayerKv};
    use candle_core::{DType, Device};

    #[test]
    fn features_are_unrotated_keys_with_heads_side_by_side() -> Result<(), ModelError> {
        let dev = Device::Cpu;
        let rope = Rope::new(
            &RopeConfig {
                theta: 10_000.0,
                layout: RopeLayout::RotateHalf,
                dim: 4,
                llama3_scaling: None,
                freq_factors: None,
            },
            64,
            DType::F32,
            &dev,
        )?;
        let raw = Tensor::randn(0f32, 1.0, (2, 10, 4), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (2, 10, 4), &dev)?;
        let shape = KvShape {
            n_layer: 1,
            n_kv_head: 2,
            head_dim: 4,
        };
        let cache = KvCache::import(
            shape,
            vec![LayerKv {
                k: rope.rotate(&raw, 0)?,
                v: v.clone(),
            }],
            DType::F32,
            &dev,
        )?;
        let f = layer_features(&cache, &rope, 0, 3, 10, 2)?;
        // Positions 3, 5, 7, 9; head 1's key of position 5 sits in row 1, columns 4..8.
        assert_eq!(f.k.dims(), &[4, 8]);
        let got = f.k.get(1)?.narrow(0, 4, 4)?;
        let want = raw.get(1)?.get(5)?;
        let err = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-5, "{err}");
        let back = rows_to_heads(&f.v, 2)?;
        assert_eq!(back.dims(), &[2, 4, 4]);
        Ok(())
    }
}
