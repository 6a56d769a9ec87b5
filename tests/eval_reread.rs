//! The re-read in text windows and task contexts, on two tiny models generated here with
//! their mappers calibrated between them: re-reading every candidate gives the target's
//! own answers, re-reading part of it counts what it read, and a re-read with nothing
//! the target reads next to choose by is refused with the flag that gives it one.

mod common;

use baton::data::corpus::{windows, Document, Split};
use baton::data::tasks::{task_def, TaskItem};
use baton::handoff::reread::RereadSetting;
use baton::lab::eval::reread::RereadModels;
use baton::lab::eval::tasks::{eval_task_with, TaskEvalOptions};
use baton::lab::eval::text::{eval_text_with, TextEvalOptions};
use baton::mapper::CacheMapper;
use baton::model::Model;
use common::engine_rig::{models_and_mappers, tiny, write_pair};

struct Pair {
    _dir: tempfile::TempDir,
    a: Model,
    b: Model,
    mapper: CacheMapper,
    reverse: CacheMapper,
}

impl Pair {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), false);
        let (a, b, mapper, reverse) = models_and_mappers(dir.path());
        Self {
            _dir: dir,
            a,
            b,
            mapper,
            reverse,
        }
    }

    fn models(&self) -> RereadModels<'_> {
        RereadModels {
            source: &self.a,
            target: &self.b,
            mapper: &self.mapper,
            reverse: Some(&self.reverse),
        }
    }
}

fn text_options(tail: usize, reread: Option<&str>) -> TextEvalOptions {
    TextEvalOptions {
        prefix: 40,
        continuation: 16,
        probes: 8,
        anchor: 1,
        tail,
        reread: reread.map(|r| RereadSetting::parse(r).unwrap().unwrap()),
    }
}

#[test]
fn a_text_window_whose_middle_is_re_read_whole_is_the_targets_own_reading() {
    let p = Pair::new();
    let docs = vec![Document::new("d", tiny().text(600, 41))];
    let w = windows(&docs, &p.a.tokenizer, Split::Whole, 56, 2).unwrap();
    let eval = |tail, reread| eval_text_with(p.models(), &w, &text_options(tail, reread)).unwrap();

    let whole = eval(8, Some("1.0:round-trip:token"));
    assert!(whole.scores.agreement.kl < 1e-6, "{:?}", whole.scores);
    assert!(whole.scores.agreement.top1 > 0.999, "{:?}", whole.scores);
    // The 31 mapped positions between the anchor and the tail, every window.
    assert_eq!(whole.reread_positions, 31.0);
    let kept = whole.context_value_recovered;
    assert!(
        kept.is_none_or(|v| (v - 1.0).abs() < 1e-3),
        "the target's own reading keeps the whole value: {kept:?}"
    );

    let tail_only = eval(8, None);
    assert_eq!(tail_only.reread_positions, 0.0);
    assert!(
        tail_only.scores.agreement.kl > whole.scores.agreement.kl,
        "the map alone differs somewhere, or the test shows nothing: {:?}",
        tail_only.scores
    );
    // A share re-reads that share of the history (the anchor and tail included in what
    // the share is of), never more, where the history is long enough for the plan to
    // cost less than the re-prefill.
    let long = windows(&docs, &p.a.tokenizer, Split::Whole, 176, 2).unwrap();
    let opts = TextEvalOptions {
        prefix: 160,
        ..text_options(8, Some("0.25:source-attention:token"))
    };
    let part = eval_text_with(p.models(), &long, &opts).unwrap();
    assert_eq!(part.reread_positions, 38.0, "25% of 152 history positions");
    // On 32, the plan's two forward calls would cost more than the one re-prefill: the
    // guard has the target read the whole mapped part instead.
    let short = eval(8, Some("0.25:source-attention:token"));
    assert_eq!(short.reread_positions, 31.0);

    // The tail alone: measured on the same windows whatever the handoff, and a tail of
    // the whole prefix alone is the target's own reading of it.
    assert!(tail_only.ppl_tail_alone.is_some());
    assert_eq!(tail_only.ppl_tail_alone, whole.ppl_tail_alone);
    let all = eval(40, None);
    let (alone, truth) = (all.ppl_tail_alone.unwrap(), all.scores.ppl_true);
    assert!((alone / truth - 1.0).abs() < 1e-4, "{alone} vs {truth}");
    assert_eq!(
        eval(0, None).ppl_tail_alone,
        None,
        "no tail, nothing to compare"
    );
}

#[test]
fn a_text_re_read_without_a_tail_is_refused_with_the_flag_to_give() {
    let p = Pair::new();
    let docs = vec![Document::new("d", tiny().text(300, 42))];
    let w = windows(&docs, &p.a.tokenizer, Split::Whole, 56, 1).unwrap();
    let e = eval_text_with(p.models(), &w, &text_options(0, Some("0.2")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--tail"), "{e}");
}

#[test]
fn a_generation_context_re_read_whole_with_the_question_read_answers_as_the_target() {
    let p = Pair::new();
    let t = tiny();
    let shots = t.text(30, 5);
    let gen: Vec<TaskItem> = (0..3u64)
        .map(|i| TaskItem::Generate {
            doc_id: i,
            context: format!("{shots} Question: {}", t.text(6, 300 + i)),
            stop: vec![],
            max_tokens: 8,
            answer: "1".into(),
        })
        .collect();
    let def = task_def("gsm8k").unwrap();
    let eval = |reread: Option<&str>, reads_question: bool| {
        let o = TaskEvalOptions {
            anchor: 1,
            target_reads_question: reads_question,
            reread: reread.map(|r| RereadSetting::parse(r).unwrap().unwrap()),
            ..TaskEvalOptions::default()
        };
        eval_task_with(p.models(), def, &gen, &o, &mut |_| {})
    };
    let whole = eval(Some("1.0:target-attention:token"), true).unwrap();
    assert!(
        whole
            .outcomes
            .iter()
            .all(|o| o.identical_generation == Some(true)),
        "{:?}",
        whole.outcomes
    );
    assert!(whole.reread_positions > 0.0);
    assert_eq!(
        whole.reread,
        RereadSetting::parse("1.0:target-attention:token").unwrap()
    );

    let mapped = eval(None, true).unwrap();
    assert!(
        mapped
            .outcomes
            .iter()
            .any(|o| o.identical_generation == Some(false)),
        "the map alone differs somewhere, or the test shows nothing: {:?}",
        mapped.outcomes
    );
    let e = eval(Some("0.2"), false).unwrap_err().to_string();
    assert!(e.contains("--target-reads-question"), "{e}");
}
