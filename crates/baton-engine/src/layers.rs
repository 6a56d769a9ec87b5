//! The plan's layers in the engine: each model keeps its residual stream at the layer a
//! plan's `upper=M` needs while it reads, the residual map of each direction is loaded
//! from the mapper directory (or fitted on the calibration text and kept there the
//! first time a plan asks for it), and at the message the target computes the layers
//! the plan names before it re-reads (see [`baton_method::handoff::layers`]).

use super::core::Engine;
use super::slot::split as split_slots;
use super::EngineError;
use baton_method::calibrate::residual::{kept_or_fitted, ResidualFit};
use baton_method::handoff::layers::{self, LayerSplit};
use baton_method::mapper::residual::ResidualMap;
use baton_protocol::Event;
use baton_runtime::model::position_set::PositionSet;
use std::time::Instant;

/// What a plan's layers did: over how many positions, in how long.
pub(super) struct LayersRun {
    pub(super) positions: usize,
    pub(super) ms: f64,
}

impl Engine {
    /// Make both models ready for the plan's layers: keep the residual stream its
    /// `upper=M` needs on each side the plan runs from, with the residual map of that
    /// direction; keep nothing where no plan needs it or no map can be had (said as a
    /// notice: the plan's layers then run over no position).
    pub(super) fn prepare_layers(&mut self) {
        for a in 0..2 {
            let map = self.wanted_layer(a).and_then(|m| self.residual_map(a, m));
            let slot = &mut self.slots[a];
            match &map {
                // The map names the source layer it reads.
                Some(map) => slot
                    .primary
                    .keep_residual(map.source_layer, slot.model.config().hidden),
                None => slot.primary.stop_keeping_residual(),
            }
            self.residual[a] = map;
        }
    }

    /// The target layer whose residual stream the plan's `upper=M` needs from slot `a`,
    /// if it runs from there; a layer the other model lacks is said and needs none.
    fn wanted_layer(&mut self, a: usize) -> Option<usize> {
        let b = 1 - a;
        let (ca, cb) = (self.slots[a].model.config(), self.slots[b].model.config());
        let m = self.settings.reread.and_then(|r| match r.layers {
            Some(LayerSplit::Upper(m)) if baton_method::handoff::reread::applies(&r, ca, cb) => {
                Some(m)
            }
            _ => None,
        })?;
        if let Err(e) = LayerSplit::Upper(m).check(cb.n_layer) {
            let names = (self.slots[a].name(), self.slots[b].name());
            self.out.emit(Event::Notice {
                message: format!("{} -> {}: {e}", names.0, names.1),
            });
            return None;
        }
        Some(m)
    }

    /// The residual map from slot `a`'s model to the other's layer `m`: the one held if
    /// it is that one, else kept in the mapper directory, or fitted now on the
    /// calibration text and kept there; `None`, said, when none can be had.
    fn residual_map(&mut self, a: usize, m: usize) -> Option<ResidualMap> {
        if let Some(held) = self.residual[a].take().filter(|r| r.target_layer == m) {
            return Some(held);
        }
        let b = 1 - a;
        let out = &mut self.out;
        let found = kept_or_fitted(
            &self.slots[a].model,
            &self.slots[b].model,
            self.mapper_dir.as_ref(),
            &[m],
            &ResidualFit::default(),
            &mut |message| {
                out.emit(Event::Notice {
                    message: message.to_string(),
                })
            },
        );
        match found.map(|mut maps| maps.pop()) {
            Ok(Some(map)) => Some(map),
            Ok(None) => None,
            Err(e) => {
                let names = (self.slots[a].name(), self.slots[b].name());
                self.out.emit(Event::Notice {
                    message: format!(
                        "no residual map {} -> {} layer {m}, so a plan's upper layers are \
                         not computed: {e}",
                        names.0, names.1
                    ),
                });
                None
            }
        }
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
        if source == a {
            return Err(EngineError::Internal(
                "a plan's layers read the other model's residual stream".into(),
            ));
        }
        let over = layers::positions(split, candidates, dropped, &self.slots[source].primary);
        let started = Instant::now();
        let (src, target) = split_slots(&mut self.slots, source);
        layers::apply(
            split,
            &target.model,
            self.residual[source].as_ref(),
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
