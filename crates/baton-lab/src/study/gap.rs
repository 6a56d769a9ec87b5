//! The gap recovered: how much of the distance between the first model answering alone
//! and the re-prefilled target a handoff's mapped answers close,
//! (F1 mapped − F1 source alone) / (F1 re-prefilled − F1 source alone), with the source
//! alone taken from the study's `switch = false` variant on the same conversation.

use super::file::Direction;
use super::items::{same_conversation, ReadItem, RESAMPLES, SEED};
use baton_method::metrics::interval::{cluster_bootstrap, Estimate};

/// The share of the gap between the source alone (`stay`'s answers) and the re-prefilled
/// target that `variant`'s mapped answers close, on the turns scored on all three of the
/// same conversation, resampling conversations.
pub(super) fn gap_recovered(
    read: &[ReadItem<'_>],
    variant: &str,
    direction: Direction,
    stay: &str,
) -> Option<Estimate> {
    let mut rows: Vec<[f64; 3]> = Vec::new();
    let mut cluster: Vec<usize> = Vec::new();
    for (k, (item, turns)) in read
        .iter()
        .enumerate()
        .filter(|(_, (i, _))| i.variant == variant && i.direction == direction)
    {
        let Some((_, alone)) = same_conversation(read, item, stay) else {
            continue;
        };
        for (turn, row) in turns {
            if let (Some(mapped), Some(reference), Some(source)) =
                (row.f1, row.reference_f1, alone.get(turn).and_then(|r| r.f1))
            {
                rows.push([source, reference, mapped]);
                cluster.push(k);
            }
        }
    }
    (!rows.is_empty()).then(|| {
        cluster_bootstrap(
            &rows,
            &cluster,
            |m| (m[1] - m[0] > 1e-9).then(|| (m[2] - m[0]) / (m[1] - m[0])),
            RESAMPLES,
            SEED,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::items::ItemTurn;
    use crate::study::plan::WorkItem;
    use std::collections::BTreeMap;

    fn item(script: &str, variant: &str) -> WorkItem {
        WorkItem {
            id: format!("{script}.{variant}"),
            script: script.into(),
            script_sha256: String::new(),
            models: ["a".into(), "b".into()],
            direction: Direction::SourceToTarget,
            variant: variant.into(),
            repeat: 1,
            expected: BTreeMap::new(),
        }
    }

    fn turn(f1: f64, reference: Option<f64>) -> BTreeMap<u32, ItemTurn> {
        let mut t = BTreeMap::new();
        t.insert(
            2,
            ItemTurn {
                f1: Some(f1),
                reference_f1: reference,
                ..ItemTurn::default()
            },
        );
        t
    }

    #[test]
    fn the_gap_is_measured_from_the_source_alone_on_the_same_conversation() {
        let items = [
            item("one", "map"),
            item("two", "map"),
            item("one", "alone"),
            item("two", "alone"),
        ];
        // Source alone 0.2, re-prefilled 1.0, mapped 0.4: a quarter of the gap closed.
        // Conversation two's mapped answer matches its re-prefilled one: all of it.
        let read: Vec<ReadItem<'_>> = vec![
            (&items[0], turn(0.4, Some(1.0))),
            (&items[1], turn(0.6, Some(0.6))),
            (&items[2], turn(0.2, None)),
            (&items[3], turn(0.0, None)),
        ];
        let g = gap_recovered(&read, "map", Direction::SourceToTarget, "alone").unwrap();
        // Means over both: source 0.1, re-prefilled 0.8, mapped 0.5: (0.5-0.1)/(0.8-0.1).
        assert!((g.value - 0.4 / 0.7).abs() < 1e-12, "{}", g.value);
        assert!(g.ci95[0] <= g.value && g.value <= g.ci95[1]);
        // No source-alone run of the conversations: nothing to measure from.
        assert!(gap_recovered(&read[..2], "map", Direction::SourceToTarget, "alone").is_none());
    }

    #[test]
    fn no_gap_between_source_and_target_leaves_it_undefined() {
        let items = [item("one", "map"), item("one", "alone")];
        let read: Vec<ReadItem<'_>> = vec![
            (&items[0], turn(0.5, Some(0.5))),
            (&items[1], turn(0.5, None)),
        ];
        let g = gap_recovered(&read, "map", Direction::SourceToTarget, "alone").unwrap();
        assert!(g.value.is_nan());
    }
}
