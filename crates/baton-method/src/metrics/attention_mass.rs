//! How much attention each position of a window receives from the model's own queries,
//! against what it would receive if every query spread its attention evenly: the weight
//! an attention-weighted calibration gives the position (see
//! [`crate::calibrate::CalibrateOptions::attention_weight`]). A map's error at a position
//! no query reads costs nothing downstream; at a position queries read hard it is what the
//! target sees.

use super::{MetricError, Result};
use candle_core::{DType, Tensor, D};

/// Attention received by every key position of one layer: `queries` [n_head, len, hd]
/// (after RoPE, one per position) attend causally over `keys` [n_kv_head, len, hd]; the
/// probabilities are summed over heads and queries.
pub fn received_by_position(queries: &Tensor, keys: &Tensor) -> Result<Vec<f64>> {
    received_from(queries, keys, 0)
}

/// Attention received by every key position of one layer from queries at positions
/// `start..start + m` (`queries` [n_head, m, hd], after RoPE) attending causally over
/// `keys` [n_kv_head, start + m, hd]: summed over heads and queries, one value per key
/// position. What a message's tokens read of the context before them.
pub fn received_from(queries: &Tensor, keys: &Tensor, start: usize) -> Result<Vec<f64>> {
    let per_head = received_by_head(queries, keys, start)?;
    let klen = per_head.first().map_or(0, |h| h.len());
    let mut total = vec![0.0f64; klen];
    for head in &per_head {
        for (t, x) in total.iter_mut().zip(head) {
            *t += x;
        }
    }
    Ok(total)
}

/// [`received_from`] per query head: one row of key positions a head, each summed over
/// the queries.
pub fn received_by_head(queries: &Tensor, keys: &Tensor, start: usize) -> Result<Vec<Vec<f64>>> {
    let (nh, m, hd) = queries.dims3()?;
    let (nkv, klen, khd) = keys.dims3()?;
    if klen != start + m || khd != hd || nkv == 0 || nh % nkv != 0 {
        return Err(MetricError::Shape(format!(
            "queries {:?} at {start} against keys {:?}: keys for every position up to the \
             last query expected",
            queries.dims(),
            keys.dims()
        )));
    }
    let group = nh / nkv;
    let q = queries
        .to_dtype(DType::F32)?
        .contiguous()?
        .reshape((nkv, group * m, hd))?;
    let k = keys.to_dtype(DType::F32)?.contiguous()?;
    let mut mask = vec![0f32; m * klen];
    for i in 0..m {
        for x in &mut mask[i * klen + start + i + 1..(i + 1) * klen] {
            *x = f32::NEG_INFINITY;
        }
    }
    let mask = Tensor::from_vec(mask, (m, klen), q.device())?;
    let scale = 1.0 / (hd as f64).sqrt();
    let s = (q.matmul(&k.t()?)? * scale)?
        .reshape((nkv, group, m, klen))?
        .broadcast_add(&mask)?;
    let p = candle_nn::ops::softmax_last_dim(&s)?;
    // Summed over queries: [query head, key position].
    let got = p.sum(D::Minus2)?.reshape((nh, klen))?;
    Ok(got
        .to_vec2::<f32>()?
        .into_iter()
        .map(|h| h.into_iter().map(f64::from).collect())
        .collect())
}

/// The attention `received` (summed over `heads` query heads, any number of layers
/// `layers` already added in) as a multiple of what even causal attention would give:
/// query `i` spreads `1/(i+1)` over each of positions `0..=i`.
pub fn relative_to_even(received: &[f64], heads_times_layers: usize) -> Vec<f64> {
    let len = received.len();
    let mut even = vec![0.0f64; len];
    let mut tail = 0.0;
    for j in (0..len).rev() {
        tail += 1.0 / (j + 1) as f64;
        even[j] = tail * heads_times_layers as f64;
    }
    received.iter().zip(&even).map(|(r, e)| r / e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_message_reading_the_context_hands_out_one_unit_per_head_and_query() {
        // Three queries at positions 5..8 over 8 keys; the last key is seen only by the
        // last query, and each query spreads over exactly the positions up to its own.
        let (nh, nkv, m, hd) = (4, 2, 3, 8);
        let q = Tensor::zeros((nh, m, hd), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::randn(0f32, 1.0, (nkv, 5 + m, hd), &Device::Cpu).unwrap();
        let got = received_from(&q, &k, 5).unwrap();
        assert_eq!(got.len(), 8);
        let total: f64 = got.iter().sum();
        assert!((total - (nh * m) as f64).abs() < 1e-4, "{total}");
        let each = |i: usize| nh as f64 / (5 + i + 1) as f64;
        assert!((got[0] - (each(0) + each(1) + each(2))).abs() < 1e-5);
        assert!((got[7] - each(2)).abs() < 1e-5);
        assert!(
            received_from(&q, &k, 4).is_err(),
            "keys must end at the last query"
        );
        // At start 0 with one query per key it is the window's own attention.
        let q = Tensor::randn(0f32, 1.0, (nh, 8, hd), &Device::Cpu).unwrap();
        assert_eq!(
            received_from(&q, &k, 0).unwrap(),
            received_by_position(&q, &k).unwrap()
        );
    }

    #[test]
    fn queries_that_see_nothing_spread_evenly_and_score_one_everywhere() {
        // Zero queries: every logit is 0, so query i gives 1/(i+1) to each earlier position.
        let (nh, nkv, len, hd) = (4, 2, 6, 8);
        let q = Tensor::zeros((nh, len, hd), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::randn(0f32, 1.0, (nkv, len, hd), &Device::Cpu).unwrap();
        let got = received_by_position(&q, &k).unwrap();
        let total: f64 = got.iter().sum();
        // Every query hands out one unit per head.
        assert!((total - (nh * len) as f64).abs() < 1e-4, "{total}");
        for r in relative_to_even(&got, nh) {
            assert!((r - 1.0).abs() < 1e-5, "{r}");
        }
    }

    #[test]
    fn a_key_every_query_points_at_receives_the_attention() {
        // Keys along one axis, one of them long: queries along the same axis all read it.
        let (len, hd) = (5, 4);
        let mut k = vec![0f32; len * hd];
        k[2 * hd] = 20.0;
        let keys = Tensor::from_vec(k, (1, len, hd), &Device::Cpu).unwrap();
        let mut q = vec![0f32; len * hd];
        for i in 0..len {
            q[i * hd] = 1.0;
        }
        let queries = Tensor::from_vec(q, (1, len, hd), &Device::Cpu).unwrap();
        let got = received_by_position(&queries, &keys).unwrap();
        let rel = relative_to_even(&got, 1);
        // Queries 2..5 put almost all their weight on position 2.
        assert!(got[2] > 2.9, "{got:?}");
        assert!(rel[2] > 3.0 && rel[3] < 0.5 && rel[4] < 0.5, "{rel:?}");
    }

    #[test]
    fn queries_and_keys_of_other_lengths_are_refused() {
        let q = Tensor::zeros((2, 3, 4), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(received_by_position(&q, &k).is_err());
    }
}
