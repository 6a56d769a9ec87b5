//! How far the background repair of the cache had got when each answer started: an
//! answer over a cache being repaired depends on it, so a replay that answers over a
//! cache repaired to another point can differ for that reason alone, and says so.

use super::Session;
use crate::protocol::{Event, PathKind};
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

/// A line for every turn whose answer started over a cache repaired to another point in
/// the replay than in the recording.
pub(super) fn compare(recorded: &Session, replayed: &Session) -> Vec<String> {
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
    use crate::protocol::CacheOrigin;
    use crate::session::fixtures;

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
