//! Byte-level BPE tokenizers, built either from a Hugging Face `tokenizer.json` or from the
//! `tokenizer.ggml.*` metadata of a GGUF file, with a fingerprint that tells whether two
//! models share one tokenizer (which KV transfer requires: the cache is indexed by token ids).
//!
//! GGUF files do not carry the pre-tokenizer itself, only its name (`tokenizer.ggml.pre`).
//! [`PreTokenizerKind`] maps the supported names onto the same normalizer / pre-tokenizer
//! pipeline that the model's own `tokenizer.json` declares, so that both routes give the same
//! ids for the same text.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use super::error::TokenizerError;
use super::fingerprint::compute_fingerprint;
use super::special_tokens::{
    collect_eos_ids, hard_boundaries, read_config_special_tokens, special_added_tokens,
};
use tokenizers::Tokenizer;

pub use super::pre_tokenizer::{
    PreTokenizerKind, GPT2_SPLIT_REGEX, LLAMA3_SPLIT_REGEX, QWEN2_SPLIT_REGEX,
};
pub(crate) use super::special_tokens::config_token;

struct Inner {
    tokenizer: Tokenizer,
    /// The same tokenizer with special-token matching off: what a person typed is encoded
    /// with it, so that `<|im_start|>` in a message stays the characters it is.
    literal: Tokenizer,
    /// The special added tokens (text, id), longest text first.
    specials: Vec<(String, u32)>,
    fingerprint: String,
    vocab_size: usize,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    /// Added tokens that cut the text: what follows them is tokenized independently of what
    /// precedes them (no lstrip/rstrip).
    hard_boundaries: HashSet<u32>,
    source: String,
}

/// A byte-level BPE tokenizer plus the model facts around it (BOS/EOS ids, fingerprint).
///
/// Cloning is cheap (shared).
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Inner>,
}

impl fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("source", &self.inner.source)
            .field("vocab_size", &self.inner.vocab_size)
            .field("bos_id", &self.inner.bos_id)
            .field("eos_ids", &self.inner.eos_ids)
            .field("fingerprint", &self.inner.fingerprint)
            .finish()
    }
}

impl TextTokenizer {
    /// Load a Hugging Face `tokenizer.json`. If a `tokenizer_config.json` sits next to it, its
    /// `bos_token` / `eos_token` name the BOS/EOS ids; BOS/EOS insertion itself follows the
    /// file's post-processor, as in Hugging Face.
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let config = path.with_file_name("tokenizer_config.json");
        let config = config.is_file().then_some(config);
        Self::from_tokenizer_json_with_config(path, config.as_deref())
    }

    /// Like [`Self::from_tokenizer_json`] with an explicit (or no) `tokenizer_config.json`.
    pub fn from_tokenizer_json_with_config(
        path: &Path,
        config: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let tokenizer: Tokenizer = text.parse().map_err(|e| TokenizerError::Load {
            path: path.to_path_buf(),
            message: format!("{e}"),
        })?;
        let (bos_tok, eos_tok) = match config {
            Some(cfg) => read_config_special_tokens(cfg)?,
            None => (None, None),
        };
        let bos_id = bos_tok.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let eos_id = eos_tok.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let vocab_size = tokenizer
            .get_vocab(true)
            .values()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1);
        Self::finish(
            tokenizer,
            vocab_size,
            bos_id,
            eos_id,
            &[],
            format!("tokenizer.json ({})", path.display()),
        )
    }

    pub(super) fn finish(
        tokenizer: Tokenizer,
        vocab_size: usize,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        extra_eos: &[u32],
        source: String,
    ) -> Result<Self, TokenizerError> {
        let eos_ids = collect_eos_ids(&tokenizer, eos_id, extra_eos);
        let hard_boundaries = hard_boundaries(&tokenizer);
        let fingerprint = compute_fingerprint(&tokenizer)?;
        let specials = special_added_tokens(&tokenizer);
        let mut literal = tokenizer.clone();
        literal.set_encode_special_tokens(true);
        Ok(Self {
            inner: Arc::new(Inner {
                tokenizer,
                literal,
                specials,
                fingerprint,
                vocab_size,
                bos_id,
                eos_id,
                eos_ids,
                hard_boundaries,
                source,
            }),
        })
    }

    /// Encode text. Special/added tokens written in the text (e.g. `<|im_start|>`) become
    /// their ids. BOS/EOS are added only where the model's metadata asks for it
    /// (`add_bos_token` in GGUF, the post-processor of a `tokenizer.json`).
    ///
    /// This is for text whose markers are meant (a corpus with `<|endoftext|>` between
    /// documents); text a person typed goes through [`Self::encode_text`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_impl(text, true)
    }

    /// Encode text a person typed: a special token's text in it (`<|im_start|>`,
    /// `<|eot_id|>`) is encoded as the characters it is, never as the special id, so a
    /// message cannot open a turn of its own. BOS/EOS as in [`Self::encode`]. Text without
    /// special tokens encodes as with [`Self::encode`].
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_literal(text, true)
    }

    /// [`Self::encode_text`] without any BOS/EOS insertion.
    pub fn encode_text_raw(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_literal(text, false)
    }

    fn encode_literal(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .literal
            .encode_fast(text, add_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The special added tokens as (text, id), longest text first.
    pub fn special_tokens(&self) -> &[(String, u32)] {
        &self.inner.specials
    }

    /// Whether `id` is a special added token (one [`Self::encode_text`] never produces
    /// from text).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.specials.iter().any(|&(_, s)| s == id)
    }

    /// Encode text without any BOS/EOS insertion (special tokens in the text are still
    /// matched). Use this for rendered chat templates, which write their own `bos_token`.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_impl(text, false)
    }

    fn encode_impl(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .tokenizer
            .encode_fast(text, add_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// `text` in the form the tokenizer reads it (NFC for Qwen's): a conversation keeps
    /// its messages in this form, so that a message rendered again is the text its ids
    /// decode to, whatever form of an accent the user typed.
    pub fn normalize(&self, text: &str) -> Result<String, TokenizerError> {
        use tokenizers::{NormalizedString, Normalizer};
        let Some(n) = self.inner.tokenizer.get_normalizer() else {
            return Ok(text.to_string());
        };
        let mut s = NormalizedString::from(text);
        n.normalize(&mut s)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(s.get().to_string())
    }

    /// Decode ids to text, skipping nothing (special tokens are written out).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.inner.vocab_size) {
            return Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.inner.vocab_size,
            });
        }
        self.inner
            .tokenizer
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The vocabulary entry of `id` in its stored form (byte-level, e.g. `"Ġhello"`).
    pub fn token_to_str(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.id_to_token(id)
    }

    /// The id of a vocabulary entry or added token, e.g. `"<|im_end|>"`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(token)
    }

    /// One past the highest token id (the size of the model's embedding table for GGUF).
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// Ids that end generation: the model's EOS first, then EOT/EOM ids from the metadata and
    /// end-of-turn tokens such as `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>` when present.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// The model's EOS id as declared by its metadata.
    pub fn eos_id(&self) -> Option<u32> {
        self.inner.eos_id
    }

    /// The model's BOS id as declared by its metadata (it may not be added by [`Self::encode`]).
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// Whether `id` is an added/special token without lstrip/rstrip: the tokenizer cuts the
    /// text there, so text after it tokenizes independently of text before it.
    pub fn is_hard_boundary(&self, id: u32) -> bool {
        self.inner.hard_boundaries.contains(&id)
    }

    /// sha256 hex of the canonical form of everything that decides token ids: normalizer,
    /// pre-tokenizer, BPE options, the vocabulary (ids to strings, in id order), merges in
    /// rank order, added tokens with their ids and matching options, and the ids the
    /// post-processor adds to an empty input.
    pub fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    /// Where this tokenizer came from, for messages.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// The underlying Hugging Face tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }
}

/// Fail with a clear message unless `a` and `b` have the same fingerprint.
pub fn ensure_same_tokenizer(a: &TextTokenizer, b: &TextTokenizer) -> Result<(), TokenizerError> {
    if a.fingerprint() == b.fingerprint() {
        Ok(())
    } else {
        Err(TokenizerError::Mismatch {
            a: a.fingerprint().to_string(),
            b: b.fingerprint().to_string(),
        })
    }
}

/// A small in-memory GGUF tokenizer for unit tests: the 256 byte-level symbols, a few merges,
/// ChatML control tokens, one user-defined and one unused token.
#[cfg(any(test, feature = "fixtures"))]
pub mod test_support {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

    /// GPT-2's byte to symbol table.
    pub fn byte_symbols() -> Vec<char> {
        let mut bs: Vec<u32> = (33..127).chain(161..173).chain(174..256).collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        let mut table = vec![' '; 256];
        for (b, c) in bs.into_iter().zip(cs) {
            table[b as usize] = char::from_u32(c).unwrap();
        }
        table
    }

    pub const MERGES: &[&str] = &["Ġ t", "h e", "Ġt he", "i n", "in g", "Ċ Ċ"];

    pub fn content_with(pre: &str, merges: &[&str], add_bos: bool) -> Content {
        let mut tokens: Vec<String> = byte_symbols().iter().map(|c| c.to_string()).collect();
        let mut types = vec![1i32; 256];
        for m in merges {
            let (a, b) = m.split_once(' ').unwrap();
            tokens.push(format!("{a}{b}"));
            types.push(1);
        }
        for (t, ty) in [
            ("<|im_start|>", 3),
            ("<|im_end|>", 3),
            ("<|endoftext|>", 3),
            ("<tool>", 4),
            ("[PAD0]", 5),
        ] {
            tokens.push(t.to_string());
            types.push(ty);
        }
        let id_of = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
        let bos = id_of("<|endoftext|>");
        let eos = id_of("<|im_end|>");
        let mut md = HashMap::new();
        let s = |x: &str| Value::String(x.to_string());
        md.insert("tokenizer.ggml.model".into(), s("gpt2"));
        md.insert("tokenizer.ggml.pre".into(), s(pre));
        md.insert(
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        );
        md.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        );
        md.insert(
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.iter().map(|m| s(m)).collect()),
        );
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(bos));
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(eos));
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos));
        Content {
            magic: VersionedMagic::GgufV3,
            metadata: md,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    pub fn content() -> Content {
        content_with("qwen2", MERGES, false)
    }

    pub fn tokenizer() -> super::TextTokenizer {
        super::TextTokenizer::from_gguf(&content()).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use candle_core::quantized::gguf_file::Value;

    #[test]
    fn builds_from_gguf_metadata() {
        let tok = tokenizer();
        assert_eq!(tok.vocab_size(), 256 + MERGES.len() + 5);
        let the = tok.token_to_id("Ġthe").unwrap();
        assert_eq!(tok.encode(" the").unwrap(), vec![the]);
        let start = tok.token_to_id("<|im_start|>").unwrap();
        let end = tok.token_to_id("<|im_end|>").unwrap();
        let tool = tok.token_to_id("<tool>").unwrap();
        let ids = tok.encode("<|im_start|>the<|im_end|><tool>[PAD0]").unwrap();
        assert_eq!(ids[0], start);
        assert_eq!(ids[1], tok.token_to_id("t").unwrap());
        assert_eq!(ids[2], tok.token_to_id("he").unwrap());
        assert_eq!(ids[3], end);
        assert_eq!(ids[4], tool);
        // The unused token is never produced from text.
        assert!(!ids.contains(&tok.token_to_id("[PAD0]").unwrap()));
        assert_eq!(
            tok.decode(&ids).unwrap(),
            "<|im_start|>the<|im_end|><tool>[PAD0]"
        );
        assert!(tok.is_hard_boundary(end));
        assert!(!tok.is_hard_boundary(the));
        assert_eq!(tok.eos_id(), Some(end));
        assert_eq!(tok.eos_ids()[0], end);
        assert!(tok
            .eos_ids()
            .contains(&tok.token_to_id("<|endoftext|>").unwrap()));
        assert_eq!(tok.bos_id(), tok.token_to_id("<|endoftext|>"));
    }

    #[test]
    fn unicode_round_trips_and_nfc() {
        let tok = tokenizer();
        for s in ["é🦀 世界\n\t  x", "👨‍👩‍👧", "", "  \n\n "] {
            assert_eq!(tok.decode(&tok.encode(s).unwrap()).unwrap(), s);
        }
        // qwen2 normalises to NFC, like the model's tokenizer.json.
        let decomposed = "e\u{301}";
        assert_eq!(
            tok.decode(&tok.encode(decomposed).unwrap()).unwrap(),
            "\u{e9}"
        );
    }

    #[test]
    fn normalize_gives_the_form_the_ids_decode_to() {
        let tok = tokenizer();
        for s in [
            "cafe\u{301} n\u{303}",
            "café ñ",
            "👨‍👩‍👧 🦀",
            "שלום עולם",
            "e\u{301}\u{301}x",
        ] {
            let n = tok.normalize(s).unwrap();
            assert_eq!(tok.decode(&tok.encode(s).unwrap()).unwrap(), n, "{s:?}");
            assert_eq!(tok.normalize(&n).unwrap(), n, "idempotent on {s:?}");
        }
        assert_eq!(tok.normalize("cafe\u{301}").unwrap(), "caf\u{e9}");
    }

    #[test]
    fn bos_only_when_metadata_asks() {
        let tok = tokenizer();
        let bos = tok.bos_id().unwrap();
        assert_ne!(tok.encode("hi").unwrap()[0], bos);
        let with_bos = TextTokenizer::from_gguf(&content_with("qwen2", MERGES, true)).unwrap();
        let ids = with_bos.encode("hi").unwrap();
        assert_eq!(ids[0], bos);
        assert_eq!(ids.len(), 3);
        assert_eq!(with_bos.encode_raw("hi").unwrap().len(), 2);
        assert_ne!(tok.fingerprint(), with_bos.fingerprint());
    }

    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        let a = tokenizer();
        let b = tokenizer();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
        ensure_same_tokenizer(&a, &b).unwrap();

        let mut reordered = MERGES.to_vec();
        reordered.swap(3, 0);
        let c = TextTokenizer::from_gguf(&content_with("qwen2", &reordered, false)).unwrap();
        assert_ne!(a.fingerprint(), c.fingerprint());

        let d = TextTokenizer::from_gguf(&content_with("smollm", MERGES, false)).unwrap();
        assert_ne!(a.fingerprint(), d.fingerprint());
        let err = ensure_same_tokenizer(&a, &d).unwrap_err().to_string();
        assert!(err.contains("different tokenizers"), "{err}");
        assert!(
            err.contains(a.fingerprint()) && err.contains(d.fingerprint()),
            "{err}"
        );
        assert!(err.contains("same family"), "{err}");
    }

    #[test]
    fn pre_tokenizers_split_numbers_per_family() {
        let digits = |pre: &str| {
            let tok = TextTokenizer::from_gguf(&content_with(pre, MERGES, false)).unwrap();
            // Without merges for digits every digit is its own id anyway; count pre-tokens
            // through the pre-tokenizer instead.
            use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
            let mut pts = PreTokenizedString::from("abc 12345");
            tok.inner()
                .get_pre_tokenizer()
                .unwrap()
                .pre_tokenize(&mut pts)
                .unwrap();
            pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(s, _, _)| s.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(digits("qwen2"), ["abc", "Ġ", "1", "2", "3", "4", "5"]);
        assert_eq!(digits("llama-bpe"), ["abc", "Ġ", "123", "45"]);
        assert_eq!(digits("smollm"), ["abc", "Ġ", "1", "2", "3", "4", "5"]);
        assert_eq!(digits("gpt2"), ["abc", "Ġ12345"]);
    }

    #[test]
    fn refuses_unknown_model_and_pre() {
        let mut c = content();
        c.metadata
            .insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = TextTokenizer::from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("\"llama\"") && err.contains("gpt2"), "{err}");

        let c = content_with("deepseek-llm", MERGES, false);
        let err = TextTokenizer::from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("deepseek-llm"), "{err}");
        for name in PreTokenizerKind::SUPPORTED {
            assert!(err.contains(name), "{err}");
        }

        let mut c = content();
        c.metadata.remove("tokenizer.ggml.pre");
        let err = TextTokenizer::from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.pre"), "{err}");
    }

    #[test]
    fn decode_rejects_out_of_range_ids() {
        let tok = tokenizer();
        let err = tok.decode(&[tok.vocab_size() as u32]).unwrap_err();
        assert!(matches!(err, TokenizerError::UnknownId { .. }), "{err}");
    }
}
