//! What every layer of a pass shares, built once per pass: the batched path's additive
//! masks and the fused path's kept positions.

use crate::model::error::Result;
use candle_core::{DType, Device, Tensor};
use std::ops::Range;

/// What every layer of a forward pass shares, built on the device once per pass instead
/// of once per layer: the batched path's additive masks (one per run of rows: a prefill
/// chunk has one, a re-read one per span), and the fused path's indices of the positions
/// kept out of the hidden ones. Never built on the host: at 16K positions a host-built
/// mask is 32 MB a layer to fill and upload.
#[derive(Default)]
pub struct Masks {
    built: Vec<(MaskKey, Tensor)>,
    kept: Vec<(MaskKey, Tensor)>,
}

struct MaskKey {
    start: usize,
    t: usize,
    hidden: Vec<Range<usize>>,
    dtype: DType,
    device: candle_core::DeviceLocation,
}

impl Masks {
    /// The [t, start + t] additive mask: 0 where row i (at `start + i`) may attend, -inf
    /// past it and at `hidden` positions.
    pub(super) fn get(
        &mut self,
        start: usize,
        t: usize,
        hidden: &[Range<usize>],
        dtype: DType,
        device: &Device,
    ) -> Result<&Tensor> {
        let key = (start, t, hidden, dtype);
        memo(&mut self.built, key, device, || {
            let total = (start + t) as u32;
            let cols = Tensor::arange(0u32, total, device)?.reshape((1, total as usize))?;
            let rows = Tensor::arange(start as u32, total, device)?.reshape((t, 1))?;
            let mut blocked = cols.broadcast_gt(&rows)?;
            for r in hidden {
                let inside = (cols.ge(r.start as u32)? * cols.lt(r.end as u32)?)?;
                blocked = blocked.broadcast_maximum(&inside)?;
            }
            let shape = (t, total as usize);
            let ninf = Tensor::full(f32::NEG_INFINITY, shape, device)?.to_dtype(dtype)?;
            let zero = Tensor::zeros(shape, dtype, device)?;
            Ok(blocked.where_cond(&ninf, &zero)?)
        })
    }

    /// The indices of the positions a run of `t` rows at `start` attends over when
    /// `hidden` (before `start`) is left out; `None` when nothing is.
    pub(super) fn kept(
        &mut self,
        start: usize,
        t: usize,
        hidden: &[Range<usize>],
        device: &Device,
    ) -> Result<Option<&Tensor>> {
        if hidden.is_empty() {
            return Ok(None);
        }
        let key = (start, t, hidden, DType::U32);
        memo(&mut self.kept, key, device, || {
            let idx = kept_positions(start, t, hidden);
            Ok(Tensor::new(idx.as_slice(), device)?)
        })
        .map(Some)
    }
}

/// The tensor `built` holds for (start, t, hidden, dtype) on `device`, built by `build`
/// the first time: every layer after a pass's first finds it here, with nothing
/// allocated.
fn memo<'a>(
    built: &'a mut Vec<(MaskKey, Tensor)>,
    (start, t, hidden, dtype): (usize, usize, &[Range<usize>], DType),
    device: &Device,
    build: impl FnOnce() -> Result<Tensor>,
) -> Result<&'a Tensor> {
    let location = device.location();
    let same = |k: &MaskKey| {
        k.start == start
            && k.t == t
            && k.hidden == hidden
            && k.dtype == dtype
            && k.device == location
    };
    let i = match built.iter().position(|(k, _)| same(k)) {
        Some(i) => i,
        None => {
            let key = MaskKey {
                start,
                t,
                hidden: hidden.to_vec(),
                dtype,
                device: location,
            };
            built.push((key, build()?));
            built.len() - 1
        }
    };
    Ok(&built[i].1)
}

/// The positions kept out of `hidden` below `start`, then the rows, as indices.
fn kept_positions(start: usize, t: usize, hidden: &[Range<usize>]) -> Vec<u32> {
    let mut kept = Vec::with_capacity(start + t);
    let mut at = 0;
    for r in hidden {
        kept.extend(at as u32..r.start.max(at) as u32);
        at = at.max(r.end);
    }
    kept.extend(at.min(start) as u32..(start + t) as u32);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_positions_skip_the_hidden_ones_and_end_with_the_rows() {
        assert_eq!(kept_positions(5, 2, &[]), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(kept_positions(6, 1, &[1..3, 4..5]), vec![0, 3, 5, 6]);
        assert_eq!(kept_positions(4, 2, &[0..4]), vec![4, 5]);
    }
}
