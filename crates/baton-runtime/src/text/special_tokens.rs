//! The special tokens around a tokenizer: which ids end generation, which added tokens cut
//! the text, and the BOS/EOS names a `tokenizer_config.json` declares.

use std::collections::HashSet;
use std::path::Path;

use super::error::TokenizerError;
use tokenizers::Tokenizer;

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

/// The ids that end generation, without repeats: the model's EOS first, then `extra_eos`,
/// then the end-of-turn tokens this tokenizer has as added tokens.
pub(super) fn collect_eos_ids(
    tokenizer: &Tokenizer,
    eos_id: Option<u32>,
    extra_eos: &[u32],
) -> Vec<u32> {
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
    eos_ids
}

/// Added tokens without lstrip/rstrip: the tokenizer cuts the text at them.
pub(super) fn hard_boundaries(tokenizer: &Tokenizer) -> HashSet<u32> {
    tokenizer
        .get_added_tokens_decoder()
        .iter()
        .filter(|(_, t)| !t.lstrip && !t.rstrip)
        .map(|(id, _)| *id)
        .collect()
}

/// The added tokens marked special, as (text, id), longest text first so that a scan
/// that tries them in order finds the longest match at a position, as the tokenizer does.
pub(super) fn special_added_tokens(tokenizer: &Tokenizer) -> Vec<(String, u32)> {
    let mut specials: Vec<(String, u32)> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && !t.content.is_empty())
        .map(|(id, t)| (t.content, id))
        .collect();
    specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
    specials
}

/// The `bos_token` and `eos_token` strings of a `tokenizer_config.json`.
pub(super) fn read_config_special_tokens(
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
