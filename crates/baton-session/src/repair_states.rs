//! How far the background repair of the cache had got when each answer started: an
//! answer over a cache being repaired depends on it, so a replay that answers over a
//! cache repaired to another point can differ for that reason alone, and says so.

use super::Session;
use baton_protocol::{Event, PathKind};
use std::collections::BTreeMap;

/// Each shown answer's turn and how many first positions of its cache were repaired,
/// for the answers that started while a repair was underway.
fn repaired_by_turn(s: &Session) -> BTreeMap<u32, usize> {
    s.events()
        .filter_map(|e| match e {
            Event::TurnStarted {
                turn,
                path: PathKind::Mapped,
                repaired: Some(r),
                ..
            } => Some((*turn, *r)),
            _ => None,
        })
        .collect()
}

/// The minor version of the session format that added `repaired` to `turn_started`.
/// A file of an earlier minor says nothing about repairs, which is not the same as
/// saying none was underway.
const REPAIRED_SINCE_MINOR: u32 = 5;

/// A line for every turn whose answer started over a cache repaired to another point in
/// the replay than in the recording. Nothing when either file predates the field.
pub(super) fn compare(recorded: &Session, replayed: &Session) -> Vec<String> {
    if recorded.header.minor.min(replayed.header.minor) < REPAIRED_SINCE_MINOR {
        return Vec::new();
    }
    let (a, b) = (repaired_by_turn(recorded), repaired_by_turn(replayed));
    let turns: std::collections::BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
    let said = |r: Option<&usize>| match r {
        Some(n) => format!("{n} repaired positions"),
        None => "no repair underway".to_string(),
    };
    turns
        .into_iter()
        .filter(|t| a.get(t) != b.get(t))
        .map(|t| {
            format!(
                "turn {t}: the recording answered over a cache with {}, the replay with {}; \
                 the answers can differ for that alone",
                said(a.get(&t)),
                said(b.get(&t))
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use baton_protocol::CacheOrigin;

    fn with_repaired(mut s: Session, turn: u32, to: Option<usize>) -> Session {
        for r in s.events.iter_mut() {
            if let Event::TurnStarted {
                turn: t,
                path: PathKind::Mapped,
                cache,
                repaired,
                ..
            } = &mut r.event
            {
                if *t == turn {
                    *cache = CacheOrigin::Mapped;
                    *repaired = to;
                }
            }
        }
        s
    }

    #[test]
    fn answers_over_caches_repaired_to_other_points_are_named() {
        let s = fixtures::session();
        let turn = repaired_turn(&s);
        let a = with_repaired(s.clone(), turn, Some(256));
        assert!(compare(&a, &a.clone()).is_empty());
        let b = with_repaired(s.clone(), turn, Some(384));
        let lines = compare(&a, &b);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains(&format!("turn {turn}"))
                && lines[0].contains("256 repaired")
                && lines[0].contains("384 repaired"),
            "{lines:?}"
        );
        let c = with_repaired(s, turn, None);
        assert!(compare(&a, &c)[0].contains("no repair underway"));
    }

    #[test]
    fn a_recording_from_before_the_field_existed_reports_no_repair_difference() {
        let s = fixtures::session();
        let turn = repaired_turn(&s);
        let mut old = with_repaired(s.clone(), turn, None);
        old.header.minor = REPAIRED_SINCE_MINOR - 1;
        let replayed = with_repaired(s, turn, Some(256));
        assert!(compare(&old, &replayed).is_empty());
        // The same pair read as the current minor is a real difference.
        old.header.minor = REPAIRED_SINCE_MINOR;
        assert_eq!(compare(&old, &replayed).len(), 1);
    }

    /// A turn of the fixture answered on the mapped path.
    fn repaired_turn(s: &Session) -> u32 {
        s.events()
            .find_map(|e| match e {
                Event::TurnStarted {
                    turn,
                    path: PathKind::Mapped,
                    ..
                } => Some(*turn),
                _ => None,
            })
            .expect("the fixture answers on the mapped path")
    }
}
