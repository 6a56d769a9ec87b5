//! Weights from GGUF (quantized) or Hugging Face safetensors (dense), into one layout the
//! decoder runs. On CPUs with AVX-512 VNNI, Q8_0 / Q5_0 / Q4_K / Q6_K projections are
//! packed for baton's own kernels (module `qmm` below: row-count invariant, fused Q/K/V,
//! gate/up + SiLU and residual epilogues); everything else goes through candle's QMatMul.

// The SIMD kernels index several parallel lane arrays with one counter; iterator
// chains would hide which lanes pair up.
#![allow(clippy::needless_range_loop, clippy::type_complexity)]

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A projection `y = x Wᵀ + b`, quantized or dense.
#[derive(Debug, Clone)]
pub struct Linear {
    w: LinearWeight,
    b: Option<Tensor>,
    quantized: bool,
    /// candle's x86 Q6K kernels differ between one row (compact GEMV) and several
    /// (repacked tiles) in the order they add partial sums, so a decode step would not
    /// reproduce the prefill's bits. Running a single row as two identical rows takes the
    /// tiled path for both. (Only for weights left to candle: the packed kernels below are
    /// row-count invariant by construction.)
    pad_single_row: bool,
}

#[derive(Debug, Clone)]
enum LinearWeight {
    Candle(QMatMul),
    /// Packed for the CPU kernels below, with the bias as plain floats.
    #[cfg(target_arch = "x86_64")]
    Packed(Arc<qmm::Packed>, Option<Arc<Vec<f32>>>),
}

impl Linear {
    fn new(w: QMatMul, b: Option<Tensor>) -> Self {
        let (quantized, pad_single_row) = match &w {
            QMatMul::QTensor(q) => (true, q.dtype() == GgmlDType::Q6K && q.device().is_cpu()),
            _ => (false, false),
        };
        Self {
            w: LinearWeight::Candle(w),
            b,
            quantized,
            pad_single_row,
        }
    }

    /// Quantized weights; packed for the CPU kernels where they apply.
    fn from_qtensor(q: QTensor, b: Option<Tensor>, dtype: DType, device: &Device) -> Result<Self> {
        #[cfg(target_arch = "x86_64")]
        if device.is_cpu() && dtype == DType::F32 {
            if let Ok((n, k)) = q.shape().dims2() {
                if qmm::Packed::supports(q.dtype(), n, k) {
                    if let Some(p) = qmm::Packed::new(q.dtype(), n, k, &q.data()?) {
                        let bias = match &b {
                            Some(b) => Some(Arc::new(
                                b.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
                            )),
                            None => None,
                        };
                        if bias.as_ref().is_none_or(|v| v.len() == n) {
                            return Ok(Self {
                                w: LinearWeight::Packed(Arc::new(p), bias),
                                b,
                                quantized: true,
                                pad_single_row: false,
                            });
                        }
                    }
                }
            }
        }
        let _ = device;
        let w = QMatMul::from_qtensor(q)?;
        let w = match w {
            QMatMul::Tensor(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
            other => other,
        };
        Ok(Self::new(w, b))
    }

    /// A dense f32 matrix `weight` ([out, in]) and bias, quantized to Q8_0 and packed
    /// for the CPU's int8 kernels. `None` where those kernels do not run (no AVX-512
    /// VNNI, not on the CPU, or a shape they do not take).
    pub fn packed_q8_0(weight: &Tensor, bias: Option<&Tensor>) -> Result<Option<Self>> {
        #[cfg(target_arch = "x86_64")]
        {
            let (n, k) = weight.dims2()?;
            if weight.device().is_cpu() && qmm::Packed::supports(GgmlDType::Q8_0, n, k) {
                let q = QTensor::quantize(&weight.to_dtype(DType::F32)?, GgmlDType::Q8_0)?;
                let b = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
                let l = Self::from_qtensor(q, b, DType::F32, weight.device())?;
                if matches!(l.w, LinearWeight::Packed(..)) {
                    return Ok(Some(l));
                }
            }
        }
        let _ = (weight, bias);
        Ok(None)
    }

    /// `x Wᵀ + b` on the packed CPU kernels for `m` rows given as parts side by side
    /// (row `r` of the input is `parts[0][r] | parts[1][r] | …`, each part `width` wide,
    /// f32 row-major); `None` when this projection is not packed as Q8_0.
    pub fn forward_parts(
        &self,
        parts: &[&[f32]],
        width: usize,
        m: usize,
    ) -> Result<Option<Vec<f32>>> {
        #[cfg(target_arch = "x86_64")]
        if let LinearWeight::Packed(p, b) = &self.w {
            if p.kind().a256() {
                return Ok(None);
            }
            if parts.len() * width != p.k()
                || !width.is_multiple_of(32)
                || parts.iter().any(|x| x.len() < m * width)
            {
                return Err(ModelError::Cache(format!(
                    "{} parts of {width} inputs ({m} rows) for a projection of {} inputs",
                    parts.len(),
                    p.k()
                )));
            }
            let mut dst = qmm::uninit(m * p.n());
            qmm::matmul_rows(
                qmm::Rows::Parts { parts, width },
                m,
                &mut [qmm::Job {
                    w: p,
                    up: None,
                    bias: b.as_ref().map(|b| b.as_slice()),
                    epilogue: qmm::Epilogue::Plain,
                    dst: &mut dst,
                }],
            );
            // SAFETY: matmul wrote every element.
            return Ok(Some(unsafe { qmm::assume_init(dst) }));
        }
        let _ = (parts, width, m);
        Ok(None)
    }

    /// The weight as a dense f32 matrix [out, in]. The packed kernels keep no other copy,
    /// so it is recovered by running the identity through the layer: a one-hot row
    /// quantizes without loss, which makes this the dequantized weight up to the f32
    /// rounding of the activation scale. For instruments, not for the forward pass.
    pub fn dense_weight(&self, in_features: usize, device: &Device) -> Result<Tensor> {
        let eye = Tensor::eye(in_features, DType::F32, device)?;
        let y = self.forward(&eye)?.to_dtype(DType::F32)?;
        let y = match &self.b {
            Some(b) => y.broadcast_sub(&b.to_dtype(DType::F32)?)?,
            None => y,
        };
        Ok(y.t()?.contiguous()?)
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.w {
            LinearWeight::Candle(w) => {
                let single_row = x.rank() == 2 && x.dim(0)? == 1;
                let y = if self.pad_single_row && single_row {
                    let x2 = Tensor::cat(&[x, x], 0)?;
                    w.forward(&x2)?.narrow(0, 0, 1)?
                } else if self.quantized && x.dtype() != DType::F32 {
                    // Quantized kernels take f32 activations; on the GPU activations are bf16.
                    w.forward(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype())?
                } else {
                    w.forward(x)?
                };
                Ok(match &self.b {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                })
            }
            #[cfg(target_arch = "x86_64")]
            LinearWeight::Packed(p, b) => {
                let ws = [(p, b.as_ref().map(|b| b.as_slice()))];
                match run_packed(&ws, x, |_| qmm::Epilogue::Plain, None)? {
                    Some(outs) => one_output(outs),
                    None => Err(ModelError::Unsupported(format!(
                        "weights packed for the CPU take f32 CPU activations, not {:?} on {:?}",
                        x.dtype(),
                        x.device().location()
                    ))),
                }
            }
        }
    }

    /// `[l.forward(x) for l in ls]`, sharing one activation quantization and one parallel
    /// region where the weights allow (Q/K/V, gate/up). Results are bit-identical to
    /// separate calls.
    pub fn forward_many(ls: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        #[cfg(target_arch = "x86_64")]
        if let Some(ws) = packed_all(ls) {
            if let Some(outs) = run_packed(&ws, x, |_| qmm::Epilogue::Plain, None)? {
                return Ok(outs);
            }
        }
        ls.iter().map(|l| l.forward(x)).collect()
    }

    /// `residual + self.forward(x)`, fused into the matmul's output on the CPU.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        #[cfg(target_arch = "x86_64")]
        if let Some(ws) = packed_all(&[self]) {
            if residual.dtype() == DType::F32 && residual.device().is_cpu() {
                let res = residual.contiguous()?;
                let (st, lay) = res.storage_and_layout();
                if let candle_core::Storage::Cpu(cs) = &*st {
                    let all = cs.as_slice::<f32>()?;
                    let rs = &all[lay.start_offset()..lay.start_offset() + res.elem_count()];
                    if let Some(outs) = run_packed(
                        &ws,
                        x,
                        |_| qmm::Epilogue::Residual(rs),
                        Some(res.elem_count()),
                    )? {
                        return one_output(outs);
                    }
                }
            }
        }
        Ok((residual + self.forward(x)?)?)
    }

    /// `silu(x gateᵀ) * (x upᵀ)`, fused into one pass on the CPU.
    pub fn forward_swiglu(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Tensor> {
        #[cfg(target_arch = "x86_64")]
        if let (Some(g), Some(u)) = (packed_all(&[gate]), packed_all(&[up])) {
            let (g, u) = (g[0], u[0]);
            if g.1.is_none()
                && u.1.is_none()
                && g.0.n() == u.0.n()
                && g.0.k() == u.0.k()
                && g.0.kind() == u.0.kind()
            {
                if let Some(outs) = run_packed_swiglu(g.0, u.0, x)? {
                    return one_output(outs);
                }
            }
        }
        let [g, u]: [Tensor; 2] = Self::forward_many(&[gate, up], x)?
            .try_into()
            .map_err(|_| {
                ModelError::Cache(
                    "fused gate/up projection returned the wrong number of outputs".into(),
                )
            })?;
        Ok((candle_nn::ops::silu(&g)? * u)?)
    }
}

#[cfg(target_arch = "x86_64")]
type PackedRef<'a> = (&'a Arc<qmm::Packed>, Option<&'a [f32]>);

/// The packed weights of every linear, if all are packed and share one input format.
#[cfg(target_arch = "x86_64")]
fn packed_all<'a>(ls: &[&'a Linear]) -> Option<Vec<PackedRef<'a>>> {
    let ws: Vec<PackedRef<'a>> = ls
        .iter()
        .map(|l| match &l.w {
            LinearWeight::Packed(p, b) => Some((p, b.as_ref().map(|b| b.as_slice()))),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let ok = !ws.is_empty()
        && ws
            .iter()
            .all(|(w, _)| w.k() == ws[0].0.k() && w.kind().a256() == ws[0].0.kind().a256());
    ok.then_some(ws)
}

/// The f32 rows of `x` ([.., k], on the CPU) for a packed matmul, or None.
#[cfg(target_arch = "x86_64")]
fn with_rows<T>(
    x: &Tensor,
    k: usize,
    f: impl FnOnce(&[f32], usize) -> Result<T>,
) -> Result<Option<T>> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 || x.rank() == 0 {
        return Ok(None);
    }
    let dims = x.dims();
    if dims[dims.len() - 1] != k {
        return Err(ModelError::Cache(format!(
            "matmul input {dims:?} for {k} inputs"
        )));
    }
    let m = x.elem_count() / k;
    let x = x.contiguous()?;
    let (st, lay) = x.storage_and_layout();
    let candle_core::Storage::Cpu(cs) = &*st else {
        return Ok(None);
    };
    let xs = &cs.as_slice::<f32>()?[lay.start_offset()..lay.start_offset() + m * k];
    f(xs, m).map(Some)
}

#[cfg(target_arch = "x86_64")]
fn out_tensor(o: Vec<f32>, x: &Tensor, n: usize) -> Result<Tensor> {
    let mut d = x.dims().to_vec();
    match d.last_mut() {
        Some(last) => *last = n,
        None => {
            return Err(ModelError::Unsupported(
                "a scalar is not a matmul input".into(),
            ))
        }
    }
    Ok(Tensor::from_vec(o, d, &Device::Cpu)?)
}

/// The single result of a one-weight packed call.
#[cfg(target_arch = "x86_64")]
fn one_output(mut outs: Vec<Tensor>) -> Result<Tensor> {
    match (outs.pop(), outs.is_empty()) {
        (Some(t), true) => Ok(t),
        _ => Err(ModelError::Unsupported(
            "a packed projection returned other than one output".into(),
        )),
    }
}

#[cfg(target_arch = "x86_64")]
fn run_packed<'a>(
    ws: &[PackedRef<'_>],
    x: &Tensor,
    epilogue: impl Fn(usize) -> qmm::Epilogue<'a>,
    residual_len: Option<usize>,
) -> Result<Option<Vec<Tensor>>> {
    let k = ws[0].0.k();
    let outs = with_rows(x, k, |xs, m| {
        if residual_len.is_some_and(|r| r != m * ws[0].0.n()) {
            return Err(ModelError::Cache(
                "residual shape differs from the projection's output".into(),
            ));
        }
        let mut outs: Vec<Vec<std::mem::MaybeUninit<f32>>> =
            ws.iter().map(|(w, _)| qmm::uninit(m * w.n())).collect();
        {
            let mut jobs: Vec<qmm::Job<'_>> = ws
                .iter()
                .zip(outs.iter_mut())
                .enumerate()
                .map(|(i, ((w, b), dst))| qmm::Job {
                    w,
                    up: None,
                    bias: *b,
                    epilogue: epilogue(i),
                    dst,
                })
                .collect();
            qmm::matmul(xs, m, &mut jobs);
        }
        // SAFETY: matmul wrote every element of every dst.
        Ok(outs
            .into_iter()
            .map(|o| unsafe { qmm::assume_init(o) })
            .collect::<Vec<_>>())
    })?;
    outs.map(|outs| {
        outs.into_iter()
            .zip(ws)
            .map(|(o, (w, _))| out_tensor(o, x, w.n()))
            .collect()
    })
    .transpose()
}

#[cfg(target_arch = "x86_64")]
fn run_packed_swiglu(g: &qmm::Packed, u: &qmm::Packed, x: &Tensor) -> Result<Option<Vec<Tensor>>> {
    let out = with_rows(x, g.k(), |xs, m| {
        let mut dst = qmm::uninit(m * g.n());
        qmm::matmul(
            xs,
            m,
            &mut [qmm::Job {
                w: g,
                up: Some(u),
                bias: None,
                epilogue: qmm::Epilogue::SwiGlu,
                dst: &mut dst,
            }],
        );
        // SAFETY: matmul wrote every element.
        Ok(unsafe { qmm::assume_init(dst) })
    })?;
    out.map(|o| Ok(vec![out_tensor(o, x, g.n())?])).transpose()
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

/// Block types without a fast CPU kernel (candle's are generic scalar code); they are
/// re-quantized to Q8_0 at load. Q5_0 is only converted where the packed kernels are
/// unavailable: on qwen2.5-coder-0.5b the conversion moves logits by 0.07 on average
/// (max 0.67 over 64 positions of code text, top-1 unchanged in 63 of 64), about the size
/// of the 8-bit activation quantization's own error against an f32 reference.
fn slow_on_cpu(t: GgmlDType) -> bool {
    match t {
        GgmlDType::Q4_1 | GgmlDType::Q5_1 => true,
        // Q5_0 runs natively in the packed kernels below (no conversion error, and 35%
        // fewer bytes per decode step than Q8_0).
        GgmlDType::Q5_0 => {
            !fast_cpu_kernels() || FORCE_Q8_0.load(std::sync::atomic::Ordering::Relaxed)
        }
        _ => false,
    }
}

/// Whether this CPU runs baton's own quantized matmul kernels (AVX-512 VNNI).
pub fn fast_cpu_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        qmm::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
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
        let q = maybe_convert(
            src.qtensor("token_embd.weight", device)?,
            opts,
            &mut report,
            device,
        )?;
        Linear::from_qtensor(q, None, dtype, device)?
    };
    let has_bias = cfg.arch == Arch::Qwen2;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        let p = format!("blk.{i}");
        let bias = |n: &str| {
            if has_bias {
                Some(format!("{p}.{n}"))
            } else {
                None
            }
        };
        let (bq, bk, bv) = (bias("attn_q"), bias("attn_k"), bias("attn_v"));
        let qk_norm = cfg.arch == Arch::Qwen3;
        layers.push(LayerWeights {
            attn_norm: src.dense(&format!("{p}.attn_norm.weight"), dtype, device)?,
            q: src.linear(
                &format!("{p}.attn_q"),
                bq.as_deref(),
                opts,
                &mut report,
                dtype,
                device,
            )?,
            k: src.linear(
                &format!("{p}.attn_k"),
                bk.as_deref(),
                opts,
                &mut report,
                dtype,
                device,
            )?,
            v: src.linear(
                &format!("{p}.attn_v"),
                bv.as_deref(),
                opts,
                &mut report,
                dtype,
                device,
            )?,
            o: src.linear(
                &format!("{p}.attn_output"),
                None,
                opts,
                &mut report,
                dtype,
                device,
            )?,
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
            gate: src.linear(
                &format!("{p}.ffn_gate"),
                None,
                opts,
                &mut report,
                dtype,
                device,
            )?,
            up: src.linear(
                &format!("{p}.ffn_up"),
                None,
                opts,
                &mut report,
                dtype,
                device,
            )?,
            down: src.linear(
                &format!("{p}.ffn_down"),
                None,
                opts,
                &mut report,
                dtype,
                device,
            )?,
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
    let output = if vb.contains_tensor("lm_head.weight") {
        linear("lm_head", false)?
    } else {
        Linear::new(QMatMul::Tensor(embed.clone()), None)
    };
    Ok(Weights {
        embedding: Embedding::Dense(embed),
        layers,
        final_norm: get("model.norm.weight")?,
        output,
        conversion: ConversionReport::default(),
    })
}

// ---------------------------------------------------------------------------------------
// CPU quantized matmul.
//
// candle picks a different kernel for the same weights depending on the number of rows
// (generic vec-dot for one row, repacked tiles or AMX for many), and those kernels round
// differently, so prefill(A+B) and prefill(A) + decode disagreed in the last bits, which
// greedy decoding then amplifies. These kernels compute every output element with one
// fixed sequence of operations whatever the row count: integer dot products per block
// (exact, in any order), then a fixed f32 combination per block in block order. Row
// grouping, threading and chunking only decide which core does the work.
//
// Weights keep (close to) their file size: tiles of 16 output columns with the blocks of
// those columns interleaved so one VNNI `vpdpbusd` yields 16 outputs for 4 k-values.
// Activations are quantized to 8 bits per 32 values (for Q8_0 / Q5_0 weights, as ggml's
// Q8_0) or per 256 values (for Q4_K / Q6_K, as ggml's Q8_K).
// ---------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
pub(crate) mod qmm {
    use candle_core::quantized::GgmlDType;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// AVX-512 with VNNI (Ice Lake / Zen 4 and later).
    pub(crate) fn available() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        })
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Kind {
        Q8_0,
        Q5_0,
        Q4K,
        Q6K,
    }

    impl Kind {
        pub(crate) fn of(dt: GgmlDType) -> Option<Kind> {
            match dt {
                GgmlDType::Q8_0 => Some(Kind::Q8_0),
                GgmlDType::Q5_0 => Some(Kind::Q5_0),
                GgmlDType::Q4K => Some(Kind::Q4K),
                GgmlDType::Q6K => Some(Kind::Q6K),
                _ => None,
            }
        }
        /// Values per weight block.
        fn block(self) -> usize {
            match self {
                Kind::Q8_0 | Kind::Q5_0 => 32,
                Kind::Q4K | Kind::Q6K => 256,
            }
        }
        /// Bytes of one ggml block.
        fn ggml_bytes(self) -> usize {
            match self {
                Kind::Q8_0 => 34,
                Kind::Q5_0 => 22,
                Kind::Q4K => 144,
                Kind::Q6K => 210,
            }
        }
        /// Bytes of one packed (16 columns x one block) unit.
        fn packed_bytes(self) -> usize {
            match self {
                // qs 512 (u8, +128) | d 16 x f16
                Kind::Q8_0 => 512 + 32,
                // nibbles 256 | high-bit masks 64 | d 16 x f16
                Kind::Q5_0 => 256 + 64 + 32,
                // nibbles 2048 | sc 128 | m 128 | d 32 | dmin 32
                Kind::Q4K => 2048 + 128 + 128 + 64,
                // low nibbles 2048 | high bits 1024 | sc 256 | d 32 | pad 32
                Kind::Q6K => 2048 + 1024 + 256 + 64,
            }
        }
        pub(crate) fn a256(self) -> bool {
            matches!(self, Kind::Q4K | Kind::Q6K)
        }
    }

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Line([u8; 64]);

    /// Zeroed 64-byte-aligned storage (calloc: pages are zeroed lazily by the kernel).
    fn lines(bytes: usize) -> Vec<Line> {
        let n = bytes.div_ceil(64);
        // SAFETY: an all-zero Line is a valid value.
        unsafe { Box::<[Line]>::new_zeroed_slice(n).assume_init() }.into_vec()
    }

    /// Weights of one linear layer, packed for these kernels. `n` output columns (a
    /// multiple of 16), `k` inputs (a multiple of the block size).
    pub(crate) struct Packed {
        kind: Kind,
        n: usize,
        k: usize,
        data: Vec<Line>,
    }

    impl std::fmt::Debug for Packed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Packed({:?}, {}x{})", self.kind, self.n, self.k)
        }
    }

    impl Packed {
        pub(crate) fn n(&self) -> usize {
            self.n
        }
        pub(crate) fn k(&self) -> usize {
            self.k
        }
        pub(crate) fn kind(&self) -> Kind {
            self.kind
        }
        #[cfg(test)]
        #[allow(dead_code)]
        pub(crate) fn bytes(&self) -> usize {
            self.data.len() * 64
        }
        fn kb(&self) -> usize {
            self.k / self.kind.block()
        }
        fn tile_bytes(&self) -> usize {
            (self.kb() * self.kind.packed_bytes()).div_ceil(64) * 64
        }
        /// Q8_0 / Q5_0 tiles keep quants, high-bit masks and scales in separate runs so
        /// every 64-byte load is aligned: [kb][qs] | [kb][64 masks] (Q5_0) | [kb][16 f16].
        fn qs_off(&self, b: usize) -> usize {
            match self.kind {
                Kind::Q8_0 => b * 512,
                _ => b * 256,
            }
        }
        fn hm_off(&self, b: usize) -> usize {
            self.kb() * 256 + b * 64
        }
        fn d_off(&self, b: usize) -> usize {
            match self.kind {
                Kind::Q8_0 => self.kb() * 512 + b * 32,
                _ => self.kb() * 320 + b * 32,
            }
        }
        fn base(&self) -> *const u8 {
            self.data.as_ptr() as *const u8
        }
        #[cfg(test)]
        #[allow(dead_code)]
        pub(crate) fn raw(&self) -> &[u8] {
            unsafe { std::slice::from_raw_parts(self.base(), self.data.len() * 64) }
        }

        /// Whether a tensor of this type and shape can be packed.
        pub(crate) fn supports(dt: GgmlDType, n: usize, k: usize) -> bool {
            available()
                && Kind::of(dt).is_some_and(|kind| k > 0 && k.is_multiple_of(kind.block()))
                && n > 0
                && n.is_multiple_of(16)
        }

        /// Pack raw ggml blocks (`n` rows of `k` values, row-major) of type `dt`.
        pub(crate) fn new(dt: GgmlDType, n: usize, k: usize, raw: &[u8]) -> Option<Packed> {
            if !Self::supports(dt, n, k) {
                return None;
            }
            let kind = Kind::of(dt)?;
            let kb = k / kind.block();
            if raw.len() != n * kb * kind.ggml_bytes() {
                return None;
            }
            let mut p = Packed {
                kind,
                n,
                k,
                data: Vec::new(),
            };
            let tb = p.tile_bytes();
            let mut data = lines(tb * (n / 16));
            let base = data.as_mut_ptr() as usize;
            let gb = kind.ggml_bytes();
            let pb = kind.packed_bytes();
            let blk = |c: usize, b: usize| &raw[(c * kb + b) * gb..(c * kb + b + 1) * gb];
            let pm = &p;
            // Tiles are independent: pack them in parallel.
            let pack_tile = |t: usize| {
                // SAFETY: tile t's bytes are written by this call only.
                let tile =
                    unsafe { std::slice::from_raw_parts_mut((base as *mut u8).add(t * tb), tb) };
                let p = pm;
                for b in 0..kb {
                    let tile = &mut *tile;
                    let (qo, ho, dof) = (p.qs_off(b), p.hm_off(b), p.d_off(b));
                    match kind {
                        Kind::Q8_0 => {
                            for c in 0..16 {
                                let x = blk(t * 16 + c, b);
                                tile[dof + 2 * c..dof + 2 * c + 2].copy_from_slice(&x[0..2]);
                                for i in 0..32 {
                                    let (g, j) = (i / 4, i % 4);
                                    tile[qo + (g * 16 + c) * 4 + j] = x[2 + i] ^ 0x80;
                                }
                            }
                            continue;
                        }
                        Kind::Q5_0 => {
                            for c in 0..16 {
                                let x = blk(t * 16 + c, b);
                                tile[dof + 2 * c..dof + 2 * c + 2].copy_from_slice(&x[0..2]);
                                let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
                                let mut v = [0u8; 32];
                                for j in 0..16 {
                                    v[j] = (x[6 + j] & 0xf) | (((qh >> j) & 1) << 4) as u8;
                                    v[j + 16] =
                                        (x[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                                }
                                put_nibbles(&mut tile[qo..qo + 256], c, &v);
                                for (i, &q) in v.iter().enumerate() {
                                    if q & 0x10 != 0 {
                                        // mask for k4-group g: bit (c*4 + j)
                                        let (g, j) = (i / 4, i % 4);
                                        let bit = c * 4 + j;
                                        tile[ho + g * 8 + bit / 8] |= 1 << (bit % 8);
                                    }
                                }
                            }
                            continue;
                        }
                        _ => {}
                    }
                    let o = &mut tile[b * pb..(b + 1) * pb];
                    match kind {
                        Kind::Q8_0 | Kind::Q5_0 => unreachable!(),
                        Kind::Q4K => {
                            for c in 0..16 {
                                let x = blk(t * 16 + c, b);
                                o[2304 + 2 * c..2304 + 2 * c + 2].copy_from_slice(&x[0..2]);
                                o[2336 + 2 * c..2336 + 2 * c + 2].copy_from_slice(&x[2..4]);
                                let mut scales = [0u8; 12];
                                scales.copy_from_slice(&x[4..16]);
                                let qs = &x[16..144];
                                let mut v = [0u8; 256];
                                for s in 0..8 {
                                    let (sc, m) = scale_min_k4(s, &scales);
                                    o[2048 + s * 16 + c] = sc;
                                    // m as i16 pairs: [pair p][col][2]
                                    o[2176 + ((s / 2) * 16 + c) * 2 + s % 2] = m;
                                    for l in 0..32 {
                                        let byte = qs[32 * (s / 2) + l];
                                        v[s * 32 + l] =
                                            if s % 2 == 0 { byte & 0xf } else { byte >> 4 };
                                    }
                                }
                                put_nibbles(&mut o[0..2048], c, &v);
                            }
                        }
                        Kind::Q6K => {
                            for c in 0..16 {
                                let x = blk(t * 16 + c, b);
                                let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
                                o[3328 + 2 * c..3328 + 2 * c + 2].copy_from_slice(&x[208..210]);
                                for s in 0..16 {
                                    o[3072 + s * 16 + c] = sc[s];
                                }
                                let mut v = [0u8; 256];
                                for h in 0..2 {
                                    let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
                                    for l in 0..32 {
                                        let n0 = 128 * h;
                                        v[n0 + l] = (ql[l] & 0xf) | ((qh[l] & 3) << 4);
                                        v[n0 + l + 32] =
                                            (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4);
                                        v[n0 + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                                        v[n0 + l + 96] =
                                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                                    }
                                }
                                put_nibbles(&mut o[0..2048], c, &v);
                                // high 2 bits: [k16-group g][col][4 bytes]; byte j holds
                                // k = 16g + j + 4i at bits 2i..2i+2
                                for g in 0..16 {
                                    for j in 0..4 {
                                        let mut byte = 0u8;
                                        for i in 0..4 {
                                            byte |= (v[16 * g + j + 4 * i] >> 4) << (2 * i);
                                        }
                                        o[2048 + (g * 16 + c) * 4 + j] = byte;
                                    }
                                }
                            }
                        }
                    }
                }
            };
            candle_core::utils::barrier_pool().execute_chunked(n / 16, |r| r.for_each(pack_tile));
            p.data = data;
            Some(p)
        }
    }

    /// Nibble layout shared by Q5_0 / Q4_K / Q6_K: [k8-group][col 16][4 bytes], byte j =
    /// v[8g + j] | v[8g + j + 4] << 4, so one 64-byte load gives two dpbusd operands.
    fn put_nibbles(o: &mut [u8], c: usize, v: &[u8]) {
        for g in 0..v.len() / 8 {
            for j in 0..4 {
                o[(g * 16 + c) * 4 + j] = (v[8 * g + j] & 0xf) | ((v[8 * g + j + 4] & 0xf) << 4);
            }
        }
    }

    fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    // ---- activations -------------------------------------------------------------

    /// 32 activations quantized to i8 with one scale (ggml's Q8_0), plus the sums that
    /// undo the unsigned offsets of the weights.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct A32 {
        qs: [i8; 32],
        d: f32,
        /// -128 * sum(qs): initial accumulator for +128-offset Q8_0 weights.
        nb128: i32,
        /// -16 * sum(qs): the same for Q5_0's +16 offset.
        nb16: i32,
        _pad: i32,
    }

    /// 256 activations with one scale (ggml's Q8_K) and the partial sums K-quants need.
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct A256 {
        qs: [i8; 256],
        /// Sums of 16 values, as i16 pairs (Q6_K's -32 offset, per 16-value sub-block).
        b16: [i16; 16],
        /// Sums of 32 values (Q4_K's mins, per 32-value sub-block).
        b32: [i16; 8],
        d: f32,
        _pad: [u8; 12],
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn quantize_a32(x: &[f32], out: *mut A32) {
        let absmask = _mm512_set1_epi32(0x7fff_ffff);
        for b in 0..x.len() / 32 {
            let p = x.as_ptr().add(b * 32);
            let v0 = _mm512_loadu_ps(p);
            let v1 = _mm512_loadu_ps(p.add(16));
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), absmask));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), absmask));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
            let o = &mut *out.add(b);
            _mm_storeu_si128(o.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(
                o.qs.as_mut_ptr().add(16) as *mut __m128i,
                _mm512_cvtsepi32_epi8(q1),
            );
            let s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            o.d = d;
            o.nb128 = -128 * s;
            o.nb16 = -16 * s;
            o._pad = 0;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn quantize_a256(x: &[f32], out: *mut A256) {
        let absmask = _mm512_set1_epi32(0x7fff_ffff);
        for b in 0..x.len() / 256 {
            let p = x.as_ptr().add(b * 256);
            let mut m = _mm512_setzero_ps();
            for i in 0..16 {
                let v = _mm512_loadu_ps(p.add(16 * i));
                m = _mm512_max_ps(
                    m,
                    _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absmask)),
                );
            }
            let amax = _mm512_reduce_max_ps(m);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm512_set1_ps(id);
            let o = &mut *out.add(b);
            for i in 0..16 {
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p.add(16 * i)), idv));
                _mm_storeu_si128(
                    o.qs.as_mut_ptr().add(16 * i) as *mut __m128i,
                    _mm512_cvtsepi32_epi8(q),
                );
                o.b16[i] = _mm512_reduce_add_epi32(q) as i16;
            }
            for s in 0..8 {
                o.b32[s] = o.b16[2 * s] + o.b16[2 * s + 1];
            }
            o.d = d;
            o._pad = [0; 12];
        }
    }

    /// Quantized activation rows, reused across calls on one thread.
    struct Acts {
        buf: Vec<Line>,
        a256: bool,
        m: usize,
        k: usize,
    }

    impl Acts {
        fn row_bytes(&self) -> usize {
            if self.a256 {
                self.k / 256 * std::mem::size_of::<A256>()
            } else {
                self.k / 32 * std::mem::size_of::<A32>()
            }
        }
        fn row(&self, r: usize) -> *const u8 {
            unsafe { (self.buf.as_ptr() as *const u8).add(r * self.row_bytes()) }
        }
    }

    /// Activation rows: one row-major matrix, or several side by side (row `r` is
    /// `parts[0][r] | parts[1][r] | …`, each `width` wide) so a caller need not copy them
    /// into one buffer first.
    #[derive(Clone, Copy)]
    pub(crate) enum Rows<'a> {
        Whole(&'a [f32]),
        Parts {
            parts: &'a [&'a [f32]],
            width: usize,
        },
    }

    fn quantize(x: Rows<'_>, m: usize, k: usize, a256: bool, acts: &mut Acts) {
        acts.a256 = a256;
        acts.m = m;
        acts.k = k;
        let need = (m * acts.row_bytes()).div_ceil(64);
        if acts.buf.len() < need {
            acts.buf = lines(need * 64);
        }
        let rb = acts.row_bytes();
        let base = acts.buf.as_mut_ptr() as usize;
        let one = |r: usize| unsafe {
            let dst = (base + r * rb) as *mut u8;
            match x {
                Rows::Whole(x) => {
                    let row = &x[r * k..(r + 1) * k];
                    if a256 {
                        quantize_a256(row, dst as *mut A256)
                    } else {
                        quantize_a32(row, dst as *mut A32)
                    }
                }
                // Each part's 32-value blocks land where the joined row's would, so the
                // kernels see one ordinary row.
                Rows::Parts { parts, width } => {
                    for (j, p) in parts.iter().enumerate() {
                        let at = (dst as *mut A32).add(j * width / 32);
                        quantize_a32(&p[r * width..(r + 1) * width], at)
                    }
                }
            }
        };
        if m * k < 1 << 16 {
            (0..m).for_each(one);
        } else {
            candle_core::utils::barrier_pool().execute_chunked(m, |range| range.for_each(one));
        }
    }

    // ---- kernels -----------------------------------------------------------------

    /// Output tiles (16 columns each) per work item.
    const NT: usize = 2;
    /// Rows per register block.
    const MT: usize = 4;
    /// Rows per work item: accumulators for RB x NT*16 outputs stay in L1.
    const RB: usize = 64;

    #[inline(always)]
    unsafe fn bcast(p: *const u8) -> __m512i {
        _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
    }

    /// Canonical 8-bit weights for one unit of NT tiles, ready for dpbusd:
    /// [tile][k4-group][col 16][4] u8, plus the per-tile scales of K-quants.
    #[repr(C, align(64))]
    struct Scratch {
        w: [u8; NT * 4096],
        /// Q4_K: sc as i32 [tile][8][16]; Q6_K: sc as i32 [tile][16][16].
        sc: [i32; NT * 256],
        /// Q4_K: mins as i16 pairs [tile][4][16][2]; Q6_K: 32*sc as i16 pairs [tile][8][16][2].
        pairs: [i16; NT * 256],
        d: [f32; NT * 16],
        dmin: [f32; NT * 16],
    }

    /// Expand one K-quant super-block of tile j (packed at `p`) into scratch slot j.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn expand_k(kind: Kind, p: *const u8, j: usize, s: &mut Scratch) {
        let m4 = _mm512_set1_epi8(0x0f);
        match kind {
            Kind::Q4K => {
                for g8 in 0..32 {
                    let v = _mm512_load_si512(p.add(g8 * 64) as *const _);
                    let o = s.w.as_mut_ptr().add(j * 4096 + (2 * g8) * 64);
                    _mm512_store_si512(o as *mut _, _mm512_and_si512(v, m4));
                    _mm512_store_si512(
                        o.add(64) as *mut _,
                        _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                    );
                }
                for sb in 0..8 {
                    let sc = _mm_loadu_si128(p.add(2048 + sb * 16) as *const _);
                    _mm512_store_si512(
                        s.sc.as_mut_ptr().add(j * 256 + sb * 16) as *mut _,
                        _mm512_cvtepu8_epi32(sc),
                    );
                }
                for pp in 0..4 {
                    let m = _mm256_loadu_si256(p.add(2176 + pp * 32) as *const _);
                    _mm512_store_si512(
                        s.pairs.as_mut_ptr().add(j * 256 + pp * 32) as *mut _,
                        _mm512_cvtepu8_epi16(m),
                    );
                }
                _mm512_store_ps(
                    s.d.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2304) as *const _)),
                );
                _mm512_store_ps(
                    s.dmin.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2336) as *const _)),
                );
            }
            Kind::Q6K => {
                for sub in 0..16 {
                    let w = q6_unpack(p, sub);
                    for (i, wi) in w.iter().enumerate() {
                        _mm512_store_si512(
                            s.w.as_mut_ptr().add(j * 4096 + (4 * sub + i) * 64) as *mut _,
                            *wi,
                        );
                    }
                }
                for sb in 0..16 {
                    let sc = _mm_loadu_si128(p.add(3072 + sb * 16) as *const _);
                    _mm512_store_si512(
                        s.sc.as_mut_ptr().add(j * 256 + sb * 16) as *mut _,
                        _mm512_cvtepi8_epi32(sc),
                    );
                }
                for pp in 0..8 {
                    _mm512_store_si512(
                        s.pairs.as_mut_ptr().add(j * 256 + pp * 32) as *mut _,
                        q6_pair(p, pp),
                    );
                }
                _mm512_store_ps(
                    s.d.as_mut_ptr().add(j * 16),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(3328) as *const _)),
                );
            }
            _ => unreachable!("expand_k takes K-quants"),
        }
    }

    /// Q6_K: the four dpbusd operands (k4-groups 4*sub..4*sub+4) of 16-value sub-block `sub`.
    #[inline(always)]
    unsafe fn q6_unpack(p: *const u8, sub: usize) -> [__m512i; 4] {
        let m4 = _mm512_set1_epi8(0x0f);
        let m3 = _mm512_set1_epi8(0x30);
        let v0 = _mm512_load_si512(p.add((2 * sub) * 64) as *const _);
        let v1 = _mm512_load_si512(p.add((2 * sub + 1) * 64) as *const _);
        let h = _mm512_load_si512(p.add(2048 + sub * 64) as *const _);
        [
            _mm512_or_si512(
                _mm512_and_si512(v0, m4),
                _mm512_and_si512(_mm512_slli_epi16(h, 4), m3),
            ),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                _mm512_and_si512(_mm512_slli_epi16(h, 2), m3),
            ),
            _mm512_or_si512(_mm512_and_si512(v1, m4), _mm512_and_si512(h, m3)),
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
                _mm512_and_si512(_mm512_srli_epi16(h, 2), m3),
            ),
        ]
    }

    /// Q6_K: 32*sc of sub-blocks (2pp, 2pp+1) per column as i16 pairs.
    #[inline(always)]
    unsafe fn q6_pair(p: *const u8, pp: usize) -> __m512i {
        let x = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(3072 + (2 * pp) * 16) as *const _));
        let y = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(3072 + (2 * pp + 1) * 16) as *const _));
        _mm512_or_si512(
            _mm512_and_si512(_mm512_slli_epi32(x, 5), _mm512_set1_epi32(0xffff)),
            _mm512_slli_epi32(_mm512_slli_epi32(y, 5), 16),
        )
    }

    /// Q5_0: expand block `b` of tile j into scratch slot (j, u) (512 bytes each).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn expand_q5(
        w: &Packed,
        tile: *const u8,
        b: usize,
        j: usize,
        u: usize,
        s: &mut Scratch,
    ) {
        let qp = tile.add(w.qs_off(b));
        let hp = tile.add(w.hm_off(b));
        for g8 in 0..4 {
            let (lo, hi) = q5_unpack(qp, hp, g8);
            let o = s.w.as_mut_ptr().add(j * 4096 + u * 512 + (2 * g8) * 64);
            _mm512_store_si512(o as *mut _, lo);
            _mm512_store_si512(o.add(64) as *mut _, hi);
        }
    }

    /// Q5_0: dpbusd operands of k4-groups 2*g8 and 2*g8+1 (5-bit values, unsigned).
    #[inline(always)]
    unsafe fn q5_unpack(qp: *const u8, hp: *const u8, g8: usize) -> (__m512i, __m512i) {
        let m4 = _mm512_set1_epi8(0x0f);
        let sixteen = _mm512_set1_epi8(16);
        let v = _mm512_load_si512(qp.add(g8 * 64) as *const _);
        let lo = _mm512_and_si512(v, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        let mlo = std::ptr::read_unaligned(hp.add((2 * g8) * 8) as *const u64);
        let mhi = std::ptr::read_unaligned(hp.add((2 * g8 + 1) * 8) as *const u64);
        (
            _mm512_mask_add_epi8(lo, mlo, lo, sixteen),
            _mm512_mask_add_epi8(hi, mhi, hi, sixteen),
        )
    }

    /// One 32-value block for M rows x N tiles: Q8_0 (offset 128) or Q5_0 (offset 16).
    /// Tile j's 512 canonical bytes at `w[j]`, its f16 scales at `d[j]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn blk32<const M: usize, const N: usize>(
        w: [*const u8; N],
        d: [*const u8; N],
        a: [*const A32; M],
        q8: bool,
        acc: &mut [[__m512; N]; M],
    ) {
        let mut s = [[_mm512_setzero_si512(); N]; M];
        for i in 0..M {
            let init = _mm512_set1_epi32(if q8 { (*a[i]).nb128 } else { (*a[i]).nb16 });
            for j in 0..N {
                s[i][j] = init;
            }
        }
        for g in 0..8 {
            let mut wv = [_mm512_setzero_si512(); N];
            for j in 0..N {
                wv[j] = _mm512_load_si512(w[j].add(g * 64) as *const _);
            }
            for i in 0..M {
                let av = bcast((*a[i]).qs.as_ptr().add(4 * g) as *const u8);
                for j in 0..N {
                    s[i][j] = _mm512_dpbusd_epi32(s[i][j], wv[j], av);
                }
            }
        }
        blk32_finish(s, d, a, acc);
    }

    /// The float step of a 32-value block: acc += float(isum) * (d_w * d_a). Shared by
    /// every path so they agree bit for bit.
    #[inline(always)]
    unsafe fn blk32_finish<const M: usize, const N: usize>(
        s: [[__m512i; N]; M],
        d: [*const u8; N],
        a: [*const A32; M],
        acc: &mut [[__m512; N]; M],
    ) {
        let mut dw = [_mm512_setzero_ps(); N];
        for j in 0..N {
            dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256(d[j] as *const _));
        }
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(s[i][j]),
                    _mm512_mul_ps(dw[j], da),
                    acc[i][j],
                );
            }
        }
    }

    /// One Q4_K super-block (256 values) for M rows x N tiles from the scratch.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn sb_q4k<const M: usize, const N: usize>(
        s: &Scratch,
        a: [*const A256; M],
        acc: &mut [[__m512; N]; M],
    ) {
        let mut i1 = [[_mm512_setzero_si512(); N]; M];
        for sb in 0..8 {
            let mut ss = [[_mm512_setzero_si512(); N]; M];
            for g in 0..8 {
                let mut wv = [_mm512_setzero_si512(); N];
                for j in 0..N {
                    wv[j] = _mm512_load_si512(
                        s.w.as_ptr().add(j * 4096 + (sb * 8 + g) * 64) as *const _
                    );
                }
                for i in 0..M {
                    let av = bcast((*a[i]).qs.as_ptr().add(sb * 32 + 4 * g) as *const u8);
                    for j in 0..N {
                        ss[i][j] = _mm512_dpbusd_epi32(ss[i][j], wv[j], av);
                    }
                }
            }
            for j in 0..N {
                let sc = _mm512_load_si512(s.sc.as_ptr().add(j * 256 + sb * 16) as *const _);
                for i in 0..M {
                    i1[i][j] = _mm512_add_epi32(i1[i][j], _mm512_mullo_epi32(ss[i][j], sc));
                }
            }
        }
        let mut i2 = [[_mm512_setzero_si512(); N]; M];
        for pp in 0..4 {
            for j in 0..N {
                let mv = _mm512_load_si512(s.pairs.as_ptr().add(j * 256 + pp * 32) as *const _);
                for i in 0..M {
                    let bv = bcast((*a[i]).b32.as_ptr().add(2 * pp) as *const u8);
                    i2[i][j] = _mm512_dpwssd_epi32(i2[i][j], mv, bv);
                }
            }
        }
        let mut d = [_mm512_setzero_ps(); N];
        let mut dm = [_mm512_setzero_ps(); N];
        for j in 0..N {
            d[j] = _mm512_load_ps(s.d.as_ptr().add(j * 16));
            dm[j] = _mm512_load_ps(s.dmin.as_ptr().add(j * 16));
        }
        q4k_finish(i1, i2, d, dm, a, acc);
    }

    /// The float step of a Q4_K super-block: acc += i1 * (d * d_a) - i2 * (dmin * d_a).
    #[inline(always)]
    unsafe fn q4k_finish<const M: usize, const N: usize>(
        i1: [[__m512i; N]; M],
        i2: [[__m512i; N]; M],
        d: [__m512; N],
        dm: [__m512; N],
        a: [*const A256; M],
        acc: &mut [[__m512; N]; M],
    ) {
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(i1[i][j]),
                    _mm512_mul_ps(d[j], da),
                    acc[i][j],
                );
                acc[i][j] = _mm512_fnmadd_ps(
                    _mm512_cvtepi32_ps(i2[i][j]),
                    _mm512_mul_ps(dm[j], da),
                    acc[i][j],
                );
            }
        }
    }

    /// One Q6_K super-block (256 values) for M rows x N tiles from the scratch.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn sb_q6k<const M: usize, const N: usize>(
        s: &Scratch,
        a: [*const A256; M],
        acc: &mut [[__m512; N]; M],
    ) {
        let mut i1 = [[_mm512_setzero_si512(); N]; M];
        for sb in 0..16 {
            let mut ss = [[_mm512_setzero_si512(); N]; M];
            for g in 0..4 {
                let mut wv = [_mm512_setzero_si512(); N];
                for j in 0..N {
                    wv[j] = _mm512_load_si512(
                        s.w.as_ptr().add(j * 4096 + (sb * 4 + g) * 64) as *const _
                    );
                }
                for i in 0..M {
                    let av = bcast((*a[i]).qs.as_ptr().add(sb * 16 + 4 * g) as *const u8);
                    for j in 0..N {
                        ss[i][j] = _mm512_dpbusd_epi32(ss[i][j], wv[j], av);
                    }
                }
            }
            for j in 0..N {
                let sc = _mm512_load_si512(s.sc.as_ptr().add(j * 256 + sb * 16) as *const _);
                for i in 0..M {
                    i1[i][j] = _mm512_add_epi32(i1[i][j], _mm512_mullo_epi32(ss[i][j], sc));
                }
            }
        }
        for pp in 0..8 {
            for j in 0..N {
                let pv = _mm512_load_si512(s.pairs.as_ptr().add(j * 256 + pp * 32) as *const _);
                for i in 0..M {
                    let bv = bcast((*a[i]).b16.as_ptr().add(2 * pp) as *const u8);
                    i1[i][j] = _mm512_sub_epi32(i1[i][j], _mm512_madd_epi16(pv, bv));
                }
            }
        }
        let mut d = [_mm512_setzero_ps(); N];
        for j in 0..N {
            d[j] = _mm512_load_ps(s.d.as_ptr().add(j * 16));
        }
        q6k_finish(i1, d, a, acc);
    }

    /// The float step of a Q6_K super-block: acc += i * (d * d_a).
    #[inline(always)]
    unsafe fn q6k_finish<const M: usize, const N: usize>(
        i1: [[__m512i; N]; M],
        d: [__m512; N],
        a: [*const A256; M],
        acc: &mut [[__m512; N]; M],
    ) {
        for i in 0..M {
            let da = _mm512_set1_ps((*a[i]).d);
            for j in 0..N {
                acc[i][j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(i1[i][j]),
                    _mm512_mul_ps(d[j], da),
                    acc[i][j],
                );
            }
        }
    }

    // Single-row kernels (decode): unpack in registers instead of through the scratch.
    // They form the same exact integer sums and call the same float steps, so a row gets
    // the same bits whichever path computed it.

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemv_q5<const N: usize>(
        w: &Packed,
        tiles: [*const u8; N],
        a: *const A32,
        acc: &mut [[__m512; N]; 1],
    ) {
        for b in 0..w.kb() {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add(w.qs_off(b + 8)), 256);
                prefetch(t.wrapping_add(w.hm_off(b + 8)), 64);
                if b % 2 == 0 {
                    prefetch(t.wrapping_add(w.d_off(b + 8)), 64);
                }
            }
            let mut s = [[_mm512_set1_epi32((*ab).nb16); N]; 1];
            let mut sh = [_mm512_setzero_si512(); N];
            for g8 in 0..4 {
                let alo = bcast((*ab).qs.as_ptr().add(8 * g8) as *const u8);
                let ahi = bcast((*ab).qs.as_ptr().add(8 * g8 + 4) as *const u8);
                for j in 0..N {
                    let (lo, hi) =
                        q5_unpack(tiles[j].add(w.qs_off(b)), tiles[j].add(w.hm_off(b)), g8);
                    s[0][j] = _mm512_dpbusd_epi32(s[0][j], lo, alo);
                    sh[j] = _mm512_dpbusd_epi32(sh[j], hi, ahi);
                }
            }
            for j in 0..N {
                s[0][j] = _mm512_add_epi32(s[0][j], sh[j]);
            }
            let mut d = [std::ptr::null(); N];
            for j in 0..N {
                d[j] = tiles[j].add(w.d_off(b));
            }
            blk32_finish(s, d, [ab], acc);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemv_q4k<const N: usize>(
        kb: usize,
        tiles: [*const u8; N],
        a: *const A256,
        acc: &mut [[__m512; N]; 1],
    ) {
        let m4 = _mm512_set1_epi8(0x0f);
        let pb = Kind::Q4K.packed_bytes();
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for s in 0..8 {
                // Two chains per tile (low / high nibbles) so dpbusd latency overlaps.
                let mut sl = [_mm512_setzero_si512(); N];
                let mut sh = [_mm512_setzero_si512(); N];
                for g in 0..4 {
                    let alo = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g) as *const u8);
                    let ahi = bcast((*ab).qs.as_ptr().add(s * 32 + 8 * g + 4) as *const u8);
                    for j in 0..N {
                        let v =
                            _mm512_load_si512(tiles[j].add(b * pb + (s * 4 + g) * 64) as *const _);
                        sl[j] = _mm512_dpbusd_epi32(sl[j], _mm512_and_si512(v, m4), alo);
                        sh[j] = _mm512_dpbusd_epi32(
                            sh[j],
                            _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                            ahi,
                        );
                    }
                }
                for j in 0..N {
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        tiles[j].add(b * pb + 2048 + s * 16) as *const _,
                    ));
                    i1[0][j] = _mm512_add_epi32(
                        i1[0][j],
                        _mm512_mullo_epi32(_mm512_add_epi32(sl[j], sh[j]), sc),
                    );
                }
            }
            let mut i2 = [[_mm512_setzero_si512(); N]; 1];
            for pp in 0..4 {
                let bv = bcast((*ab).b32.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    let mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        tiles[j].add(b * pb + 2176 + pp * 32) as *const _,
                    ));
                    i2[0][j] = _mm512_dpwssd_epi32(i2[0][j], mv, bv);
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            let mut dm = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(tiles[j].add(b * pb + 2304) as *const _));
                dm[j] =
                    _mm512_cvtph_ps(_mm256_loadu_si256(tiles[j].add(b * pb + 2336) as *const _));
            }
            q4k_finish(i1, i2, d, dm, [ab], acc);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemv_q6k<const N: usize>(
        kb: usize,
        tiles: [*const u8; N],
        a: *const A256,
        acc: &mut [[__m512; N]; 1],
    ) {
        let pb = Kind::Q6K.packed_bytes();
        for b in 0..kb {
            let ab = a.add(b);
            for t in tiles.iter() {
                prefetch(t.wrapping_add((b + 2) * pb), pb);
            }
            let mut i1 = [[_mm512_setzero_si512(); N]; 1];
            for sub in 0..16 {
                let mut av = [_mm512_setzero_si512(); 4];
                for (i, v) in av.iter_mut().enumerate() {
                    *v = bcast((*ab).qs.as_ptr().add(sub * 16 + 4 * i) as *const u8);
                }
                for j in 0..N {
                    let p = tiles[j].add(b * pb);
                    let w = q6_unpack(p, sub);
                    let s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], av[0]);
                    let s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], av[1]);
                    let s0 = _mm512_dpbusd_epi32(s0, w[2], av[2]);
                    let s1 = _mm512_dpbusd_epi32(s1, w[3], av[3]);
                    let ss = _mm512_add_epi32(s0, s1);
                    let sc =
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(3072 + sub * 16) as *const _));
                    i1[0][j] = _mm512_add_epi32(i1[0][j], _mm512_mullo_epi32(ss, sc));
                }
            }
            for pp in 0..8 {
                let bv = bcast((*ab).b16.as_ptr().add(2 * pp) as *const u8);
                for j in 0..N {
                    i1[0][j] = _mm512_sub_epi32(
                        i1[0][j],
                        _mm512_madd_epi16(q6_pair(tiles[j].add(b * pb), pp), bv),
                    );
                }
            }
            let mut d = [_mm512_setzero_ps(); N];
            for j in 0..N {
                d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(tiles[j].add(b * pb + 3328) as *const _));
            }
            q6k_finish(i1, d, [ab], acc);
        }
    }

    /// Software prefetch of `bytes` at `p` (which may lie past the data: prefetches do not
    /// fault). Single-row kernels run at memory speed only with it: the hardware
    /// prefetcher alone leaves each core at about half the bandwidth.
    #[inline(always)]
    unsafe fn prefetch(p: *const u8, bytes: usize) {
        for l in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(l) as *const i8);
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn gemv_q8<const N: usize>(
        w: &Packed,
        tiles: [*const u8; N],
        a: *const A32,
        acc: &mut [[__m512; N]; 1],
    ) {
        for b in 0..w.kb() {
            let ab = a.add(b);
            let mut wp = [std::ptr::null::<u8>(); N];
            let mut dp = [std::ptr::null::<u8>(); N];
            for j in 0..N {
                prefetch(tiles[j].wrapping_add(w.qs_off(b + 8)), 512);
                if b % 2 == 0 {
                    prefetch(tiles[j].wrapping_add(w.d_off(b + 8)), 64);
                }
                wp[j] = tiles[j].add(w.qs_off(b));
                dp[j] = tiles[j].add(w.d_off(b));
            }
            blk32::<1, N>(wp, dp, [ab], true, acc);
        }
    }

    /// What a work item writes for its rows and columns.
    #[derive(Clone, Copy)]
    pub(crate) enum Epilogue<'a> {
        /// y = acc + bias
        Plain,
        /// y = acc + bias + residual (same shape as y)
        Residual(&'a [f32]),
        /// Two matrices of equal shape (gate, up): y = silu(acc_gate) * acc_up
        SwiGlu,
    }

    /// silu(x) = x / (1 + e^-x), with a fixed polynomial exp.
    #[inline(always)]
    unsafe fn silu(x: __m512) -> __m512 {
        let nx = _mm512_sub_ps(_mm512_setzero_ps(), x);
        // e^-x: clamp to keep the polynomial in range; far out silu is x or 0 anyway.
        let nx = _mm512_min_ps(
            _mm512_max_ps(nx, _mm512_set1_ps(-104.0)),
            _mm512_set1_ps(88.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(nx, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), nx);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5e-1));
        let e = _mm512_scalef_ps(
            _mm512_add_ps(
                _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                _mm512_set1_ps(1.0),
            ),
            n,
        );
        _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
    }

    /// One work item: output columns [16*t0, 16*(t0+nt)) of rows [r0, r1). Tile j's packed
    /// data starts at `tiles[j]` (for SwiGLU, tile 0 is gate's and tile 1 up's, same
    /// columns). Accumulators live in `acc` ([row][NT]) between units of k.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn item(
        w: &Packed,
        acts: &Acts,
        tiles: [*const u8; NT],
        nt: usize,
        r0: usize,
        r1: usize,
        scratch: &mut Scratch,
        acc: &mut [__m512; RB * NT],
    ) {
        let kind = w.kind;
        let kb = w.kb();
        let rows = r1 - r0;
        for a in acc.iter_mut().take(rows * NT) {
            *a = _mm512_setzero_ps();
        }
        if rows == 1 {
            let a = acts.row(r0);
            let mut v = [[_mm512_setzero_ps(); NT]; 1];
            if nt == 2 {
                match kind {
                    Kind::Q8_0 => gemv_q8::<2>(w, tiles, a as *const A32, &mut v),
                    Kind::Q5_0 => gemv_q5::<2>(w, tiles, a as *const A32, &mut v),
                    Kind::Q4K => gemv_q4k::<2>(kb, tiles, a as *const A256, &mut v),
                    _ => gemv_q6k::<2>(kb, tiles, a as *const A256, &mut v),
                }
            } else {
                let mut v1 = [[_mm512_setzero_ps(); 1]; 1];
                let t1 = [tiles[0]];
                match kind {
                    Kind::Q8_0 => gemv_q8::<1>(w, t1, a as *const A32, &mut v1),
                    Kind::Q5_0 => gemv_q5::<1>(w, t1, a as *const A32, &mut v1),
                    Kind::Q4K => gemv_q4k::<1>(kb, t1, a as *const A256, &mut v1),
                    _ => gemv_q6k::<1>(kb, t1, a as *const A256, &mut v1),
                }
                v[0][0] = v1[0][0];
            }
            acc[..NT].copy_from_slice(&v[0]);
            return;
        }
        macro_rules! rows_loop {
            ($body:ident, $($extra:expr),*) => {{
                let mut r = 0;
                while r < rows {
                    let mt = (rows - r).min(MT);
                    match (mt, nt) {
                        (4, 2) => $body::<4, 2>(r, $($extra),*),
                        (3, 2) => $body::<3, 2>(r, $($extra),*),
                        (2, 2) => $body::<2, 2>(r, $($extra),*),
                        (1, 2) => $body::<1, 2>(r, $($extra),*),
                        (4, _) => $body::<4, 1>(r, $($extra),*),
                        (3, _) => $body::<3, 1>(r, $($extra),*),
                        (2, _) => $body::<2, 1>(r, $($extra),*),
                        _ => $body::<1, 1>(r, $($extra),*),
                    }
                    r += mt;
                }
            }};
        }
        #[inline(always)]
        unsafe fn load_acc<const M: usize, const N: usize>(
            acc: &[__m512; RB * NT],
            r: usize,
        ) -> [[__m512; N]; M] {
            let mut a = [[_mm512_setzero_ps(); N]; M];
            for i in 0..M {
                for j in 0..N {
                    a[i][j] = acc[(r + i) * NT + j];
                }
            }
            a
        }
        #[inline(always)]
        unsafe fn store_acc<const M: usize, const N: usize>(
            acc: &mut [__m512; RB * NT],
            r: usize,
            a: &[[__m512; N]; M],
        ) {
            for i in 0..M {
                for j in 0..N {
                    acc[(r + i) * NT + j] = a[i][j];
                }
            }
        }
        match kind {
            Kind::Q8_0 | Kind::Q5_0 => {
                let q8 = kind == Kind::Q8_0;
                // Units of up to 8 blocks: expand once (Q5_0), then every row group.
                let mut b0 = 0;
                while b0 < kb {
                    let ub = (kb - b0).min(8);
                    if !q8 {
                        for u in 0..ub {
                            for (j, &t) in tiles.iter().enumerate().take(nt) {
                                expand_q5(w, t, b0 + u, j, u, scratch);
                            }
                        }
                    }
                    #[inline(always)]
                    #[allow(clippy::too_many_arguments)]
                    unsafe fn unit<const M: usize, const N: usize>(
                        r: usize,
                        acc: &mut [__m512; RB * NT],
                        acts: &Acts,
                        r0: usize,
                        w: &Packed,
                        b0: usize,
                        ub: usize,
                        tiles: [*const u8; NT],
                        scratch: *const Scratch,
                    ) {
                        let q8 = w.kind == Kind::Q8_0;
                        let mut a = load_acc::<M, N>(acc, r);
                        let mut ap = [std::ptr::null::<A32>(); M];
                        for u in 0..ub {
                            let b = b0 + u;
                            for (i, p) in ap.iter_mut().enumerate() {
                                *p = (acts.row(r0 + r + i) as *const A32).add(b);
                            }
                            let mut wp = [std::ptr::null::<u8>(); N];
                            let mut dp = [std::ptr::null::<u8>(); N];
                            for j in 0..N {
                                dp[j] = tiles[j].add(w.d_off(b));
                                wp[j] = if q8 {
                                    tiles[j].add(w.qs_off(b))
                                } else {
                                    (*scratch).w.as_ptr().add(j * 4096 + u * 512)
                                };
                            }
                            blk32::<M, N>(wp, dp, ap, q8, &mut a);
                        }
                        store_acc::<M, N>(acc, r, &a);
                    }
                    let sp = scratch as *const Scratch;
                    rows_loop!(unit, acc, acts, r0, w, b0, ub, tiles, sp);
                    b0 += ub;
                }
            }
            Kind::Q4K | Kind::Q6K => {
                let pb = kind.packed_bytes();
                for b in 0..kb {
                    for (j, &t) in tiles.iter().enumerate().take(nt) {
                        expand_k(kind, t.add(b * pb), j, scratch);
                    }
                    #[inline(always)]
                    unsafe fn unit<const M: usize, const N: usize>(
                        r: usize,
                        acc: &mut [__m512; RB * NT],
                        acts: &Acts,
                        r0: usize,
                        b: usize,
                        q4: bool,
                        scratch: *const Scratch,
                    ) {
                        let mut a = load_acc::<M, N>(acc, r);
                        let mut ap = [std::ptr::null::<A256>(); M];
                        for (i, p) in ap.iter_mut().enumerate() {
                            *p = (acts.row(r0 + r + i) as *const A256).add(b);
                        }
                        if q4 {
                            sb_q4k::<M, N>(&*scratch, ap, &mut a);
                        } else {
                            sb_q6k::<M, N>(&*scratch, ap, &mut a);
                        }
                        store_acc::<M, N>(acc, r, &a);
                    }
                    let sp = scratch as *const Scratch;
                    rows_loop!(unit, acc, acts, r0, b, kind == Kind::Q4K, sp);
                }
            }
        }
    }

    thread_local! {
        static ACTS: std::cell::RefCell<Acts> = const { std::cell::RefCell::new(Acts { buf: Vec::new(), a256: false, m: 0, k: 0 }) };
    }

    /// One output of a (possibly fused) matmul.
    pub(crate) struct Job<'a> {
        /// One matrix, or (gate, up) for [`Epilogue::SwiGlu`].
        pub w: &'a Packed,
        pub up: Option<&'a Packed>,
        pub bias: Option<&'a [f32]>,
        pub epilogue: Epilogue<'a>,
        /// Every element is written.
        pub dst: &'a mut [std::mem::MaybeUninit<f32>],
    }

    /// An output buffer for [`matmul`], which writes every element.
    pub(crate) fn uninit(len: usize) -> Vec<std::mem::MaybeUninit<f32>> {
        let mut v = Vec::with_capacity(len);
        // SAFETY: MaybeUninit needs no initialization.
        unsafe { v.set_len(len) };
        v
    }

    /// # Safety
    /// Every element of `v` was written (as [`matmul`] does for its `dst`).
    pub(crate) unsafe fn assume_init(v: Vec<std::mem::MaybeUninit<f32>>) -> Vec<f32> {
        let mut v = std::mem::ManuallyDrop::new(v);
        Vec::from_raw_parts(v.as_mut_ptr() as *mut f32, v.len(), v.capacity())
    }

    thread_local! {
        static WORK: std::cell::RefCell<Option<(Box<Scratch>, Box<[__m512; RB * NT]>)>> = const { std::cell::RefCell::new(None) };
    }

    /// `dst_i = epilogue(x W_iᵀ + b_i)` for every job, all sharing the activations `x`
    /// ([m, k] row-major) and one activation format: one quantization, one parallel region.
    pub(crate) fn matmul(x: &[f32], m: usize, jobs: &mut [Job<'_>]) {
        matmul_rows(Rows::Whole(x), m, jobs)
    }

    /// [`matmul`] on activations given as [`Rows`].
    pub(crate) fn matmul_rows(x: Rows<'_>, m: usize, jobs: &mut [Job<'_>]) {
        assert!(!jobs.is_empty());
        let k = jobs[0].w.k;
        let a256 = jobs[0].w.kind.a256();
        for j in jobs.iter() {
            assert!(j.w.k == k && j.w.kind.a256() == a256 && j.dst.len() == m * j.w.n);
            assert!(j.bias.is_none_or(|b| b.len() == j.w.n));
            match j.epilogue {
                Epilogue::SwiGlu => {
                    let up = j.up.expect("SwiGLU needs the up matrix");
                    assert!(up.n == j.w.n && up.k == k && up.kind == j.w.kind && j.bias.is_none());
                }
                Epilogue::Residual(r) => assert_eq!(r.len(), m * j.w.n),
                Epilogue::Plain => {}
            }
        }
        match x {
            Rows::Whole(x) => assert_eq!(x.len(), m * k),
            Rows::Parts { parts, width } => {
                assert!(!a256 && width.is_multiple_of(32) && parts.len() * width == k);
                assert!(parts.iter().all(|p| p.len() >= m * width));
            }
        }
        ACTS.with(|cell| {
            let mut acts = cell.borrow_mut();
            quantize(x, m, k, a256, &mut acts);
            let acts = &*acts;
            let n_rc = m.div_ceil(RB);
            // Items: (column group, row chunk) per job, column-group major.
            let mut starts = Vec::with_capacity(jobs.len());
            let mut total = 0;
            for j in jobs.iter() {
                starts.push(total);
                let per = if matches!(j.epilogue, Epilogue::SwiGlu) {
                    1
                } else {
                    NT
                };
                total += (j.w.n / 16).div_ceil(per) * n_rc;
            }
            struct Raw<'a> {
                w: &'a Packed,
                up: Option<&'a Packed>,
                bias: Option<&'a [f32]>,
                epilogue: Epilogue<'a>,
                dst: usize,
            }
            let raws: Vec<Raw<'_>> = jobs
                .iter_mut()
                .map(|j| Raw {
                    w: j.w,
                    up: j.up,
                    bias: j.bias,
                    epilogue: j.epilogue,
                    dst: j.dst.as_mut_ptr() as usize,
                })
                .collect();
            let run = |range: std::ops::Range<usize>| {
                WORK.with(|cell| {
                    let mut work = cell.borrow_mut();
                    // SAFETY: all-zero bytes are valid for both (integers and floats).
                    let (scratch, acc) = work.get_or_insert_with(|| unsafe {
                        (
                            Box::new_zeroed().assume_init(),
                            Box::new_zeroed().assume_init(),
                        )
                    });
                    for it in range {
                        let ji = starts.partition_point(|&s| s <= it) - 1;
                        let r = &raws[ji];
                        let local = it - starts[ji];
                        let (cg, rc) = (local / n_rc, local % n_rc);
                        let ts = r.w.tile_bytes();
                        let n = r.w.n;
                        let (t0, nt, tiles) = match (r.epilogue, r.up) {
                            (Epilogue::SwiGlu, Some(up)) => (
                                cg,
                                2,
                                [
                                    r.w.base().wrapping_add(cg * ts),
                                    up.base().wrapping_add(cg * ts),
                                ],
                            ),
                            _ => {
                                let t0 = cg * NT;
                                let nt = (n / 16 - t0).min(NT);
                                (
                                    t0,
                                    nt,
                                    [
                                        r.w.base().wrapping_add(t0 * ts),
                                        r.w.base().wrapping_add((t0 + 1) * ts),
                                    ],
                                )
                            }
                        };
                        let r0 = rc * RB;
                        let r1 = (r0 + RB).min(m);
                        unsafe {
                            item(r.w, acts, tiles, nt, r0, r1, scratch, acc);
                            store(r, n, t0, nt, r0, r1, acc);
                        }
                    }
                })
            };
            #[target_feature(enable = "avx512f")]
            unsafe fn store(
                r: &Raw<'_>,
                n: usize,
                t0: usize,
                nt: usize,
                r0: usize,
                r1: usize,
                acc: &[__m512; RB * NT],
            ) {
                let dst = r.dst as *mut f32;
                for row in 0..r1 - r0 {
                    match r.epilogue {
                        Epilogue::SwiGlu => {
                            let y = _mm512_mul_ps(silu(acc[row * NT]), acc[row * NT + 1]);
                            _mm512_storeu_ps(dst.add((r0 + row) * n + t0 * 16), y);
                        }
                        _ => {
                            for j in 0..nt {
                                let col = (t0 + j) * 16;
                                let mut v = acc[row * NT + j];
                                if let Some(b) = r.bias {
                                    v = _mm512_add_ps(v, _mm512_loadu_ps(b.as_ptr().add(col)));
                                }
                                if let Epilogue::Residual(res) = r.epilogue {
                                    v = _mm512_add_ps(
                                        v,
                                        _mm512_loadu_ps(res.as_ptr().add((r0 + row) * n + col)),
                                    );
                                }
                                _mm512_storeu_ps(dst.add((r0 + row) * n + col), v);
                            }
                        }
                    }
                }
            }
            if total == 1 {
                run(0..1);
            } else {
                candle_core::utils::barrier_pool().execute_chunked(total, run);
            }
        });
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::qmm::{self, Epilogue, Job, Packed};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    fn run(
        x: &[f32],
        m: usize,
        w: &Packed,
        up: Option<&Packed>,
        ep: Epilogue<'_>,
        bias: Option<&[f32]>,
    ) -> Vec<f32> {
        let mut out = qmm::uninit(m * w.n());
        qmm::matmul(
            x,
            m,
            &mut [Job {
                w,
                up,
                bias,
                epilogue: ep,
                dst: &mut out,
            }],
        );
        unsafe { qmm::assume_init(out) }
    }

    fn rel(a: &[f32], b: &[f32]) -> f32 {
        let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f32 = b.iter().map(|y| y * y).sum();
        (num / den).sqrt()
    }

    /// Every block type against a dequantized f32 matmul, and the row-count invariance
    /// the decoder's chunking guarantee rests on: a row computed alone, in a small group or
    /// in a big batch gets the same bits.
    #[test]
    fn packed_kernels_are_accurate_and_row_count_invariant() -> candle_core::Result<()> {
        if !qmm::available() {
            return Ok(());
        }
        let dev = Device::Cpu;
        let (n, k, m) = (48, 512, 70);
        for dt in [
            GgmlDType::Q8_0,
            GgmlDType::Q5_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let wf = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let q = QTensor::quantize(&wf, dt)?;
            let w = Packed::new(dt, n, k, &q.data()?).expect("packable");
            let deq = q.dequantize(&dev)?;
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let all = run(&xs, m, &w, None, Epilogue::Plain, Some(&bias));
            let reference: Vec<f32> = x
                .matmul(&deq.t()?)?
                .broadcast_add(&Tensor::new(bias.as_slice(), &dev)?)?
                .flatten_all()?
                .to_vec1()?;
            let e = rel(&all, &reference);
            assert!(e < 0.02, "{dt:?}: relative error {e}");
            for (r0, rows) in [(0, 1), (37, 1), (69, 1), (3, 7), (60, 10)] {
                let part = run(
                    &xs[r0 * k..(r0 + rows) * k],
                    rows,
                    &w,
                    None,
                    Epilogue::Plain,
                    Some(&bias),
                );
                assert_eq!(
                    part,
                    all[r0 * n..(r0 + rows) * n],
                    "{dt:?}: rows {r0}..{}",
                    r0 + rows
                );
            }
            // Fused epilogues: residual add and SwiGLU.
            let res: Vec<f32> = (0..m * n).map(|i| (i % 13) as f32 - 6.0).collect();
            let with_res = run(&xs, m, &w, None, Epilogue::Residual(&res), Some(&bias));
            for i in 0..m * n {
                assert_eq!(with_res[i], all[i] + res[i]);
            }
            let q2 = QTensor::quantize(&Tensor::randn(0f32, 1.0, (n, k), &dev)?, dt)?;
            let up = Packed::new(dt, n, k, &q2.data()?).expect("packable");
            let g = run(&xs, m, &w, None, Epilogue::Plain, None);
            let u = run(&xs, m, &up, None, Epilogue::Plain, None);
            let sw = run(&xs, m, &w, Some(&up), Epilogue::SwiGlu, None);
            for i in 0..m * n {
                let want = g[i] / (1.0 + (-g[i]).exp()) * u[i];
                assert!(
                    (sw[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{dt:?} swiglu {i}: {} vs {want}",
                    sw[i]
                );
            }
            let sw1 = run(&xs[5 * k..6 * k], 1, &w, Some(&up), Epilogue::SwiGlu, None);
            assert_eq!(sw1, sw[5 * n..6 * n]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod dense_weight_tests {
    use super::Linear;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn dense_weight_recovers_the_dequantized_matrix_without_the_bias() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (64, 256), &dev)?;
        let b = Tensor::randn(0f32, 1.0, 64, &dev)?;
        for dt in [GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = QTensor::quantize(&w, dt)?;
            let deq = q.dequantize(&dev)?;
            let l = Linear::from_qtensor(q, Some(b.clone()), DType::F32, &dev)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            let d = l
                .dense_weight(256, &dev)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            assert_eq!(d.dims(), &[64, 256]);
            let err = (d - &deq)?.abs()?.max_all()?.to_scalar::<f32>()?;
            // Within the f32 rounding of one activation scale, far below a quant step.
            assert!(err < 1e-4, "{dt:?}: {err}");
        }
        Ok(())
    }
}
