//! The decoder: one forward function over a chunk of tokens that appends to a
//! caller-owned [`KvCache`]. Prefill, extend and decode are all this one call, which is
//! what makes "prefill(A+B) == prefill(A) then extend(B)" hold by construction.

use super::attention;
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::kv_cache::{KvCache, KvShape};
use super::rope::Rope;
use super::weights::{Linear, Weights};
use candle_core::{DType, Device, Tensor, D};

/// Which positions of a chunk want logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// What a forward pass should return besides updating the cache.
#[derive(Debug, Clone)]
pub struct ForwardOptions {
    pub logits: Logits,
    /// Absolute positions (inside this chunk) whose per-layer queries are returned,
    /// after any q-norm and RoPE: what attention-output cosine needs.
    pub probe_positions: Vec<usize>,
}

impl ForwardOptions {
    /// Only fill the cache: no logits, no probe queries (a prefill whose output is the
    /// cache itself).
    pub fn cache_only() -> Self {
        Self {
            logits: Logits::None,
            probe_positions: Vec::new(),
        }
    }

    pub fn last_logits() -> Self {
        Self {
            logits: Logits::Last,
            probe_positions: Vec::new(),
        }
    }
}

#[derive(Debug)]
pub struct ForwardOutput {
    /// [rows, vocab] in f32, rows as asked by [`Logits`].
    pub logits: Option<Tensor>,
    /// Per layer [n_head, probes, head_dim], only when probes were asked for.
    pub queries: Vec<Tensor>,
}

/// Prefill long inputs in chunks so attention scores stay bounded in memory
/// (heads x chunk x context floats).
pub const PREFILL_CHUNK: usize = 512;

/// How many rows a chunk of the fused path takes: its memory grows with the rows alone
/// (no [rows, positions] scores), and fewer chunks are fewer kernel launches per token.
pub const FUSED_CHUNK: usize = 4096;

pub struct Decoder {
    cfg: ModelConfig,
    weights: Weights,
    rope: Rope,
    dtype: DType,
    device: Device,
    attention: attention::AttentionPath,
}

impl Decoder {
    pub fn new(cfg: ModelConfig, weights: Weights, dtype: DType, device: &Device) -> Result<Self> {
        let rope = Rope::new(&cfg.rope, cfg.context_length, dtype, device)?;
        Ok(Self {
            cfg,
            weights,
            rope,
            dtype,
            device: device.clone(),
            attention: attention::AttentionPath::Batched,
        })
    }

    /// This decoder attending on `path`, or why it cannot here (a build without the
    /// fused kernels, the CPU, f32 activations, a head width they do not cover).
    pub fn with_attention(mut self, path: attention::AttentionPath) -> Result<Self> {
        if path == attention::AttentionPath::Fused {
            super::attention::fused::check(&self.device, self.dtype, self.cfg.head_dim)?;
        }
        self.attention = path;
        Ok(self)
    }

    /// What runs this model's attention: "exact" (baton's CPU kernels, f32 on the CPU),
    /// else the path chosen: "batched" or "fused".
    pub fn attention_name(&self) -> &'static str {
        if self.device.is_cpu() && self.dtype == DType::F32 {
            "exact"
        } else {
            self.attention.name()
        }
    }

    /// Where this model runs, as sessions and benches record it: the device, and the
    /// attention path where it is not the default (timings on it are not the batched
    /// path's, so a report or a replay that compares runs sees the difference).
    pub fn device_label(&self) -> String {
        let mut label = format!("{:?}", self.device.location()).to_lowercase();
        // (The fused path is refused at load wherever the exact kernels would run.)
        if self.attention == attention::AttentionPath::Fused {
            label.push_str(", fused attention");
        }
        label
    }

    /// Rows per forward chunk: bounded for the batched path's scores, larger for the
    /// fused path.
    fn chunk_rows(&self) -> usize {
        match self.attention {
            attention::AttentionPath::Fused => FUSED_CHUNK,
            attention::AttentionPath::Batched => PREFILL_CHUNK,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            n_layer: self.cfg.n_layer,
            n_kv_head: self.cfg.n_kv_head,
            head_dim: self.cfg.head_dim,
        }
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.kv_shape(), self.dtype, &self.device)
    }

    fn check_tokens(&self, tokens: &[u32], cache: &KvCache) -> Result<()> {
        if cache.shape() != self.kv_shape() {
            return Err(ModelError::Cache(format!(
                "cache geometry {:?} does not fit this model ({:?})",
                cache.shape(),
                self.kv_shape()
            )));
        }
        let total = cache.len() + tokens.len();
        if total > self.cfg.context_length {
            return Err(ModelError::ContextOverflow {
                len: total,
                max: self.cfg.context_length,
            });
        }
        self.check_ids(tokens)
    }

    /// Every id has a row in the embedding.
    pub(super) fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            Some(&id) => Err(ModelError::BadToken {
                id,
                vocab: self.cfg.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Run `tokens` after what `cache` holds, in chunks of at most [`PREFILL_CHUNK`]
    /// ([`FUSED_CHUNK`] on the fused path);
    /// logits rows and probes refer to the whole of `tokens`.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<ForwardOutput> {
        self.forward_until(tokens, cache, opts, &|| false)
    }

    /// [`Decoder::forward`] that gives up with [`ModelError::Interrupted`] as soon as
    /// `stop` says so, checked before every layer's attention and its MLP: for work someone may be waiting behind
    /// (a switch's measurement). `cache` then holds the whole chunks of
    /// [`PREFILL_CHUNK`] completed before the stop; a caller that wants all or nothing
    /// drops it.
    pub fn forward_until(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        opts: &ForwardOptions,
        stop: &dyn Fn() -> bool,
    ) -> Result<ForwardOutput> {
        self.forward_watched(tokens, cache, opts, stop, &mut |_| {})
    }

    /// [`Decoder::forward_until`] that tells `on_chunk` how many of `tokens` are in the
    /// cache after each chunk: a prompt of tens of thousands of tokens reads for minutes,
    /// and whoever waits for it wants to see it move.
    pub fn forward_watched(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        opts: &ForwardOptions,
        stop: &dyn Fn() -> bool,
        on_chunk: &mut dyn FnMut(usize),
    ) -> Result<ForwardOutput> {
        self.check_tokens(tokens, cache)?;
        if tokens.is_empty() {
            return Ok(ForwardOutput {
                logits: None,
                queries: Vec::new(),
            });
        }
        let start = cache.len();
        let mut logits = Vec::new();
        let mut queries: Vec<Vec<Tensor>> = vec![
            Vec::new();
            if opts.probe_positions.is_empty() {
                0
            } else {
                self.cfg.n_layer
            }
        ];
        let rows = self.chunk_rows();
        let n_chunks = tokens.len().div_ceil(rows);
        for (ci, chunk) in tokens.chunks(rows).enumerate() {
            let chunk_start = cache.len();
            let want = match opts.logits {
                Logits::None => Logits::None,
                Logits::All => Logits::All,
                Logits::Last if ci + 1 == n_chunks => Logits::Last,
                Logits::Last => Logits::None,
            };
            let probes: Vec<usize> = opts
                .probe_positions
                .iter()
                .filter(|&&p| p >= chunk_start && p < chunk_start + chunk.len())
                .map(|&p| p - chunk_start)
                .collect();
            let out = self.forward_chunk(chunk, cache, want, &probes, stop)?;
            on_chunk(cache.len() - start);
            if let Some(l) = out.logits {
                logits.push(l);
            }
            for (l, q) in out.queries.into_iter().enumerate() {
                queries[l].push(q);
            }
        }
        let logits = match logits.len() {
            0 => None,
            1 => logits.pop(),
            _ => Some(Tensor::cat(&logits, 0)?),
        };
        let queries = queries
            .into_iter()
            .map(|qs| Ok(Tensor::cat(&qs, 1)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(ForwardOutput { logits, queries })
    }

    fn forward_chunk(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        want: Logits,
        probes: &[usize],
        stop: &dyn Fn() -> bool,
    ) -> Result<ForwardOutput> {
        let cfg = &self.cfg;
        let t = tokens.len();
        let start = cache.len();
        let eps = cfg.rms_eps as f32;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut h = self.weights.embedding.forward(&ids, self.dtype)?;
        cache.reserve(t)?;
        let probe_idx = if probes.is_empty() {
            None
        } else {
            let p: Vec<u32> = probes.iter().map(|&p| p as u32).collect();
            Some(Tensor::new(p.as_slice(), &self.device)?)
        };
        let mut queries = Vec::new();
        let span = start..start + t;
        let run = std::slice::from_ref(&span);
        let mut masks = attention::Masks::default();
        for l in 0..self.weights.layers.len() {
            h = self.layer(
                l,
                h,
                run,
                cache,
                probe_idx.as_ref(),
                &mut queries,
                &mut masks,
                stop,
            )?;
        }
        cache.advance(t);
        let rows = match want {
            Logits::None => None,
            Logits::Last => Some(h.narrow(0, t - 1, 1)?),
            Logits::All => Some(h),
        };
        let logits = match rows {
            None => None,
            Some(r) => {
                let r = candle_nn::ops::rms_norm(&r.contiguous()?, &self.weights.final_norm, eps)?;
                Some(self.weights.output.forward(&r)?.to_dtype(DType::F32)?)
            }
        };
        Ok(ForwardOutput { logits, queries })
    }

    /// Decoder layer `l` over hidden rows `h` that sit at the positions of `runs`
    /// (contiguous spans in increasing order, rows in the same order). Each run's keys and
    /// values are written to the cache at its positions before the run attends, causally,
    /// over the cache's positions before its end: earlier runs' rows as just rewritten,
    /// every other position as the cache holds it. A prefill is one run at the cache's
    /// end; a re-read is several runs inside it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer(
        &self,
        l: usize,
        h: Tensor,
        runs: &[std::ops::Range<usize>],
        cache: &mut KvCache,
        probe_idx: Option<&Tensor>,
        queries: &mut Vec<Tensor>,
        masks: &mut attention::Masks,
        stop: &dyn Fn() -> bool,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let w = self.weights.layers.get(l).ok_or_else(|| {
            ModelError::Cache(format!("layer {l} of a {}-layer model", cfg.n_layer))
        })?;
        let t = h.dim(0)?;
        let (nh, nkv, hd) = (cfg.n_head, cfg.n_kv_head, cfg.head_dim);
        let eps = cfg.rms_eps as f32;
        if stop() {
            return Err(ModelError::Interrupted);
        }
        cache.keep_rows(l, runs, &h)?;
        let x = candle_nn::ops::rms_norm(&h, &w.attn_norm, eps)?;
        let [q, k, v]: [Tensor; 3] = Linear::forward_many(&[&w.q, &w.k, &w.v], &x)?
            .try_into()
            .map_err(|_| {
                ModelError::Cache(
                    "fused q/k/v projection returned the wrong number of outputs".into(),
                )
            })?;
        let q = q.reshape((t, nh, hd))?.transpose(0, 1)?;
        let k = k.reshape((t, nkv, hd))?.transpose(0, 1)?;
        let v = v.reshape((t, nkv, hd))?.transpose(0, 1)?;
        let (q, k) = match (&w.q_norm, &w.k_norm) {
            (Some(qn), Some(kn)) => (
                candle_nn::ops::rms_norm(&q.contiguous()?, qn, eps)?,
                candle_nn::ops::rms_norm(&k.contiguous()?, kn, eps)?,
            ),
            _ => (q, k),
        };
        // Dropped positions stay out of every row's attention.
        let hidden = cache.dropped().to_vec();
        let path = self.attention;
        let o = if let [run] = runs {
            // One run (every prefill): no row is split off or joined.
            let q = self.rope.rotate(&q, run.start)?;
            let k = self.rope.rotate(&k, run.start)?;
            if let Some(idx) = probe_idx {
                queries.push(q.index_select(idx, 1)?);
            }
            let kv = cache.write_at(l, run.start, &k, &v)?;
            attention::causal_attention(&q, &kv.k, &kv.v, run.start, &hidden, path, masks)?
        } else {
            let mut outs = Vec::with_capacity(runs.len());
            let mut row = 0;
            for run in runs {
                let n = run.len();
                let q = self.rope.rotate(&q.narrow(1, row, n)?, run.start)?;
                let k = self.rope.rotate(&k.narrow(1, row, n)?, run.start)?;
                let kv = cache.write_at(l, run.start, &k, &v.narrow(1, row, n)?)?;
                outs.push(attention::causal_attention(
                    &q, &kv.k, &kv.v, run.start, &hidden, path, masks,
                )?);
                row += n;
            }
            Tensor::cat(&outs, 0)?
        };
        let h = w.o.forward_residual(&o, &h)?;
        // Attention and the MLP take about as long each: asking between them halves how
        // long a waiting message can wait.
        if stop() {
            return Err(ModelError::Interrupted);
        }
        let x = candle_nn::ops::rms_norm(&h, &w.ffn_norm, eps)?;
        let act = Linear::forward_swiglu(&w.gate, &w.up, &x)?;
        w.down.forward_residual(&act, &h)
    }

    /// Logits for the last position after running `tokens`: the common case.
    pub fn next_logits(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let out = self.forward(tokens, cache, &ForwardOptions::last_logits())?;
        let l = out
            .logits
            .ok_or_else(|| ModelError::Cache("no tokens to run".into()))?;
        Ok(l.squeeze(0)?)
    }
}

/// Softmax-free helper used by metrics: log-probabilities over the vocabulary.
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::log_softmax(logits, D::Minus1)?)
}
