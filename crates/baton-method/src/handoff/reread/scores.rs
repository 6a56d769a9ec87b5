//! Each selector's score per position of the history: higher is re-read first.

use super::{lexical, RereadError, Selector};
use crate::gate::estimate::RoundTrip;
use crate::gate::round_trip_by_position;
use crate::mapper::features::heads_to_rows;
use crate::mapper::CacheMapper;
use crate::metrics::attention_mass::received_by_head;
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use candle_core::DType;
use std::ops::Range;

/// Queries of the message that score the context at most: its newest ones. A long
/// message's last tokens read the context as well as all of them do, and the scores
/// stay bounded in memory (heads × queries × context).
const MAX_MESSAGE_QUERIES: usize = 128;

/// The target layer at which `deviation` compares the map with the target's own keys
/// and values: the second, so that the first layer's attention has mixed context in
/// (layer 0 sees only each token's own embedding) while the target computes only two of
/// its layers for every position.
const DEVIATION_LAYER: usize = 1;

/// What the selectors read.
pub struct SelectInputs<'a> {
    pub source: &'a Model,
    /// The source's own cache, holding at least the history (more is ignored).
    pub source_cache: &'a KvCache,
    pub target: &'a Model,
    /// The target's cache as handed over, holding at least the history.
    pub handed: &'a KvCache,
    pub mapper: &'a CacheMapper,
    /// The reverse direction's mapper: the round trip needs it.
    pub reverse: Option<&'a CacheMapper>,
    /// The history followed by the next message.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the history.
    pub history: usize,
}

/// One score per position of the history; positions outside `candidates` score zero.
pub fn score_positions(
    selector: Selector,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
) -> Result<Vec<f64>, RereadError> {
    let h = inputs.history;
    let hull = candidates.span();
    if hull.end > h || inputs.tokens.len() < h {
        return Err(RereadError::Input(format!(
            "re-read candidates {hull:?} in a history of {h} positions ({} tokens given)",
            inputs.tokens.len()
        )));
    }
    let mut scores = vec![0.0; h];
    if candidates.is_empty() {
        return Ok(scores);
    }
    let selector = match selector {
        Selector::CheaperAttention => cheaper_reader(inputs),
        s => s,
    };
    let got = match selector {
        Selector::SourceAttention => {
            message_attention(inputs.source, inputs.source_cache, inputs.tokens, h)?
        }
        // (`cheaper-attention` is resolved to one of the two above.)
        Selector::TargetAttention | Selector::CheaperAttention => {
            message_attention(inputs.target, inputs.handed, inputs.tokens, h)?
        }
        Selector::RoundTrip => {
            let reverse = inputs.reverse.ok_or_else(|| {
                RereadError::Input(
                    "the round-trip selector needs the mapper of the other direction; \
                     calibrate it or choose another selector"
                        .into(),
                )
            })?;
            let trip = RoundTrip {
                forward: inputs.mapper,
                reverse,
                src: inputs.source_cache,
                tokens: inputs.tokens,
                src_rope: inputs.source.decoder.rope(),
                tgt_rope: inputs.target.decoder.rope(),
            };
            let cos = round_trip_by_position(trip, hull.start, hull.end)?;
            let mut s = vec![0.0; hull.start];
            s.extend(cos.into_iter().map(|c| 1.0 - c));
            s
        }
        Selector::Deviation => deviation(inputs, hull)?,
        Selector::Recency => (0..h).map(|p| p as f64).collect(),
        Selector::Contrast => contrast(inputs)?,
        Selector::MessageWords => lexical::message_words(
            &inputs.target.tokenizer,
            &inputs.tokens[..h],
            &inputs.tokens[h..],
        ),
        Selector::MessageSentences => lexical::message_sentences(
            &inputs.target.tokenizer,
            &inputs.tokens[..h],
            &inputs.tokens[h..],
        ),
        Selector::Rare => lexical::rare_tokens(&inputs.target.tokenizer, &inputs.tokens[..h]),
        Selector::Facts => facts(inputs)?,
        Selector::SentenceFacts => {
            let best = lexical::best_sentence(
                &inputs.target.tokenizer,
                &inputs.tokens[..h],
                &inputs.tokens[h..],
            );
            facts(inputs)?
                .iter()
                .zip(&best)
                .map(|(f, b)| f + BEST_SENTENCE_FIRST * b)
                .collect()
        }
    };
    for r in candidates.runs() {
        for p in r.clone() {
            scores[p] = got.get(p).copied().unwrap_or(0.0);
        }
    }
    Ok(scores)
}

/// `facts`: the cheaper model's contrast of heads, the message's words and the
/// fact-bearing tokens, each rescaled to at most 1.
fn facts(inputs: &SelectInputs<'_>) -> Result<Vec<f64>, RereadError> {
    let h = inputs.history;
    let tok = &inputs.target.tokenizer;
    let read = lexical::unit_max(&contrast(inputs)?);
    let asked = lexical::unit_max(&lexical::message_words(
        tok,
        &inputs.tokens[..h],
        &inputs.tokens[h..],
    ));
    let rare = lexical::rare_tokens(tok, &inputs.tokens[..h]);
    Ok(read
        .iter()
        .zip(&asked)
        .zip(&rare)
        .map(|((r, a), x)| r + a + FACTS_RARE_WEIGHT * x)
        .collect())
}

/// In `sentence-facts`, the best sentence's lift: past the most `facts` gives any
/// position (1 + 1 + [`FACTS_RARE_WEIGHT`]), so the sentence is read before anything
/// else and `facts` orders it and the rest.
const BEST_SENTENCE_FIRST: f64 = 3.0;

/// In `facts`, a fact-bearing token's weight beside the read and the message's words
/// (each rescaled to at most 1): enough to order the tokens of a passage the message
/// points at, too little to outweigh what it points at.
const FACTS_RARE_WEIGHT: f64 = 0.5;

/// `contrast`: the message read by the cheaper model, each position scored by how much
/// more some heads give it than their layer's heads give it on average, summed over
/// heads and layers. Sinks and template tokens, which every head reads, score little;
/// what a few heads seek out scores.
fn contrast(inputs: &SelectInputs<'_>) -> Result<Vec<f64>, RereadError> {
    let h = inputs.history;
    let (model, cache) = match cheaper_reader(inputs) {
        Selector::SourceAttention => (inputs.source, inputs.source_cache),
        _ => (inputs.target, inputs.handed),
    };
    message_attention_by(model, cache, inputs.tokens, h, &|heads| {
        let n = heads.len().max(1) as f64;
        let len = heads.first().map_or(0, |x| x.len());
        let mut mean = vec![0.0f64; len];
        for head in heads {
            for (m, x) in mean.iter_mut().zip(head) {
                *m += x / n;
            }
        }
        let mut out = vec![0.0f64; len];
        for head in heads {
            for ((o, x), m) in out.iter_mut().zip(head).zip(&mean) {
                *o += (x - m).max(0.0);
            }
        }
        out
    })
}

/// Whichever attention selector reads the message with the smaller model.
pub fn cheaper_reader(inputs: &SelectInputs<'_>) -> Selector {
    let (s, t) = (inputs.source.config(), inputs.target.config());
    if s.weights_per_token() <= t.weights_per_token() {
        Selector::SourceAttention
    } else {
        Selector::TargetAttention
    }
}

/// Attention the message (`tokens[h..]`) gives each history position when `model` reads
/// it over `cache`'s first `h` positions, summed over layers, heads and queries.
fn message_attention(
    model: &Model,
    cache: &KvCache,
    tokens: &[u32],
    h: usize,
) -> Result<Vec<f64>, RereadError> {
    message_attention_by(model, cache, tokens, h, &|heads| {
        let len = heads.first().map_or(0, |x| x.len());
        let mut total = vec![0.0f64; len];
        for head in heads {
            for (t, x) in total.iter_mut().zip(head) {
                *t += x;
            }
        }
        total
    })
}

/// The message read by `model` over `cache`'s first `h` positions; each layer's
/// attention per query head (summed over the queries) folded by `fold` into one score
/// per position, and the layers' scores added.
fn message_attention_by(
    model: &Model,
    cache: &KvCache,
    tokens: &[u32],
    h: usize,
    fold: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
) -> Result<Vec<f64>, RereadError> {
    let message = &tokens[h..];
    if message.is_empty() {
        return Err(RereadError::Input(
            "an attention selector reads the next message, and there is none".into(),
        ));
    }
    if cache.len() < h {
        return Err(RereadError::Input(format!(
            "the cache holds {} positions of a history of {h}",
            cache.len()
        )));
    }
    let mut scratch = cache.try_clone_prefix(h)?;
    let m = message.len();
    let first = h + m - m.min(MAX_MESSAGE_QUERIES);
    let out = model.decoder.forward(
        message,
        &mut scratch,
        &ForwardOptions {
            logits: Logits::None,
            probe_positions: (first..h + m).collect(),
        },
    )?;
    let mut total = vec![0.0f64; h];
    for (l, q) in out.queries.iter().enumerate() {
        let keys = scratch.layer_range(l, 0, h + m)?.k;
        let heads = received_by_head(q, &keys, first)?;
        for (t, g) in total.iter_mut().zip(fold(&heads)) {
            *t += g;
        }
    }
    Ok(total)
}

/// How far the handed-over keys and values at [`DEVIATION_LAYER`] lie from the target's
/// own, relative to their size, per position of `candidates` (zero before them).
fn deviation(inputs: &SelectInputs<'_>, candidates: Range<usize>) -> Result<Vec<f64>, RereadError> {
    let tgt = &inputs.target.decoder;
    let layer = DEVIATION_LAYER.min(tgt.config().n_layer - 1);
    let own = tgt.leading_layers(&inputs.tokens[..candidates.end], layer + 1)?;
    let own = &own[layer];
    let handed = inputs
        .handed
        .layer_range(layer, candidates.start, candidates.end)?;
    let n = candidates.len();
    let mut scores = vec![0.0f64; candidates.start];
    scores.resize(candidates.start + n, 0.0);
    for (mine, theirs) in [
        (own.k.narrow(1, candidates.start, n)?, handed.k),
        (own.v.narrow(1, candidates.start, n)?, handed.v),
    ] {
        let a = heads_to_rows(&mine)?.to_dtype(DType::F32)?;
        let b = heads_to_rows(&theirs)?.to_dtype(DType::F32)?;
        let err = (&a - &b)?.sqr()?.sum(1)?.to_vec1::<f32>()?;
        let size = a.sqr()?.sum(1)?.to_vec1::<f32>()?;
        for (i, (e, s)) in err.iter().zip(size).enumerate() {
            scores[candidates.start + i] += f64::from(*e) / (f64::from(s) + 1e-12);
        }
    }
    Ok(scores)
}
