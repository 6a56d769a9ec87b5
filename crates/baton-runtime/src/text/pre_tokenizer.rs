//! The pre-tokenization pipelines of the supported model families, keyed by llama.cpp's
//! `tokenizer.ggml.pre` names. GGUF files carry only that name, so each pipeline here has to
//! reproduce what the family's own `tokenizer.json` declares.

use super::error::{build_err, TokenizerError};
use tokenizers::normalizers::{NormalizerWrapper, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

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

    pub(super) fn normalizer(self) -> Option<NormalizerWrapper> {
        match self {
            Self::Qwen2 => Some(NormalizerWrapper::NFC(NFC)),
            Self::Llama3 | Self::SmolLm | Self::Gpt2 => None,
        }
    }

    pub(super) fn pre_tokenizer(self) -> Result<PreTokenizerWrapper, TokenizerError> {
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

    pub(super) fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3)
    }
}
