//! JSON-lines corpora: one document per line's `"text"`, read a line at a time, so a
//! file of any length costs one line of memory.

use super::CorpusError;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// The longest line read; a longer one is one document too large to hold.
const MAX_LINE: usize = 256 << 20;

/// Each non-blank line's number (from 1) and text, and the bytes read so far.
pub(super) struct Lines {
    reader: BufReader<File>,
    path: PathBuf,
    line: usize,
    pub(super) bytes: u64,
    buf: Vec<u8>,
}

impl Lines {
    pub(super) fn open(path: &Path) -> Result<Self, CorpusError> {
        let f = File::open(path).map_err(|e| CorpusError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Ok(Self {
            reader: BufReader::with_capacity(1 << 20, f),
            path: path.to_path_buf(),
            line: 0,
            bytes: 0,
            buf: Vec::new(),
        })
    }

    fn bad(&self, reason: impl Into<String>) -> CorpusError {
        CorpusError::Jsonl {
            path: self.path.clone(),
            line: self.line,
            reason: reason.into(),
        }
    }

    fn read_line(&mut self) -> Result<Option<(usize, String)>, CorpusError> {
        loop {
            self.buf.clear();
            let n = (&mut self.reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| CorpusError::Io {
                    path: self.path.clone(),
                    source: e,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            self.bytes += n as u64;
            if n > MAX_LINE {
                return Err(self.bad(format!(
                    "longer than {} MiB; split the document into several lines",
                    MAX_LINE >> 20
                )));
            }
            let Ok(line) = std::str::from_utf8(&self.buf) else {
                return Err(self.bad("not UTF-8 text"));
            };
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| self.bad(e.to_string()))?;
            let text = v
                .get("text")
                .and_then(|t| t.as_str())
                .ok_or_else(|| self.bad("no \"text\" string"))?;
            return Ok(Some((self.line, text.to_string())));
        }
    }
}

impl Iterator for Lines {
    type Item = Result<(usize, String), CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.read_line().transpose()
    }
}
