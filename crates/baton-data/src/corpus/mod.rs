//! Calibration and evaluation text: files in, fixed-length token windows out.
//!
//! Every file is cut into three disjoint regions by character offset — the first 70% for
//! fitting, the next 10% for choosing k and λ, the last 20% for evaluation — so the
//! default corpus serves all three without one ever seeing another's text.
//!
//! Memory does not grow with the corpus: plain files are scanned once when read and
//! then read in blocks, .jsonl files a line at a time, and windows are taken from each
//! document in turn only until enough are taken ([`units`]).

mod file_text;
mod html;
mod jsonl;
mod units;
mod walk;

pub use file_text::FileText;
pub use html::html_to_text;
pub use walk::expand_inputs;

use baton_fetch as fetch;
use baton_runtime::text::TextTokenizer;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("cannot read corpus file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} line {line}: not a JSON object with a \"text\" string ({reason}); JSONL corpora need one {{\"text\": ...}} object per line")]
    Jsonl {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("unsupported corpus file {0}: use plain text (.txt .utf8 .md .py .rs and other source files), .html, or .jsonl with a \"text\" field")]
    Extension(PathBuf),
    #[error("the corpus yields only {got} windows of {len} tokens, {want} were asked for: add text (--corpus) or ask for fewer sequences")]
    TooSmall { got: usize, want: usize, len: usize },
    #[error("the text holds no window of {len} tokens to evaluate: give longer --texts, or a shorter --prefix and --continuation")]
    NoWindow { len: usize },
    #[error("{0} holds no file baton reads as text: give .txt/.md/.py/.rs/.html/.jsonl files or directories holding them")]
    NoTextFiles(String),
    #[error("{path} {reason}: name a text file or a directory of them")]
    NotText { path: PathBuf, reason: String },
    #[error(
        "no text of the evaluation package is named {0:?}: give one of {1}, or a file or directory"
    )]
    UnknownPackageText(String, String),
    #[error("{path} is larger than {limit_mib} MiB, the most read of an HTML page: save its text as a .txt file and give that")]
    TooLarge { path: PathBuf, limit_mib: u64 },
    #[error("cannot render calibration text as a conversation: {0}")]
    Template(String),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error(transparent)]
    Tokenizer(#[from] baton_runtime::text::TokenizerError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Fit,
    Select,
    Eval,
    /// All of each document: text the user names as held out.
    Whole,
}

impl Split {
    /// The share of each document this split takes, as a fraction range.
    pub(super) fn range(self) -> (f64, f64) {
        match self {
            Split::Fit => (0.0, 0.7),
            Split::Select => (0.7, 0.8),
            Split::Eval => (0.8, 1.0),
            Split::Whole => (0.0, 1.0),
        }
    }
}

/// One named text of a corpus: in memory, or a file read when windows are cut from it.
#[derive(Debug, Clone)]
pub struct Document {
    pub name: String,
    body: Body,
}

#[derive(Debug, Clone)]
enum Body {
    Text(String),
    /// A plain-text file, scanned and read in blocks.
    File(FileText),
    /// A .jsonl file: each line's `"text"` is a document of its own, named
    /// `<file name>:<line>`.
    Jsonl(PathBuf),
}

impl Document {
    /// A document held in memory.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            body: Body::Text(text.into()),
        }
    }

    /// Its text, when it is held in memory (files are read as windows are cut).
    pub fn text(&self) -> Option<&str> {
        match &self.body {
            Body::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// A corpus as read: its documents, and the fingerprint of their text computed in the
/// same pass.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub docs: Vec<Document>,
    pub fingerprint: String,
}

/// The largest HTML page read: a page is read whole to find its text.
const MAX_HTML: u64 = 256 << 20;

/// The default corpus: the plain-text calibration files of the exllamav2 package.
pub fn default_files() -> Result<Vec<PathBuf>, CorpusError> {
    let dir = fetch::ensure_by_name("calibration-text", &fetch::SilentProgress)?.path;
    let rd = std::fs::read_dir(&dir).map_err(|e| CorpusError::Io {
        path: dir.clone(),
        source: e,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "utf8"))
        .collect();
    files.sort();
    Ok(files)
}

/// Extensions read as plain text: prose and source code.
const PLAIN: &[&str] = &[
    "txt", "utf8", "text", "md", "rst", "py", "rs", "c", "h", "cc", "cpp", "js", "ts", "go",
    "java", "toml", "sh",
];

fn supported(path: &std::path::Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| PLAIN.contains(&e) || matches!(e, "jsonl" | "html" | "htm"))
}

/// Reads `files` once, in order: plain text and source files are checked to be UTF-8
/// and counted (their text is read again, in blocks, when windows are cut), HTML pages
/// are read whole to their text, and every line of a .jsonl file is checked to hold a
/// `"text"` string. `progress(bytes_done, bytes_total)` is told after each block.
pub fn read_corpus(
    files: &[PathBuf],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Corpus, CorpusError> {
    let total: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let mut h = Sha256::new();
    let mut docs = Vec::with_capacity(files.len());
    let mut done = 0u64;
    progress(0, total);
    for path in files {
        let io = |e| CorpusError::Io {
            path: path.clone(),
            source: e,
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = match path.extension().and_then(|e| e.to_str()) {
            Some(e) if PLAIN.contains(&e) => {
                h.update(name.as_bytes());
                h.update([0]);
                let f = FileText::scan(path, |block| {
                    h.update(block);
                    done += block.len() as u64;
                    progress(done, total);
                })?;
                h.update([0]);
                Body::File(f)
            }
            Some("html") | Some("htm") => {
                let len = std::fs::metadata(path).map_err(io)?.len();
                if len > MAX_HTML {
                    return Err(CorpusError::TooLarge {
                        path: path.clone(),
                        limit_mib: MAX_HTML >> 20,
                    });
                }
                let text = html_to_text(&std::fs::read_to_string(path).map_err(io)?);
                hash_text(&mut h, &name, &text);
                done += len;
                progress(done, total);
                Body::Text(text)
            }
            Some("jsonl") => {
                let mut lines = jsonl::Lines::open(path)?;
                let start = done;
                while let Some(line) = lines.next() {
                    let (i, text) = line?;
                    hash_text(&mut h, &format!("{name}:{i}"), &text);
                    progress(start + lines.bytes, total);
                }
                done = start + lines.bytes;
                Body::Jsonl(path.clone())
            }
            _ => return Err(CorpusError::Extension(path.clone())),
        };
        docs.push(Document { name, body });
    }
    Ok(Corpus {
        docs,
        fingerprint: hex::encode(h.finalize()),
    })
}

/// [`read_corpus`] without progress.
pub fn read_documents(files: &[PathBuf]) -> Result<Vec<Document>, CorpusError> {
    Ok(read_corpus(files, &mut |_, _| {})?.docs)
}

fn hash_text(h: &mut Sha256, name: &str, text: &str) {
    h.update(name.as_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    h.update([0]);
}

/// sha256 over document names and texts: names what a mapper was fitted on. Files are
/// read again for it; [`read_corpus`] gives the same value from its one pass.
pub fn fingerprint(docs: &[Document]) -> String {
    let mut h = Sha256::new();
    let read = (|| -> Result<(), CorpusError> {
        for d in docs {
            match &d.body {
                Body::Text(t) => hash_text(&mut h, &d.name, t),
                Body::File(f) => {
                    h.update(d.name.as_bytes());
                    h.update([0]);
                    for block in f.blocks((0, f.bytes))? {
                        h.update(block?.as_bytes());
                    }
                    h.update([0]);
                }
                Body::Jsonl(p) => {
                    for line in jsonl::Lines::open(p)? {
                        let (i, text) = line?;
                        hash_text(&mut h, &format!("{}:{i}", d.name), &text);
                    }
                }
            }
        }
        Ok(())
    })();
    match read {
        Ok(()) => hex::encode(h.finalize()),
        // A file that cannot be read again has no fingerprint to give; one that no text
        // can have says so, rather than a hash of part of it.
        Err(e) => {
            tracing::warn!("corpus fingerprint: {e}");
            format!("unreadable: {e}")
        }
    }
}

pub(super) fn char_slice(text: &str, from: f64, to: f64) -> &str {
    let n = text.chars().count();
    let a = (n as f64 * from) as usize;
    let b = (n as f64 * to) as usize;
    let start = text
        .char_indices()
        .nth(a)
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    let end = text
        .char_indices()
        .nth(b)
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    &text[start..end]
}

/// The files a command reads its text from: those named (directories expanded), or the
/// default calibration text when none is named.
pub fn files_or_default(named: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    if named.is_empty() {
        return default_files();
    }
    let files = expand_inputs(named)?;
    if files.is_empty() {
        let named: Vec<String> = named.iter().map(|p| p.display().to_string()).collect();
        return Err(CorpusError::NoTextFiles(named.join(", ")));
    }
    Ok(files)
}

/// Up to `count` windows of exactly `len` tokens from `split` of the documents, taken in
/// turn from each document so every domain is represented.
pub fn windows(
    docs: &[Document],
    tok: &TextTokenizer,
    split: Split,
    len: usize,
    count: usize,
) -> Result<Vec<Vec<u32>>, CorpusError> {
    let range = split.range();
    let per_doc = units::units(docs).map(|u| u.and_then(|u| u.windows(tok, range, len)));
    take_in_turn(per_doc, count, len)
}

/// Windows `conversations` makes of each document's tokens of `split` (its end, for a
/// large file), taken in turn from each document from its last window backwards.
pub(crate) fn chat_windows_with(
    docs: &[Document],
    tok: &TextTokenizer,
    split: Split,
    len: usize,
    count: usize,
    conversations: impl Fn(&[u32]) -> Result<Vec<Vec<u32>>, CorpusError>,
) -> Result<Vec<Vec<u32>>, CorpusError> {
    let range = split.range();
    let per_doc = units::units(docs).map(|u| {
        let ids = u?.tail_tokens(tok, range)?;
        Ok(conversations(&ids)?.into_iter().rev().map(Ok))
    });
    take_in_turn(per_doc, count, len)
}

/// Up to `count` windows taken in turn from each document's windows, so that every
/// domain is represented; fewer than `count` is [`CorpusError::TooSmall`]. Documents are
/// reached one at a time: the first round stops at the document that completes `count`,
/// and only documents that gave a window are held for the next rounds.
pub(super) fn take_in_turn<I>(
    docs: impl Iterator<Item = Result<I, CorpusError>>,
    count: usize,
    len: usize,
) -> Result<Vec<Vec<u32>>, CorpusError>
where
    I: Iterator<Item = Result<Vec<u32>, CorpusError>>,
{
    let mut out = Vec::with_capacity(count.min(1 << 16));
    let mut held = Vec::new();
    for doc in docs {
        if out.len() == count {
            break;
        }
        let mut doc = doc?;
        if let Some(w) = doc.next() {
            out.push(w?);
            held.push(doc);
        }
    }
    while out.len() < count && !held.is_empty() {
        let mut i = 0;
        while i < held.len() && out.len() < count {
            match held[i].next() {
                Some(w) => {
                    out.push(w?);
                    i += 1;
                }
                None => {
                    held.remove(i);
                }
            }
        }
    }
    if out.len() < count {
        return Err(CorpusError::TooSmall {
            got: out.len(),
            want: count,
            len,
        });
    }
    Ok(out)
}

/// The name shown for a corpus made of `files`.
pub fn describe(files: &[PathBuf]) -> String {
    const SHOWN: usize = 8;
    let more = files.len().saturating_sub(SHOWN);
    let listed = files
        .iter()
        .take(SHOWN)
        .map(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string())
        })
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        format!("{listed} and {more} more ({} files)", files.len())
    } else {
        listed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_inputs_without_text_files_are_refused_not_replaced_by_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let e = files_or_default(&[dir.path().to_path_buf()]).unwrap_err();
        assert!(matches!(e, CorpusError::NoTextFiles(_)), "{e}");
        assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        );
        std::fs::write(dir.path().join("a.txt"), "text").unwrap();
        let files = files_or_default(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(files, vec![dir.path().join("a.txt")]);
    }

    #[test]
    fn splits_are_disjoint_and_cover_the_text() {
        let text: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let a = char_slice(&text, 0.0, 0.7);
        let b = char_slice(&text, 0.7, 0.8);
        let c = char_slice(&text, 0.8, 1.0);
        assert_eq!(a.len() + b.len() + c.len(), text.len());
        assert_eq!(format!("{a}{b}{c}"), text);
    }

    #[test]
    fn directories_expand_to_their_supported_files_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pkg/sub")).unwrap();
        for f in [
            "pkg/b.py",
            "pkg/a.py",
            "pkg/sub/c.rs",
            "pkg/image.png",
            "pkg/d.html",
        ] {
            std::fs::write(dir.path().join(f), "x = 1\n").unwrap();
        }
        let files = expand_inputs(&[dir.path().join("pkg")]).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            ["pkg/a.py", "pkg/b.py", "pkg/d.html", "pkg/sub/c.rs"]
        );
        let docs = read_documents(&files).unwrap();
        assert_eq!(docs.len(), 4);
        assert!(read_documents(&[dir.path().join("pkg/image.png")]).is_err());
    }

    #[test]
    fn jsonl_needs_a_text_field_and_says_which_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        std::fs::write(&p, "{\"text\": \"one\"}\n\n{\"body\": \"two\"}\n").unwrap();
        let e = read_documents(&[p]).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("\"text\""), "{e}");
    }
}
