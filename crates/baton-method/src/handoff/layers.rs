//! The handoff's second axis, layers: which of the target's layers it computes itself
//! over the handed positions.
//! - **upper from m** (`upper=M`): the source's residual stream at the layer of the same
//!   depth, kept as it read ([`baton_runtime::model::kept_residual`]), is mapped to the target's
//!   entering its layer `m` ([`crate::mapper::residual`]), and the target computes its
//!   layers `m..L` itself over those positions: its upper keys and values are its own
//!   computation and agree with one another; the layers below `m` keep the KV map. About
//!   (L − m)/L of a prefill of those positions.
//! - **lower to m** (`lower=M`, the control): the target computes its first `m` layers
//!   itself from the tokens, and the KV map gives the layers from `m` on. About m/L of a
//!   prefill.
//!
//! A position the source did not compute itself (mapped into it at an earlier switch)
//! has no residual stream of the source's: upper layers leave it as mapped, and it stays
//! a candidate of the position plan, which may re-read it. Positions the plan drops are
//! not computed, and those it re-reads are computed again over the new layers, as the
//! recall suite measured it.

use crate::mapper::residual::ResidualMap;
pub use baton_protocol::plan::LayerSplit;
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::model::{KvCache, Model, ModelError};
use candle_core::Tensor;
use std::ops::Range;

/// The positions a split computes over: of `candidates` (what the target did not
/// compute itself), those not `dropped`, and for upper layers only those whose residual
/// stream the source kept as its own (`source`).
pub fn positions(
    split: LayerSplit,
    candidates: &PositionSet,
    dropped: &[Range<usize>],
    source: &KvCache,
) -> PositionSet {
    let mut out = match split {
        LayerSplit::Upper(_) => {
            let mut own = source.residual_positions();
            let span = candidates.span();
            own.truncate(span.end);
            for gap in candidates.gaps(0..span.end) {
                own.remove(gap);
            }
            own
        }
        LayerSplit::Lower(_) => candidates.clone(),
    };
    for r in dropped {
        out.remove(r.clone());
    }
    out
}

/// Upper from `map.target_layer`: the target computes its layers from there on over the
/// positions of `runs`, from `source_rows` ([positions of the runs, source hidden], in
/// order): the source's residual stream there.
pub fn compute_upper(
    target: &Model,
    map: &ResidualMap,
    source_rows: &Tensor,
    runs: &[Range<usize>],
    cache: &mut KvCache,
) -> Result<(), ModelError> {
    if runs.is_empty() {
        return Ok(());
    }
    let hidden = map
        .apply(source_rows)
        .map_err(|e| ModelError::Cache(format!("the residual map: {e}")))?;
    target
        .decoder
        .upper_layers(&hidden, runs, map.target_layer, cache)
}

/// Run `split` over `runs` of the target's `cache` (`tokens` holds the history): upper
/// layers from the source's kept residual stream through `map`, or the target's own
/// lower layers.
pub fn apply(
    split: LayerSplit,
    target: &Model,
    map: Option<&ResidualMap>,
    source: &KvCache,
    tokens: &[u32],
    runs: &PositionSet,
    cache: &mut KvCache,
) -> Result<(), ModelError> {
    if runs.is_empty() {
        return Ok(());
    }
    match split {
        LayerSplit::Upper(m) => {
            let map = map.filter(|map| map.target_layer == m).ok_or_else(|| {
                ModelError::Cache(format!("no residual map to the target's layer {m}"))
            })?;
            let kept = source
                .kept_residual()
                .ok_or_else(|| ModelError::Cache("the source kept no residual stream".into()))?;
            if kept.layer() != map.source_layer {
                return Err(ModelError::Cache(format!(
                    "the source kept its residual stream entering layer {}, and the map \
                     reads the one entering layer {}",
                    kept.layer(),
                    map.source_layer
                )));
            }
            let rows = kept.rows(runs.runs(), target.decoder.device())?;
            compute_upper(target, map, &rows, runs.runs(), cache)
        }
        LayerSplit::Lower(m) => target.decoder.lower_layers(tokens, runs.runs(), m, cache),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_parse_print_label_and_check_their_layer() {
        assert_eq!(
            LayerSplit::parse("upper", "14"),
            Some(Ok(LayerSplit::Upper(14)))
        );
        assert_eq!(
            LayerSplit::parse_word("lower= 7"),
            Some(Ok(LayerSplit::Lower(7)))
        );
        assert!(matches!(LayerSplit::parse("upper", "x"), Some(Err(_))));
        assert_eq!(LayerSplit::parse("tail", "3"), None);
        assert_eq!(LayerSplit::parse_word("20%"), None);
        assert_eq!(LayerSplit::Upper(21).label(), "upper layers from 21");
        assert_eq!(LayerSplit::Upper(21).to_string(), "upper=21");
        assert_eq!(
            LayerSplit::parse_word("lower=3")
                .unwrap()
                .unwrap()
                .to_string(),
            "lower=3"
        );
        assert!(LayerSplit::Upper(14).check(28).is_ok());
        for bad in [LayerSplit::Upper(0), LayerSplit::Lower(28)] {
            let e = bad.check(28).unwrap_err();
            assert!(e.contains("from 1 to 27"), "{e}");
        }
    }

    #[test]
    fn the_share_of_a_prefill_is_the_layers_computed() {
        assert_eq!(LayerSplit::Upper(21).share_of_prefill(28), 0.25);
        assert_eq!(LayerSplit::Lower(7).share_of_prefill(28), 0.25);
        assert_eq!(LayerSplit::Upper(14).share_of_prefill(28), 0.5);
    }
}
