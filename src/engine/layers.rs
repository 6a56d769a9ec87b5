//! The plan's layers in the engine: each model keeps its residual stream at the layer a
//! plan's `upper=M` needs while it reads, the residual map of each direction is loaded
//! from the mapper directory (or fitted on the calibration text and kept there the
//! first time a plan asks for it), and at the message the target computes the layers
//! the plan names before it re-reads (see [`crate::handoff::layers`]).

use super::core::Engine;
use super::EngineError;
use crate::calibrate::residual::{kept_or_fitted, ResidualFit};
use crate::handoff::layers::{self, LayerSplit};
use crate::mapper::residual::{matching_layer, ResidualMap};
use crate::model::position_set::PositionSet;
use crate::protocol::Event;
use std::time::Instant;

/// What a plan's layers did: over how many positions, in how long.
pub(super) struct LayersRun {
    pub(super) positions: usize,
    pub(super) ms: f64,
}

impl Engine {
    /// Make both models ready for the plan's layers: keep the residual stream its
    /// `upper=M` needs on each side the plan runs from, with the residual map of that
    /// direction; keep nothing where no plan needs it. Said as notices; a map that cannot
    /// be had leaves the plan's layers undone at the switch (which says why).
    pub(super) fn prepare_layers(&mut self) {
        for a in 0..2 {
            let b = 1 - a;
            let (ca, cb) = (self.slots[a].model.config(), self.slots[b].model.config());
            let want = self.settings.reread.and_then(|r| match r.layers {
                Some(LayerSplit::Upper(m)) if r.applies(ca, cb) => Some(m),
                _ => None,
            });
            let Some(m) = want else {
                self.slots[a].primary.stop_keeping_residual();
                self.residual[a] = None;
                continue;
            };
            if let Err(e) = LayerSplit::Upper(m).check(cb.n_layer) {
                self.out.emit(Event::Notice {
                    message: format!("{} -> {}: {e}", self.slots[a].name(), self.slots[b].name()),
                });
                self.slots[a].primary.stop_keeping_residual();
                self.residual[a] = None;
                continue;
            }
            let source_layer = matching_layer(m, cb.n_layer, ca.n_layer);
            let hidden = ca.hidden;
            self.slots[a].primary.keep_residual(source_layer, hidden);
            if self.residual[a].as_ref().map(|r| r.target_layer) == Some(m) {
                continue;
            }
            self.residual[a] = match self.residual_map(a, m) {
                Ok(map) => Some(map),
                Err(e) => {
                    // Nothing to read it with: nothing kept.
                    self.slots[a].primary.stop_keeping_residual();
                    self.out.emit(Event::Notice {
                        message: format!(
                            "no residual map {} -> {} layer {m}, so a plan's upper layers \
                             are not computed: {e}",
                            self.slots[a].name(),
                            self.slots[b].name()
                        ),
                    });
                    None
                }
            };
        }
    }

    /// The residual map from slot `a`'s model to the other's layer `m`: kept in the
    /// mapper directory, or fitted now on the calibration text and kept there.
    fn residual_map(&mut self, a: usize, m: usize) -> Result<ResidualMap, EngineError> {
        let b = 1 - a;
        let said = std::cell::RefCell::new(Vec::new());
        let found = kept_or_fitted(
            &self.slots[a].model,
            &self.slots[b].model,
            self.mapper_dir.as_ref(),
            &[m],
            &ResidualFit::default(),
            &|message| said.borrow_mut().push(message.to_string()),
        );
        for message in said.into_inner() {
            self.out.emit(Event::Notice { message });
        }
        found
            .map_err(|e| EngineError::Internal(format!("the residual map: {e}")))?
            .pop()
            .ok_or_else(|| EngineError::Internal("the residual fit returned no map".into()))
    }

    /// Run the layers `split` names over `candidates` of the active model's cache (minus
    /// `dropped`), from what slot `source` kept; `None` where nothing ran.
    pub(super) fn run_layers(
        &mut self,
        split: LayerSplit,
        source: usize,
        candidates: &PositionSet,
        dropped: &[std::ops::Range<usize>],
        history: usize,
    ) -> Result<LayersRun, EngineError> {
        let a = self.active;
        let over = layers::positions(split, candidates, dropped, &self.slots[source].primary);
        let started = Instant::now();
        let map = self.residual[source].as_ref();
        if matches!(split, LayerSplit::Upper(_)) && map.is_none() && !over.is_empty() {
            return Err(EngineError::Internal(format!(
                "{}: no residual map for this direction",
                split.label()
            )));
        }
        if source == a {
            return Err(EngineError::Internal(
                "a plan's layers read the other model's residual stream".into(),
            ));
        }
        let (x, y) = self.slots.split_at_mut(1);
        let (target, src) = if a == 0 {
            (&mut x[0], &y[0])
        } else {
            (&mut y[0], &x[0])
        };
        layers::apply(
            split,
            &target.model,
            map,
            &src.primary,
            &self.conv.history[..history],
            &over,
            &mut target.primary,
        )?;
        Ok(LayersRun {
            positions: over.count(),
            ms: super::timing::synced_ms(target.model.decoder.device(), started),
        })
    }
}
