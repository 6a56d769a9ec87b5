//! Held-out text evaluation of a mapper: the source prefills a prefix, the mapped cache
//! replaces the target's own, and the target continues teacher-forced. Every metric of
//! the metrics module, per target layer where it has layers.

use super::reread::{RereadModels, RereadTurn};
use super::EvalError;
use baton_method::handoff::fidelity;
use baton_method::handoff::reread::RereadSetting;
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::mapper::CacheMapper;
use baton_method::metrics::{self, probe_positions, ContinuationScores, QueryGram};
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TextEvalOptions {
    pub prefix: usize,
    pub continuation: usize,
    pub probes: usize,
    /// Leading positions the target computes itself instead of receiving them mapped.
    pub anchor: usize,
    /// The last positions of the prefix the target reads itself, on top of the mapped
    /// rest (the newest part of a conversation, re-read at the handoff).
    pub tail: usize,
    /// What the target re-reads of the mapped middle, chosen with the tail as the
    /// message it reads next (so it needs a tail).
    #[serde(default)]
    pub reread: Option<RereadSetting>,
}

impl Default for TextEvalOptions {
    fn default() -> Self {
        Self {
            prefix: 384,
            continuation: 128,
            probes: 32,
            anchor: 0,
            tail: 0,
            reread: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TextEval {
    pub windows: usize,
    pub prefix: usize,
    pub continuation: usize,
    /// Per target layer, means over windows.
    pub r2_k: Vec<f64>,
    pub r2_v: Vec<f64>,
    /// Probes inside the mapped prefix.
    pub cosine_prefix: Vec<f64>,
    /// Probes in the continuation, attending over mapped prefix + continuation.
    pub cosine_continuation: Vec<f64>,
    /// Key-error concentration over the mapped prefix (1 = error spread evenly over
    /// the directions queries read; above 1 = concentrated where attention looks).
    pub key_error_concentration: Vec<f64>,
    pub scores: ContinuationScores,
    /// Seconds per window: mapping the prefix vs the target re-prefilling it.
    pub map_seconds: f64,
    pub reprefill_seconds: f64,
    /// Seconds per window choosing and re-reading (part of `map_seconds`), and the
    /// positions re-read per window.
    #[serde(default)]
    pub reread_seconds: f64,
    #[serde(default)]
    pub reread_positions: f64,
    /// How much of the context's value the handed context keeps, in log perplexity of
    /// the continuation: `(ln PPL none − ln PPL handed) / (ln PPL none − ln PPL true)`.
    /// Below zero the handed context is worse than none; `None` when the true context
    /// is worth nothing on these windows (no share of it can be given).
    #[serde(default)]
    pub context_value_recovered: Option<f64>,
    /// With a tail: the continuation's perplexity after the tail alone (the target reading
    /// only the prefix's last `tail` tokens), and the share of the context's value that
    /// alone keeps, measured as `context_value_recovered` is. The handed context is worth
    /// its map only where it keeps more than this.
    #[serde(default)]
    pub ppl_tail_alone: Option<f64>,
    #[serde(default)]
    pub tail_alone_value: Option<f64>,
}

fn add(acc: &mut Vec<f64>, v: &[f64]) {
    if acc.is_empty() {
        acc.resize(v.len(), 0.0);
    }
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

fn all_logits(
    m: &Model,
    ids: &[u32],
    cache: &mut KvCache,
    probes: Vec<usize>,
) -> Result<(Tensor, Vec<Tensor>), EvalError> {
    let out = m.decoder.forward(
        ids,
        cache,
        &ForwardOptions {
            logits: Logits::All,
            probe_positions: probes,
        },
    )?;
    let logits = out
        .logits
        .ok_or_else(|| EvalError::Input("no logits for the continuation".into()))?;
    Ok((logits, out.queries))
}

pub fn eval_text(
    src: &Model,
    tgt: &Model,
    mapper: &CacheMapper,
    windows: &[Vec<u32>],
    opts: &TextEvalOptions,
) -> Result<TextEval, EvalError> {
    let models = RereadModels {
        source: src,
        target: tgt,
        mapper,
        reverse: None,
    };
    eval_text_with(models, windows, opts)
}

/// [`eval_text`] with the other direction's mapper at hand, for a re-read that ranks by
/// the round trip.
pub fn eval_text_with(
    models: RereadModels<'_>,
    windows: &[Vec<u32>],
    opts: &TextEvalOptions,
) -> Result<TextEval, EvalError> {
    let tgt = models.target;
    if opts.reread.is_some() && opts.tail == 0 {
        return Err(EvalError::Input(
            "a re-read in text windows chooses with the newest tokens as the message the \
             target reads itself: give it a tail (--tail 32, say)"
                .into(),
        ));
    }
    let (p, c) = (opts.prefix, opts.continuation);
    let mut out = TextEval {
        prefix: p,
        continuation: c,
        ..TextEval::default()
    };
    let run = TextEvalRun {
        models,
        opts,
        l_t: tgt.config().n_layer,
        prefix_probes: probe_positions(p, opts.probes),
        cont_probes: probe_positions(c, opts.probes)
            .into_iter()
            .map(|q| q + p)
            .collect(),
        grams: fidelity::query_grams(tgt)?,
    };
    let mut scores_acc = ContinuationScores::default();
    for w in windows {
        run.window(w, &mut out, &mut scores_acc)?;
        out.windows += 1;
    }
    average(&mut out, &scores_acc);
    Ok(out)
}

/// What every window of one text evaluation reads.
struct TextEvalRun<'a> {
    /// The source, the target, the mapper (and the reverse one a re-read may need).
    models: RereadModels<'a>,
    opts: &'a TextEvalOptions,
    /// The target's layer count.
    l_t: usize,
    prefix_probes: Vec<usize>,
    /// Probe positions in the continuation, counted from the window's start.
    cont_probes: Vec<usize>,
    grams: Vec<QueryGram>,
}

/// A window's prefix as the target holds it: its own cache with the queries at the
/// probes, and the cache mapped from the source.
struct PrefixCaches {
    truth: KvCache,
    truth_queries: Vec<Tensor>,
    mapped: KvCache,
}

impl TextEvalRun<'_> {
    /// Adds one window's sums to `out` and `scores_acc`.
    fn window(
        &self,
        w: &[u32],
        out: &mut TextEval,
        scores_acc: &mut ContinuationScores,
    ) -> Result<(), EvalError> {
        let (p, c) = (self.opts.prefix, self.opts.continuation);
        if w.len() < p + c {
            return Err(EvalError::Input(format!(
                "a window of {} tokens is shorter than prefix + continuation ({})",
                w.len(),
                p + c
            )));
        }
        let (prefix, cont) = (&w[..p], &w[p..p + c]);
        let mut caches = self.prefill(prefix, out)?;
        self.add_prefix_fidelity(&caches, out)?;
        if self.opts.tail > 0 {
            let tail = &prefix[p - self.opts.tail.min(p)..];
            *out.ppl_tail_alone.get_or_insert(0.0) += self.tail_alone(tail, cont)?.ln();
        }
        self.add_continuation(cont, &mut caches, out, scores_acc)
    }

    /// The continuation's perplexity after the tail alone, read by the target as the
    /// start of a text: what the handed context adds beyond the part the target reads
    /// itself is measured against this.
    fn tail_alone(&self, tail: &[u32], cont: &[u32]) -> Result<f64, EvalError> {
        let mut cache = self.models.target.decoder.new_cache();
        self.models
            .target
            .decoder
            .forward(tail, &mut cache, &ForwardOptions::cache_only())?;
        let (logits, _) = all_logits(self.models.target, cont, &mut cache, vec![])?;
        let n = cont.len();
        Ok(metrics::logits::perplexity(
            &logits.narrow(0, 0, n - 1)?,
            &cont[1..],
        )?)
    }

    /// The source's and the target's prefill of the prefix, and the mapped cache; the
    /// target's prefill and the mapping are timed.
    fn prefill(&self, prefix: &[u32], out: &mut TextEval) -> Result<PrefixCaches, EvalError> {
        let (src, tgt) = (self.models.source, self.models.target);
        let mut src_cache = src.decoder.new_cache();
        src.decoder.forward(
            prefix,
            &mut src_cache,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )?;
        let t0 = Instant::now();
        let mut true_cache = tgt.decoder.new_cache();
        let truth = tgt.decoder.forward(
            prefix,
            &mut true_cache,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: self.prefix_probes.clone(),
            },
        )?;
        let reprefill_s = t0.elapsed().as_secs_f64();
        out.reprefill_seconds += reprefill_s;
        let t1 = Instant::now();
        let plan = HandoffPlan::new(self.opts.prefix)
            .anchor(self.opts.anchor)
            .tail(self.opts.tail);
        // With a re-read to follow, the tail is mapped here and re-read with the chosen
        // spans, in one pass instead of two.
        let built = match self.opts.reread {
            Some(_) => plan.tail_mapped(),
            None => plan.clone(),
        };
        let (mut mapped, _) = built.build_new(&HandoffInputs {
            source: src,
            source_cache: &src_cache,
            target: tgt,
            mapper: self.models.mapper,
            tokens: prefix,
            exact: None,
        })?;
        if let Some(setting) = &self.opts.reread {
            let turn = RereadTurn {
                history: plan.tail_start(),
                plan,
                source_cache: &src_cache,
                tokens: prefix,
                ms_per_position: Some(reprefill_s * 1e3 / prefix.len().max(1) as f64),
            };
            let done = self.models.reread(setting, turn, &mut mapped)?;
            out.reread_seconds += done.ms / 1e3;
            out.reread_positions += done.positions as f64;
        }
        out.map_seconds += t1.elapsed().as_secs_f64();
        Ok(PrefixCaches {
            truth: true_cache,
            truth_queries: truth.queries,
            mapped,
        })
    }

    /// Per-layer R², attention cosine and key-error concentration over the prefix.
    fn add_prefix_fidelity(
        &self,
        caches: &PrefixCaches,
        out: &mut TextEval,
    ) -> Result<(), EvalError> {
        let l_t = self.l_t;
        let mut r2k = Vec::with_capacity(l_t);
        let mut r2v = Vec::with_capacity(l_t);
        let mut cos_p = Vec::with_capacity(l_t);
        let mut conc = Vec::with_capacity(l_t);
        for (l, gram) in self.grams.iter().enumerate().take(l_t) {
            let f = fidelity::layer_fidelity(
                self.models.target,
                gram,
                &caches.truth,
                &caches.mapped,
                self.opts.prefix,
                caches.truth_queries.get(l),
                &self.prefix_probes,
                l,
            )?;
            conc.push(f.key_error_concentration);
            r2k.push(f.r2_k);
            r2v.push(f.r2_v);
            cos_p.push(f.attention_cosine);
        }
        add(&mut out.r2_k, &r2k);
        add(&mut out.r2_v, &r2v);
        add(&mut out.cosine_prefix, &cos_p);
        add(&mut out.key_error_concentration, &conc);
        Ok(())
    }

    /// The target continues teacher-forced from its own cache, the mapped one and an
    /// empty one: attention cosine at the continuation's probes and the scores of the
    /// three continuations.
    fn add_continuation(
        &self,
        cont: &[u32],
        caches: &mut PrefixCaches,
        out: &mut TextEval,
        scores_acc: &mut ContinuationScores,
    ) -> Result<(), EvalError> {
        let tgt = self.models.target;
        let (true_logits, cont_queries) =
            all_logits(tgt, cont, &mut caches.truth, self.cont_probes.clone())?;
        let (mapped_logits, _) = all_logits(tgt, cont, &mut caches.mapped, vec![])?;
        let mut empty = tgt.decoder.new_cache();
        let (floor_logits, _) = all_logits(tgt, cont, &mut empty, vec![])?;
        let mut cos_c = Vec::with_capacity(self.l_t);
        for (l, q) in cont_queries.iter().enumerate().take(self.l_t) {
            let (a, b) = (caches.truth.layer(l)?, caches.mapped.layer(l)?);
            cos_c.push(metrics::attention_output_cosine(
                q,
                &self.cont_probes,
                &a.k,
                &a.v,
                &b.k,
                &b.v,
            )?);
        }
        add(&mut out.cosine_continuation, &cos_c);
        let s = metrics::continuation_scores(&true_logits, &mapped_logits, &floor_logits, cont)?;
        add_scores(scores_acc, &s);
        Ok(())
    }
}

fn add_scores(acc: &mut ContinuationScores, s: &ContinuationScores) {
    acc.agreement.top1 += s.agreement.top1;
    acc.agreement.kl += s.agreement.kl;
    acc.agreement.positions += s.agreement.positions;
    acc.agreement_no_prefix.top1 += s.agreement_no_prefix.top1;
    acc.agreement_no_prefix.kl += s.agreement_no_prefix.kl;
    acc.agreement_no_prefix.positions += s.agreement_no_prefix.positions;
    // Perplexities are averaged in log space: the geometric mean over windows.
    acc.ppl_true += s.ppl_true.ln();
    acc.ppl_mapped += s.ppl_mapped.ln();
    acc.ppl_no_prefix += s.ppl_no_prefix.ln();
}

/// Turns the sums over windows into means.
fn average(out: &mut TextEval, scores_acc: &ContinuationScores) {
    let n = out.windows.max(1) as f64;
    for v in [
        &mut out.r2_k,
        &mut out.r2_v,
        &mut out.cosine_prefix,
        &mut out.cosine_continuation,
        &mut out.key_error_concentration,
    ] {
        v.iter_mut().for_each(|x| *x /= n);
    }
    out.scores = ContinuationScores {
        agreement: metrics::NextTokenAgreement {
            top1: scores_acc.agreement.top1 / n,
            kl: scores_acc.agreement.kl / n,
            positions: scores_acc.agreement.positions,
        },
        agreement_no_prefix: metrics::NextTokenAgreement {
            top1: scores_acc.agreement_no_prefix.top1 / n,
            kl: scores_acc.agreement_no_prefix.kl / n,
            positions: scores_acc.agreement_no_prefix.positions,
        },
        ppl_true: (scores_acc.ppl_true / n).exp(),
        ppl_mapped: (scores_acc.ppl_mapped / n).exp(),
        ppl_no_prefix: (scores_acc.ppl_no_prefix / n).exp(),
    };
    out.map_seconds /= n;
    out.reprefill_seconds /= n;
    out.reread_seconds /= n;
    out.reread_positions /= n;
    let (none, truth) = (out.scores.ppl_no_prefix, out.scores.ppl_true);
    out.context_value_recovered = value_kept(none, truth, out.scores.ppl_mapped);
    out.ppl_tail_alone = out.ppl_tail_alone.map(|sum| (sum / n).exp());
    out.tail_alone_value = out
        .ppl_tail_alone
        .and_then(|ppl| value_kept(none, truth, ppl));
}

/// The share of the context's value a context with perplexity `ppl` keeps, in log
/// perplexity, between none (`none`) and the true context (`truth`).
fn value_kept(none: f64, truth: f64, ppl: f64) -> Option<f64> {
    let worth = none.ln() - truth.ln();
    (worth > 0.0 && worth.is_finite())
        .then(|| (none.ln() - ppl.ln()) / worth)
        .filter(|v| v.is_finite())
}
