//! Plain-text corpus files read in blocks, so that a file of any size costs one block of
//! memory: a scan when the corpus is read (is it UTF-8, how many characters, where every
//! millionth one starts) and, when windows are cut, only the blocks of the split asked
//! for, from its start, for as many windows as are wanted.
//!
//! Blocks end where the tokenizers' pre-tokenization cannot join across: after a line
//! break that a non-blank character follows (their patterns end a piece at a newline run
//! and begin the next at the character after it), so tokenizing block after block gives
//! the tokens of the whole text. A line longer than a block is cut before a space that
//! starts a word, which pre-tokenization also begins a piece at.

use super::CorpusError;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Bytes read at a time, and the most text one block holds.
pub(super) const BLOCK: usize = 1 << 20;
/// Characters between two remembered offsets.
const MARK: u64 = 1 << 20;

/// A UTF-8 text file known by its size and character count, read when used.
#[derive(Debug, Clone)]
pub struct FileText {
    pub(super) path: PathBuf,
    pub(super) bytes: u64,
    pub(super) chars: u64,
    /// Byte offset of character `i * MARK`, so a split's start is found without counting
    /// from the beginning of the file.
    marks: Vec<u64>,
}

fn io(path: &Path, e: std::io::Error) -> CorpusError {
    CorpusError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn not_utf8(path: &Path, at: u64) -> CorpusError {
    io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text at byte {at}: save it as UTF-8 or leave it out"),
        ),
    )
}

fn binary(path: &Path, at: u64) -> CorpusError {
    io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a NUL byte at byte {at}: a binary file, not text; leave it out"),
        ),
    )
}

fn is_char_start(b: u8) -> bool {
    b & 0xC0 != 0x80
}

impl FileText {
    /// Reads `path` once, block by block: checks it is UTF-8, counts its characters, and
    /// hands every block of bytes to `each` (for the corpus fingerprint and progress).
    pub(super) fn scan(path: &Path, mut each: impl FnMut(&[u8])) -> Result<Self, CorpusError> {
        let mut f = File::open(path).map_err(|e| io(path, e))?;
        let mut buf = vec![0u8; BLOCK];
        // Bytes not yet counted: a block, after the bytes of a character the previous
        // block cut; `base` is the file offset of its first byte.
        let mut pending: Vec<u8> = Vec::with_capacity(BLOCK + 4);
        let (mut base, mut chars, mut marks) = (0u64, 0u64, Vec::new());
        loop {
            let n = f.read(&mut buf).map_err(|e| io(path, e))?;
            if n == 0 {
                break;
            }
            each(&buf[..n]);
            // Zeros are valid UTF-8, and a file of them (or a binary that happens to be
            // UTF-8) would pass for text.
            if let Some(i) = buf[..n].iter().position(|&b| b == 0) {
                return Err(binary(path, base + pending.len() as u64 + i as u64));
            }
            pending.extend_from_slice(&buf[..n]);
            let valid = match std::str::from_utf8(&pending) {
                Ok(_) => pending.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(e) => return Err(not_utf8(path, base + e.valid_up_to() as u64)),
            };
            for (i, &b) in pending[..valid].iter().enumerate() {
                if is_char_start(b) {
                    if chars.is_multiple_of(MARK) {
                        marks.push(base + i as u64);
                    }
                    chars += 1;
                }
            }
            pending.drain(..valid);
            base += valid as u64;
        }
        if !pending.is_empty() {
            return Err(not_utf8(path, base));
        }
        let bytes = base;
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            chars,
            marks,
        })
    }

    fn open(&self) -> Result<File, CorpusError> {
        File::open(&self.path).map_err(|e| io(&self.path, e))
    }

    /// The byte offset where character `n` starts (the file's length for `n == chars`).
    fn offset_of_char(&self, n: u64) -> Result<u64, CorpusError> {
        if n >= self.chars {
            return Ok(self.bytes);
        }
        let mark = (n / MARK) as usize;
        let (mut at, mut left) = (self.marks[mark], n % MARK);
        let mut f = self.open()?;
        f.seek(SeekFrom::Start(at)).map_err(|e| io(&self.path, e))?;
        let mut buf = vec![0u8; BLOCK.min(64 << 10)];
        loop {
            let got = f.read(&mut buf).map_err(|e| io(&self.path, e))?;
            if got == 0 {
                return Err(self.changed());
            }
            for &b in &buf[..got] {
                if is_char_start(b) {
                    if left == 0 {
                        return Ok(at);
                    }
                    left -= 1;
                }
                at += 1;
            }
        }
    }

    fn changed(&self) -> CorpusError {
        io(
            &self.path,
            std::io::Error::other(
                "the file changed while the corpus was read: run the command again",
            ),
        )
    }

    /// Byte range of the characters `[from, to)` (as fractions of the file's characters),
    /// cut as [`super::char_slice`] cuts text in memory.
    pub(super) fn region(&self, (from, to): (f64, f64)) -> Result<(u64, u64), CorpusError> {
        let a = (self.chars as f64 * from) as u64;
        let b = (self.chars as f64 * to) as u64;
        Ok((self.offset_of_char(a)?, self.offset_of_char(b)?))
    }

    /// The text of bytes `[start, end)` in blocks of at most [`BLOCK`] bytes.
    pub(super) fn blocks(&self, (start, end): (u64, u64)) -> Result<Blocks, CorpusError> {
        let mut file = self.open()?;
        file.seek(SeekFrom::Start(start))
            .map_err(|e| io(&self.path, e))?;
        Ok(Blocks {
            file,
            text: self.clone(),
            at: start,
            end,
            carry: Vec::new(),
        })
    }

    /// The first line start at or after byte `at` within `[at, end)`: where a tail read
    /// from the middle of a file begins.
    pub(super) fn line_start_after(&self, at: u64, end: u64) -> Result<u64, CorpusError> {
        if at == 0 {
            return Ok(0);
        }
        let mut f = self.open()?;
        f.seek(SeekFrom::Start(at - 1))
            .map_err(|e| io(&self.path, e))?;
        let mut buf = vec![0u8; 64 << 10];
        let mut pos = at - 1;
        while pos < end {
            let got = f.read(&mut buf).map_err(|e| io(&self.path, e))?;
            if got == 0 {
                break;
            }
            if let Some(i) = buf[..got].iter().position(|&b| b == b'\n') {
                return Ok((pos + i as u64 + 1).min(end));
            }
            pos += got as u64;
        }
        Ok(end)
    }
}

/// Successive blocks of a file's text; see the module's note on where they end.
pub(super) struct Blocks {
    file: File,
    text: FileText,
    at: u64,
    end: u64,
    carry: Vec<u8>,
}

/// Where a block of `buf` may end so that pre-tokenization of the parts equals that of
/// the whole: after a line break followed by a non-blank byte; failing that before a
/// space between a non-blank byte and a letter; failing that at a character start.
fn cut_point(buf: &[u8]) -> usize {
    let n = buf.len();
    if let Some(i) = (1..n)
        .rev()
        .find(|&i| buf[i - 1] == b'\n' && !buf[i].is_ascii_whitespace())
    {
        return i;
    }
    if let Some(i) = (1..n.saturating_sub(1)).rev().find(|&i| {
        buf[i] == b' ' && !buf[i - 1].is_ascii_whitespace() && buf[i + 1].is_ascii_alphabetic()
    }) {
        return i;
    }
    (1..n).rev().find(|&i| is_char_start(buf[i])).unwrap_or(n)
}

impl Iterator for Blocks {
    type Item = Result<String, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.carry.is_empty() && self.at >= self.end {
            return None;
        }
        let mut buf = std::mem::take(&mut self.carry);
        let want = (BLOCK.saturating_sub(buf.len()) as u64).min(self.end - self.at) as usize;
        let old = buf.len();
        buf.resize(old + want, 0);
        if let Err(e) = self.file.read_exact(&mut buf[old..]) {
            self.at = self.end;
            return Some(Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.text.changed()
            } else {
                io(&self.text.path, e)
            }));
        }
        self.at += want as u64;
        if self.at < self.end {
            let cut = cut_point(&buf);
            self.carry = buf.split_off(cut);
        }
        match String::from_utf8(buf) {
            Ok(s) => Some(Ok(s)),
            Err(_) => {
                self.at = self.end;
                self.carry.clear();
                Some(Err(self.text.changed()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(text: &str) -> (tempfile::TempDir, FileText) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, text).unwrap();
        let f = FileText::scan(&p, |_| {}).unwrap();
        (dir, f)
    }

    #[test]
    fn the_scan_counts_characters_across_block_ends() {
        // Multi-byte characters placed so that some straddle the 1 MiB block boundary.
        let text: String = "aé€😀\n".repeat(BLOCK / 5 + 7);
        let (_d, f) = scanned(&text);
        assert_eq!(f.bytes, text.len() as u64);
        assert_eq!(f.chars, text.chars().count() as u64);
    }

    #[test]
    fn invalid_utf8_is_refused_with_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        let mut bytes = b"fine text ".repeat(10);
        bytes.extend_from_slice(&[0xff, 0xfe]);
        std::fs::write(&p, &bytes).unwrap();
        let e = FileText::scan(&p, |_| {}).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("byte 100"), "{e}");
        // Zeros are UTF-8, but no text.
        std::fs::write(&p, b"text\0\0\0").unwrap();
        let e = FileText::scan(&p, |_| {}).unwrap_err().to_string();
        assert!(e.contains("binary file") && e.contains("byte 4"), "{e}");
        // A character cut by the end of the file is no text either.
        std::fs::write(&p, &"é".as_bytes()[..1]).unwrap();
        assert!(FileText::scan(&p, |_| {}).is_err());
    }

    #[test]
    fn regions_and_blocks_give_the_text_a_slice_in_memory_gives() {
        let line = "Ünïcode line with words, 😀 and numbers 1234.\n";
        let text: String = line.repeat(3 * BLOCK / line.len());
        let (_d, f) = scanned(&text);
        for range in [(0.0, 0.7), (0.7, 0.8), (0.8, 1.0), (0.0, 1.0)] {
            let want = super::super::char_slice(&text, range.0, range.1);
            let got: Vec<String> = f
                .blocks(f.region(range).unwrap())
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(got.iter().all(|b| b.len() <= BLOCK));
            assert_eq!(got.concat(), want, "{range:?}");
            // Every block but the last ends after a line break, before a non-blank.
            for b in &got[..got.len() - 1] {
                assert!(b.ends_with('\n'), "{:?}", &b[b.len() - 20..]);
            }
        }
    }

    #[test]
    fn a_line_longer_than_a_block_is_cut_before_a_word() {
        let text: String = "word ".repeat(BLOCK / 2);
        let (_d, f) = scanned(&text);
        let got: Vec<String> = f
            .blocks((0, f.bytes))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(got.len() > 1);
        assert_eq!(got.concat(), text);
        assert!(got[1].starts_with(" word"), "{:?}", &got[1][..10]);
    }
}
