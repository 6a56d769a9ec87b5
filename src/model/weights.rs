//! Weights from GGUF (quantized, through candle's QMatMul) or Hugging Face safetensors
//! (dense), into one layout the decoder runs.

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A projection `y = x Wᵀ + b`, quantized or dense.
#[derive(Debug, Clone)]
pub struct Linear {
    w: QMatMul,
    b: Option<Tensor>,
    quantized: bool,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Quantized kernels take f32 activations; on the GPU activations are bf16.
        let y = if self.quantized && x.dtype() != DType::F32 {
            self.w.forward(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype())?
        } else {
            self.w.forward(x)?
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Token embedding table; quantized tables are looked up row by row, never dequantized
/// whole (the 1.5B's table would be 930 MB in f32).
#[derive(Debug, Clone)]
pub enum Embedding {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Embedding {
    pub fn forward(&self, ids: &Tensor, dtype: DType) -> Result<Tensor> {
        Ok(match self {
            Self::Quantized(q) => q.embedding(ids)?.to_dtype(dtype)?,
            Self::Dense(t) => t.embedding(ids)?.to_dtype(dtype)?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Debug, Clone)]
pub struct Weights {
    pub embedding: Embedding,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Tensor,
    pub output: Linear,
    /// What was converted at load and what it cost.
    pub conversion: ConversionReport,
}

/// Block types whose CPU kernels in candle are generic scalar code; they are re-quantized
/// to Q8_0 at load, which has SIMD (and VNNI-repacked) kernels. Q8_0 holds every Q5_0
/// value to within half a Q8_0 step, so the logit change is small (measured in tests).
fn slow_on_cpu(t: GgmlDType) -> bool {
    matches!(t, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1)
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ConversionReport {
    /// (from type, tensor count, bytes before, bytes after)
    pub converted: Vec<(String, usize, usize, usize)>,
}

impl ConversionReport {
    fn record(&mut self, from: GgmlDType, before: usize, after: usize) {
        let name = format!("{from:?}");
        if let Some(e) = self.converted.iter_mut().find(|e| e.0 == name) {
            e.1 += 1;
            e.2 += before;
            e.3 += after;
        } else {
            self.converted.push((name, 1, before, after));
        }
    }

    pub fn extra_bytes(&self) -> isize {
        self.converted.iter().map(|e| e.3 as isize - e.2 as isize).sum()
    }
}

/// Options that change how weights are held in memory.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Re-quantize block types without fast CPU kernels to Q8_0 (default on CPU).
    pub convert_slow_blocks: bool,
}

impl LoadOptions {
    pub fn for_device(device: &Device) -> Self {
        Self {
            convert_slow_blocks: device.is_cpu(),
        }
    }
}

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
        Ok(self.qtensor(name, device)?.dequantize(device)?.to_dtype(dtype)?)
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
        let quantized = !matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let w = QMatMul::from_qtensor(q)?;
        let w = match w {
            QMatMul::Tensor(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
            other => other,
        };
        Ok(Linear { w, b, quantized })
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

pub(crate) fn load_gguf(
    src: &mut GgufSource<'_>,
    cfg: &ModelConfig,
    opts: LoadOptions,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let mut report = ConversionReport::default();
    let embed_q = Arc::new(src.qtensor("token_embd.weight", device)?);
    let output = if src.has("output.weight") {
        src.linear("output", None, opts, &mut report, dtype, device)?
    } else {
        // Tied embeddings: the output projection is the embedding table.
        let q = maybe_convert(src.qtensor("token_embd.weight", device)?, opts, &mut report, device)?;
        Linear {
            w: QMatMul::from_qtensor(q)?,
            b: None,
            quantized: true,
        }
    };
    let has_bias = cfg.arch == Arch::Qwen2;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        let p = format!("blk.{i}");
        let bias = |n: &str| if has_bias { Some(format!("{p}.{n}")) } else { None };
        let (bq, bk, bv) = (bias("attn_q"), bias("attn_k"), bias("attn_v"));
        let qk_norm = cfg.arch == Arch::Qwen3;
        layers.push(LayerWeights {
            attn_norm: src.dense(&format!("{p}.attn_norm.weight"), dtype, device)?,
            q: src.linear(&format!("{p}.attn_q"), bq.as_deref(), opts, &mut report, dtype, device)?,
            k: src.linear(&format!("{p}.attn_k"), bk.as_deref(), opts, &mut report, dtype, device)?,
            v: src.linear(&format!("{p}.attn_v"), bv.as_deref(), opts, &mut report, dtype, device)?,
            o: src.linear(&format!("{p}.attn_output"), None, opts, &mut report, dtype, device)?,
            q_norm: if qk_norm {
                Some(src.dense(&format!("{p}.attn_q_norm.weight"), dtype, device)?)
            } else {
                None
            },
            k_norm: if qk_norm {
                Some(src.dense(&format!("{p}.attn_k_norm.weight"), dtype, device)?)
            } else {
                None
            },
            ffn_norm: src.dense(&format!("{p}.ffn_norm.weight"), dtype, device)?,
            gate: src.linear(&format!("{p}.ffn_gate"), None, opts, &mut report, dtype, device)?,
            up: src.linear(&format!("{p}.ffn_up"), None, opts, &mut report, dtype, device)?,
            down: src.linear(&format!("{p}.ffn_down"), None, opts, &mut report, dtype, device)?,
        });
    }
    Ok(Weights {
        embedding: Embedding::Quantized(embed_q),
        layers,
        final_norm: src.dense("output_norm.weight", dtype, device)?,
        output,
        conversion: report,
    })
}

/// The `*.safetensors` files of a Hugging Face model directory.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| ModelError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::BadSafetensors {
            path: dir.to_path_buf(),
            reason: "no *.safetensors files in this directory".into(),
        });
    }
    Ok(files)
}

pub(crate) fn load_safetensors(
    dir: &Path,
    cfg: &ModelConfig,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let files = safetensors_files(dir)?;
    // SAFETY: the files are memory-mapped read-only; baton never writes them, and a file
    // changed underneath a running process is outside what any loader can defend against.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&files, dtype, device) }
        .map_err(|e| ModelError::BadSafetensors {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
    let get = |name: &str| -> Result<Tensor> {
        vb.get_unchecked(name).map_err(|e| ModelError::MissingTensor {
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
        Ok(Linear {
            w: QMatMul::Tensor(w),
            b,
            quantized: false,
        })
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
            q_norm: if qk_norm { Some(get(&format!("{p}.self_attn.q_norm.weight"))?) } else { None },
            k_norm: if qk_norm { Some(get(&format!("{p}.self_attn.k_norm.weight"))?) } else { None },
            ffn_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
            gate: linear(&format!("{p}.mlp.gate_proj"), false)?,
            up: linear(&format!("{p}.mlp.up_proj"), false)?,
            down: linear(&format!("{p}.mlp.down_proj"), false)?,
        });
    }
    let embed = get("model.embed_tokens.weight")?;
    let output = if vb.contains_tensor("lm_head.weight") {
        linear("lm_head", false)?
    } else {
        Linear {
            w: QMatMul::Tensor(embed.clone()),
            b: None,
            quantized: false,
        }
    };
    Ok(Weights {
        embedding: Embedding::Dense(embed),
        layers,
        final_norm: get("model.norm.weight")?,
        output,
        conversion: ConversionReport::default(),
    })
}
