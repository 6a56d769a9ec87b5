//! Calibration and evaluation text: files in, fixed-length token windows out.
//!
//! Every file is cut into three disjoint regions by character offset — the first 70% for
//! fitting, the next 10% for choosing k and λ, the last 20% for evaluation — so the
//! default corpus serves all three without one ever seeing another's text.

use crate::fetch;
use crate::text::TextTokenizer;
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
    #[error("the files and directories named hold no readable text files: give .txt/.md/.py/.rs/.html/.jsonl files or directories holding them")]
    NoTextFiles,
    #[error(
        "no text of the evaluation package is named {0:?}: give one of {1}, or a file or directory"
    )]
    UnknownPackageText(String, String),
    #[error("cannot render calibration text as a conversation: {0}")]
    Template(String),
    #[error(transparent)]
    Fetch(#[from] fetch::FetchError),
    #[error(transparent)]
    Tokenizer(#[from] crate::text::TokenizerError),
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

#[derive(Debug, Clone)]
pub struct Document {
    pub name: String,
    pub text: String,
}

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

/// Files as given, and directories walked recursively for supported files, each
/// directory's files in sorted order (so a corpus and its fingerprint are reproducible).
pub fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut stack = vec![p.clone()];
            let mut found = Vec::new();
            while let Some(dir) = stack.pop() {
                let rd = std::fs::read_dir(&dir).map_err(|e| CorpusError::Io {
                    path: dir.clone(),
                    source: e,
                })?;
                for e in rd.flatten() {
                    let path = e.path();
                    if path.is_dir() {
                        stack.push(path);
                    } else if supported(&path) {
                        found.push(path);
                    }
                }
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The readable text of an HTML page: scripts, styles and tags dropped, common entities
/// decoded, runs of blank lines collapsed.
pub fn html_to_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'<' {
            let skip_to = |close: &str| lower[i..].find(close).map(|j| i + j + close.len());
            let end = if lower[i..].starts_with("<script") {
                skip_to("</script>")
            } else if lower[i..].starts_with("<style") {
                skip_to("</style>")
            } else {
                lower[i..].find('>').map(|j| i + j + 1)
            };
            i = end.unwrap_or(bytes.len());
            continue;
        }
        let next = lower[i..].find('<').map(|j| i + j).unwrap_or(bytes.len());
        out.push_str(&html[i..next]);
        i = next;
    }
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    let mut text = String::with_capacity(decoded.len());
    let mut blank = 0;
    for line in decoded.lines() {
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// Read plain-text and source files whole, HTML as its text, and .jsonl files one
/// `text` field per line.
pub fn read_documents(files: &[PathBuf]) -> Result<Vec<Document>, CorpusError> {
    let mut docs = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).map_err(|e| CorpusError::Io {
            path: path.clone(),
            source: e,
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if PLAIN.contains(&e) => docs.push(Document { name, text }),
            Some("html") | Some("htm") => docs.push(Document {
                name,
                text: html_to_text(&text),
            }),
            Some("jsonl") => {
                for (i, line) in text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                {
                    let v: serde_json::Value =
                        serde_json::from_str(line).map_err(|e| CorpusError::Jsonl {
                            path: path.clone(),
                            line: i + 1,
                            reason: e.to_string(),
                        })?;
                    let t = v.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
                        CorpusError::Jsonl {
                            path: path.clone(),
                            line: i + 1,
                            reason: "no \"text\" string".into(),
                        }
                    })?;
                    docs.push(Document {
                        name: format!("{name}:{}", i + 1),
                        text: t.to_string(),
                    });
                }
            }
            _ => return Err(CorpusError::Extension(path.clone())),
        }
    }
    Ok(docs)
}

/// sha256 over document names and texts: names what a mapper was fitted on.
pub fn fingerprint(docs: &[Document]) -> String {
    let mut h = Sha256::new();
    for d in docs {
        h.update(d.name.as_bytes());
        h.update([0]);
        h.update(d.text.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
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
        return Err(CorpusError::NoTextFiles);
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
    let (from, to) = split.range();
    let mut per_doc: Vec<std::vec::IntoIter<Vec<u32>>> = Vec::new();
    for d in docs {
        let ids = tok.encode_raw(char_slice(&d.text, from, to))?;
        let chunks: Vec<Vec<u32>> = ids.chunks_exact(len).map(|c| c.to_vec()).collect();
        per_doc.push(chunks.into_iter());
    }
    take_in_turn(per_doc, count, len)
}

/// Up to `count` windows taken in turn from each document's windows, so that every
/// domain is represented; fewer than `count` is [`CorpusError::TooSmall`].
pub(super) fn take_in_turn<I: Iterator<Item = Vec<u32>>>(
    mut per_doc: Vec<I>,
    count: usize,
    len: usize,
) -> Result<Vec<Vec<u32>>, CorpusError> {
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let before = out.len();
        for it in per_doc.iter_mut() {
            if out.len() == count {
                break;
            }
            if let Some(w) = it.next() {
                out.push(w);
            }
        }
        if out.len() == before {
            break;
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
        assert!(matches!(e, CorpusError::NoTextFiles), "{e}");
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
    fn html_keeps_text_and_code_and_drops_markup() {
        let html = "<html><head><style>p{color:red}</style><script>var x = 1 < 2;</script></head>\n<body><h1>Ownership</h1>\n\n\n\n<pre><code>let s = String::from(&quot;hi&quot;);\nif a &lt; b &amp;&amp; c {}</code></pre></body></html>";
        let t = html_to_text(html);
        assert!(t.contains("Ownership"), "{t}");
        assert!(t.contains("let s = String::from(\"hi\");"), "{t}");
        assert!(t.contains("if a < b && c {}"), "{t}");
        assert!(!t.contains("color:red") && !t.contains("var x"), "{t}");
        assert!(!t.contains("\n\n\n"), "blank runs collapse: {t:?}");
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
