//! Building a [`TextTokenizer`] from the `tokenizer.ggml.*` metadata of a GGUF file.

use super::error::{build_err, TokenizerError};
use super::gguf_meta::{int_array, meta, meta_bool, meta_str, meta_str_array, meta_u32};
use super::pre_tokenizer::PreTokenizerKind;
use super::tokenizer::TextTokenizer;
use candle_core::quantized::gguf_file::Content;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, ModelWrapper, Tokenizer};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

impl TextTokenizer {
    /// Build the tokenizer from GGUF metadata (`tokenizer.ggml.*`). Only byte-level BPE
    /// (`tokenizer.ggml.model = "gpt2"`) with a pre-tokenizer listed in
    /// [`PreTokenizerKind::SUPPORTED`] is accepted.
    ///
    /// Control (3), user-defined (4) and unknown (2) tokens become added tokens, matched as
    /// single tokens anywhere in the text; control and unknown ones are marked special.
    /// Unused tokens (type 5, e.g. Qwen's `[PAD151665]`) stay plain vocabulary entries that
    /// no text produces, as in llama.cpp.
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        ensure_byte_level_bpe(content)?;
        let (pre_name, pre) = read_pre_tokenizer(content)?;
        let tokens = meta_str_array(content, "tokenizer.ggml.tokens")?;
        let types = read_token_types(content, tokens.len())?;
        let merges = read_merges(content)?;
        let vocab = build_vocab(&tokens)?;
        let mut tokenizer = bpe_tokenizer(vocab, merges, pre)?;

        let bos_id = meta_u32(content, "tokenizer.ggml.bos_token_id")?;
        let eos_id = meta_u32(content, "tokenizer.ggml.eos_token_id")?;
        let post = gguf_post_processor(content, &tokens, bos_id, eos_id)?;
        tokenizer.with_post_processor(Some(post));
        tokenizer
            .add_tokens(added_tokens(&tokens, &types))
            .map_err(build_err)?;

        let extra_eos = read_extra_eos(content)?;
        Self::finish(
            tokenizer,
            tokens.len(),
            bos_id,
            eos_id,
            &extra_eos,
            format!("gguf (pre={pre_name})"),
        )
    }
}

fn ensure_byte_level_bpe(content: &Content) -> Result<(), TokenizerError> {
    let model = meta_str(content, "tokenizer.ggml.model")?
        .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?;
    if model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel(model.to_string()));
    }
    Ok(())
}

/// The `tokenizer.ggml.pre` name and the pipeline it stands for.
fn read_pre_tokenizer(content: &Content) -> Result<(&str, PreTokenizerKind), TokenizerError> {
    let pre_name = meta_str(content, "tokenizer.ggml.pre")?.ok_or_else(|| {
        TokenizerError::MissingKey(format!(
            "tokenizer.ggml.pre` (the pre-tokenizer type; supported: {})",
            PreTokenizerKind::SUPPORTED.join(", ")
        ))
    })?;
    Ok((pre_name, PreTokenizerKind::from_gguf_name(pre_name)?))
}

/// One type per token; a file without types has only normal (1) tokens.
fn read_token_types(content: &Content, n_tokens: usize) -> Result<Vec<i64>, TokenizerError> {
    match meta(content, "tokenizer.ggml.token_type") {
        Some(v) => {
            let t = int_array(v, "tokenizer.ggml.token_type")?;
            if t.len() != n_tokens {
                return Err(TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.token_type".into(),
                    message: format!("{} entries for {} tokens", t.len(), n_tokens),
                });
            }
            Ok(t)
        }
        None => Ok(vec![1; n_tokens]),
    }
}

/// The merges in rank order, each as its (left, right) pair.
fn read_merges(content: &Content) -> Result<Vec<(String, String)>, TokenizerError> {
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
    Ok(merges)
}

/// Token strings to ids; the first of duplicate strings keeps its id.
fn build_vocab(tokens: &[&str]) -> Result<Vocab, TokenizerError> {
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
    Ok(vocab)
}

/// The BPE model with the family's normalizer, pre-tokenizer and byte-level decoder.
fn bpe_tokenizer(
    vocab: Vocab,
    merges: Vec<(String, String)>,
    pre: PreTokenizerKind,
) -> Result<Tokenizer, TokenizerError> {
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
    Ok(tokenizer)
}

/// The post-processor that adds BOS/EOS where `add_bos_token` / `add_eos_token` ask for it.
fn gguf_post_processor(
    content: &Content,
    tokens: &[&str],
    bos_id: Option<u32>,
    eos_id: Option<u32>,
) -> Result<PostProcessorWrapper, TokenizerError> {
    let add_bos = meta_bool(content, "tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = meta_bool(content, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let bos_tok = token_at(tokens, "tokenizer.ggml.bos_token_id", bos_id)?;
    let eos_tok = token_at(tokens, "tokenizer.ggml.eos_token_id", eos_id)?;
    post_processor(
        add_bos.then(|| bos_tok.clone().zip(bos_id)).flatten(),
        add_eos.then(|| eos_tok.clone().zip(eos_id)).flatten(),
    )
}

/// The token string of the id stored under `key`, if there is one.
fn token_at(tokens: &[&str], key: &str, id: Option<u32>) -> Result<Option<String>, TokenizerError> {
    match id {
        None => Ok(None),
        Some(id) => tokens
            .get(id as usize)
            .map(|t| Some(t.to_string()))
            .ok_or_else(|| TokenizerError::BadMetadata {
                key: key.to_string(),
                message: format!("id {id} is outside the {}-token vocabulary", tokens.len()),
            }),
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

/// Control and unknown tokens become special added tokens, user-defined ones plain added
/// tokens; the others stay vocabulary entries.
fn added_tokens(tokens: &[&str], types: &[i64]) -> Vec<AddedToken> {
    tokens
        .iter()
        .zip(types.iter())
        .filter(|(_, &ty)| {
            ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED || ty == TOKEN_TYPE_UNKNOWN
        })
        .map(|(tok, &ty)| {
            AddedToken::from(tok.to_string(), ty != TOKEN_TYPE_USER_DEFINED).normalized(false)
        })
        .collect()
}

/// End-of-turn and end-of-message ids, which also stop generation.
fn read_extra_eos(content: &Content) -> Result<Vec<u32>, TokenizerError> {
    let mut extra_eos = Vec::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = meta_u32(content, key)? {
            extra_eos.push(id);
        }
    }
    Ok(extra_eos)
}
