//! The evaluation package's request files (`requests.jsonl.gz`): HellaSwag, ARC,
//! WinoGrande and PIQA as multiple choice, GSM8K as generation with a numeric answer.

use super::{Choice, TaskError, TaskItem, TaskKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

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

/// The first `limit` items of a request file: for multiple choice, `limit` documents with
/// their choices in order; for generation (GSM8K), `limit` requests.
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
    let mut documents = Documents::default();
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
                if !documents.add(r, limit).map_err(|e| perr(n, e))? {
                    break;
                }
            }
            TaskKind::GenerateNumber => {
                if items.len() == limit {
                    break;
                }
                items.push(generate_item(r).map_err(|e| perr(n, e))?);
            }
        }
    }
    if kind == TaskKind::MultipleChoice {
        items = documents.into_items().map_err(|e| perr(0, e))?;
    }
    Ok(items)
}

/// Multiple-choice requests grouped per document. Requests of one document are contiguous
/// in these files; documents are kept in order of first appearance.
#[derive(Default)]
struct Documents {
    order: Vec<u64>,
    /// Per document: (choice index, choice) as read, and the gold index.
    by_id: BTreeMap<u64, (Vec<(usize, Choice)>, usize)>,
}

impl Documents {
    /// Adds one request's choice; `false`, adding nothing, when it would start a document
    /// past `limit` (the reader then stops). An error is the reason the line is bad.
    fn add(&mut self, r: RawRequest, limit: usize) -> Result<bool, String> {
        if r.request_type != "loglikelihood" {
            return Err(format!("unexpected request type {}", r.request_type));
        }
        let cont = r
            .request
            .continuation
            .ok_or_else(|| "no continuation".to_string())?;
        let gold =
            gold_index(r.label.as_ref(), &r.doc).ok_or_else(|| "no gold label".to_string())?;
        if !self.by_id.contains_key(&r.doc_id) {
            if self.order.len() == limit {
                return Ok(false);
            }
            self.order.push(r.doc_id);
        }
        let e = self
            .by_id
            .entry(r.doc_id)
            .or_insert_with(|| (Vec::new(), gold));
        e.0.push((
            r.idx,
            Choice {
                context: r.request.context,
                continuation: cont,
            },
        ));
        Ok(true)
    }

    /// One item per document, its choices sorted by their index.
    fn into_items(mut self) -> Result<Vec<TaskItem>, String> {
        let mut items = Vec::with_capacity(self.order.len());
        for id in self.order {
            let Some((mut choices, gold)) = self.by_id.remove(&id) else {
                continue;
            };
            choices.sort_by_key(|(i, _)| *i);
            let choices: Vec<Choice> = choices.into_iter().map(|(_, c)| c).collect();
            if gold >= choices.len() {
                return Err(format!(
                    "document {id}: gold {gold} but {} choices",
                    choices.len()
                ));
            }
            items.push(TaskItem::MultipleChoice {
                doc_id: id,
                choices,
                gold,
            });
        }
        Ok(items)
    }
}

/// A generation request (GSM8K's): its context and stop sequences, the length cap, and the
/// document's short answer. An error is the reason the line is bad.
fn generate_item(r: RawRequest) -> Result<TaskItem, String> {
    let answer = r
        .doc
        .get("short_answer")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| "no short_answer in the document".to_string())?;
    let max = r
        .request
        .generation_kwargs
        .as_ref()
        .and_then(|g| g.get("max_gen_toks"))
        .and_then(|v| v.as_u64())
        .map(|m| m as usize)
        .unwrap_or(GENERATE_MAX_TOKENS);
    Ok(TaskItem::Generate {
        doc_id: r.doc_id,
        context: r.request.context,
        stop: r.request.stop_sequences,
        max_tokens: max.min(GENERATE_MAX_TOKENS),
        answer,
    })
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
}
