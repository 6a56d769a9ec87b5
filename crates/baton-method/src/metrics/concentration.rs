//! Key-error concentration: does the mapping error sit where attention reads?
//!
//! For query head h with projection W_h ([hd, hidden], q = W_h x) and SVD W_h = U Σ Vᵀ,
//! project a key error e onto the columns of U (the key-space directions queries can
//! point along), weight each component by σ², and divide by the mean weight:
//!   C(e) = (Σ σ_i² (u_iᵀe)² / Σ (u_iᵀe)²) / mean(σ²)
//! which equals (eᵀ W_h W_hᵀ e / ‖e‖²) / (tr(W_h W_hᵀ) / hd), so no SVD is needed.
//! C > 1 means the error is concentrated in directions that queries weigh heavily.
//! Keys are compared without RoPE (the rotation is orthogonal and moves q and k
//! together); for q-normed architectures W_h is the projection before the norm.

use super::{MetricError, Result};
use candle_core::{DType, Tensor, D};

/// Per query head of one layer: W_h W_hᵀ and its mean eigenvalue, computed once per
/// layer so that many key errors can be scored against it.
#[derive(Debug, Clone)]
pub struct QueryGram {
    /// [n_head, hd, hd]
    gram: Tensor,
    mean_weight: Vec<f64>,
}

impl QueryGram {
    /// `wq`: [n_head·hd, hidden], the query projection without its bias.
    pub fn new(wq: &Tensor, n_head: usize, hd: usize) -> Result<Self> {
        let (rows, _hidden) = wq.dims2()?;
        if rows != n_head * hd {
            return Err(MetricError::Shape(format!(
                "query projection {:?} for {n_head} heads of width {hd}",
                wq.dims()
            )));
        }
        let wq = wq.to_dtype(DType::F32)?;
        let mut grams = Vec::with_capacity(n_head);
        let mut mean_weight = Vec::with_capacity(n_head);
        for h in 0..n_head {
            let w = wq.narrow(0, h * hd, hd)?;
            grams.push(w.matmul(&w.t()?)?);
            // tr(W Wᵀ) is the squared Frobenius norm of W.
            mean_weight.push(w.sqr()?.sum_all()?.to_scalar::<f32>()? as f64 / hd as f64);
        }
        Ok(Self {
            gram: Tensor::stack(&grams, 0)?,
            mean_weight,
        })
    }

    pub fn n_head(&self) -> usize {
        self.mean_weight.len()
    }

    /// `key_error`: [n_kv_head, n, hd] (true − mapped, RoPE removed). The mean of C over
    /// tokens and query heads; tokens with no error are skipped (NaN if none has any).
    pub fn concentration(&self, key_error: &Tensor) -> Result<f64> {
        let (nkv, _n, hd) = key_error.dims3()?;
        let n_head = self.n_head();
        if !n_head.is_multiple_of(nkv) || self.gram.dim(1)? != hd {
            return Err(MetricError::Shape(format!(
                "key error {:?} against {n_head} query heads of width {}",
                key_error.dims(),
                self.gram.dim(1)?
            )));
        }
        let group = n_head / nkv;
        let e = key_error.to_dtype(DType::F32)?;
        let mut total = 0f64;
        let mut count = 0usize;
        for h in 0..n_head {
            let m = self.gram.get(h)?;
            let eh = e.get(h / group)?; // [n, hd]
            let weighted = (eh.matmul(&m)? * &eh)?.sum(D::Minus1)?.to_vec1::<f32>()?;
            let energy = eh.sqr()?.sum(D::Minus1)?.to_vec1::<f32>()?;
            for (wv, ev) in weighted.iter().zip(&energy) {
                if *ev > 0.0 && self.mean_weight[h] > 0.0 {
                    total += (*wv as f64 / *ev as f64) / self.mean_weight[h];
                    count += 1;
                }
            }
        }
        Ok(if count > 0 {
            total / count as f64
        } else {
            f64::NAN
        })
    }
}

/// `key_error`: [n_kv_head, n, hd] (true − mapped, RoPE removed); `wq`: [n_head·hd,
/// hidden]. The mean of C over tokens and query heads; tokens with no error are skipped.
pub fn key_error_concentration(key_error: &Tensor, wq: &Tensor, n_head: usize) -> Result<f64> {
    let hd = key_error.dim(2)?;
    QueryGram::new(wq, n_head, hd)?.concentration(key_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn error_along_the_strongest_direction_scores_high_and_isotropic_scores_one() -> Result<()> {
        let dev = Device::Cpu;
        // One head of width 4 whose projection stretches key-space axis 0 tenfold.
        let wq = Tensor::new(
            &[[10f32, 0., 0.], [0., 1., 0.], [0., 0., 1.], [0., 0., 0.5]],
            &dev,
        )?;
        let along = Tensor::new(&[[[1f32, 0., 0., 0.]]], &dev)?;
        let c = key_error_concentration(&along, &wq, 1)?;
        let mean = (100.0 + 1.0 + 1.0 + 0.25) / 4.0;
        assert!((c - 100.0 / mean).abs() < 1e-4, "{c}");
        let weak = Tensor::new(&[[[0f32, 0., 0., 1.]]], &dev)?;
        assert!(key_error_concentration(&weak, &wq, 1)? < 0.1);
        // An orthonormal projection weighs every direction alike.
        let eye = Tensor::eye(4, DType::F32, &dev)?;
        let any = Tensor::randn(0f32, 1.0, (1, 5, 4), &dev)?;
        assert!((key_error_concentration(&any, &eye, 1)? - 1.0).abs() < 1e-5);
        Ok(())
    }
}
