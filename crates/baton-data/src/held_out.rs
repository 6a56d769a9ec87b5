//! The windows `baton eval` scores text on: the evaluation split of the default corpus,
//! or all of the files and package texts the user names (held out by them).

use super::corpus::{files_or_default, read_documents, windows, CorpusError, Document, Split};
use super::package_texts::split_inputs;
use baton_runtime::text::TextTokenizer;
use std::path::PathBuf;

/// The text `baton eval` scores: documents, and the split of them it reads.
pub struct EvalText {
    pub docs: Vec<Document>,
    pub split: Split,
}

/// The text to evaluate on: the evaluation split of the default corpus, or, for named
/// files and package texts (`eval:coqa`), all of each document. Read in full here, so
/// that a path that holds no text is refused before any model loads.
pub fn eval_text(named: &[PathBuf]) -> Result<EvalText, CorpusError> {
    let split = if named.is_empty() {
        Split::Eval
    } else {
        Split::Whole
    };
    let (package, paths) = split_inputs(named)?;
    let mut docs = Vec::new();
    for t in package {
        docs.extend(t.documents()?);
    }
    if !paths.is_empty() || docs.is_empty() {
        docs.extend(read_documents(&files_or_default(&paths)?)?);
    }
    Ok(EvalText { docs, split })
}

impl EvalText {
    /// Windows of `len` tokens taken from each document in turn. Text for fewer than
    /// `count` windows gives the windows there are (the caller says so); text for none
    /// is an error.
    pub fn windows(
        &self,
        tok: &TextTokenizer,
        len: usize,
        count: usize,
    ) -> Result<Vec<Vec<u32>>, CorpusError> {
        match windows(&self.docs, tok, self.split, len, count) {
            Err(CorpusError::TooSmall { got: 0, len, .. }) => Err(CorpusError::NoWindow { len }),
            Err(CorpusError::TooSmall { got, .. }) => {
                windows(&self.docs, tok, self.split, len, got)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_text_is_evaluated_on_the_windows_it_has_and_an_empty_one_refused() {
        use baton_runtime::text::tokenizer::test_support::tokenizer;
        let tok = tokenizer();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("short.txt");
        std::fs::write(
            &p,
            "the cat sat on the mat and then the dog sat too ".repeat(4),
        )
        .unwrap();
        let n = tok
            .encode_raw(&std::fs::read_to_string(&p).unwrap())
            .unwrap()
            .len();
        let w = eval_text(std::slice::from_ref(&p))
            .unwrap()
            .windows(&tok, n / 3, 100)
            .unwrap();
        assert_eq!(w.len(), 3);
        let e = eval_text(&[p])
            .unwrap()
            .windows(&tok, n + 1, 4)
            .unwrap_err();
        assert!(matches!(e, CorpusError::NoWindow { .. }), "{e}");
        assert!(e.to_string().contains("--texts"), "{e}");
    }
}
