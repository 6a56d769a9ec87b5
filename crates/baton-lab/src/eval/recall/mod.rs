//! Multi-turn recall: does the target still know the facts of a conversation it was
//! handed through the mapper? The handoff's own shape: a passage read in the first turn,
//! then one short question a turn, each asked right after a switch.
//!
//! Each conversation (see [`baton_data::recall`]) is rendered through the chat
//! template: the first user message holds the passage, the assistant acknowledges it,
//! then come the questions, earlier ones followed by their first reference answer (so
//! every turn sees the same history whatever a model answered before: turns are
//! comparable across models and paths). For question *j* the history is everything
//! before its user message. Three answers are generated greedily:
//! - **source alone**: the source reads the history and the question itself;
//! - **reference**: the target does (its re-prefilled cache; "target alone");
//! - **mapped**: the source's cache of the history goes through the mapper (the target
//!   computes its first `anchor` positions and re-reads the last `tail` history tokens
//!   itself, as at a workbench switch), then the target reads the question.
//!
//! Each answer is scored against the reference answers (SQuAD F1 and exact match, see
//! [`baton_method::metrics::answers`]), and the mapped one also against the re-prefilled one.
//! From those: the mapped F1 as a share of the re-prefilled F1, the share of turns whose
//! mapped answer is word for word the re-prefilled one, and how much of the gap between
//! the source alone and the target alone the mapped cache recovers,
//! `(F1 mapped − F1 source) / (F1 target − F1 source)`. Turns of one conversation share
//! a passage, so intervals resample whole conversations.

pub mod coverage;
pub mod layers;
mod variants;

pub use layers::LayerSplit;
pub use variants::{HandoffVariant, Handover};

use super::tasks::{common_prefix_len, generate_until};
use super::EvalError;
use baton_data::recall::RecallConversation;
use baton_method::handoff::reread::RereadSetting;
use baton_method::learn::{ConversationPair, LearnOutcome, Learner};
use baton_method::mapper::residual::ResidualMap;
use baton_method::mapper::CacheMapper;
use baton_method::metrics::answers::{best_exact_match, best_f1, token_f1};
use baton_method::metrics::interval::{cluster_bootstrap, Estimate};
use baton_runtime::model::{ForwardOptions, KvCache, Logits, Model};
use baton_runtime::text::{ChatMessage, ChatTemplate};
use serde::{Deserialize, Serialize};
use std::time::Instant;
use variants::TurnInputs;

/// What the user says with the passage, before it.
pub const PASSAGE_INTRO: &str = "Read this passage. I will ask you questions about it.";
/// The assistant's reply to the passage, the same for every model.
pub const ACKNOWLEDGEMENT: &str = "I have read the passage. Ask me about it.";
/// Appended to every question, so that answers are short phrases, as SQuAD's are.
pub const ANSWER_STYLE: &str = "Answer in a few words, using the passage.";

/// A diagnosis: one half of the mapped positions replaced by the target's own, to tell
/// whether the facts are lost in the keys (where attention reads) or in the values (what
/// it reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// Named as the flag's values are (true-keys, …).
#[allow(clippy::enum_variant_names)]
pub enum Oracle {
    /// The target's own keys with the mapped values.
    TrueKeys,
    /// The mapped keys with the target's own values.
    TrueValues,
    /// Both halves the target's own, through the same path: a check of the diagnosis
    /// itself, whose answers must be the re-prefilled ones.
    TrueBoth,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RecallOptions {
    /// Leading positions the target computes itself (attention sinks).
    pub anchor: usize,
    /// Last history tokens the target re-reads itself on top of the mapped rest.
    pub tail: usize,
    /// What the target re-reads of the mapped middle once the question is known.
    #[serde(default)]
    pub reread: Option<RereadSetting>,
    /// Longest answer generated, in tokens.
    pub max_answer_tokens: usize,
    pub bootstrap_resamples: usize,
    pub seed: u64,
    /// Not a handoff: a diagnosis (see [`Oracle`]); `None` maps both halves.
    #[serde(default)]
    pub oracle: Option<Oracle>,
    /// The suite's number of the first conversation given (those before it were
    /// skipped), so that outcomes keep the suite's numbering.
    #[serde(default)]
    pub first_conversation: usize,
}

impl Default for RecallOptions {
    fn default() -> Self {
        Self {
            anchor: 0,
            tail: 0,
            reread: None,
            max_answer_tokens: 32,
            bootstrap_resamples: 2000,
            seed: 20_261_201,
            oracle: None,
            first_conversation: 0,
        }
    }
}

/// One question of one conversation, answered three ways.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnOutcome {
    /// Index of the conversation in the suite.
    pub conversation: usize,
    /// 1 for the first question.
    pub question_number: usize,
    pub question_id: String,
    /// History tokens handed over at the switch before the question.
    pub context_tokens: usize,
    pub source: String,
    pub reference: String,
    pub mapped: String,
    pub f1_source: f64,
    pub f1_reference: f64,
    pub f1_mapped: f64,
    pub em_source: f64,
    pub em_reference: f64,
    pub em_mapped: f64,
    /// F1 of the mapped answer against the re-prefilled one.
    pub f1_mapped_vs_reference: f64,
    /// The mapped answer is word for word the re-prefilled one.
    pub identical: bool,
    /// History positions the target re-read before the question.
    #[serde(default)]
    pub reread_positions: usize,
    /// Whether every history position of the answer, where the passage gives it, was the
    /// target's own when it read the question (kept or re-read; see [`coverage`]);
    /// `None` when the passage does not contain an answer as written.
    #[serde(default)]
    pub answer_covered: Option<bool>,
}

/// The suite's result in one direction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecallResult {
    pub conversations: usize,
    pub turns: usize,
    pub anchor: usize,
    pub tail: usize,
    /// The handoff's name (`map`, `tail 64`, `re-read 20%:source-attention:word`).
    #[serde(default)]
    pub handoff: String,
    #[serde(default)]
    pub reread: Option<RereadSetting>,
    /// Mean share of the history's positions re-read.
    #[serde(default)]
    pub reread_share: f64,
    /// Set when this was a diagnosis, not a handoff.
    #[serde(default)]
    pub oracle: Option<Oracle>,
    /// Mean F1 / exact match against the reference answers, 95% intervals.
    pub f1_source: Estimate,
    pub f1_reference: Estimate,
    pub f1_mapped: Estimate,
    pub em_source: Estimate,
    pub em_reference: Estimate,
    pub em_mapped: Estimate,
    /// F1 mapped / F1 re-prefilled.
    pub f1_retention: Estimate,
    /// (F1 mapped − F1 source) / (F1 target − F1 source); undefined (NaN) unless the
    /// target alone beats the source alone.
    pub gap_recovered: Estimate,
    /// Share of turns with the mapped answer identical to the re-prefilled one.
    pub identical: Estimate,
    /// Share of the turns whose answer the passage holds as written in which the handed
    /// cache held every position of that answer as the target's own (see
    /// [`coverage`]); `None` when no turn's answer was found.
    #[serde(default)]
    pub answer_coverage: Option<f64>,
    pub f1_mapped_vs_reference: Estimate,
    /// Mean seconds per turn to hand the history over: the map (with the anchor and tail
    /// the target reads) against the target re-prefilling it.
    pub map_seconds: f64,
    /// Mean seconds per turn choosing and re-reading spans once the question is known.
    #[serde(default)]
    pub reread_seconds: f64,
    /// Of which choosing.
    #[serde(default)]
    pub select_seconds: f64,
    pub reprefill_seconds: f64,
    pub outcomes: Vec<TurnOutcome>,
    /// With learning on: what the mapper learned after each conversation, which the
    /// conversations after it were answered with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub learning: Vec<ConversationLearning>,
}

/// What the mapper learned from one conversation, once its questions were answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConversationLearning {
    pub conversation: usize,
    /// `None`: too little new text to learn from.
    pub outcome: Option<LearnOutcome>,
}

/// The messages up to and including question `j`'s (0-based), earlier questions
/// answered with their first reference answer.
pub fn messages_for(conv: &RecallConversation, j: usize) -> Vec<ChatMessage> {
    let title = conv.title.replace('_', " ");
    let mut m = vec![
        ChatMessage::user(format!(
            "{PASSAGE_INTRO}\n\nTitle: {title}\n\n{}",
            conv.passage
        )),
        ChatMessage::assistant(ACKNOWLEDGEMENT),
    ];
    for (i, q) in conv.questions.iter().enumerate().take(j + 1) {
        m.push(ChatMessage::user(format!("{}\n{ANSWER_STYLE}", q.question)));
        if i < j {
            m.push(ChatMessage::assistant(
                q.answers.first().cloned().unwrap_or_default(),
            ));
        }
    }
    m
}

/// Grows `cache` (which holds `held` ids) to hold `ids`, keeping what they share.
fn extend_to(
    model: &Model,
    cache: &mut KvCache,
    held: &mut Vec<u32>,
    ids: &[u32],
) -> Result<(), EvalError> {
    let keep = common_prefix_len(&[held.as_slice(), ids]);
    cache.truncate(keep);
    held.truncate(keep);
    if keep < ids.len() {
        model
            .decoder
            .forward(&ids[keep..], cache, &ForwardOptions::cache_only())?;
        held.extend_from_slice(&ids[keep..]);
    }
    Ok(())
}

/// Run the suite in one direction. `on_turn` is called after each answered question.
/// With a `learner`, each conversation is answered with its mapper, and it learns from
/// the conversation once all its questions are answered (never before: no answer is
/// helped by its own conversation).
pub fn eval_recall(
    src: &Model,
    tgt: &Model,
    mapper: &CacheMapper,
    conversations: &[RecallConversation],
    opts: &RecallOptions,
    learner: Option<&mut Learner>,
    on_turn: &mut dyn FnMut(usize),
) -> Result<RecallResult, EvalError> {
    let ways = [HandoffVariant::of(opts)];
    let mut r = eval_recall_variants(
        src,
        tgt,
        (mapper, None, &[]),
        conversations,
        opts,
        &ways,
        learner,
        on_turn,
    )?;
    r.pop()
        .ok_or_else(|| EvalError::Input("the recall suite gave no result".into()))
}

/// [`eval_recall`] with the history handed over each way of `variants` in the same
/// turns: one result per variant, all scored against the same source-alone and
/// re-prefilled answers. Of the maps, `reverse` (the other direction's mapper) is needed
/// by the round-trip selector only, and the residual maps by `upper=` variants (one per
/// target layer they name).
#[allow(clippy::too_many_arguments)]
pub fn eval_recall_variants(
    src: &Model,
    tgt: &Model,
    (mapper, reverse, residual): (&CacheMapper, Option<&CacheMapper>, &[ResidualMap]),
    conversations: &[RecallConversation],
    opts: &RecallOptions,
    variants: &[HandoffVariant],
    mut learner: Option<&mut Learner>,
    on_turn: &mut dyn FnMut(usize),
) -> Result<Vec<RecallResult>, EvalError> {
    let template = tgt.chat_template()?;
    let mut outcomes: Vec<Vec<TurnOutcome>> = vec![Vec::new(); variants.len()];
    let mut learning = Vec::new();
    let mut seconds = vec![HandoverSeconds::default(); variants.len()];
    let mut turns_done = 0;
    for (c, conv) in conversations.iter().enumerate() {
        let mut source = SourceHistory {
            cache: src.decoder.new_cache(),
            held: Vec::new(),
        };
        let turns = TurnRun {
            src,
            tgt,
            mapper: learner.as_deref().map_or(mapper, |l| l.mapper()),
            reverse,
            residual,
            template,
            opts,
            variants,
        };
        for j in 0..conv.questions.len() {
            let each = turns.turn(conv, c, j, &mut source, &mut seconds)?;
            for (all, o) in outcomes.iter_mut().zip(each) {
                all.push(o);
            }
            turns_done += 1;
            on_turn(turns_done);
        }
        if let Some(l) = learner.as_deref_mut() {
            let outcome = learn_from(src, tgt, l, &source.cache, &source.held)?;
            learning.push(ConversationLearning {
                conversation: opts.first_conversation + c,
                outcome,
            });
        }
    }
    Ok(variants
        .iter()
        .zip(outcomes)
        .zip(seconds)
        .map(|((v, o), sec)| {
            let mut vopts = *opts;
            vopts.tail = v.tail;
            vopts.reread = v.reread;
            let mut result = summarise(conversations.len(), o, (sec.map, sec.reprefill), &vopts);
            result.reread_seconds = sec.reread / result.turns.max(1) as f64;
            result.select_seconds = sec.select / result.turns.max(1) as f64;
            result.handoff = v.label();
            result.learning = learning.clone();
            result
        })
        .collect())
}

/// The source's cache of one conversation, grown turn by turn, and the ids it holds.
struct SourceHistory {
    cache: KvCache,
    held: Vec<u32>,
}

/// Time spent handing histories over, summed over turns.
#[derive(Default, Clone)]
struct HandoverSeconds {
    map: f64,
    reread: f64,
    select: f64,
    reprefill: f64,
}

/// What every turn of one conversation reads.
struct TurnRun<'a> {
    src: &'a Model,
    tgt: &'a Model,
    mapper: &'a CacheMapper,
    reverse: Option<&'a CacheMapper>,
    residual: &'a [ResidualMap],
    template: &'a ChatTemplate,
    opts: &'a RecallOptions,
    variants: &'a [HandoffVariant],
}

/// The answers to one question, trimmed, with the target's token ids: the source's, the
/// re-prefilled target's and one per handoff variant.
struct Answers {
    source: String,
    reference: String,
    mapped: Vec<String>,
    reference_ids: Vec<u32>,
    mapped_ids: Vec<Vec<u32>>,
}

impl TurnRun<'_> {
    /// Question `j` of conversation `c`: hand the history over each way, let each path
    /// read the question, answer it and score the answers (one outcome per variant).
    fn turn(
        &self,
        conv: &RecallConversation,
        c: usize,
        j: usize,
        source: &mut SourceHistory,
        seconds: &mut [HandoverSeconds],
    ) -> Result<Vec<TurnOutcome>, EvalError> {
        let (src, tgt) = (self.src, self.tgt);
        let (ids, h) = self.render(conv, c, j)?;
        let (prompt, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);
        let history = &ids[..h];

        // The source's cache of the history, handed over as it would be at a switch.
        extend_to(src, &mut source.cache, &mut source.held, history)?;
        let t0 = Instant::now();
        let mut reference = tgt.decoder.new_cache();
        tgt.decoder
            .forward(history, &mut reference, &ForwardOptions::cache_only())?;
        let reprefill_s = t0.elapsed().as_secs_f64();
        let upper: Vec<layers::UpperInput> = layers::source_rows(src, history, self.residual)?
            .into_iter()
            .zip(self.residual)
            .map(|(source_rows, map)| layers::UpperInput {
                map: map.clone(),
                source_rows,
            })
            .collect();
        let inputs = TurnInputs {
            src,
            tgt,
            mapper: self.mapper,
            reverse: self.reverse,
            src_cache: &source.cache,
            reference: &reference,
            ms_per_position: reprefill_s * 1e3 / h as f64,
            prompt,
            history: h,
            anchor: self.opts.anchor,
            oracle: self.opts.oracle,
            upper: &upper,
        };
        let mut handed = Vec::with_capacity(self.variants.len());
        for (v, sec) in self.variants.iter().zip(seconds.iter_mut()) {
            let got = variants::hand_over(v, &inputs)?;
            sec.map += got.map_ms / 1e3;
            sec.reread += got.reread_ms / 1e3;
            sec.select += got.select_ms / 1e3;
            sec.reprefill += reprefill_s;
            handed.push(got);
        }

        // The question, read by each path itself.
        tgt.decoder
            .forward(&prompt[h..], &mut reference, &ForwardOptions::cache_only())?;
        for got in &mut handed {
            tgt.decoder
                .forward(&prompt[h..], &mut got.cache, &ForwardOptions::cache_only())?;
        }
        extend_to(src, &mut source.cache, &mut source.held, prompt)?;

        let span = coverage::answer_positions(
            &tgt.tokenizer,
            history,
            &format!("Title: {}", conv.title.replace('_', " ")),
            &conv.questions[j].answers,
        );
        let covered: Vec<Option<bool>> = handed
            .iter()
            .map(|g| {
                span.as_ref()
                    .map(|s| coverage::covered(g.cache.foreign(), s))
            })
            .collect();
        let positions: Vec<usize> = handed.iter().map(|g| g.reread_positions).collect();
        let caches = handed.into_iter().map(|g| g.cache).collect();
        let answers = self.answer(&source.cache, reference, caches, last)?;
        let q = &conv.questions[j];
        Ok(answers
            .mapped
            .iter()
            .zip(&answers.mapped_ids)
            .zip(positions)
            .zip(covered)
            .map(|(((mapped, mapped_ids), reread_positions), answer_covered)| {
                tracing::debug!(conversation = c, question = j + 1, reference = %answers.reference, %mapped, "recall turn");
                TurnOutcome {
                    conversation: self.opts.first_conversation + c,
                    question_number: j + 1,
                    question_id: q.id.clone(),
                    context_tokens: h,
                    f1_source: best_f1(&answers.source, &q.answers),
                    f1_reference: best_f1(&answers.reference, &q.answers),
                    f1_mapped: best_f1(mapped, &q.answers),
                    em_source: best_exact_match(&answers.source, &q.answers),
                    em_reference: best_exact_match(&answers.reference, &q.answers),
                    em_mapped: best_exact_match(mapped, &q.answers),
                    f1_mapped_vs_reference: token_f1(mapped, &answers.reference),
                    identical: &answers.reference_ids == mapped_ids,
                    source: answers.source.clone(),
                    reference: answers.reference.clone(),
                    mapped: mapped.clone(),
                    reread_positions,
                    answer_covered,
                }
            })
            .collect())
    }

    /// The ids of question `j`'s prompt, and how many of them are the history before
    /// the question's user message.
    fn render(
        &self,
        conv: &RecallConversation,
        c: usize,
        j: usize,
    ) -> Result<(Vec<u32>, usize), EvalError> {
        let (template, tok) = (self.template, &self.tgt.tokenizer);
        let messages = messages_for(conv, j);
        let ids = template.render_ids(tok, &messages, true)?;
        let before = template.render_ids(tok, &messages[..messages.len() - 1], false)?;
        let h = common_prefix_len(&[&ids, &before]);
        if ids.len() < 2 || h == 0 || h >= ids.len() {
            return Err(EvalError::Input(format!(
                "conversation {c} question {}: the rendered prompt does not extend its history",
                j + 1
            )));
        }
        Ok((ids, h))
    }

    /// Greedy answers of the source on its own cache and of the target on the
    /// reference and each handed-over one, each continuing from `last`.
    fn answer(
        &self,
        src_cache: &KvCache,
        reference: KvCache,
        mapped: Vec<KvCache>,
        last: u32,
    ) -> Result<Answers, EvalError> {
        let (src, tgt) = (self.src, self.tgt);
        let max = self.opts.max_answer_tokens;
        let (_, source) = generate_until(src, src_cache.try_clone()?, last, &[], max)?;
        let (reference_ids, reference_text) = generate_until(tgt, reference, last, &[], max)?;
        let (mut texts, mut ids) = (Vec::new(), Vec::new());
        for cache in mapped {
            let (i, t) = generate_until(tgt, cache, last, &[], max)?;
            texts.push(t.trim().to_string());
            ids.push(i);
        }
        Ok(Answers {
            source: source.trim().to_string(),
            reference: reference_text.trim().to_string(),
            mapped: texts,
            reference_ids,
            mapped_ids: ids,
        })
    }
}

/// Probe positions the target keeps its queries at when a conversation is learned from.
const LEARN_PROBES: usize = 32;

/// `learner` learns from a conversation: the source's own cache of `ids` and the
/// target's, read here.
fn learn_from(
    src: &Model,
    tgt: &Model,
    learner: &mut Learner,
    src_cache: &KvCache,
    ids: &[u32],
) -> Result<Option<LearnOutcome>, EvalError> {
    let probes = baton_method::metrics::probe_positions(ids.len(), LEARN_PROBES);
    let mut own = tgt.decoder.new_cache();
    let out = tgt.decoder.forward(
        ids,
        &mut own,
        &ForwardOptions {
            logits: Logits::None,
            probe_positions: probes.clone(),
        },
    )?;
    let pair = ConversationPair {
        tokens: ids,
        src: src_cache,
        tgt: &own,
        queries: &out.queries,
        probes: &probes,
        from: 0,
    };
    Ok(learner.learn(src, tgt, &pair)?)
}

/// The suite's estimates from its turns.
pub fn summarise(
    conversations: usize,
    outcomes: Vec<TurnOutcome>,
    (map_s, pre_s): (f64, f64),
    opts: &RecallOptions,
) -> RecallResult {
    let rows: Vec<[f64; 8]> = outcomes
        .iter()
        .map(|o| {
            [
                o.f1_source,
                o.f1_reference,
                o.f1_mapped,
                o.em_source,
                o.em_reference,
                o.em_mapped,
                f64::from(u8::from(o.identical)),
                o.f1_mapped_vs_reference,
            ]
        })
        .collect();
    let cluster: Vec<usize> = outcomes.iter().map(|o| o.conversation).collect();
    let est = |f: &dyn Fn(&[f64; 8]) -> Option<f64>| {
        cluster_bootstrap(&rows, &cluster, f, opts.bootstrap_resamples, opts.seed)
    };
    let mean = |i: usize| est(&move |m: &[f64; 8]| Some(m[i]));
    let n = outcomes.len().max(1) as f64;
    RecallResult {
        conversations,
        turns: outcomes.len(),
        anchor: opts.anchor,
        tail: opts.tail,
        handoff: HandoffVariant::of(opts).label(),
        reread: opts.reread,
        reread_share: baton_method::metrics::mean(
            &outcomes
                .iter()
                .map(|o| o.reread_positions as f64 / o.context_tokens.max(1) as f64)
                .collect::<Vec<_>>(),
        ),
        oracle: opts.oracle,
        f1_source: mean(0),
        f1_reference: mean(1),
        f1_mapped: mean(2),
        em_source: mean(3),
        em_reference: mean(4),
        em_mapped: mean(5),
        f1_retention: est(&|m| (m[1] > 0.0).then(|| m[2] / m[1])),
        // Only a target better than the source leaves a gap to recover.
        gap_recovered: est(&|m| (m[1] - m[0] > 1e-9).then(|| (m[2] - m[0]) / (m[1] - m[0]))),
        identical: mean(6),
        answer_coverage: {
            let found: Vec<f64> = outcomes
                .iter()
                .filter_map(|o| o.answer_covered.map(|c| f64::from(u8::from(c))))
                .collect();
            (!found.is_empty()).then(|| baton_method::metrics::mean(&found))
        },
        f1_mapped_vs_reference: mean(7),
        map_seconds: map_s / n,
        reread_seconds: 0.0,
        select_seconds: 0.0,
        reprefill_seconds: pre_s / n,
        outcomes,
        learning: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_data::recall::RecallQuestion;

    fn conv() -> RecallConversation {
        let q = |id: &str, question: &str, answer: &str| RecallQuestion {
            id: id.into(),
            question: question.into(),
            answers: vec![answer.into(), format!("the {answer}")],
        };
        RecallConversation {
            title: "Harvard_University".into(),
            passage: "Older than The Game by 23 years.".into(),
            questions: vec![
                q("a", "How many years?", "23"),
                q("b", "Older than what?", "Game"),
            ],
        }
    }

    #[test]
    fn a_question_turn_sees_the_passage_and_earlier_questions_answered_by_reference() {
        let m = messages_for(&conv(), 1);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
        assert!(m[0]
            .content
            .contains("Title: Harvard University\n\nOlder than The Game"));
        assert_eq!(m[1].content, ACKNOWLEDGEMENT);
        assert_eq!(m[3].content, "23", "the first reference answer");
        assert!(m[4].content.starts_with("Older than what?\n"));
        assert_eq!(messages_for(&conv(), 0).len(), 3);
    }

    fn turn(conversation: usize, f1: [f64; 3], identical: bool) -> TurnOutcome {
        TurnOutcome {
            conversation,
            question_number: 1,
            question_id: String::new(),
            context_tokens: 10,
            source: String::new(),
            reference: String::new(),
            mapped: String::new(),
            f1_source: f1[0],
            f1_reference: f1[1],
            f1_mapped: f1[2],
            em_source: 0.0,
            em_reference: 0.0,
            em_mapped: 0.0,
            f1_mapped_vs_reference: f64::from(u8::from(identical)),
            identical,
            reread_positions: 0,
            answer_covered: None,
        }
    }

    #[test]
    fn the_summary_gives_retention_identity_and_the_gap_recovered() {
        // Source 0.2, target 0.6, mapped 0.3: retention 0.5, a quarter of the gap.
        let turns = vec![
            turn(0, [0.2, 0.6, 0.3], true),
            turn(0, [0.2, 0.6, 0.3], false),
            turn(1, [0.2, 0.6, 0.3], false),
            turn(1, [0.2, 0.6, 0.3], false),
        ];
        let r = summarise(2, turns, (0.4, 8.0), &RecallOptions::default());
        assert_eq!((r.conversations, r.turns), (2, 4));
        assert!((r.f1_retention.value - 0.5).abs() < 1e-12);
        assert!((r.gap_recovered.value - 0.25).abs() < 1e-12);
        assert!((r.identical.value - 0.25).abs() < 1e-12);
        assert!((r.map_seconds - 0.1).abs() < 1e-12 && (r.reprefill_seconds - 2.0).abs() < 1e-12);
        assert!(r.identical.ci95[0] <= 0.25 && 0.25 <= r.identical.ci95[1]);
    }

    #[test]
    fn no_gap_between_the_models_leaves_the_gap_recovered_undefined() {
        let turns = vec![turn(0, [0.5, 0.5, 0.4], false)];
        let r = summarise(1, turns, (0.0, 0.0), &RecallOptions::default());
        assert!(r.gap_recovered.value.is_nan());
        // Towards the weaker model there is no gap to recover either.
        let turns = vec![turn(0, [0.7, 0.4, 0.1], false)];
        let r = summarise(1, turns, (0.0, 0.0), &RecallOptions::default());
        assert!(r.gap_recovered.value.is_nan());
    }
}
