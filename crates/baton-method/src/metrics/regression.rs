//! R² of mapped against true per-layer features, on held-out positions.

use super::{MetricError, Result};
use candle_core::{DType, Tensor};

/// `truth` and `pred`: per layer [positions, features]. R² = 1 − SSE / SST with SST
/// around each feature's mean over the positions; one value per layer.
pub fn r2_per_layer(truth: &[Tensor], pred: &[Tensor]) -> Result<Vec<f64>> {
    if truth.len() != pred.len() {
        return Err(MetricError::Shape(format!(
            "{} vs {} layers",
            truth.len(),
            pred.len()
        )));
    }
    truth
        .iter()
        .zip(pred)
        .map(|(t, p)| {
            if t.dims() != p.dims() {
                return Err(MetricError::Shape(format!(
                    "{:?} vs {:?}",
                    t.dims(),
                    p.dims()
                )));
            }
            let t = t.to_dtype(DType::F64)?;
            let p = p.to_dtype(DType::F64)?;
            let sse = (&t - &p)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
            let mean = t.mean_keepdim(0)?;
            let sst = t
                .broadcast_sub(&mean)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
            Ok(if sst > 0.0 { 1.0 - sse / sst } else { f64::NAN })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn perfect_mean_and_noise() -> Result<()> {
        let dev = Device::Cpu;
        let t = Tensor::randn(0f32, 1.0, (200, 6), &dev)?;
        let mean = t.mean_keepdim(0)?.broadcast_as((200, 6))?.contiguous()?;
        let r = r2_per_layer(&[t.clone(), t.clone()], &[t.clone(), mean])?;
        assert!((r[0] - 1.0).abs() < 1e-12);
        assert!(
            r[1].abs() < 1e-9,
            "predicting the mean scores zero: {}",
            r[1]
        );
        Ok(())
    }
}
