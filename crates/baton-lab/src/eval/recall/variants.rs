//! Handoff variants of the recall suite: the same turns handed over several ways in one
//! run (map only, a tail, a re-read by some selector and budget), so that every variant
//! is scored against the same source-alone and re-prefilled answers and timed against
//! the same re-prefill.

use super::layers::{compute_upper, swap_in_lower, LayerSplit, UpperInput};
use super::{Oracle, RecallOptions};
use crate::eval::reread::{RereadModels, RereadTurn};
use crate::eval::EvalError;
use baton_method::handoff::reread::{opening_len, PlanKind, RereadBudget, RereadSetting};
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::mapper::CacheMapper;
use baton_runtime::model::{KvCache, LayerKv, Model, ModelError};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::Instant;

/// One way of handing the history over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HandoffVariant {
    /// Newest history tokens the target reads itself.
    pub tail: usize,
    /// What the target re-reads of the mapped middle once the question is known.
    pub reread: Option<RereadSetting>,
    /// The target holds the conversation's opening (the system turn) as its own, as the
    /// workbench's handoff does: it is copied from the target's cache, not mapped, and no
    /// plan reads it or spends its budget on it.
    #[serde(default)]
    pub opening: bool,
    /// Layers the target computes itself (see [`super::layers`]).
    #[serde(default)]
    pub layers: Option<LayerSplit>,
}

impl HandoffVariant {
    /// The variant a recall run's own options describe.
    pub fn of(opts: &RecallOptions) -> Self {
        Self {
            tail: opts.tail,
            reread: opts.reread,
            opening: false,
            layers: None,
        }
    }

    /// Parse `map`, `tail=64`, `reread=0.2[:SELECTOR[:SPANS]]`, `opening` (the target
    /// holds the opening), or several joined by commas (`opening,reread=0.1`).
    pub fn parse(s: &str) -> Result<Self, EvalError> {
        let mut v = Self {
            tail: 0,
            reread: None,
            opening: false,
            layers: None,
        };
        let bad = |why: String| {
            EvalError::Input(format!(
                "handoff {s:?}: {why}; give map, tail=N, reread=BUDGET[:SELECTOR[:SPANS]], \
                 opening, upper=LAYER, lower=LAYER, or several joined by commas \
                 (opening,upper=14,reread=…)"
            ))
        };
        if s.trim() == "map" {
            return Ok(v);
        }
        for part in s.split(',') {
            if part.trim() == "opening" {
                v.opening = true;
                continue;
            }
            if let Some((key, value)) = part.trim().split_once('=') {
                if let Some(split) = LayerSplit::parse(key.trim(), value) {
                    v.layers = Some(split.map_err(bad)?);
                    continue;
                }
            }
            match part.trim().split_once('=') {
                Some(("tail", n)) => {
                    v.tail = n
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("tail {n:?} is not a count of tokens")))?;
                }
                Some(("reread", r)) => {
                    let plan = RereadSetting::parse(r).map_err(|e| bad(e.to_string()))?;
                    // A plan that names its layers is the same variant as `upper=` beside
                    // it: the suite runs the layers itself, then the positions.
                    if let Some(split) = plan.and_then(|p| p.layers) {
                        v.layers = Some(split);
                    }
                    v.reread = plan
                        .filter(|p| {
                            let layers_alone = p.layers.is_some()
                                && p.kind == PlanKind::Map
                                && p.budget == RereadBudget::Share(0.0);
                            !layers_alone
                        })
                        .map(|p| p.with_layers(None));
                }
                _ => {
                    return Err(bad(format!(
                        "{part:?} is none of opening, tail=, reread=, upper= and lower="
                    )))
                }
            }
        }
        Ok(v)
    }

    /// How the variant is named in reports: `map`, `tail 64`, `re-read 20%:…`, or
    /// `plan drop:20%:…` for a plan that drops.
    pub fn label(&self) -> String {
        let plan = |r: RereadSetting| match r.kind {
            PlanKind::Map => format!("re-read {r}"),
            _ => format!("plan {r}"),
        };
        let label = match (self.tail, self.reread) {
            (0, None) => "map".into(),
            (t, None) => format!("tail {t}"),
            (0, Some(r)) => plan(r),
            (t, Some(r)) => format!("tail {t}, {}", plan(r)),
        };
        let label = match self.layers {
            Some(split) if label == "map" => split.label(),
            Some(split) => format!("{}, {label}", split.label()),
            None => label,
        };
        if self.opening {
            format!("opening held, {label}")
        } else {
            label
        }
    }
}

/// One variant's handed-over cache of one turn's history, with what it cost.
pub struct Handover {
    pub cache: KvCache,
    /// The anchor, the map and the tail, in milliseconds.
    pub map_ms: f64,
    /// Choosing what to re-read and re-reading it.
    pub reread_ms: f64,
    /// Positions re-read.
    pub reread_positions: usize,
    /// Of the re-read's time, choosing.
    pub select_ms: f64,
}

/// What every variant of one turn reads.
pub struct TurnInputs<'a> {
    pub src: &'a Model,
    pub tgt: &'a Model,
    pub mapper: &'a CacheMapper,
    pub reverse: Option<&'a CacheMapper>,
    /// The source's own cache of the history.
    pub src_cache: &'a KvCache,
    /// The target's re-prefilled cache of the history.
    pub reference: &'a KvCache,
    /// How long the re-prefill took per position, which a time budget is spent at.
    pub ms_per_position: f64,
    /// The history followed by the question.
    pub prompt: &'a [u32],
    pub history: usize,
    pub anchor: usize,
    pub oracle: Option<Oracle>,
    /// The residual maps with the source's residual streams of the history, one per
    /// target layer an `upper=` variant asks for.
    pub upper: &'a [UpperInput],
}

/// Hand the history over as `variant` says: map it (with the anchor and tail), then,
/// with a re-read, choose the spans with the question known and re-read them (the tail
/// with them).
pub fn hand_over(variant: &HandoffVariant, t: &TurnInputs<'_>) -> Result<Handover, EvalError> {
    let history = &t.prompt[..t.history];
    let started = Instant::now();
    let anchor = if variant.opening {
        opening_len(&t.tgt.tokenizer, history).max(t.anchor)
    } else {
        t.anchor
    };
    let plan = HandoffPlan::new(t.history)
        .anchor(anchor)
        .tail(variant.tail);
    // With a re-read or upper layers to follow, the tail is mapped here and read with
    // them, in one pass instead of two.
    let built = match (variant.reread, variant.layers) {
        (None, None | Some(LayerSplit::Lower(_))) => plan.clone(),
        _ => plan.tail_mapped(),
    };
    let inputs = HandoffInputs {
        source: t.src,
        source_cache: t.src_cache,
        target: t.tgt,
        mapper: t.mapper,
        tokens: history,
        exact: Some(t.reference),
    };
    let mut cache = t.tgt.decoder.new_cache();
    let oracle = t.oracle;
    let lower = match variant.layers {
        // The target's own first layers, computed here: part of the handoff's time.
        Some(LayerSplit::Lower(m)) => t.tgt.decoder.leading_layers(history, m)?,
        _ => Vec::new(),
    };
    let mut swap = |layers: &mut [LayerKv], range: Range<usize>| match oracle {
        None => swap_in_lower(&lower, layers, range),
        Some(oracle) => swap_in_own(oracle, t.reference, layers, range),
    };
    built.build_edited(&inputs, &mut cache, Some(&mut swap))?;
    if let Some(LayerSplit::Upper(m)) = variant.layers {
        let input = t
            .upper
            .iter()
            .find(|u| u.map.target_layer == m)
            .ok_or_else(|| EvalError::Input(format!("no residual map to layer {m}")))?;
        compute_upper(t.tgt, input, built.mapped(), &mut cache)?;
        if variant.reread.is_none() {
            // The tail, read over the middle's new upper layers.
            plan.reread_in(t.tgt, history, &mut cache)?;
        }
    }
    let map_ms = started.elapsed().as_secs_f64() * 1e3;
    let Some(setting) = variant.reread else {
        return Ok(Handover {
            cache,
            map_ms,
            reread_ms: 0.0,
            reread_positions: 0,
            select_ms: 0.0,
        });
    };
    let models = RereadModels {
        source: t.src,
        target: t.tgt,
        mapper: t.mapper,
        reverse: t.reverse,
    };
    let done = models.reread(
        &setting,
        RereadTurn {
            plan,
            source_cache: t.src_cache,
            tokens: t.prompt,
            history: t.history,
            ms_per_position: Some(t.ms_per_position),
        },
        &mut cache,
    )?;
    Ok(Handover {
        cache,
        map_ms,
        reread_ms: done.ms,
        reread_positions: done.positions,
        select_ms: done.select_ms,
    })
}

/// The oracle swaps the target's own keys or values (from `own`) in for the mapped
/// ones of `range`.
fn swap_in_own(
    oracle: Oracle,
    own: &KvCache,
    layers: &mut [LayerKv],
    range: Range<usize>,
) -> Result<(), ModelError> {
    for (l, layer) in layers.iter_mut().enumerate() {
        let own = own.layer_range(l, range.start, range.end)?;
        match oracle {
            Oracle::TrueKeys => layer.k = own.k,
            Oracle::TrueValues => layer.v = own.v,
            Oracle::TrueBoth => *layer = own,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_method::handoff::reread::Selector;

    #[test]
    fn variants_parse_and_name_themselves() {
        assert_eq!(HandoffVariant::parse("map").unwrap().label(), "map");
        assert_eq!(HandoffVariant::parse("tail=64").unwrap().label(), "tail 64");
        let v = HandoffVariant::parse("reread=0.1:round-trip").unwrap();
        assert_eq!(v.reread.unwrap().selector, Selector::RoundTrip);
        assert_eq!(v.label(), "re-read 10%:round-trip:word");
        let v = HandoffVariant::parse("tail=32,reread=20%").unwrap();
        assert_eq!(
            (v.tail, v.label().as_str()),
            (32, "tail 32, re-read 20%:facts:word")
        );
        // A plan naming its layers is the variant with `upper=` beside it.
        let v = HandoffVariant::parse("opening,reread=0.2:facts:word:upper=14").unwrap();
        let w = HandoffVariant::parse("opening,upper=14,reread=0.2:facts:word").unwrap();
        assert_eq!(
            (v.layers, v.reread, v.opening),
            (w.layers, w.reread, w.opening)
        );
        let v = HandoffVariant::parse("reread=upper=7").unwrap();
        assert_eq!((v.layers, v.reread), (Some(LayerSplit::Upper(7)), None));
        for bad in ["", "tail=x", "reread=2", "budget=0.2", "reread=0.2:nope"] {
            assert!(HandoffVariant::parse(bad).is_err(), "{bad}");
        }
    }
}
