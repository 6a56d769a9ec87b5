//! The handoff's second axis, layers, as the recall suite measures it:
//! - **upper from m**: the source's residual stream at the layer of the same depth,
//!   mapped to the target's at its layer `m` ([`crate::mapper::residual`]); the target
//!   computes its layers `m..L` itself over every mapped position, and only the layers
//!   below `m` keep the KV map. About (L − m)/L of a prefill.
//! - **lower to m** (the control): the target computes its first `m` layers itself for
//!   every position, and the KV map gives the layers from `m` on. About m/L of a prefill.
//!
//! The source's residual stream is taken here by a read of its own of the history: in a
//! workbench the source keeps it while it reads, so the suite leaves that read out of
//! the handoff's time, and counts the residual map and the target's layers in it.

use crate::mapper::residual::ResidualMap;
use crate::model::{KvCache, LayerKv, Model, ModelError};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Which layers the target computes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerSplit {
    /// Its layers from this one on, over a mapped residual stream.
    Upper(usize),
    /// Its layers below this one, over its own; the map gives the rest.
    Lower(usize),
}

impl LayerSplit {
    /// `upper=M` or `lower=M`; `None` for any other key.
    pub fn parse(key: &str, value: &str) -> Option<Result<Self, String>> {
        let m = || {
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("{key}={value:?} is not a layer number"))
        };
        match key {
            "upper" => Some(m().map(LayerSplit::Upper)),
            "lower" => Some(m().map(LayerSplit::Lower)),
            _ => None,
        }
    }

    pub fn label(self) -> String {
        match self {
            LayerSplit::Upper(m) => format!("upper layers from {m}"),
            LayerSplit::Lower(m) => format!("lower layers to {m}"),
        }
    }

    /// Check the layer against the target's `n_layer`.
    pub fn check(self, n_layer: usize) -> Result<(), String> {
        let (LayerSplit::Upper(m) | LayerSplit::Lower(m)) = self;
        if m == 0 || m >= n_layer {
            return Err(format!(
                "{}: the target has layers 0 to {}; give a layer from 1 to {}",
                self.label(),
                n_layer - 1,
                n_layer - 1
            ));
        }
        Ok(())
    }
}

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
    let hidden = input
        .map
        .apply(&rows)
        .map_err(|e| ModelError::Cache(format!("the residual map: {e}")))?;
    tgt.decoder
        .upper_layers(&hidden, &[mapped], input.map.target_layer, cache)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_parse_label_and_check_their_layer() {
        assert_eq!(
            LayerSplit::parse("upper", "14"),
            Some(Ok(LayerSplit::Upper(14)))
        );
        assert_eq!(
            LayerSplit::parse("lower", " 7"),
            Some(Ok(LayerSplit::Lower(7)))
        );
        assert!(matches!(LayerSplit::parse("upper", "x"), Some(Err(_))));
        assert_eq!(LayerSplit::parse("tail", "3"), None);
        assert_eq!(LayerSplit::Upper(21).label(), "upper layers from 21");
        assert!(LayerSplit::Upper(14).check(28).is_ok());
        for bad in [LayerSplit::Upper(0), LayerSplit::Lower(28)] {
            let e = bad.check(28).unwrap_err();
            assert!(e.contains("from 1 to 27"), "{e}");
        }
    }
}
