//! The first layer's keys and values straight from the token ids. Layer 0 reads only the
//! token embeddings, so its keys (before RoPE) and values need no attention and no other
//! position: the embedding lookup, the input norm and two projections. That is a small
//! fraction of one layer's prefill, and it gives a mapper exact, position-free features of
//! which token stands where, in the target's own basis.

use super::decoder::Decoder;
use super::error::Result;
use super::weights::{Embedding, Linear};
use super::ModelError;
use candle_core::{DType, Tensor};

/// What layer 0's keys and values need from a decoder (its weights are shared, not
/// copied).
#[derive(Debug, Clone)]
pub struct LayerZero {
    embedding: Embedding,
    attn_norm: Tensor,
    k: Linear,
    v: Linear,
    k_norm: Option<Tensor>,
    eps: f32,
    hidden: usize,
    n_kv_head: usize,
    head_dim: usize,
    dtype: DType,
}

impl LayerZero {
    pub fn of(d: &Decoder) -> Result<Self> {
        let w = d
            .weights()
            .layers
            .first()
            .ok_or_else(|| ModelError::Cache("the model has no layers".into()))?;
        let cfg = d.config();
        Ok(Self {
            embedding: d.weights().embedding.clone(),
            attn_norm: w.attn_norm.clone(),
            k: w.k.clone(),
            v: w.v.clone(),
            k_norm: w.k_norm.clone(),
            eps: cfg.rms_eps as f32,
            hidden: cfg.hidden,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            dtype: d.dtype(),
        })
    }

    /// Width of the keys (and of the values) of one position: all heads side by side.
    pub fn width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Multiply-adds per token: the key and value projections (the lookup and the norm
    /// are a few hundred operations more).
    pub fn macs_per_token(&self) -> usize {
        2 * self.hidden * self.width()
    }

    /// Layer 0's un-rotated keys and values of `tokens`, each [tokens, heads·head_dim] in
    /// f32, laid out as [`baton_method::mapper::features`] lays out a cache's features.
    pub fn features(&self, tokens: &[u32]) -> Result<(Tensor, Tensor)> {
        let t = tokens.len();
        let dev = self.attn_norm.device();
        if t == 0 {
            let empty = Tensor::zeros((0, self.width()), DType::F32, dev)?;
            return Ok((empty.clone(), empty));
        }
        let ids = Tensor::new(tokens, dev)?;
        let h = self.embedding.forward(&ids, self.dtype)?;
        let x = candle_nn::ops::rms_norm(&h, &self.attn_norm, self.eps)?;
        let [k, v]: [Tensor; 2] = Linear::forward_many(&[&self.k, &self.v], &x)?
            .try_into()
            .map_err(|_| {
                ModelError::Cache("the k/v projection returned the wrong number of outputs".into())
            })?;
        let k = match &self.k_norm {
            Some(kn) => {
                let k = k
                    .reshape((t, self.n_kv_head, self.head_dim))?
                    .contiguous()?;
                candle_nn::ops::rms_norm(&k, kn, self.eps)?.reshape((t, self.width()))?
            }
            None => k,
        };
        Ok((k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?))
    }
}
