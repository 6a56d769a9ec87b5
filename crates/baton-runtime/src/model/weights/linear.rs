//! [`Linear`]: a projection on candle's quantized matmul, or on baton's int8 kernels
//! ([`crate::kernels::int8`]) where they run, with the fused forms the decoder uses.

use super::super::error::{ModelError, Result};
use crate::kernels::int8::{self, Epilogue, Job, Packed, Rows};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
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
    /// Packed for the int8 kernels, with the bias as plain floats.
    Packed(Arc<Packed>, Option<Arc<Vec<f32>>>),
}

impl Linear {
    pub(super) fn new(w: QMatMul, b: Option<Tensor>) -> Self {
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
    pub(super) fn from_qtensor(
        q: QTensor,
        b: Option<Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if device.is_cpu() && dtype == DType::F32 && int8::enabled() {
            if let Ok((n, k)) = q.shape().dims2() {
                if Packed::supports(q.dtype(), n, k) {
                    if let Ok(p) = Packed::new(q.dtype(), n, k, &q.data()?) {
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
        let w = QMatMul::from_qtensor(q)?;
        let w = match w {
            QMatMul::Tensor(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
            other => other,
        };
        Ok(Self::new(w, b))
    }

    /// A dense f32 matrix `weight` ([out, in]) and bias, quantized to Q8_0 and packed
    /// for the CPU's int8 kernels. `None` where those kernels do not run (no AVX-512
    /// VNNI, no AVX2 and no `BATON_PORTABLE_KERNELS`, not on the CPU, or a shape they do
    /// not take).
    pub fn packed_q8_0(weight: &Tensor, bias: Option<&Tensor>) -> Result<Option<Self>> {
        let (n, k) = weight.dims2()?;
        if weight.device().is_cpu() && int8::enabled() && Packed::supports(GgmlDType::Q8_0, n, k) {
            let q = QTensor::quantize(&weight.to_dtype(DType::F32)?, GgmlDType::Q8_0)?;
            let b = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
            let l = Self::from_qtensor(q, b, DType::F32, weight.device())?;
            if matches!(l.w, LinearWeight::Packed(..)) {
                return Ok(Some(l));
            }
        }
        Ok(None)
    }

    /// Whether this projection runs on baton's int8 kernels (else on candle's).
    pub fn is_packed(&self) -> bool {
        matches!(self.w, LinearWeight::Packed(..))
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
        Ok(Self::forward_parts_fused(&[self], parts, width, m)?
            .and_then(|outs| outs.into_iter().next()))
    }

    /// [`Self::forward_parts`] for several projections of the same input in one pass:
    /// the input is quantized once for all of them. `None` unless every one is packed as
    /// Q8_0.
    pub fn forward_parts_fused(
        layers: &[&Linear],
        parts: &[&[f32]],
        width: usize,
        m: usize,
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let mut jobs = Vec::with_capacity(layers.len());
        for l in layers {
            let LinearWeight::Packed(p, b) = &l.w else {
                return Ok(None);
            };
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
            jobs.push(Job {
                w: p,
                up: None,
                bias: b.as_ref().map(|b| b.as_slice()),
                epilogue: Epilogue::Plain,
            });
        }
        if jobs.is_empty() {
            return Ok(None);
        }
        Ok(Some(int8::matmul_rows(
            Rows::Parts { parts, width },
            m,
            &jobs,
        )?))
    }

    /// The weight as a dense f32 matrix [out, in]. The packed kernels keep no other copy,
    /// so it is recovered by running the identity through the layer: a one-hot row
    /// quantizes without loss, which makes this the dequantized weight up to the f32
    /// rounding of the activation scale. For instruments, not for the forward pass.
    pub fn dense_weight(&self, in_features: usize, device: &Device) -> Result<Tensor> {
        // A dense weight takes activations of its own dtype (bf16 where they are).
        let dtype = match &self.w {
            LinearWeight::Candle(QMatMul::Tensor(t))
            | LinearWeight::Candle(QMatMul::TensorF16(t)) => t.dtype(),
            _ => DType::F32,
        };
        let eye = Tensor::eye(in_features, dtype, device)?;
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
            LinearWeight::Packed(p, b) => {
                let ws = [(p, b.as_ref().map(|b| b.as_slice()))];
                match run_packed(&ws, x, |_| Epilogue::Plain, None)? {
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
        if let Some(ws) = packed_all(ls) {
            if let Some(outs) = run_packed(&ws, x, |_| Epilogue::Plain, None)? {
                return Ok(outs);
            }
        }
        ls.iter().map(|l| l.forward(x)).collect()
    }

    /// `residual + self.forward(x)`, fused into the matmul's output on the CPU.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        if let Some(ws) = packed_all(&[self]) {
            if residual.dtype() == DType::F32 && residual.device().is_cpu() {
                let res = residual.contiguous()?;
                let (st, lay) = res.storage_and_layout();
                if let candle_core::Storage::Cpu(cs) = &*st {
                    let all = cs.as_slice::<f32>()?;
                    let rs = &all[lay.start_offset()..lay.start_offset() + res.elem_count()];
                    if let Some(outs) =
                        run_packed(&ws, x, |_| Epilogue::Residual(rs), Some(res.elem_count()))?
                    {
                        return one_output(outs);
                    }
                }
            }
        }
        Ok((residual + self.forward(x)?)?)
    }

    /// `silu(x gateᵀ) * (x upᵀ)`, fused into one pass on the CPU.
    pub fn forward_swiglu(gate: &Linear, up: &Linear, x: &Tensor) -> Result<Tensor> {
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

type PackedRef<'a> = (&'a Arc<Packed>, Option<&'a [f32]>);

/// The packed weights of every linear, if all are packed and share one input format.
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
fn one_output(mut outs: Vec<Tensor>) -> Result<Tensor> {
    match (outs.pop(), outs.is_empty()) {
        (Some(t), true) => Ok(t),
        _ => Err(ModelError::Unsupported(
            "a packed projection returned other than one output".into(),
        )),
    }
}

fn run_packed<'a>(
    ws: &[PackedRef<'_>],
    x: &Tensor,
    epilogue: impl Fn(usize) -> Epilogue<'a>,
    residual_len: Option<usize>,
) -> Result<Option<Vec<Tensor>>> {
    let k = ws[0].0.k();
    let outs = with_rows(x, k, |xs, m| {
        if residual_len.is_some_and(|r| r != m * ws[0].0.n()) {
            return Err(ModelError::Cache(
                "residual shape differs from the projection's output".into(),
            ));
        }
        let jobs: Vec<Job<'_>> = ws
            .iter()
            .enumerate()
            .map(|(i, (w, b))| Job {
                w,
                up: None,
                bias: *b,
                epilogue: epilogue(i),
            })
            .collect();
        Ok(int8::matmul(xs, m, &jobs)?)
    })?;
    outs.map(|outs| {
        outs.into_iter()
            .zip(ws)
            .map(|(o, (w, _))| out_tensor(o, x, w.n()))
            .collect()
    })
    .transpose()
}

fn run_packed_swiglu(g: &Packed, u: &Packed, x: &Tensor) -> Result<Option<Vec<Tensor>>> {
    let out = with_rows(x, g.k(), |xs, m| {
        let job = Job {
            w: g,
            up: Some(u),
            bias: None,
            epilogue: Epilogue::SwiGlu,
        };
        Ok(int8::matmul(xs, m, &[job])?)
    })?;
    out.map(|outs| outs.into_iter().map(|o| out_tensor(o, x, g.n())).collect())
        .transpose()
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

#[cfg(test)]
mod fused_parts_tests {
    use super::Linear;
    use candle_core::{Device, Tensor};

    #[test]
    fn projections_run_side_by_side_give_what_each_gives_alone() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let err = |e: super::ModelError| candle_core::Error::Msg(e.to_string());
        let (w1, b1) = (
            Tensor::randn(0f32, 1.0, (96, 64), &dev)?,
            Tensor::randn(0f32, 1.0, 96, &dev)?,
        );
        let w2 = Tensor::randn(0f32, 1.0, (32, 64), &dev)?;
        let (Some(a), Some(b)) = (
            Linear::packed_q8_0(&w1, Some(&b1)).map_err(err)?,
            Linear::packed_q8_0(&w2, None).map_err(err)?,
        ) else {
            // No int8 kernels on this CPU: nothing is fused, and nothing to compare.
            return Ok(());
        };
        let rows = 5;
        let x: Vec<f32> = Tensor::randn(0f32, 1.0, rows * 64, &dev)?.to_vec1()?;
        let (p0, p1): (Vec<f32>, Vec<f32>) = (0..rows)
            .flat_map(|r| {
                x[r * 64..][..64]
                    .chunks(32)
                    .map(|c| c.to_vec())
                    .collect::<Vec<_>>()
            })
            .enumerate()
            .fold((vec![], vec![]), |(mut l, mut r), (i, c)| {
                if i % 2 == 0 {
                    l.extend(c)
                } else {
                    r.extend(c)
                }
                (l, r)
            });
        let parts = [p0.as_slice(), p1.as_slice()];
        let fused = Linear::forward_parts_fused(&[&a, &b], &parts, 32, rows)
            .map_err(err)?
            .expect("both packed");
        assert_eq!(fused.len(), 2);
        assert_eq!(
            Some(&fused[0]),
            a.forward_parts(&parts, 32, rows).map_err(err)?.as_ref()
        );
        assert_eq!(
            Some(&fused[1]),
            b.forward_parts(&parts, 32, rows).map_err(err)?.as_ref()
        );
        // And what a dense product of the same input gives, within Q8_0's rounding.
        let xt = Tensor::from_vec(x, (rows, 64), &dev)?;
        let want: Vec<f32> = xt.matmul(&w2.t()?)?.flatten_all()?.to_vec1()?;
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, w) in fused[1].iter().zip(&want) {
            assert!((g - w).abs() <= 0.02 * scale, "{g} against {w}");
        }
        Ok(())
    }
}
