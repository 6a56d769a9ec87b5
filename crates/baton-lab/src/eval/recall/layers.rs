//! The handoff's second axis, layers, as the recall suite measures it:
//! - **upper from m**: the source's residual stream at the layer of the same depth,
//!   mapped to the target's at its layer `m` ([`baton_method::mapper::residual`]); the target
//!   computes its layers `m..L` itself over every mapped position, and only the layers
//!   below `m` keep the KV map. About (L − m)/L of a prefill.
//! - **lower to m** (the control): the target computes its first `m` layers itself for
//!   every position, and the KV map gives the layers from `m` on. About m/L of a prefill.
//!
//! The source's residual stream is taken here by a read of its own of the history: in a
//! workbench the source keeps it while it reads, so the suite leaves that read out of
//! the handoff's time, and counts the residual map and the target's layers in it.

pub use baton_method::handoff::layers::LayerSplit;
use baton_method::mapper::residual::ResidualMap;
use baton_runtime::model::{KvCache, LayerKv, Model, ModelError};
use candle_core::Tensor;
use std::ops::Range;

/// A residual map and the source's residual stream of the history at its layer.
pub struct UpperInput {
    pub map: ResidualMap,
    /// [history positions, source hidden].
    pub source_rows: Tensor,
}

/// The source's residual streams of `history` for each map's source layer.
pub fn source_rows(
    src: &Model,
    history: &[u32],
    maps: &[ResidualMap],
) -> Result<Vec<Tensor>, ModelError> {
    if maps.is_empty() {
        return Ok(Vec::new());
    }
    let layers: Vec<usize> = maps.iter().map(|m| m.source_layer).collect();
    src.decoder
        .forward_keeping(history, &mut src.decoder.new_cache(), &layers)
}

/// Upper from `input.map.target_layer`: the target computes its layers from there on for
/// the positions of `mapped`, from the mapped residual stream.
pub fn compute_upper(
    tgt: &Model,
    input: &UpperInput,
    mapped: Range<usize>,
    cache: &mut KvCache,
) -> Result<(), ModelError> {
    if mapped.is_empty() {
        return Ok(());
    }
    let rows = input.source_rows.narrow(0, mapped.start, mapped.len())?;
    baton_method::handoff::layers::compute_upper(tgt, &input.map, &rows, &[mapped], cache)
}

/// Lower to `m`: the mapped layers below `m` of positions `range` replaced by `own`'s
/// (the target's own first layers of the history).
pub fn swap_in_lower(
    own: &[LayerKv],
    layers: &mut [LayerKv],
    range: Range<usize>,
) -> Result<(), ModelError> {
    for (layer, own) in layers.iter_mut().zip(own) {
        layer.k = own.k.narrow(1, range.start, range.len())?;
        layer.v = own.v.narrow(1, range.start, range.len())?;
    }
    Ok(())
}
