//! The document `baton eval --json` prints: one [`EvalReport`], versioned so that scripts
//! reading it break only on a version bump. Field names and nesting are held by a
//! snapshot test; change them only with [`VERSION`].
//!
//! ```text
//! {format: "baton.eval", version, results: [{direction, mapper, k, precision, anchor,
//!  tail, key_gain, value_gain, text: null | TextEval, tasks: [TaskResult],
//!  conversations: null | RecallResult}]}
//! ```
//!
//! Beside it, the one-line summaries of the same results printed for people.

use super::recall::RecallResult;
use super::tasks::TaskResult;
use super::text::TextEval;
use baton_method::mapper::MapPrecision;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const FORMAT: &str = "baton.eval";
/// 2: `anchor`, `tail` and GSM8K `generations` added. 3: `key_gain`, `value_gain`.
/// 4: `conversations`, the multi-turn recall suite. 6: the recall suite's
/// `answer_coverage` and each turn's `answer_covered`.
pub const VERSION: u32 = 6;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] of this baton.
    pub version: u32,
    /// One entry per direction evaluated.
    pub results: Vec<DirectionEval>,
}

impl EvalReport {
    pub fn new(results: Vec<DirectionEval>) -> Self {
        Self {
            format: FORMAT.into(),
            version: VERSION,
            results,
        }
    }
}

/// Everything measured for one direction (source → target) with one mapper.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirectionEval {
    /// `"<source> -> <target>"`, the models' names.
    pub direction: String,
    /// The mapper artifact evaluated.
    pub mapper: PathBuf,
    /// Source layers per target layer in that mapper.
    pub k: usize,
    /// What the map ran in.
    pub precision: MapPrecision,
    /// Leading positions the target computed itself.
    pub anchor: usize,
    /// Final context tokens the target re-read on top of the mapped cache (text
    /// prefixes and task contexts).
    pub tail: usize,
    /// Gains around the mean prediction applied to the mapped keys and values (1: none).
    #[serde(default = "one")]
    pub key_gain: f32,
    #[serde(default = "one")]
    pub value_gain: f32,
    /// Held-out text, when any was evaluated.
    pub text: Option<TextEval>,
    /// One result per task asked for.
    pub tasks: Vec<TaskResult>,
    /// The multi-turn recall suite, when asked for.
    #[serde(default)]
    pub conversations: Option<RecallResult>,
    /// The recall suite's other handoffs (`--handoff`), run in the same turns as
    /// `conversations`: the same source-alone and re-prefilled answers, the same
    /// re-prefill timings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handoffs: Vec<RecallResult>,
}

fn one() -> f32 {
    1.0
}

/// The one-line summary of a text evaluation printed for people.
pub fn text_line(direction: &str, k: usize, r: &TextEval) -> String {
    let m = baton_method::metrics::mean;
    format!(
        "{direction} (k={k}): R² K {:.3} V {:.3} | attention cosine prefix {:.3} / continuation {:.3} | key-error concentration {:.2} | top-1 {:.3} (no prefix {:.3}) KL {:.3} | PPL mapped {:.2} true {:.2} no prefix {:.2} ({} of the context's value kept) | map {:.1} ms{} vs re-prefill {:.0} ms",
        m(&r.r2_k),
        m(&r.r2_v),
        m(&r.cosine_prefix),
        m(&r.cosine_continuation),
        m(&r.key_error_concentration),
        r.scores.agreement.top1,
        r.scores.agreement_no_prefix.top1,
        r.scores.agreement.kl,
        r.scores.ppl_mapped,
        r.scores.ppl_true,
        r.scores.ppl_no_prefix,
        r.context_value_recovered
            .map_or("n/a".to_string(), |v| format!("{:.0}%", v * 100.0))
            + &r.tail_alone_value
                .map(|v| format!("; the tail alone {:.0}%", v * 100.0))
                .unwrap_or_default(),
        r.map_seconds * 1e3,
        if r.reread_positions > 0.0 {
            format!(
                " (re-read {:.1} ms, {:.0} positions)",
                r.reread_seconds * 1e3,
                r.reread_positions
            )
        } else {
            String::new()
        },
        r.reprefill_seconds * 1e3
    )
}

/// The one-line summary of the recall suite printed for people.
pub fn recall_line(direction: &str, r: &RecallResult) -> String {
    let ci = |e: &baton_method::metrics::interval::Estimate| {
        format!("{:.3} [{:.3}, {:.3}]", e.value, e.ci95[0], e.ci95[1])
    };
    format!(
        "{direction} recall{}{}: {} conversations, {} turns | F1 source alone {}  target alone {}  mapped {} | EM {:.3} / {:.3} / {:.3} | F1 retention {}  gap recovered {}  identical {} | map {:.1} ms + re-read {:.1} ms ({:.1}% of the history) vs re-prefill {:.0} ms",
        match r.oracle {
            None => String::new(),
            Some(o) => format!(" (diagnosis: {o:?})"),
        },
        if r.handoff.is_empty() || r.handoff == "map" {
            String::new()
        } else {
            format!(" [{}]", r.handoff)
        },
        r.conversations,
        r.turns,
        ci(&r.f1_source),
        ci(&r.f1_reference),
        ci(&r.f1_mapped),
        r.em_source.value,
        r.em_reference.value,
        r.em_mapped.value,
        ci(&r.f1_retention),
        ci(&r.gap_recovered),
        ci(&r.identical),
        r.map_seconds * 1e3,
        r.reread_seconds * 1e3,
        r.reread_share * 100.0,
        r.reprefill_seconds * 1e3,
    ) + &learning_note(r)
}

/// What the mapper learned over the suite, when it learned: how many updates were taken
/// and the held-out cosine before the first and after the last taken.
fn learning_note(r: &RecallResult) -> String {
    if r.learning.is_empty() {
        return String::new();
    }
    let steps: Vec<_> = r
        .learning
        .iter()
        .filter_map(|l| l.outcome.as_ref())
        .collect();
    let taken: Vec<_> = steps.iter().filter(|o| o.accepted).collect();
    let (Some(first), Some(last)) = (taken.first(), taken.last()) else {
        return format!(" | learning: no update of {} taken", steps.len());
    };
    format!(
        " | learning: {} of {} updates taken, {} positions, held-out cosine {:.3} -> {:.3}",
        taken.len(),
        steps.len(),
        last.learned_tokens,
        first.before.combined(),
        last.after.combined()
    )
}

/// The one-line summary of a task result printed for people.
pub fn task_line(direction: &str, r: &TaskResult) -> String {
    let ci = |e: &baton_method::metrics::interval::Estimate| {
        format!("{:.3} [{:.3}, {:.3}]", e.value, e.ci95[0], e.ci95[1])
    };
    let task = if r.target_reads_question {
        format!("{} (question read by the target)", r.task)
    } else {
        r.task.clone()
    };
    format!(
        "{direction} {task:<14} n={:<4} reference {}  mapped {}  floor ({}) {:.3}  retention {}  floor-normalised {}  same answer {:.3}",
        r.items,
        ci(&r.accuracy_reference),
        ci(&r.accuracy_mapped),
        r.floor,
        r.accuracy_floor.value,
        ci(&r.retention_raw),
        ci(&r.retention_floor_normalised),
        r.answer_agreement,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::tasks::{Generations, ItemOutcome};
    use baton_data::tasks::TaskKind;
    use baton_method::metrics::interval::Estimate;
    use baton_test_support::json_shape;

    fn estimate(v: f64) -> Estimate {
        Estimate {
            value: v,
            ci95: [v - 0.1, v + 0.1],
        }
    }

    fn report() -> EvalReport {
        let task = TaskResult {
            task: "gsm8k".into(),
            kind: TaskKind::GenerateNumber,
            shots: 8,
            items: 1,
            target_reads_question: true,
            accuracy_reference: estimate(0.5),
            accuracy_mapped: estimate(0.25),
            accuracy_floor: estimate(0.0),
            floor: "zero".into(),
            chance: None,
            retention_raw: estimate(0.5),
            retention_floor_normalised: estimate(0.5),
            answer_agreement: 0.5,
            map_seconds: 0.01,
            reprefill_seconds: 0.5,
            reread: baton_method::handoff::reread::RereadSetting::parse("0.4").unwrap_or_default(),
            reread_seconds: 0.2,
            reread_positions: 300.0,
            outcomes: vec![ItemOutcome {
                doc_id: 3,
                reference_correct: true,
                mapped_correct: false,
                floor_correct: false,
                same_answer: false,
                identical_generation: Some(false),
                generations: Some(Generations {
                    reference: "42".into(),
                    mapped: "41".into(),
                }),
            }],
        };
        EvalReport::new(vec![DirectionEval {
            direction: "a -> b".into(),
            mapper: PathBuf::from("m.safetensors"),
            k: 8,
            precision: MapPrecision::Int8,
            anchor: 1,
            tail: 0,
            key_gain: 1.0,
            value_gain: 1.0,
            text: Some(TextEval {
                windows: 2,
                prefix: 384,
                continuation: 128,
                r2_k: vec![0.6],
                r2_v: vec![0.5],
                cosine_prefix: vec![0.9],
                cosine_continuation: vec![0.8],
                key_error_concentration: vec![1.2],
                ..TextEval::default()
            }),
            tasks: vec![task],
            conversations: Some(crate::eval::recall::summarise(
                1,
                vec![crate::eval::recall::TurnOutcome {
                    conversation: 0,
                    question_number: 1,
                    question_id: "q".into(),
                    context_tokens: 200,
                    source: "William James".into(),
                    reference: "William Astbury".into(),
                    mapped: "William James".into(),
                    f1_source: 0.5,
                    f1_reference: 1.0,
                    f1_mapped: 0.5,
                    em_source: 0.0,
                    em_reference: 1.0,
                    em_mapped: 0.0,
                    f1_mapped_vs_reference: 0.5,
                    identical: false,
                    reread_positions: 40,
                    answer_covered: Some(true),
                }],
                (0.08, 2.0),
                &crate::eval::recall::RecallOptions::default(),
            )),
            handoffs: Vec::new(),
        }])
    }

    #[test]
    fn the_eval_document_keeps_its_field_names_and_nesting() {
        let v = serde_json::to_value(report()).map_err(|e| e.to_string());
        insta::assert_snapshot!(json_shape(&v.unwrap_or_default()));
    }

    #[test]
    fn the_eval_document_names_its_format_and_version() {
        let v = serde_json::to_value(report()).unwrap_or_default();
        assert_eq!(v["format"], "baton.eval");
        assert_eq!(v["version"], 6);
    }

    #[test]
    fn the_summary_lines_carry_the_measured_numbers() {
        let r = report();
        let d = &r.results[0];
        let text = text_line(
            &d.direction,
            d.k,
            d.text.as_ref().unwrap_or(&TextEval::default()),
        );
        assert!(text.starts_with("a -> b (k=8): R² K 0.600"), "{text}");
        let task = task_line(&d.direction, &d.tasks[0]);
        assert!(task.contains("mapped 0.250 [0.150, 0.350]"), "{task}");
        assert!(task.contains("same answer 0.500"), "{task}");
        let recall = recall_line(&d.direction, d.conversations.as_ref().unwrap());
        assert!(recall.contains("1 conversations, 1 turns"), "{recall}");
        assert!(recall.contains("target alone 1.000"), "{recall}");
        assert!(recall.contains("F1 retention 0.500"), "{recall}");
        assert!(
            recall.contains(
                "map 80.0 ms + re-read 0.0 ms (20.0% of the history) vs re-prefill 2000 ms"
            ),
            "{recall}"
        );
    }

    #[test]
    fn the_recall_line_says_what_was_learned_only_when_learning_was_on() {
        use crate::eval::recall::ConversationLearning;
        use baton_method::learn::{HeldOutScores, LearnOutcome};
        let r = report();
        let mut recall = r.results[0].conversations.clone().unwrap();
        assert!(!recall_line("a -> b", &recall).contains("learning"));
        let step = |accepted: bool, before: f64, after: f64, learned: u64| LearnOutcome {
            tokens: 100,
            held_out: 33,
            before: HeldOutScores {
                conversation: before,
                calibration: Some(before),
            },
            after: HeldOutScores {
                conversation: after,
                calibration: Some(after),
            },
            accepted,
            learned_tokens: learned,
            learned_to: 101,
            seconds: 1.0,
        };
        recall.learning = vec![
            ConversationLearning {
                conversation: 0,
                outcome: Some(step(true, 0.70, 0.75, 100)),
            },
            ConversationLearning {
                conversation: 1,
                outcome: None,
            },
            ConversationLearning {
                conversation: 2,
                outcome: Some(step(false, 0.75, 0.74, 100)),
            },
            ConversationLearning {
                conversation: 3,
                outcome: Some(step(true, 0.76, 0.80, 200)),
            },
        ];
        let line = recall_line("a -> b", &recall);
        assert!(
            line.contains(
                "learning: 2 of 3 updates taken, 200 positions, held-out cosine 0.700 -> 0.800"
            ),
            "{line}"
        );
        recall.learning.retain(|l| l.conversation == 2);
        assert!(recall_line("a -> b", &recall).contains("learning: no update of 1 taken"));
    }
}
