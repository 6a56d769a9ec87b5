//! A model ready to talk: decoder, tokenizer, chat template and identity, loaded from a
//! local path whose checksum the caller has already established (see `fetch::models`).

use super::config::ModelConfig;
use super::decoder::Decoder;
use super::error::{ModelError, Result};
use super::load::{load_decoder, ModelFormat};
use super::weights::LoadOptions;
use crate::text::{ChatTemplate, TextTokenizer};
use candle_core::Device;
use serde::Serialize;
use std::path::PathBuf;

/// Who a model is, for binding mapper artifacts and session files to it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelIdentity {
    /// The manifest name, or the file name for a path.
    pub name: String,
    pub path: PathBuf,
    pub format: ModelFormat,
    /// sha256 of the GGUF file; for a safetensors directory, of the sorted list of
    /// (file name, sha256) of its weight files.
    pub sha256: String,
    pub tokenizer_fingerprint: String,
}

pub struct Model {
    pub decoder: Decoder,
    pub tokenizer: TextTokenizer,
    /// `None` when the model ships no template; chat mode then refuses with a reason.
    pub template: Option<ChatTemplate>,
    pub identity: ModelIdentity,
    /// Whether `identity.sha256` was computed from the bytes at this load or trusted
    /// from a stamp.
    pub sha256_check: DigestCheck,
}

/// How the sha256 a model reports was established at this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestCheck {
    /// Computed from every byte of the weights now.
    HashedNow,
    /// Taken from the stamp written when the bytes were last hashed, trusted because the
    /// file's size and modification time are unchanged since.
    Stamp,
}

/// Where a model is and who it is, as the fetch layer hands it to the runtime.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    pub name: String,
    pub path: PathBuf,
    /// sha256 of the GGUF file; for a safetensors directory, of the sorted list of
    /// (file name, sha256) of its weight files. Verified (or computed) before loading.
    pub sha256: String,
    /// Where it came from when it was fetched.
    pub source: Option<String>,
    pub sha256_check: DigestCheck,
}

impl Model {
    pub fn load(resolved: &ResolvedModel, device: &Device, opts: LoadOptions) -> Result<Self> {
        let loaded = load_decoder(&resolved.path, device, opts)?;
        let (tokenizer, template) = match &loaded.gguf {
            Some(content) => {
                let tok = TextTokenizer::from_gguf(content)?;
                let tpl = ChatTemplate::from_gguf(content).ok();
                (tok, tpl)
            }
            None => {
                let tok = TextTokenizer::from_tokenizer_json(resolved.path.join("tokenizer.json"))?;
                let tpl = ChatTemplate::from_tokenizer_config(
                    resolved.path.join("tokenizer_config.json"),
                )
                .ok();
                (tok, tpl)
            }
        };
        if tokenizer.vocab_size() > loaded.decoder.config().vocab_size {
            return Err(ModelError::Unsupported(format!(
                "the tokenizer has {} tokens but the model's embedding only {}",
                tokenizer.vocab_size(),
                loaded.decoder.config().vocab_size
            )));
        }
        let identity = ModelIdentity {
            name: resolved.name.clone(),
            path: resolved.path.clone(),
            format: loaded.format,
            sha256: resolved.sha256.clone(),
            tokenizer_fingerprint: tokenizer.fingerprint().to_string(),
        };
        Ok(Self {
            decoder: loaded.decoder,
            tokenizer,
            template,
            identity,
            sha256_check: resolved.sha256_check,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.decoder.config()
    }

    /// The chat template, or an error saying the model has none.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{} ships no chat template: use plain prompts (without --chat)",
                self.identity.name
            ))
        })
    }
}
