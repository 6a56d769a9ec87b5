//! A study item's session read back per turn: what the report and the gap recovered are
//! computed from, and the resampling both use.

use super::plan::WorkItem;
use super::StudyError;
use baton_method::metrics::answers::{best_exact_match, best_f1};
use baton_protocol::{Event, PathKind};
use baton_session::{read_session, Report};
use std::collections::BTreeMap;
use std::path::Path;

/// Resamples of whole conversations behind every interval, seeded so a report is
/// reproducible.
pub(super) const RESAMPLES: usize = 2000;
pub(super) const SEED: u64 = 7;

/// An item with what its session says, per turn.
pub(super) type ReadItem<'a> = (&'a WorkItem, BTreeMap<u32, ItemTurn>);

/// What one item's session says, per turn.
#[derive(Debug, Clone, Default)]
pub(super) struct ItemTurn {
    pub(super) f1: Option<f64>,
    pub(super) exact: Option<f64>,
    pub(super) reference_f1: Option<f64>,
    pub(super) identical: Option<f64>,
    pub(super) agreement: Option<f64>,
    pub(super) cosine: Option<f64>,
    pub(super) next_token: Option<f64>,
    pub(super) mapped_text: Option<String>,
}

pub(super) fn item_turns(
    item: &WorkItem,
    path: &Path,
) -> Result<BTreeMap<u32, ItemTurn>, StudyError> {
    let session = read_session(path).map_err(|e| StudyError::Item(e.to_string()))?;
    let mut out: BTreeMap<u32, ItemTurn> = BTreeMap::new();
    for e in session.events() {
        if let Event::Generation {
            turn, path, text, ..
        } = e
        {
            let row = out.entry(*turn).or_default();
            let expected = item.expected.get(turn);
            match path {
                PathKind::Mapped => {
                    row.f1 = expected.map(|x| best_f1(text, x));
                    row.exact = expected.map(|x| best_exact_match(text, x));
                    row.mapped_text = Some(text.clone());
                }
                PathKind::Reference => row.reference_f1 = expected.map(|x| best_f1(text, x)),
            }
        }
    }
    let report = Report::from_session(&session);
    for t in report.turns {
        let row = out.entry(t.turn).or_default();
        row.identical = t.identical.map(|i| f64::from(u8::from(i)));
        row.agreement = t.agreement;
    }
    for sw in report.switches {
        let row = out.entry(sw.turn).or_default();
        row.cosine = sw.cosine_mean().filter(|c| c.is_finite());
        row.next_token = sw.top1_agreement().filter(|c| c.is_finite());
    }
    Ok(out)
}

/// The item of `variant` that ran the same conversation as `item`: the same script,
/// models in the same order and repeat.
pub(super) fn same_conversation<'r, 'a>(
    read: &'r [ReadItem<'a>],
    item: &WorkItem,
    variant: &str,
) -> Option<&'r ReadItem<'a>> {
    read.iter().find(|(i, _)| {
        i.variant == variant
            && i.script == item.script
            && i.models == item.models
            && i.repeat == item.repeat
    })
}
