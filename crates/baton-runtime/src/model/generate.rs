//! Generation on a caller-owned cache: prefill the new ids, then sample token by token,
//! streaming each one, until an end-of-turn id, the token budget, or a cancel.

use super::decoder::{Decoder, ForwardOptions};
use super::error::{ModelError, Result};
use super::kv_cache::KvCache;
use super::sampler::{Sampler, Sampling};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops after producing any of these (the stop id is returned but not
    /// run through the model, so the cache ends just before it).
    pub stop_ids: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndOfTurn,
    MaxTokens,
    Cancelled,
    ContextFull,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Throughput {
    pub tokens: usize,
    pub seconds: f64,
}

impl Throughput {
    pub fn tokens_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated ids, including the stop id when the turn ended on one.
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prefill: Throughput,
    pub decode: Throughput,
}

impl Generation {
    /// Throughput of both phases and why it stopped, in one line.
    pub fn summary_line(&self) -> String {
        format!(
            "prefill {} tokens at {:.1} tokens/s; decode {} tokens at {:.1} tokens/s; stopped: {:?}",
            self.prefill.tokens,
            self.prefill.tokens_per_second(),
            self.decode.tokens,
            self.decode.tokens_per_second(),
            self.stop
        )
    }
}

/// Run `new_ids` after what `cache` holds and generate. The last returned id is never in
/// the cache: the caller runs it with the next input (so a turn's end-of-turn id costs
/// nothing extra and the next turn starts exactly where the template expects). `on_token` sees every generated
/// id as soon as it is chosen; returning `false` from it stops like a cancel.
pub fn generate(
    decoder: &Decoder,
    cache: &mut KvCache,
    new_ids: &[u32],
    opts: &GenerateOptions,
    cancel: &AtomicBool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generation> {
    generate_until(
        decoder,
        cache,
        new_ids,
        opts,
        &|| cancel.load(Ordering::Relaxed),
        on_token,
    )
}

/// [`generate`] with the cancel asked of `stop`, which is also asked during the prefill
/// (before every half layer), so a long prompt can be cancelled while it is read. A
/// prefill cancelled that way leaves `cache` as it was and generates nothing.
pub fn generate_until(
    decoder: &Decoder,
    cache: &mut KvCache,
    new_ids: &[u32],
    opts: &GenerateOptions,
    stop: &dyn Fn() -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generation> {
    generate_watched(decoder, cache, new_ids, opts, stop, &mut |_| {}, on_token)
}

/// [`generate_until`] that tells `on_prefill` how many of `new_ids` the cache holds
/// after each prefill chunk (see [`Decoder::forward_watched`]).
pub fn generate_watched(
    decoder: &Decoder,
    cache: &mut KvCache,
    new_ids: &[u32],
    opts: &GenerateOptions,
    stop: &dyn Fn() -> bool,
    on_prefill: &mut dyn FnMut(usize),
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generation> {
    let max_ctx = decoder.config().context_length;
    let t0 = Instant::now();
    if new_ids.is_empty() {
        return Err(if cache.is_empty() {
            ModelError::EmptyPrompt
        } else {
            ModelError::Cache(
                "generation needs at least one new id after the cache (e.g. the generation prompt)"
                    .into(),
            )
        });
    }
    let before = cache.len();
    let read = decoder.forward_watched(
        new_ids,
        cache,
        &ForwardOptions::last_logits(),
        stop,
        on_prefill,
    );
    let mut logits = match read {
        Ok(out) => out
            .logits
            .ok_or_else(|| ModelError::Cache("the prefill returned no logits".into()))?
            .squeeze(0)?,
        Err(ModelError::Interrupted) => {
            cache.truncate(before);
            return Ok(Generation {
                tokens: Vec::new(),
                stop: StopReason::Cancelled,
                prefill: Throughput {
                    tokens: 0,
                    seconds: t0.elapsed().as_secs_f64(),
                },
                decode: Throughput {
                    tokens: 0,
                    seconds: 0.0,
                },
            });
        }
        Err(e) => return Err(e),
    };
    let prefill = Throughput {
        tokens: new_ids.len(),
        seconds: t0.elapsed().as_secs_f64(),
    };
    let mut sampler = Sampler::new(opts.sampling);
    let mut tokens = Vec::new();
    let t1 = Instant::now();
    let mut decoded = 0usize;
    let reason = loop {
        let tok = sampler.sample(&logits)?;
        tokens.push(tok);
        let keep_going = on_token(tok);
        if opts.stop_ids.contains(&tok) {
            break StopReason::EndOfTurn;
        }
        // Asked after each token, before the next decode step is paid for (the prefill
        // asked it last before its final half layer).
        if !keep_going || stop() {
            break StopReason::Cancelled;
        }
        if tokens.len() >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        if cache.len() + 1 >= max_ctx {
            break StopReason::ContextFull;
        }
        logits = decoder.next_logits(&[tok], cache)?;
        decoded += 1;
    };
    let decode = Throughput {
        tokens: decoded,
        seconds: t1.elapsed().as_secs_f64(),
    };
    Ok(Generation {
        tokens,
        stop: reason,
        prefill,
        decode,
    })
}
