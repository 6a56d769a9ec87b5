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

use super::error::{build_err, TokenizerError};
use super::fingerprint::compute_fingerprint;
use super::gguf_meta::{int_array, meta, meta_bool, meta_str, meta_str_array, meta_u32};
use candle_core::quantized::gguf_file::Content;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, ModelWrapper, SplitDelimiterBehavior, Tokenizer};

/// Qwen2 / Qwen2.5 / Qwen3 split pattern, verbatim from their `tokenizer.json`
/// (llama.cpp pre-type `qwen2` uses the same pattern, spelled without `(?i:...)`).
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3 split pattern, verbatim from Meta-Llama-3's `tokenizer.json` (llama.cpp pre-type
/// `llama-bpe`): like Qwen2's but numbers are split in groups of up to three digits.
pub const LLAMA3_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-2 pattern that the tokenizers crate's `ByteLevel { use_regex: true }` applies.
/// Listed for documentation; the `gpt2` and `smollm` pipelines get it through `ByteLevel`.
pub const GPT2_SPLIT_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Token strings that end a turn in the chat formats of the supported families.
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
];

/// The pre-tokenization pipelines this crate knows, keyed by llama.cpp's `tokenizer.ggml.pre`
/// names. Each reproduces what the family's `tokenizer.json` declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// `qwen2`: NFC normalizer, Split([`QWEN2_SPLIT_REGEX`], Isolated), ByteLevel without regex.
    Qwen2,
    /// `llama-bpe` / `llama3`: Split([`LLAMA3_SPLIT_REGEX`], Isolated), ByteLevel without
    /// regex, BPE with `ignore_merges` (a pre-token that is itself in the vocabulary is taken
    /// whole), no normalizer.
    Llama3,
    /// `smollm` / `starcoder`: Digits(individual), then ByteLevel with the GPT-2 regex
    /// ([`GPT2_SPLIT_REGEX`]); this is HF SmolLM2's `tokenizer.json`, and llama.cpp groups
    /// `smollm` with `starcoder` (`\p{N}` split, then the GPT-2 pattern).
    SmolLm,
    /// `gpt2`: ByteLevel with the GPT-2 regex.
    Gpt2,
}

impl PreTokenizerKind {
    /// Accepted `tokenizer.ggml.pre` values.
    pub const SUPPORTED: &'static [&'static str] = &[
        "qwen2",
        "llama-bpe",
        "llama3",
        "smollm",
        "starcoder",
        "gpt2",
    ];

    /// Map a `tokenizer.ggml.pre` value.
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        match name {
            "qwen2" => Ok(Self::Qwen2),
            "llama-bpe" | "llama3" => Ok(Self::Llama3),
            "smollm" | "starcoder" => Ok(Self::SmolLm),
            "gpt2" => Ok(Self::Gpt2),
            other => Err(TokenizerError::UnsupportedPre {
                name: other.to_string(),
                supported: Self::SUPPORTED.join(", "),
            }),
        }
    }

    fn normalizer(self) -> Option<NormalizerWrapper> {
        match self {
            Self::Qwen2 => Some(NormalizerWrapper::NFC(NFC)),
            Self::Llama3 | Self::SmolLm | Self::Gpt2 => None,
        }
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = |re: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
            let s = Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(build_err)?;
            Ok(PreTokenizerWrapper::Split(s))
        };
        Ok(match self {
            Self::Qwen2 => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                split(QWEN2_SPLIT_REGEX)?,
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
            ])),
            Self::Llama3 => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                split(LLAMA3_SPLIT_REGEX)?,
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ])),
            Self::SmolLm => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
            ])),
            Self::Gpt2 => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        })
    }

    fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3)
    }
}

struct Inner {
    tokenizer: Tokenizer,
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

    /// Build the tokenizer from GGUF metadata (`tokenizer.ggml.*`). Only byte-level BPE
    /// (`tokenizer.ggml.model = "gpt2"`) with a pre-tokenizer listed in
    /// [`PreTokenizerKind::SUPPORTED`] is accepted.
    ///
    /// Control (3), user-defined (4) and unknown (2) tokens become added tokens, matched as
    /// single tokens anywhere in the text; control and unknown ones are marked special.
    /// Unused tokens (type 5, e.g. Qwen's `[PAD151665]`) stay plain vocabulary entries that
    /// no text produces, as in llama.cpp.
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        let model = meta_str(content, "tokenizer.ggml.model")?
            .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre_name = meta_str(content, "tokenizer.ggml.pre")?.ok_or_else(|| {
            TokenizerError::MissingKey(format!(
                "tokenizer.ggml.pre` (the pre-tokenizer type; supported: {})",
                PreTokenizerKind::SUPPORTED.join(", ")
            ))
        })?;
        let pre = PreTokenizerKind::from_gguf_name(pre_name)?;

        let tokens = meta_str_array(content, "tokenizer.ggml.tokens")?;
        let types = match meta(content, "tokenizer.ggml.token_type") {
            Some(v) => {
                let t = int_array(v, "tokenizer.ggml.token_type")?;
                if t.len() != tokens.len() {
                    return Err(TokenizerError::BadMetadata {
                        key: "tokenizer.ggml.token_type".into(),
                        message: format!("{} entries for {} tokens", t.len(), tokens.len()),
                    });
                }
                t
            }
            None => vec![1; tokens.len()],
        };
        let merges_raw = meta_str_array(content, "tokenizer.ggml.merges")?;
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (i, m) in merges_raw.iter().enumerate() {
            // Like llama.cpp: split at the first space after the first character.
            let split_at = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(pos, _)| pos)
                .ok_or_else(|| TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.merges".into(),
                    message: format!("merge #{i} {m:?} has no space separator"),
                })?;
            merges.push((m[..split_at].to_string(), m[split_at + 1..].to_string()));
        }

        let mut vocab = Vocab::with_capacity(tokens.len());
        let mut duplicates = 0usize;
        for (id, tok) in tokens.iter().enumerate() {
            let id = u32::try_from(id).map_err(build_err)?;
            if vocab.contains_key(*tok) {
                duplicates += 1;
            } else {
                vocab.insert(tok.to_string(), id);
            }
        }
        if duplicates > 0 {
            tracing::warn!(
                duplicates,
                "GGUF vocabulary has duplicate token strings; later duplicates are unreachable"
            );
        }

        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.ignore_merges())
            .build()
            .map_err(build_err)?;
        let mut tokenizer = Tokenizer::new(ModelWrapper::BPE(bpe));
        tokenizer
            .with_normalizer(pre.normalizer())
            .map_err(build_err)?;
        tokenizer.with_pre_tokenizer(Some(pre.pre_tokenizer()?));
        tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

        let bos_id = meta_u32(content, "tokenizer.ggml.bos_token_id")?;
        let eos_id = meta_u32(content, "tokenizer.ggml.eos_token_id")?;
        let add_bos = meta_bool(content, "tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        let add_eos = meta_bool(content, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let token_at = |key: &str, id: Option<u32>| -> Result<Option<String>, TokenizerError> {
            match id {
                None => Ok(None),
                Some(id) => tokens
                    .get(id as usize)
                    .map(|t| Some(t.to_string()))
                    .ok_or_else(|| TokenizerError::BadMetadata {
                        key: key.to_string(),
                        message: format!(
                            "id {id} is outside the {}-token vocabulary",
                            tokens.len()
                        ),
                    }),
            }
        };
        let bos_tok = token_at("tokenizer.ggml.bos_token_id", bos_id)?;
        let eos_tok = token_at("tokenizer.ggml.eos_token_id", eos_id)?;
        let post = post_processor(
            add_bos.then(|| bos_tok.clone().zip(bos_id)).flatten(),
            add_eos.then(|| eos_tok.clone().zip(eos_id)).flatten(),
        )?;
        tokenizer.with_post_processor(Some(post));

        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter())
            .filter(|(_, &ty)| {
                ty == TOKEN_TYPE_CONTROL
                    || ty == TOKEN_TYPE_USER_DEFINED
                    || ty == TOKEN_TYPE_UNKNOWN
            })
            .map(|(tok, &ty)| {
                AddedToken::from(tok.to_string(), ty != TOKEN_TYPE_USER_DEFINED).normalized(false)
            })
            .collect();
        tokenizer.add_tokens(added).map_err(build_err)?;

        let mut extra_eos = Vec::new();
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = meta_u32(content, key)? {
                extra_eos.push(id);
            }
        }
        Self::finish(
            tokenizer,
            tokens.len(),
            bos_id,
            eos_id,
            &extra_eos,
            format!("gguf (pre={pre_name})"),
        )
    }

    fn finish(
        tokenizer: Tokenizer,
        vocab_size: usize,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        extra_eos: &[u32],
        source: String,
    ) -> Result<Self, TokenizerError> {
        let added = tokenizer.get_added_tokens_decoder();
        let mut eos_ids = Vec::new();
        let mut push = |id: u32| {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        };
        if let Some(id) = eos_id {
            push(id);
        }
        for &id in extra_eos {
            push(id);
        }
        for name in END_OF_TURN_TOKENS {
            if let Some(id) = tokenizer.token_to_id(name) {
                if added.contains_key(&id) {
                    push(id);
                }
            }
        }
        let hard_boundaries = added
            .iter()
            .filter(|(_, t)| !t.lstrip && !t.rstrip)
            .map(|(id, _)| *id)
            .collect();
        let fingerprint = compute_fingerprint(&tokenizer)?;
        Ok(Self {
            inner: Arc::new(Inner {
                tokenizer,
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
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_impl(text, true)
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

fn post_processor(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> Result<PostProcessorWrapper, TokenizerError> {
    if bos.is_none() && eos.is_none() {
        return Ok(PostProcessorWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    if let Some((tok, id)) = &bos {
        single.push(format!("{tok}:0"));
        pair.push(format!("{tok}:0"));
        specials.push((tok.clone(), *id));
    }
    single.push("$A:0".to_string());
    pair.push("$A:0".to_string());
    if let Some((tok, id)) = &eos {
        single.push(format!("{tok}:0"));
        pair.push(format!("{tok}:0"));
        if !specials.iter().any(|(t, _)| t == tok) {
            specials.push((tok.clone(), *id));
        }
    }
    if let Some((tok, _)) = &bos {
        pair.push(format!("{tok}:1"));
    }
    pair.push("$B:1".to_string());
    if let Some((tok, _)) = &eos {
        pair.push(format!("{tok}:1"));
    }
    let tp = TemplateProcessing::builder()
        .try_single(single)
        .map_err(build_err)?
        .try_pair(pair)
        .map_err(build_err)?
        .special_tokens(specials)
        .build()
        .map_err(build_err)?;
    Ok(PostProcessorWrapper::Template(tp))
}

fn read_config_special_tokens(
    path: &Path,
) -> Result<(Option<String>, Option<String>), TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| TokenizerError::Load {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok((
        config_token(&cfg, "bos_token"),
        config_token(&cfg, "eos_token"),
    ))
}

/// A special token in `tokenizer_config.json`: a string or `{"content": "..."}`.
pub(crate) fn config_token(cfg: &serde_json::Value, key: &str) -> Option<String> {
    match cfg.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// A small in-memory GGUF tokenizer for unit tests: the 256 byte-level symbols, a few merges,
/// ChatML control tokens, one user-defined and one unused token.
#[cfg(test)]
pub(crate) mod test_support {
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
