//! One item scored both ways: multiple choice by the per-character log-likelihood of each
//! option, generation greedily up to the task's stop strings.

use super::caches::{prepare, question_start, Prepared, Shared};
use super::{Generations, ItemOutcome, TaskEvalOptions};
use crate::eval::reread::{RereadDone, RereadModels};
use crate::eval::EvalError;
use baton_data::tasks::{extract_number, normalize_number, Choice};
use baton_runtime::model::decoder::log_softmax;
use baton_runtime::model::sampler::argmax;
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use std::collections::HashMap;

/// Sum of log-probabilities of `cont` after the cache and `last` (the final context
/// token, computed by the target itself).
fn continuation_logprob(
    tgt: &Model,
    cache: &KvCache,
    last: u32,
    cont: &[u32],
) -> Result<f64, EvalError> {
    let mut c = cache.try_clone()?;
    let mut ids = Vec::with_capacity(cont.len() + 1);
    ids.push(last);
    ids.extend_from_slice(cont);
    let out = tgt.decoder.forward(
        &ids,
        &mut c,
        &ForwardOptions {
            logits: Logits::All,
            probe_positions: vec![],
        },
    )?;
    let logits = out
        .logits
        .ok_or_else(|| EvalError::Input("no logits for the continuation".into()))?;
    let lp = log_softmax(&logits)?;
    let mut total = 0f64;
    for (row, &tok) in cont.iter().enumerate() {
        total += lp.get(row)?.get(tok as usize)?.to_scalar::<f32>()? as f64;
    }
    Ok(total)
}

/// The option with the highest log-likelihood per character of its text.
fn pick(scores: &[f64], choices: &[Choice]) -> usize {
    let mut best = (0usize, f64::NEG_INFINITY);
    for (i, (s, c)) in scores.iter().zip(choices).enumerate() {
        let v = s / c.continuation.chars().count().max(1) as f64;
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

pub(crate) fn generate_until(
    tgt: &Model,
    mut cache: KvCache,
    last: u32,
    stop: &[String],
    max_tokens: usize,
) -> Result<(Vec<u32>, String), EvalError> {
    let eos = tgt.tokenizer.eos_ids().to_vec();
    let mut ids = Vec::new();
    let mut next = last;
    let mut text = String::new();
    for _ in 0..max_tokens {
        let logits = tgt.decoder.next_logits(&[next], &mut cache)?;
        let v = logits.flatten_all()?.to_vec1::<f32>()?;
        let tok = argmax(&v);
        if eos.contains(&tok) {
            break;
        }
        ids.push(tok);
        text = tgt.tokenizer.decode(&ids)?;
        if let Some(cut) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            break;
        }
        next = tok;
    }
    Ok((ids, text))
}

/// What every item of one task reads, and the time its items spent mapping and
/// re-prefilling so far.
pub(super) struct ItemRun<'a> {
    pub(super) models: RereadModels<'a>,
    pub(super) opts: &'a TaskEvalOptions,
    pub(super) contexts: &'a HashMap<String, Vec<u32>>,
    pub(super) shared: Shared,
    /// The floor's cache: no context at all.
    pub(super) empty: KvCache,
    pub(super) map_s: f64,
    pub(super) pre_s: f64,
    /// The re-reads' positions and milliseconds, summed over items.
    pub(super) reread: RereadDone,
}

impl ItemRun<'_> {
    /// The reference and mapped caches of `prefix`, adding their times to the totals.
    fn prepare(&mut self, prefix: &[u32], read_from: Option<usize>) -> Result<Prepared, EvalError> {
        let p = prepare(self.models, &self.shared, prefix, self.opts, read_from)?;
        self.map_s += p.map_seconds;
        self.pre_s += p.reprefill_seconds;
        self.reread.positions += p.reread.positions;
        self.reread.ms += p.reread.ms;
        Ok(p)
    }

    /// Scores every choice after the reference, the mapped and the empty cache, and
    /// compares the picks with `gold`.
    pub(super) fn multiple_choice(
        &mut self,
        doc_id: u64,
        choices: &[Choice],
        gold: usize,
    ) -> Result<ItemOutcome, EvalError> {
        let (tgt, tok) = (self.models.target, &self.models.target.tokenizer);
        let contexts = self.contexts;
        let mut prepared: HashMap<&str, Prepared> = HashMap::new();
        let (mut sr, mut sm, mut sf) = (Vec::new(), Vec::new(), Vec::new());
        for c in choices {
            let ids = &contexts[c.context.as_str()];
            let (prefix, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);
            if !prepared.contains_key(c.context.as_str()) {
                let p = self.prepare(prefix, None)?;
                prepared.insert(c.context.as_str(), p);
            }
            let p = &prepared[c.context.as_str()];
            let cont = tok.encode_raw(&c.continuation)?;
            sr.push(continuation_logprob(tgt, &p.reference, last, &cont)?);
            sm.push(continuation_logprob(tgt, &p.mapped, last, &cont)?);
            sf.push(continuation_logprob(tgt, &self.empty, last, &cont)?);
        }
        let (r, m, f) = (pick(&sr, choices), pick(&sm, choices), pick(&sf, choices));
        Ok(ItemOutcome {
            doc_id,
            reference_correct: r == gold,
            mapped_correct: m == gold,
            floor_correct: f == gold,
            same_answer: r == m,
            identical_generation: None,
            generations: None,
        })
    }

    /// Generates greedily after the reference and the mapped cache, and compares the
    /// final numbers with `answer`.
    pub(super) fn generate(
        &mut self,
        doc_id: u64,
        context: &str,
        stop: &[String],
        max_tokens: usize,
        answer: &str,
    ) -> Result<ItemOutcome, EvalError> {
        let tgt = self.models.target;
        let ids = &self.contexts[context];
        let (prefix, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);
        let read_from = if self.opts.target_reads_question {
            Some(question_start(&tgt.tokenizer, context, ids)?)
        } else {
            None
        };
        let p = self.prepare(prefix, read_from)?;
        let (ids_r, text_r) = generate_until(tgt, p.reference, last, stop, max_tokens)?;
        let (ids_m, text_m) = generate_until(tgt, p.mapped, last, stop, max_tokens)?;
        let (ar, am) = (extract_number(&text_r), extract_number(&text_m));
        let gold = normalize_number(answer);
        tracing::debug!(doc_id, reference = %text_r, mapped = %text_m, "generated");
        Ok(ItemOutcome {
            doc_id,
            reference_correct: ar.as_deref() == Some(gold.as_str()),
            mapped_correct: am.as_deref() == Some(gold.as_str()),
            floor_correct: false,
            same_answer: ar == am,
            identical_generation: Some(ids_r == ids_m),
            generations: Some(Generations {
                reference: text_r,
                mapped: text_m,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_compared_per_character() {
        let ch = |s: &str| Choice {
            context: String::new(),
            continuation: s.into(),
        };
        // The longer answer has the lower total but the higher per-character score.
        let choices = [ch(" ab"), ch(" abcdefgh")];
        assert_eq!(pick(&[-3.0, -4.5], &choices), 1);
        assert_eq!(pick(&[-1.0, -9.0], &choices), 0);
    }
}
