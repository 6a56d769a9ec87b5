//! A study's results read back: which items are missing, and for each variant and
//! direction the fidelity by turn number with 95% intervals that resample whole
//! conversations (one item is one conversation: its turns are not independent), a paired
//! comparison of two variants on the same conversations, and the items whose answers
//! differ between repeats.
//!
//! Per turn: F1 and exact match of the mapped answer against the script's expected
//! answers (SQuAD-style, the best over the answers given), the same of the re-prefilled
//! reference answer, whether the mapped answer is identical to the reference's, the
//! share of their tokens that agree, and at a turn a switch handed over, that switch's
//! mean attention-output cosine and next-token agreement (with the reference path on).

use super::file::Direction;
use super::gap::gap_recovered;
use super::items::{item_turns, same_conversation, ItemTurn, ReadItem, RESAMPLES, SEED};
use super::plan::Manifest;
use super::run::session_path;
use super::StudyError;
use baton_method::metrics::interval::{cluster_bootstrap, Estimate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const FORMAT: &str = "baton-study-report";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudyReport {
    pub format: String,
    pub version: u32,
    pub study: String,
    pub items: usize,
    /// Items of the manifest with no session (not run, failed, or still running).
    pub missing: Vec<String>,
    /// Items whose file is there but does not read as a session (another file put in
    /// its place, or a damaged one): left out of every figure, with why.
    #[serde(default)]
    pub unreadable: Vec<Unreadable>,
    pub groups: Vec<Group>,
    /// Each other variant against `--against`, on the conversations both ran.
    pub comparisons: Vec<Comparison>,
    /// Items whose mapped answers differ between repeats of the same conversation.
    pub differing_repeats: Vec<String>,
}

/// An item's file that is not a session this report can read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unreadable {
    pub id: String,
    pub reason: String,
}

/// One variant in one direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub variant: String,
    pub direction: Direction,
    pub conversations: usize,
    pub turns: Vec<TurnStats>,
    /// Over every turn with expected answers.
    pub f1: Option<Estimate>,
    pub reference_f1: Option<Estimate>,
    /// Mapped F1 over reference F1.
    pub retention: Option<Estimate>,
    /// Over every turn answered on both paths.
    pub identical: Option<Estimate>,
    pub agreement: Option<Estimate>,
    /// Whether this variant leaves the switches out: its F1 is the first model's alone.
    #[serde(default)]
    pub source_alone: bool,
    /// (F1 mapped − F1 source alone) / (F1 re-prefilled − F1 source alone) on the turns
    /// scored on all three, the source alone taken from the study's `switch = false`
    /// variant on the same conversation.
    #[serde(default)]
    pub gap_recovered: Option<Estimate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    pub turn: u32,
    pub conversations: usize,
    pub f1: Option<Estimate>,
    pub exact: Option<Estimate>,
    pub reference_f1: Option<Estimate>,
    pub identical: Option<Estimate>,
    pub agreement: Option<Estimate>,
    /// The switches handed over at this turn: mean attention cosine, next-token agreement.
    pub attention_cosine: Option<Estimate>,
    pub next_token: Option<Estimate>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub variant: String,
    pub against: String,
    pub direction: Direction,
    /// What is compared per conversation: mean F1 where expected answers are given, else
    /// mean token agreement with the reference.
    pub measure: String,
    pub pairs: usize,
    /// `variant` minus `against`, with its paired 95% interval.
    pub difference: Estimate,
    /// The conversations where `variant` scored lower, worst first.
    pub worse: Vec<(String, f64)>,
}

/// The mean of `values` (one per conversation, `cluster` naming it) with its interval.
fn mean(values: &[(usize, f64)]) -> Option<Estimate> {
    if values.is_empty() {
        return None;
    }
    let rows: Vec<[f64; 1]> = values.iter().map(|&(_, v)| [v]).collect();
    let cluster: Vec<usize> = values.iter().map(|&(c, _)| c).collect();
    Some(cluster_bootstrap(
        &rows,
        &cluster,
        |m| Some(m[0]),
        RESAMPLES,
        SEED,
    ))
}

/// Reads every item's session under `out` and sums the study up; `against` names the
/// variant the others are compared with.
pub fn report(
    manifest: &Manifest,
    out: &Path,
    against: Option<&str>,
) -> Result<StudyReport, StudyError> {
    if let Some(v) = against {
        if !manifest.variants.contains_key(v) {
            return Err(StudyError::Item(format!(
                "--against {v}: the study has no such variant (it has {})",
                manifest
                    .variants
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    manifest.check_ids()?;
    let mut missing = Vec::new();
    let mut unreadable = Vec::new();
    let mut read: Vec<ReadItem<'_>> = Vec::new();
    for item in &manifest.items {
        let path = session_path(out, item);
        if !path.is_file() {
            missing.push(item.id.clone());
            continue;
        }
        // One file that is not a session says nothing about the others: the report
        // goes on without it and names it.
        match item_turns(item, &path) {
            Ok(turns) => read.push((item, turns)),
            Err(e) => {
                tracing::warn!("study report: skipped {}: {e}", path.display());
                unreadable.push(Unreadable {
                    id: item.id.clone(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let mut groups = Vec::new();
    let mut keys: Vec<(String, Direction)> = read
        .iter()
        .map(|(i, _)| (i.variant.clone(), i.direction))
        .collect();
    keys.sort();
    keys.dedup();
    for (variant, direction) in &keys {
        let members: Vec<(usize, &BTreeMap<u32, ItemTurn>)> = read
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| &i.variant == variant && i.direction == *direction)
            .map(|(k, (_, t))| (k, t))
            .collect();
        let mut g = group(variant, *direction, &members);
        g.source_alone = manifest.variants.get(variant).is_some_and(|v| v.stays());
        if let Some(stay) = manifest
            .variants
            .iter()
            .find(|(_, v)| v.stays())
            .map(|(n, _)| n.as_str())
            .filter(|n| n != variant)
        {
            g.gap_recovered = gap_recovered(&read, variant, *direction, stay);
        }
        groups.push(g);
    }
    let comparisons = match against {
        Some(base) => compare(&read, base),
        None => Vec::new(),
    };
    Ok(StudyReport {
        format: FORMAT.into(),
        version: VERSION,
        study: manifest.study.clone(),
        items: manifest.items.len(),
        missing,
        unreadable,
        groups,
        comparisons,
        differing_repeats: differing_repeats(&read),
    })
}

fn group(
    variant: &str,
    direction: Direction,
    members: &[(usize, &BTreeMap<u32, ItemTurn>)],
) -> Group {
    let turns: std::collections::BTreeSet<u32> = members
        .iter()
        .flat_map(|(_, t)| t.keys().copied())
        .collect();
    let column = |turn: Option<u32>, f: &dyn Fn(&ItemTurn) -> Option<f64>| -> Vec<(usize, f64)> {
        members
            .iter()
            .flat_map(|(k, t)| {
                t.iter()
                    .filter(move |(n, _)| turn.is_none_or(|x| x == **n))
                    .filter_map(move |(_, row)| f(row).map(|v| (*k, v)))
            })
            .collect()
    };
    let by_turn = turns
        .iter()
        .map(|&turn| TurnStats {
            turn,
            conversations: members
                .iter()
                .filter(|(_, t)| t.contains_key(&turn))
                .count(),
            f1: mean(&column(Some(turn), &|r| r.f1)),
            exact: mean(&column(Some(turn), &|r| r.exact)),
            reference_f1: mean(&column(Some(turn), &|r| r.reference_f1)),
            identical: mean(&column(Some(turn), &|r| r.identical)),
            agreement: mean(&column(Some(turn), &|r| r.agreement)),
            attention_cosine: mean(&column(Some(turn), &|r| r.cosine)),
            next_token: mean(&column(Some(turn), &|r| r.next_token)),
        })
        .collect();
    // Retention on the turns scored on both paths, resampling conversations together.
    let both: Vec<(usize, [f64; 2])> = members
        .iter()
        .flat_map(|(k, t)| {
            t.values()
                .filter_map(move |r| Some((*k, [r.f1?, r.reference_f1?])))
        })
        .collect();
    let retention = (!both.is_empty()).then(|| {
        let rows: Vec<[f64; 2]> = both.iter().map(|(_, r)| *r).collect();
        let cluster: Vec<usize> = both.iter().map(|(c, _)| *c).collect();
        cluster_bootstrap(
            &rows,
            &cluster,
            |m| (m[1] > 0.0).then(|| m[0] / m[1]),
            RESAMPLES,
            SEED,
        )
    });
    Group {
        variant: variant.to_string(),
        direction,
        conversations: members.len(),
        turns: by_turn,
        f1: mean(&column(None, &|r| r.f1)),
        reference_f1: mean(&column(None, &|r| r.reference_f1)),
        retention,
        identical: mean(&column(None, &|r| r.identical)),
        agreement: mean(&column(None, &|r| r.agreement)),
        source_alone: false,
        gap_recovered: None,
    }
}

/// A conversation's score: mean F1 over its expected answers, or mean agreement.
fn score(turns: &BTreeMap<u32, ItemTurn>, by_f1: bool) -> Option<f64> {
    let v: Vec<f64> = turns
        .values()
        .filter_map(|r| if by_f1 { r.f1 } else { r.agreement })
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn compare(read: &[ReadItem<'_>], base: &str) -> Vec<Comparison> {
    let by_f1 = read.iter().any(|(i, _)| !i.expected.is_empty());
    let mut variants: Vec<(&str, Direction)> = read
        .iter()
        .filter(|(i, _)| i.variant != base)
        .map(|(i, _)| (i.variant.as_str(), i.direction))
        .collect();
    variants.sort();
    variants.dedup();
    let mut out = Vec::new();
    for (variant, direction) in variants {
        let mut diffs: Vec<(String, f64)> = Vec::new();
        for (item, turns) in read
            .iter()
            .filter(|(i, _)| i.variant == variant && i.direction == direction)
        {
            let Some(other) = same_conversation(read, item, base) else {
                continue;
            };
            if let (Some(a), Some(b)) = (score(turns, by_f1), score(&other.1, by_f1)) {
                diffs.push((item.id.clone(), a - b));
            }
        }
        let Some(difference) = mean(
            &diffs
                .iter()
                .enumerate()
                .map(|(k, (_, d))| (k, *d))
                .collect::<Vec<_>>(),
        ) else {
            continue;
        };
        let mut worse: Vec<(String, f64)> =
            diffs.iter().filter(|(_, d)| *d < 0.0).cloned().collect();
        worse.sort_by(|a, b| a.1.total_cmp(&b.1));
        out.push(Comparison {
            variant: variant.to_string(),
            against: base.to_string(),
            direction,
            measure: if by_f1 { "F1" } else { "agreement" }.into(),
            pairs: diffs.len(),
            difference,
            worse,
        });
    }
    out
}

fn differing_repeats(read: &[ReadItem<'_>]) -> Vec<String> {
    let mut by_conversation: BTreeMap<(String, [String; 2], String), Vec<&ReadItem<'_>>> =
        BTreeMap::new();
    for r in read {
        let i = r.0;
        by_conversation
            .entry((i.script.clone(), i.models.clone(), i.variant.clone()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for runs in by_conversation.values().filter(|r| r.len() > 1) {
        let answers = |r: &ReadItem<'_>| {
            r.1.values()
                .map(|t| t.mapped_text.clone())
                .collect::<Vec<_>>()
        };
        let first = answers(runs[0]);
        for r in &runs[1..] {
            if answers(r) != first {
                out.push(r.0.id.clone());
            }
        }
    }
    out
}

fn est(e: &Option<Estimate>) -> String {
    match e {
        Some(e) if e.value.is_finite() => {
            format!("{:.3} [{:.3}, {:.3}]", e.value, e.ci95[0], e.ci95[1])
        }
        _ => "-".into(),
    }
}

/// The report as text: completeness, a table per variant and direction, comparisons.
pub fn render(r: &StudyReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let done = r.items - r.missing.len() - r.unreadable.len();
    let _ = writeln!(s, "study {}: {done} of {} items recorded", r.study, r.items);
    if !r.unreadable.is_empty() {
        let n = r.unreadable.len();
        let _ = writeln!(
            s,
            "SKIPPED: {n} {} not a session this report reads (left out of every figure):",
            if n == 1 {
                "item's file is"
            } else {
                "items' files are"
            }
        );
        for u in &r.unreadable {
            let _ = writeln!(s, "  {}: {}", u.id, u.reason);
        }
    }
    if !r.missing.is_empty() {
        let n = r.missing.len();
        let _ = writeln!(
            s,
            "INCOMPLETE: {n} {} no session (not run, failed, or running):",
            if n == 1 { "item has" } else { "items have" }
        );
        for id in &r.missing {
            let _ = writeln!(s, "  {id}");
        }
    }
    for g in &r.groups {
        let _ = writeln!(
            s,
            "\n{} · {} · {} conversations{}",
            g.variant,
            g.direction,
            g.conversations,
            if g.source_alone {
                " · no switch: the first model answers alone"
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "  {:>4}  {:>3}  {:<22} {:<22} {:<22} {:<22} {:<22}",
            "turn",
            "n",
            "F1 (mapped)",
            "F1 (re-prefilled)",
            "identical",
            "token agreement",
            "attention cosine"
        );
        for t in &g.turns {
            let _ = writeln!(
                s,
                "  {:>4}  {:>3}  {:<22} {:<22} {:<22} {:<22} {:<22}",
                t.turn,
                t.conversations,
                est(&t.f1),
                est(&t.reference_f1),
                est(&t.identical),
                est(&t.agreement),
                est(&t.attention_cosine)
            );
        }
        let _ = writeln!(
            s,
            "  all turns: F1 {} · re-prefilled {} · retention {} · identical {} · agreement {}",
            est(&g.f1),
            est(&g.reference_f1),
            est(&g.retention),
            est(&g.identical),
            est(&g.agreement)
        );
        if g.gap_recovered.is_some() {
            let _ = writeln!(
                s,
                "  gap recovered (from the first model alone to the re-prefilled target): {}",
                est(&g.gap_recovered)
            );
        }
    }
    for c in &r.comparisons {
        let _ = writeln!(
            s,
            "\n{} against {} ({}, {} conversations): {} difference {}",
            c.variant,
            c.against,
            c.direction,
            c.pairs,
            c.measure,
            est(&Some(c.difference))
        );
        for (id, d) in &c.worse {
            let _ = writeln!(s, "  worse: {id} ({d:+.3})");
        }
    }
    if !r.differing_repeats.is_empty() {
        let _ = writeln!(s, "\nanswers differ between repeats:");
        for id in &r.differing_repeats {
            let _ = writeln!(s, "  {id}");
        }
    }
    s
}
