//! Held-out text evaluation of a mapper: the source prefills a prefix, the mapped cache
//! replaces the target's own, and the target continues teacher-forced. Every metric of
//! the metrics module, per target layer where it has layers.

use super::EvalError;
use crate::handoff::fidelity;
use crate::handoff::{HandoffInputs, HandoffPlan};
use crate::mapper::CacheMapper;
use crate::metrics::{self, probe_positions, ContinuationScores};
use crate::model::{ForwardOptions, KvCache, Logits, Model};
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
}

impl Default for TextEvalOptions {
    fn default() -> Self {
        Self {
            prefix: 384,
            continuation: 128,
            probes: 32,
            anchor: 0,
            tail: 0,
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
}

impl TextEval {
    pub fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }
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
    let (p, c) = (opts.prefix, opts.continuation);
    let mut out = TextEval {
        prefix: p,
        continuation: c,
        ..TextEval::default()
    };
    let l_t = tgt.config().n_layer;
    let prefix_probes = probe_positions(p, opts.probes);
    let cont_probes: Vec<usize> = probe_positions(c, opts.probes)
        .into_iter()
        .map(|q| q + p)
        .collect();
    let mut scores_acc = ContinuationScores::default();
    let grams = fidelity::query_grams(tgt)?;
    for w in windows {
        if w.len() < p + c {
            return Err(EvalError::Input(format!(
                "a window of {} tokens is shorter than prefix + continuation ({})",
                w.len(),
                p + c
            )));
        }
        let (prefix, cont) = (&w[..p], &w[p..p + c]);
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
                probe_positions: prefix_probes.clone(),
            },
        )?;
        out.reprefill_seconds += t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let plan = HandoffPlan::new(p).anchor(opts.anchor).tail(opts.tail);
        let (mut mapped, _) = plan.build_new(&HandoffInputs {
            source: src,
            source_cache: &src_cache,
            target: tgt,
            mapper,
            tokens: prefix,
            exact: None,
        })?;
        out.map_seconds += t1.elapsed().as_secs_f64();

        let mut r2k = Vec::with_capacity(l_t);
        let mut r2v = Vec::with_capacity(l_t);
        let mut cos_p = Vec::with_capacity(l_t);
        let mut conc = Vec::with_capacity(l_t);
        for (l, gram) in grams.iter().enumerate().take(l_t) {
            let f = fidelity::layer_fidelity(
                tgt,
                gram,
                &true_cache,
                &mapped,
                p,
                truth.queries.get(l),
                &prefix_probes,
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

        let (true_logits, cont_queries) =
            all_logits(tgt, cont, &mut true_cache, cont_probes.clone())?;
        let (mapped_logits, _) = all_logits(tgt, cont, &mut mapped, vec![])?;
        let mut empty = tgt.decoder.new_cache();
        let (floor_logits, _) = all_logits(tgt, cont, &mut empty, vec![])?;
        let mut cos_c = Vec::with_capacity(l_t);
        for (l, q) in cont_queries.iter().enumerate().take(l_t) {
            let (a, b) = (true_cache.layer(l)?, mapped.layer(l)?);
            cos_c.push(metrics::attention_output_cosine(
                q,
                &cont_probes,
                &a.k,
                &a.v,
                &b.k,
                &b.v,
            )?);
        }
        add(&mut out.cosine_continuation, &cos_c);
        let s = metrics::continuation_scores(&true_logits, &mapped_logits, &floor_logits, cont)?;
        scores_acc.agreement.top1 += s.agreement.top1;
        scores_acc.agreement.kl += s.agreement.kl;
        scores_acc.agreement.positions += s.agreement.positions;
        scores_acc.agreement_no_prefix.top1 += s.agreement_no_prefix.top1;
        scores_acc.agreement_no_prefix.kl += s.agreement_no_prefix.kl;
        scores_acc.agreement_no_prefix.positions += s.agreement_no_prefix.positions;
        // Perplexities are averaged in log space: the geometric mean over windows.
        scores_acc.ppl_true += s.ppl_true.ln();
        scores_acc.ppl_mapped += s.ppl_mapped.ln();
        scores_acc.ppl_no_prefix += s.ppl_no_prefix.ln();
        out.windows += 1;
    }
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
    Ok(out)
}
