//! Calibrating a residual map ([`crate::mapper::residual`]): both models read the same
//! calibration windows (plain and chat-shaped, as the KV maps are calibrated), each
//! keeping its residual stream at its layer, and one ridge is fitted from the source's to
//! the target's.

use super::{mixed_windows, CalibrateError};
use crate::data::corpus::{Document, Split};
use crate::mapper::residual::{matching_layer, ResidualMap};
use crate::mapper::PairStats;
use crate::model::Model;
use candle_core::{DType, Tensor};

/// How a residual map is calibrated.
#[derive(Debug, Clone, Copy)]
pub struct ResidualFit {
    /// Windows read, and their length in tokens.
    pub sequences: usize,
    pub seq_len: usize,
    /// The share of windows in the chat template's shape.
    pub chat_share: f64,
    /// First positions of every window left out of the fit: the attention sink's
    /// residual stream holds activations thousands of times the rest, and a handoff never
    /// maps it (the target holds its opening).
    pub skip_first: usize,
    pub lambda: f64,
}

impl Default for ResidualFit {
    fn default() -> Self {
        Self {
            sequences: 32,
            seq_len: 256,
            chat_share: 0.5,
            skip_first: 4,
            lambda: 1.0,
        }
    }
}

/// Fit one map for each target layer of `target_layers`, from `src`'s residual stream
/// at the layer of the same depth ([`matching_layer`]) to `tgt`'s entering that layer, on
/// windows of `docs`'s fitting split. Both models read each window once, keeping every
/// layer asked for.
pub fn fit_residual_maps(
    src: &Model,
    tgt: &Model,
    docs: &[Document],
    target_layers: &[usize],
    opts: &ResidualFit,
) -> Result<Vec<ResidualMap>, CalibrateError> {
    let windows = mixed_windows(
        src,
        docs,
        Split::Fit,
        opts.seq_len,
        (0, opts.sequences),
        opts.chat_share,
    )?;
    let (ls, lt) = (src.config().n_layer, tgt.config().n_layer);
    let source_layers: Vec<usize> = target_layers
        .iter()
        .map(|&m| matching_layer(m, lt, ls))
        .collect();
    let (d_s, d_t) = (src.config().hidden, tgt.config().hidden);
    let mut stats = target_layers
        .iter()
        .map(|_| PairStats::new(1, d_s, 1, d_t))
        .collect::<Result<Vec<_>, _>>()?;
    for w in &windows {
        let xs = src
            .decoder
            .forward_keeping(w, &mut src.decoder.new_cache(), &source_layers)?;
        let ys = tgt
            .decoder
            .forward_keeping(w, &mut tgt.decoder.new_cache(), target_layers)?;
        let skip = opts.skip_first.min(w.len());
        let rows = w.len() - skip;
        if rows == 0 {
            continue;
        }
        let flat = |t: &Tensor| -> Result<Vec<f32>, CalibrateError> {
            Ok(t.narrow(0, skip, rows)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        for ((x, y), st) in xs.iter().zip(&ys).zip(stats.iter_mut()) {
            st.update(&flat(x)?, &flat(y)?, rows)?;
        }
    }
    stats
        .iter()
        .zip(source_layers.iter().zip(target_layers))
        .map(|(st, (&i, &m))| {
            Ok(ResidualMap::fit(
                st,
                i,
                m,
                opts.lambda,
                tgt.decoder.device(),
            )?)
        })
        .collect()
}
