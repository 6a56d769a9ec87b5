//! A study expanded into work items: every script × pair × direction × variant × repeat,
//! each with an id that depends only on what it runs (not on its place in the list), so
//! that adding a script or a variant leaves the other items' ids, and their finished
//! sessions, as they were. The manifest lists them and is saved with the results.

use super::file::{Direction, Study, Variant};
use super::StudyError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MANIFEST_FORMAT: &str = "baton-study-manifest";
pub const MANIFEST_VERSION: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";

/// One conversation to run and record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkItem {
    /// `<script>.<first model>-to-<second model>.<variant>.r<repeat>`, with every
    /// character outside `[A-Za-z0-9._-]` made `-`: the session file is `<id>.jsonl`.
    pub id: String,
    /// The script's name in the study (its path relative to the study file, no `.toml`).
    pub script: String,
    pub script_sha256: String,
    /// The two models, the one that starts first.
    pub models: [String; 2],
    pub direction: Direction,
    pub variant: String,
    /// From 1.
    pub repeat: u32,
    /// Expected answers by turn, from the script.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub expected: BTreeMap<u32, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub study: String,
    pub study_sha256: String,
    pub variants: BTreeMap<String, Variant>,
    pub items: Vec<WorkItem>,
}

impl Manifest {
    /// Refuses an item id that is not a plain file name: the session path joins it to
    /// the items folder, so a separator or `..` would lead outside it.
    pub fn check_ids(&self) -> Result<(), StudyError> {
        for item in &self.items {
            if let Some(reason) = not_plain(&item.id) {
                return Err(StudyError::BadItemId {
                    id: item.id.clone(),
                    reason: reason.into(),
                });
            }
        }
        Ok(())
    }
}

/// Why `name` is not a plain file name, if it is not.
fn not_plain(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name == "." || name == ".." {
        Some("names a directory")
    } else if name.contains(['/', '\\']) {
        Some("holds a path separator")
    } else if name.contains('\0') {
        Some("holds a NUL character")
    } else {
        None
    }
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Every work item of `study`, in a fixed order: scripts, then pairs, directions,
/// variants and repeats.
pub fn plan(study: &Study) -> Manifest {
    let mut items = Vec::new();
    for s in &study.scripts {
        for pair in &study.pairs {
            for &direction in &study.directions {
                let models = direction.order(pair).map(String::from);
                for variant in study.variants.keys() {
                    for repeat in 1..=study.repeats {
                        let id = file_safe(&format!(
                            "{}.{}-to-{}.{variant}.r{repeat}",
                            s.name, models[0], models[1]
                        ));
                        items.push(WorkItem {
                            id,
                            script: s.name.clone(),
                            script_sha256: s.sha256.clone(),
                            models: models.clone(),
                            direction,
                            variant: variant.clone(),
                            repeat,
                            expected: s.script.expected.clone(),
                        });
                    }
                }
            }
        }
    }
    Manifest {
        format: MANIFEST_FORMAT.into(),
        version: MANIFEST_VERSION,
        study: study.name.clone(),
        study_sha256: study.sha256.clone(),
        variants: study.variants.clone(),
        items,
    }
}

/// Which part of the items one process runs: item `k` belongs to shard `k % count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// `i/n`, `i` from 0 to `n - 1`.
    pub fn parse(s: &str) -> Result<Self, StudyError> {
        let bad = |reason: String| StudyError::Shard(format!("--shard {s:?}: {reason}"));
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| bad("give it as INDEX/COUNT, e.g. 0/4, or `auto`".into()))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| bad(format!("{i:?} is not a shard index")))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| bad(format!("{n:?} is not a shard count")))?;
        Self::new(index, count).map_err(|e| match e {
            StudyError::Shard(r) => bad(r),
            other => other,
        })
    }

    pub fn new(index: usize, count: usize) -> Result<Self, StudyError> {
        if count == 0 {
            return Err(StudyError::Shard(
                "a study splits into 1 or more shards".into(),
            ));
        }
        if index >= count {
            return Err(StudyError::Shard(format!(
                "shard {index} of {count} is out of range: shards run from 0 to {}",
                count - 1
            )));
        }
        Ok(Self { index, count })
    }

    /// The shard a scheduler gave this process: a Slurm array task
    /// (`SLURM_ARRAY_TASK_ID` from `SLURM_ARRAY_TASK_MIN`, of `SLURM_ARRAY_TASK_COUNT`)
    /// or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`, of `shards`).
    pub fn auto(
        env: &dyn Fn(&str) -> Option<String>,
        shards: Option<usize>,
    ) -> Result<Self, StudyError> {
        let num = |key: &str| -> Result<Option<usize>, StudyError> {
            env(key)
                .map(|v| {
                    v.trim().parse::<usize>().map_err(|_| {
                        StudyError::Shard(format!("{key}={v:?} is not a whole number"))
                    })
                })
                .transpose()
        };
        if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let count = match num("SLURM_ARRAY_TASK_COUNT")? {
                Some(c) => c,
                None => shards.ok_or_else(|| {
                    StudyError::Shard(
                        "SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_COUNT: give --shards N"
                            .into(),
                    )
                })?,
            };
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let index = id.checked_sub(min).ok_or_else(|| {
                StudyError::Shard(format!(
                    "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"
                ))
            })?;
            return Self::new(index, count);
        }
        if let Some(index) = num("JOB_COMPLETION_INDEX")? {
            let count = shards.ok_or_else(|| {
                StudyError::Shard(
                    "JOB_COMPLETION_INDEX is set: give the Job's completions as --shards N".into(),
                )
            })?;
            return Self::new(index, count);
        }
        Err(StudyError::Shard(
            "--shard auto found neither SLURM_ARRAY_TASK_ID nor JOB_COMPLETION_INDEX: run it \
             as a Slurm array task or a Kubernetes Indexed Job, or give --shard INDEX/COUNT"
                .into(),
        ))
    }

    /// The items of `manifest` this shard runs.
    pub fn items<'a>(&self, manifest: &'a Manifest) -> Vec<&'a WorkItem> {
        manifest
            .items
            .iter()
            .enumerate()
            .filter(|(k, _)| k % self.count == self.index)
            .map(|(_, item)| item)
            .collect()
    }
}
