//! The two per-switch estimates (see the module above).

use super::GateError;
use crate::mapper::features::{heads_to_rows, layer_features};
use crate::mapper::CacheMapper;
use baton_runtime::model::rope::Rope;
use baton_runtime::model::{KvCache, LayerKv};
use candle_core::Tensor;

/// Positions read per estimate at most: spread evenly, enough to steady a mean.
pub const MAX_POSITIONS: usize = 256;

/// Source layers the maps read (the token block's pieces are not cache layers).
fn layers_read(mapper: &CacheMapper) -> Vec<usize> {
    let mut layers: Vec<usize> = mapper
        .keys()
        .iter()
        .chain(mapper.values())
        .flat_map(|m| m.sources.iter().copied())
        .filter(|&s| s < mapper.source().n_layer)
        .collect();
    layers.sort_unstable();
    layers.dedup();
    layers
}

fn stride_for(n: usize) -> usize {
    n.div_ceil(MAX_POSITIONS).max(1)
}

/// Mean of `((x − μ) / σ)²` over positions `start..end` of `src` and every feature the
/// maps read, keys and values, under the calibration's means and spreads; `None` when
/// the mapper has none (artifacts older than them) or the range is empty.
pub fn feature_distance(
    mapper: &CacheMapper,
    src: &KvCache,
    rope: &Rope,
    start: usize,
    end: usize,
) -> Result<Option<f64>, GateError> {
    let Some(scales) = mapper.source_scales() else {
        return Ok(None);
    };
    if end <= start || end > src.len() {
        return Ok(None);
    }
    let d = mapper.source().n_kv_head * mapper.source().head_dim;
    let stride = stride_for(end - start);
    let (mut sum, mut count) = (0.0f64, 0usize);
    for s in layers_read(mapper) {
        let f = layer_features(src, rope, s, start, end, stride)?;
        let pairs = [
            (&f.k, &scales.key_mean, &scales.key_std),
            (&f.v, &scales.value_mean, &scales.value_std),
        ];
        for (x, mean, std) in pairs {
            let rows: Vec<Vec<f32>> = x.to_dtype(candle_core::DType::F32)?.to_vec2()?;
            let (Some(mean), Some(std)) =
                (mean.get(s * d..(s + 1) * d), std.get(s * d..(s + 1) * d))
            else {
                return Ok(None);
            };
            for row in rows {
                for ((v, m), sd) in row.iter().zip(mean).zip(std) {
                    // A feature that never moved in calibration says nothing here.
                    if *sd > 1e-6 {
                        let z = f64::from((v - m) / sd);
                        sum += z * z;
                        count += 1;
                    }
                }
            }
        }
    }
    Ok((count > 0).then(|| sum / count as f64))
}

/// The positions a round trip reads: the newest [`MAX_POSITIONS`] of `from..n`.
pub fn round_trip_range(from: usize, n: usize) -> (usize, usize) {
    (from.max(n.saturating_sub(MAX_POSITIONS)), n)
}

/// What a round trip reads: the source's cache `src` and the ids it holds, the maps
/// there (`forward`) and back (`reverse`), and both models' rotations.
#[derive(Clone, Copy)]
pub struct RoundTrip<'a> {
    pub forward: &'a CacheMapper,
    pub reverse: &'a CacheMapper,
    pub src: &'a KvCache,
    pub tokens: &'a [u32],
    pub src_rope: &'a Rope,
    pub tgt_rope: &'a Rope,
}

/// Mean cosine, over positions `start..end` and every source layer, between the source's
/// own keys and values and what mapping them to the target and back gives. Both sides
/// carry the same rotation per position, so the cosine is that of the un-rotated
/// features. `None` for an empty range.
pub fn round_trip(trip: RoundTrip<'_>, start: usize, end: usize) -> Result<Option<f64>, GateError> {
    let each = round_trip_by_position(trip, start, end)?;
    Ok((!each.is_empty()).then(|| each.iter().sum::<f64>() / each.len() as f64))
}

/// [`round_trip`] per position of `start..end`: the cosine of each position's keys and
/// values after two maps, averaged over the source's layers. A low one says the map
/// loses that position: what the re-read's error selector ranks by. Empty for an empty
/// range.
pub fn round_trip_by_position(
    trip: RoundTrip<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<f64>, GateError> {
    let RoundTrip {
        forward,
        reverse,
        src,
        tokens,
        src_rope,
        tgt_rope,
    } = trip;
    if end <= start || end > src.len() {
        return Ok(Vec::new());
    }
    let there = forward.map_range(src, tokens, src_rope, tgt_rope, start, end)?;
    // The reverse map reads positions start..end of a target cache: the positions before
    // them are never read, so zeros hold their place.
    let t = forward.target();
    let mut scratch = KvCache::new(t, src.dtype(), src.device());
    if start > 0 {
        let zeros = (0..t.n_layer)
            .map(|_| {
                let z = Tensor::zeros((t.n_kv_head, start, t.head_dim), src.dtype(), src.device())?;
                Ok(LayerKv { k: z.clone(), v: z })
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()?;
        scratch.extend_with(&zeros)?;
    }
    scratch.extend_with(&there)?;
    let back = reverse.map_range(&scratch, tokens, tgt_rope, src_rope, start, end)?;
    let mut sum = vec![0.0f64; end - start];
    let mut count = 0usize;
    for (l, b) in back.iter().enumerate() {
        let own = src.layer_range(l, start, end)?;
        for (x, y) in [(&own.k, &b.k), (&own.v, &b.v)] {
            let c = row_cosines(&heads_to_rows(x)?, &heads_to_rows(y)?)?;
            for (s, v) in sum.iter_mut().zip(c) {
                *s += f64::from(v);
            }
            count += 1;
        }
    }
    Ok(sum.into_iter().map(|s| s / count.max(1) as f64).collect())
}

/// Cosine of each row of `a` with the same row of `b` ([n, d] each).
fn row_cosines(a: &Tensor, b: &Tensor) -> Result<Vec<f32>, GateError> {
    let a = a.to_dtype(candle_core::DType::F32)?;
    let b = b.to_dtype(candle_core::DType::F32)?;
    let dot = (&a * &b)?.sum(1)?;
    let na = a.sqr()?.sum(1)?.sqrt()?;
    let nb = b.sqr()?.sum(1)?.sqrt()?;
    let c = (dot / ((na * nb)? + 1e-12)?)?;
    Ok(c.to_vec1()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn row_cosines_are_one_for_equal_rows_and_minus_one_for_opposite_ones() {
        let a = Tensor::new(&[[1.0f32, 2.0], [3.0, -1.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[2.0f32, 4.0], [-3.0, 1.0]], &Device::Cpu).unwrap();
        let c = row_cosines(&a, &b).unwrap();
        assert!(
            (c[0] - 1.0).abs() < 1e-6 && (c[1] + 1.0).abs() < 1e-6,
            "{c:?}"
        );
    }

    #[test]
    fn the_stride_keeps_at_most_max_positions() {
        for n in [1, 255, 256, 257, 1000, 5000] {
            let s = stride_for(n);
            assert!(n.div_ceil(s) <= MAX_POSITIONS, "{n} {s}");
        }
    }
}
