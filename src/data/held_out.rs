//! The windows `baton eval` scores text on: the evaluation split of the default corpus,
//! or all of the files and package texts the user names (held out by them).

use super::corpus::{files_or_default, read_documents, windows, CorpusError, Split};
use super::package_texts::split_inputs;
use crate::text::TextTokenizer;
use std::path::PathBuf;

/// Windows to evaluate on: the evaluation split of the default corpus, or, for named
/// files and package texts (`eval:coqa`), all of each document, windows taken from each
/// in turn. Text for fewer than `count` windows gives the windows there are (the caller
/// says so); text for none is an error.
pub fn eval_windows(
    named: &[PathBuf],
    tok: &TextTokenizer,
    len: usize,
    count: usize,
) -> Result<Vec<Vec<u32>>, CorpusError> {
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
    match windows(&docs, tok, split, len, count) {
        Err(CorpusError::TooSmall { got: 0, len, .. }) => Err(CorpusError::NoWindow { len }),
        Err(CorpusError::TooSmall { got, .. }) => windows(&docs, tok, split, len, got),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_text_is_evaluated_on_the_windows_it_has_and_an_empty_one_refused() {
        use crate::text::tokenizer::test_support::tokenizer;
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
        let w = eval_windows(std::slice::from_ref(&p), &tok, n / 3, 100).unwrap();
        assert_eq!(w.len(), 3);
        let e = eval_windows(&[p], &tok, n + 1, 4).unwrap_err();
        assert!(matches!(e, CorpusError::NoWindow { .. }), "{e}");
        assert!(e.to_string().contains("--texts"), "{e}");
    }
}
