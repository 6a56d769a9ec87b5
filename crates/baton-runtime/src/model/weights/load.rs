//! Loading weights from GGUF (re-quantizing the block types without fast CPU kernels)
//! and from safetensors.

use super::super::config::{Arch, ModelConfig};
use super::super::error::{ModelError, Result};
use super::{slow_on_cpu, ConversionReport, Embedding, LayerWeights, Linear, LoadOptions, Weights};
use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) struct GgufSource<'a> {
    pub path: &'a Path,
    pub content: &'a gguf_file::Content,
    pub file: std::fs::File,
}

impl GgufSource<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has(name) {
            return Err(ModelError::MissingTensor {
                name: name.to_string(),
                reason: format!("not in {}", self.path.display()),
            });
        }
        self.content
            .tensor(&mut self.file, name, device)
            .map_err(|e| ModelError::BadGguf {
                path: self.path.to_path_buf(),
                reason: format!("reading tensor `{name}`: {e}"),
            })
    }

    pub(crate) fn dense_f32(&mut self, name: &str, device: &Device) -> Result<Vec<f32>> {
        Ok(self
            .qtensor(name, device)?
            .dequantize(device)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }

    fn dense(&mut self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        Ok(self
            .qtensor(name, device)?
            .dequantize(device)?
            .to_dtype(dtype)?)
    }

    fn linear(
        &mut self,
        name: &str,
        bias: Option<&str>,
        opts: LoadOptions,
        report: &mut ConversionReport,
        dtype: DType,
        device: &Device,
    ) -> Result<Linear> {
        let q = self.qtensor(&format!("{name}.weight"), device)?;
        let q = maybe_convert(q, opts, report, device)?;
        let b = match bias {
            Some(b) if self.has(&format!("{b}.bias")) => {
                Some(self.dense(&format!("{b}.bias"), dtype, device)?)
            }
            _ => None,
        };
        Linear::from_qtensor(q, b, dtype, device)
    }
}

fn maybe_convert(
    q: QTensor,
    opts: LoadOptions,
    report: &mut ConversionReport,
    device: &Device,
) -> Result<QTensor> {
    if !(opts.convert_slow_blocks && slow_on_cpu(q.dtype())) {
        return Ok(q);
    }
    let before = q.storage_size_in_bytes();
    let from = q.dtype();
    let converted = QTensor::quantize(&q.dequantize(device)?, GgmlDType::Q8_0)?;
    report.record(from, before, converted.storage_size_in_bytes());
    Ok(converted)
}

/// A vocabulary larger than the embedding would load and fail only when a token past the
/// rows comes up, mid-answer. A smaller one is normal: embeddings are padded (Qwen's has
/// 151,936 rows for 151,665 tokens).
fn check_vocabulary(cfg: &ModelConfig, embedding: &[usize]) -> Result<()> {
    let rows = embedding.first().copied().unwrap_or(0);
    if cfg.vocab_size > rows {
        return Err(ModelError::BadMetadata {
            key: "vocabulary size".into(),
            reason: format!(
                "the metadata names {} tokens but the embedding has {rows} rows: the file is \
                 inconsistent; fetch or convert it again",
                cfg.vocab_size
            ),
        });
    }
    Ok(())
}

pub(crate) fn load_gguf(
    src: &mut GgufSource<'_>,
    cfg: &ModelConfig,
    opts: LoadOptions,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let mut load = GgufLoad {
        src,
        opts,
        dtype,
        device,
        report: ConversionReport::default(),
    };
    let embed_q = Arc::new(load.src.qtensor("token_embd.weight", device)?);
    check_vocabulary(cfg, embed_q.shape().dims())?;
    let output = load.output()?;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        layers.push(load.layer(cfg, i)?);
    }
    let final_norm = load.dense("output_norm.weight")?;
    Ok(Weights {
        embedding: Embedding::Quantized(embed_q),
        layers,
        final_norm,
        output,
        conversion: load.report,
    })
}

/// A GGUF file being read into weights of one dtype on one device, with the record of
/// the blocks converted on the way.
struct GgufLoad<'s, 'a> {
    src: &'s mut GgufSource<'a>,
    opts: LoadOptions,
    dtype: DType,
    device: &'s Device,
    report: ConversionReport,
}

impl GgufLoad<'_, '_> {
    fn dense(&mut self, name: &str) -> Result<Tensor> {
        self.src.dense(name, self.dtype, self.device)
    }

    fn linear(&mut self, name: &str, bias: Option<&str>) -> Result<Linear> {
        self.src.linear(
            name,
            bias,
            self.opts,
            &mut self.report,
            self.dtype,
            self.device,
        )
    }

    fn output(&mut self) -> Result<Linear> {
        if self.src.has("output.weight") {
            return self.linear("output", None);
        }
        // Tied embeddings: the output projection is the embedding table.
        let q = maybe_convert(
            self.src.qtensor("token_embd.weight", self.device)?,
            self.opts,
            &mut self.report,
            self.device,
        )?;
        Linear::from_qtensor(q, None, self.dtype, self.device)
    }

    fn layer(&mut self, cfg: &ModelConfig, i: usize) -> Result<LayerWeights> {
        let p = format!("blk.{i}");
        let has_bias = cfg.arch == Arch::Qwen2;
        let bias = |n: &str| {
            if has_bias {
                Some(format!("{p}.{n}"))
            } else {
                None
            }
        };
        let (bq, bk, bv) = (bias("attn_q"), bias("attn_k"), bias("attn_v"));
        let qk_norm = cfg.arch == Arch::Qwen3;
        Ok(LayerWeights {
            attn_norm: self.dense(&format!("{p}.attn_norm.weight"))?,
            q: self.linear(&format!("{p}.attn_q"), bq.as_deref())?,
            k: self.linear(&format!("{p}.attn_k"), bk.as_deref())?,
            v: self.linear(&format!("{p}.attn_v"), bv.as_deref())?,
            o: self.linear(&format!("{p}.attn_output"), None)?,
            q_norm: if qk_norm {
                Some(self.dense(&format!("{p}.attn_q_norm.weight"))?)
            } else {
                None
            },
            k_norm: if qk_norm {
                Some(self.dense(&format!("{p}.attn_k_norm.weight"))?)
            } else {
                None
            },
            ffn_norm: self.dense(&format!("{p}.ffn_norm.weight"))?,
            gate: self.linear(&format!("{p}.ffn_gate"), None)?,
            up: self.linear(&format!("{p}.ffn_up"), None)?,
            down: self.linear(&format!("{p}.ffn_down"), None)?,
        })
    }
}

/// The `*.safetensors` files of a directory, sorted; none is not an error here.
pub fn list_safetensors(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// The `*.safetensors` files of a Hugging Face model directory.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let files = list_safetensors(dir).map_err(|e| ModelError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    if files.is_empty() {
        return Err(ModelError::BadSafetensors {
            path: dir.to_path_buf(),
            reason: "no *.safetensors files in this directory".into(),
        });
    }
    Ok(files)
}

/// `tied`: whether config.json ties the output projection to the embedding; when it does
/// not, `lm_head.weight` must be there.
pub(crate) fn load_safetensors(
    dir: &Path,
    cfg: &ModelConfig,
    tied: bool,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let files = safetensors_files(dir)?;
    let vb = crate::os::mapped_safetensors(&files, dtype, device).map_err(|e| {
        ModelError::BadSafetensors {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    let get = |name: &str| -> Result<Tensor> {
        vb.get_unchecked(name)
            .map_err(|e| ModelError::MissingTensor {
                name: name.to_string(),
                reason: e.to_string(),
            })
    };
    let linear = |name: &str, bias: bool| -> Result<Linear> {
        let w = get(&format!("{name}.weight"))?;
        let b = if bias && vb.contains_tensor(&format!("{name}.bias")) {
            Some(get(&format!("{name}.bias"))?)
        } else {
            None
        };
        Ok(Linear::new(QMatMul::Tensor(w), b))
    };
    let has_bias = cfg.arch == Arch::Qwen2;
    let qk_norm = cfg.arch == Arch::Qwen3;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        let p = format!("model.layers.{i}");
        layers.push(LayerWeights {
            attn_norm: get(&format!("{p}.input_layernorm.weight"))?,
            q: linear(&format!("{p}.self_attn.q_proj"), has_bias)?,
            k: linear(&format!("{p}.self_attn.k_proj"), has_bias)?,
            v: linear(&format!("{p}.self_attn.v_proj"), has_bias)?,
            o: linear(&format!("{p}.self_attn.o_proj"), false)?,
            q_norm: if qk_norm {
                Some(get(&format!("{p}.self_attn.q_norm.weight"))?)
            } else {
                None
            },
            k_norm: if qk_norm {
                Some(get(&format!("{p}.self_attn.k_norm.weight"))?)
            } else {
                None
            },
            ffn_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
            gate: linear(&format!("{p}.mlp.gate_proj"), false)?,
            up: linear(&format!("{p}.mlp.up_proj"), false)?,
            down: linear(&format!("{p}.mlp.down_proj"), false)?,
        });
    }
    let embed = get("model.embed_tokens.weight")?;
    check_vocabulary(cfg, embed.dims())?;
    let output = if vb.contains_tensor("lm_head.weight") {
        linear("lm_head", false)?
    } else if tied {
        Linear::new(QMatMul::Tensor(embed.clone()), None)
    } else {
        // Falling back to the embedding here would run, and answer nonsense.
        return Err(ModelError::MissingTensor {
            name: "lm_head.weight".into(),
            reason: format!(
                "config.json sets tie_word_embeddings to false, so the output projection \
                 must be among the weights, and no file in {} holds it: the directory is \
                 incomplete (a shard missing?); fetch the model's files again",
                dir.display()
            ),
        });
    };
    Ok(Weights {
        embedding: Embedding::Dense(embed),
        layers,
        final_norm: get("model.norm.weight")?,
        output,
        conversion: ConversionReport::default(),
    })
}
