//! Teacher-forced comparison of a target continuing from its true cache and from a
//! mapped cache: next-token top-1 agreement, KL(true ‖ mapped), and perplexities, with
//! the no-prefix floor a mapper has to beat.

use super::{MetricError, Result};
use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct NextTokenAgreement {
    /// Share of positions where both argmaxes agree.
    pub top1: f64,
    /// Mean KL(p_true ‖ p_mapped) in nats.
    pub kl: f64,
    pub positions: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ContinuationScores {
    pub agreement: NextTokenAgreement,
    /// The same comparison for the target with no prefix at all: the floor.
    pub agreement_no_prefix: NextTokenAgreement,
    pub ppl_true: f64,
    pub ppl_mapped: f64,
    /// The continuation scored with no prefix at all: the floor.
    pub ppl_no_prefix: f64,
}

/// Log-softmax rows of [n, vocab] logits in f32.
fn log_probs(logits: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::log_softmax(
        &logits.to_dtype(DType::F32)?,
        D::Minus1,
    )?)
}

/// Top-1 agreement and mean KL between two [n, vocab] logit matrices.
pub fn agreement(true_logits: &Tensor, mapped_logits: &Tensor) -> Result<NextTokenAgreement> {
    if true_logits.dims() != mapped_logits.dims() {
        return Err(MetricError::Shape(format!(
            "{:?} vs {:?}",
            true_logits.dims(),
            mapped_logits.dims()
        )));
    }
    let n = true_logits.dim(0)?;
    let lt = log_probs(true_logits)?;
    let lm = log_probs(mapped_logits)?;
    let kl = (lt.exp()? * (&lt - &lm)?)?.sum(D::Minus1)?;
    let kl = kl.mean_all()?.to_scalar::<f32>()? as f64;
    let at = true_logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
    let am = mapped_logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
    let same = at.iter().zip(&am).filter(|(a, b)| a == b).count();
    Ok(NextTokenAgreement {
        top1: same as f64 / n.max(1) as f64,
        kl,
        positions: n,
    })
}

/// Perplexity of `targets` (one id per row) under [n, vocab] logits.
pub fn perplexity(logits: &Tensor, targets: &[u32]) -> Result<f64> {
    let n = logits.dim(0)?;
    if n != targets.len() {
        return Err(MetricError::Shape(format!(
            "{n} rows, {} targets",
            targets.len()
        )));
    }
    let lp = log_probs(logits)?;
    let idx = Tensor::new(targets, logits.device())?.unsqueeze(1)?;
    let nll = lp.gather(&idx, 1)?.neg()?.mean_all()?.to_scalar::<f32>()? as f64;
    Ok(nll.exp())
}

/// `true_logits` / `mapped_logits`: the target's logits at every continuation position
/// after the true / mapped prefix (row i predicts `continuation[i + 1]`), and
/// `no_prefix_logits` the same from an empty cache. Every perplexity is over the same
/// tokens, `continuation[1..]`, because with no prefix the first token has no context.
pub fn continuation_scores(
    true_logits: &Tensor,
    mapped_logits: &Tensor,
    no_prefix_logits: &Tensor,
    continuation: &[u32],
) -> Result<ContinuationScores> {
    let n = continuation.len();
    if n < 2 {
        return Err(MetricError::Shape(
            "a continuation needs at least two tokens".into(),
        ));
    }
    let rows = |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(0, 0, n - 1)?) };
    let targets = &continuation[1..];
    Ok(ContinuationScores {
        agreement: agreement(&rows(true_logits)?, &rows(mapped_logits)?)?,
        agreement_no_prefix: agreement(&rows(true_logits)?, &rows(no_prefix_logits)?)?,
        ppl_true: perplexity(&rows(true_logits)?, targets)?,
        ppl_mapped: perplexity(&rows(mapped_logits)?, targets)?,
        ppl_no_prefix: perplexity(&rows(no_prefix_logits)?, targets)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn identical_logits_agree_fully_with_zero_kl() -> Result<()> {
        let l = Tensor::randn(0f32, 3.0, (7, 50), &Device::Cpu)?;
        let a = agreement(&l, &l)?;
        assert_eq!(a.top1, 1.0);
        assert!(a.kl.abs() < 1e-6);
        let other = Tensor::randn(0f32, 3.0, (7, 50), &Device::Cpu)?;
        assert!(agreement(&l, &other)?.kl > 0.1);
        Ok(())
    }

    #[test]
    fn uniform_logits_have_vocabulary_sized_perplexity() -> Result<()> {
        let l = Tensor::zeros((4, 32), DType::F32, &Device::Cpu)?;
        let p = perplexity(&l, &[1, 2, 3, 4])?;
        assert!((p - 32.0).abs() < 1e-3, "{p}");
        Ok(())
    }
}
