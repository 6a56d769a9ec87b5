//! Opening a model from disk: format detection, integrity checks that turn a truncated
//! or foreign file into a clear error, and decoder construction.

use super::attention::AttentionPath;
use super::config::ModelConfig;
use super::decoder::Decoder;
use super::error::{ModelError, Result};
use super::weights::{self, GgufSource, LoadOptions};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

/// `auto` (None: the device's own), `f32`, `bf16` or `f16`.
pub fn parse_activations(s: &str) -> std::result::Result<Option<DType>, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        "f32" => Ok(Some(DType::F32)),
        "bf16" => Ok(Some(DType::BF16)),
        "f16" => Ok(Some(DType::F16)),
        other => Err(format!(
            "unknown activation dtype `{other}`: use auto, f32, bf16 or f16"
        )),
    }
}

pub fn detect_format(path: &Path) -> Result<ModelFormat> {
    if !path.exists() {
        return Err(ModelError::NotFound(path.to_path_buf()));
    }
    if path.is_dir() {
        if path.join("config.json").is_file() {
            weights::safetensors_files(path)?;
            return Ok(ModelFormat::Safetensors);
        }
        return Err(ModelError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "a directory without config.json (a Hugging Face model directory holds config.json, *.safetensors and tokenizer.json)".into(),
        });
    }
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let n = f.read(&mut magic).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    if n == 4 && &magic == b"GGUF" {
        Ok(ModelFormat::Gguf)
    } else {
        Err(ModelError::UnknownFormat {
            path: path.to_path_buf(),
            reason: "it does not start with the GGUF magic bytes and is not a directory".into(),
        })
    }
}

/// A GGUF file's header, checked against the file's real length so a truncated download
/// is caught before any tensor is read.
pub fn read_gguf_header(path: &Path) -> Result<gguf_file::Content> {
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let content = gguf_file::Content::read(&mut f).map_err(|e| ModelError::BadGguf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let len = f
        .metadata()
        .map_err(|e| ModelError::Io {
            path: path.to_path_buf(),
            source: e,
        })?
        .len();
    let end = content
        .tensor_infos
        .values()
        .map(|t| {
            let dt = t.ggml_dtype;
            let bytes = t.shape.elem_count() / dt.block_size() * dt.type_size();
            content.tensor_data_offset + t.offset + bytes as u64
        })
        .max()
        .unwrap_or(content.tensor_data_offset);
    if end > len {
        return Err(ModelError::BadGguf {
            path: path.to_path_buf(),
            reason: format!(
                "the file is truncated: {len} bytes, but its tensors end at byte {end}"
            ),
        });
    }
    Ok(content)
}

/// What was loaded, with the metadata the tokenizer and chat template are built from.
pub struct LoadedDecoder {
    pub decoder: Decoder,
    pub format: ModelFormat,
    pub path: PathBuf,
    pub gguf: Option<gguf_file::Content>,
}

pub fn load_decoder(path: &Path, device: &Device, opts: LoadOptions) -> Result<LoadedDecoder> {
    let format = detect_format(path)?;
    let dtype = opts.compute.activation_dtype(device);
    match format {
        ModelFormat::Gguf => {
            let content = read_gguf_header(path)?;
            let mut cfg = ModelConfig::from_gguf(&content.metadata)?;
            let file = std::fs::File::open(path).map_err(|e| ModelError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
            let mut src = GgufSource {
                path,
                content: &content,
                file,
            };
            if content.tensor_infos.contains_key("rope_freqs.weight") {
                let t = src.dense_f32("rope_freqs.weight", device)?;
                cfg.rope.freq_factors = Some(t);
            }
            let attention = attention_for(opts.compute.attention, &cfg, device, dtype)?;
            let w = weights::load_gguf(&mut src, &cfg, opts, dtype, device)?;
            tracing::info!(path = %path.display(), arch = cfg.arch.name(), layers = cfg.n_layer, converted = ?w.conversion, "loaded GGUF model");
            Ok(LoadedDecoder {
                decoder: Decoder::new(cfg, w, dtype, device)?.with_attention(attention)?,
                format,
                path: path.to_path_buf(),
                gguf: Some(content),
            })
        }
        ModelFormat::Safetensors => {
            let cfg_path = path.join("config.json");
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::Io {
                path: cfg_path.clone(),
                source: e,
            })?;
            let cfg = ModelConfig::from_hf_json(&text)?;
            let tied = tied_embeddings(&text)?;
            let attention = attention_for(opts.compute.attention, &cfg, device, dtype)?;
            let w = weights::load_safetensors(path, &cfg, tied, dtype, device)?;
            tracing::info!(path = %path.display(), arch = cfg.arch.name(), layers = cfg.n_layer, "loaded safetensors model");
            Ok(LoadedDecoder {
                decoder: Decoder::new(cfg, w, dtype, device)?.with_attention(attention)?,
                format,
                path: path.to_path_buf(),
                gguf: None,
            })
        }
    }
}

/// The attention path asked for, refused before any weight is read where this model
/// cannot run it.
fn attention_for(
    path: AttentionPath,
    cfg: &ModelConfig,
    device: &Device,
    dtype: DType,
) -> Result<AttentionPath> {
    if path == AttentionPath::Fused {
        super::attention::fused::check(device, dtype, cfg.head_dim)?;
    }
    Ok(path)
}

/// Whether config.json ties the output projection to the embedding: transformers' default
/// (true) when it does not say.
fn tied_embeddings(config_json: &str) -> Result<bool> {
    #[derive(serde::Deserialize)]
    struct Tie {
        tie_word_embeddings: Option<bool>,
    }
    let tie: Tie = serde_json::from_str(config_json).map_err(|e| ModelError::BadMetadata {
        key: "config.json: tie_word_embeddings".into(),
        reason: e.to_string(),
    })?;
    Ok(tie.tie_word_embeddings.unwrap_or(true))
}
