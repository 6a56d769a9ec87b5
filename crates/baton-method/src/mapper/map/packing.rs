//! Weights rewritten for the int8 path's conditioned features and packed for its
//! kernels: shared by the ridge maps and the trained heads packed beside them.

use super::SourceScales;
use baton_runtime::model::weights::Linear;
use baton_runtime::model::ModelError;
use candle_core::{Device, Tensor};

/// `μ·W` added to `b` (`W` [rows, cols] row-major, `μ` the source means of the features
/// the rows read): the bias of the same map on centred features.
pub fn mean_into_bias(
    sources: &[usize],
    scales: &SourceScales,
    width: usize,
    keys: bool,
    w: &[f32],
    b: &mut [f32],
) {
    let cols = b.len();
    for (j, &l) in sources.iter().enumerate() {
        let (mean, _) = scales.layer(l, width, keys);
        for (i, mu) in mean.iter().enumerate() {
            for (bc, x) in b.iter_mut().zip(&w[(j * width + i) * cols..][..cols]) {
                *bc += mu * x;
            }
        }
    }
}

/// Rows of `mat` ([rows, cols]) divided by the scale of their feature.
pub fn unscale_rows(
    sources: &[usize],
    scales: &SourceScales,
    width: usize,
    keys: bool,
    mat: &mut [f32],
    cols: usize,
) {
    for (j, &l) in sources.iter().enumerate() {
        let (_, scale) = scales.layer(l, width, keys);
        for (i, s) in scale.iter().enumerate() {
            for x in &mut mat[(j * width + i) * cols..][..cols] {
                *x /= s;
            }
        }
    }
}

/// `mat` ([r, c] row-major) and `bias` on the int8 kernels, or `None` where they do not
/// take that shape.
pub fn packed_linear(
    mat: Vec<f32>,
    r: usize,
    c: usize,
    bias: Option<&[f32]>,
) -> Result<Option<Linear>, ModelError> {
    let t = Tensor::from_vec(mat, (r, c), &Device::Cpu)?
        .t()?
        .contiguous()?;
    let b = bias
        .map(|b| Tensor::from_slice(b, c, &Device::Cpu))
        .transpose()?;
    Linear::packed_q8_0(&t, b.as_ref())
}

pub fn vec2(t: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}
