//! Weights from GGUF (quantized) or Hugging Face safetensors (dense), into one layout the
//! decoder runs. On x86 CPUs with AVX-512 VNNI or AVX2, Q8_0 / Q5_0 / Q4_K / Q6_K projections are
//! packed for baton's own kernels ([`crate::kernels::int8`]: row-count invariant, fused
//! Q/K/V, gate/up + SiLU and residual epilogues); everything else goes through candle's
//! QMatMul.

mod linear;
mod load;

pub use linear::Linear;
pub use load::list_safetensors;
pub(crate) use load::{load_gguf, load_safetensors, safetensors_files, GgufSource};

use super::compute::Compute;
use super::error::Result;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

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

/// Block types without a fast CPU kernel (candle's are generic scalar code); they are
/// re-quantized to Q8_0 at load. Q5_0 is only converted where the packed kernels are
/// unavailable: on qwen2.5-coder-0.5b the conversion moves logits by 0.07 on average
/// (max 0.67 over 64 positions of code text, top-1 unchanged in 63 of 64), about the size
/// of the 8-bit activation quantization's own error against an f32 reference.
fn slow_on_cpu(t: GgmlDType) -> bool {
    match t {
        GgmlDType::Q4_1 | GgmlDType::Q5_1 => true,
        // Q5_0 runs natively in the packed kernels (no conversion error, and 35%
        // fewer bytes per decode step than Q8_0).
        GgmlDType::Q5_0 => {
            !fast_cpu_kernels() || FORCE_Q8_0.load(std::sync::atomic::Ordering::Relaxed)
        }
        _ => false,
    }
}

/// Whether weights on the CPU run on baton's own int8 kernels: where the CPU has AVX-512
/// VNNI or AVX2, or where `BATON_PORTABLE_KERNELS` asks for their portable path.
pub fn fast_cpu_kernels() -> bool {
    crate::kernels::int8::enabled()
}

/// Test hook: convert Q5_0 to Q8_0 even where Q5_0 has a fast kernel (to measure what
/// the conversion costs in logits).
pub(crate) static FORCE_Q8_0: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

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
        self.converted
            .iter()
            .map(|e| e.3 as isize - e.2 as isize)
            .sum()
    }
}

/// Options that change how a model is held in memory and how it computes.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Re-quantize block types without fast CPU kernels to Q8_0 (default on CPU).
    pub convert_slow_blocks: bool,
    /// The activations' dtype and the attention path.
    pub compute: Compute,
}

impl LoadOptions {
    pub fn for_device(device: &Device) -> Self {
        Self {
            convert_slow_blocks: device.is_cpu(),
            compute: Compute::default(),
        }
    }

    pub fn computing(self, compute: Compute) -> Self {
        Self { compute, ..self }
    }
}
