//! Which positions of the handed-over cache come from where.

use std::ops::Range;

/// The target's cache of a conversation of `len` positions, described once:
///
/// ```text
/// 0 ........ held ........ own_end ............ map_end ............ len
/// | kept as it is | target computes | mapped from the  | target reads    |
/// | (already in   | itself (anchor) | source's cache   | itself (tail)   |
/// |  the cache)   |                 |                  |                 |
/// ```
///
/// Every position before the first mapped one is the target's exact own: the target
/// computed it over exact positions only. Positions the target reads after the mapped
/// middle attend over it, so they are the target's own reading of a mapped context, not
/// its truth.
///
/// Inside the mapped middle the target may re-read chosen spans (see [`super::reread`]):
/// it recomputes them layer by layer over the cache as it stands, once the middle is
/// mapped. It may also drop spans of the middle: they keep their slots (every later
/// position keeps its own RoPE position) but no attention reads them, re-read positions
/// included. So each position of the middle is re-read, left mapped or dropped, and
/// each position before it is kept as the target computed it. The anchor is the re-read of a prefix (over exact positions only, so exact),
/// and the tail the re-read of a suffix; they stay separate parts because the target
/// computes them without mapping them first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffPlan {
    len: usize,
    held: usize,
    anchor: usize,
    read_from: usize,
    reread: Vec<Range<usize>>,
    dropped: Vec<Range<usize>>,
}

impl HandoffPlan {
    /// Map all `len` positions: no anchor, no tail, nothing held.
    pub fn new(len: usize) -> Self {
        Self {
            len,
            held: 0,
            anchor: 0,
            read_from: len,
            reread: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// The target computes the first `anchor` positions itself (the attention sink, the
    /// template's opening): at most `len`.
    pub fn anchor(mut self, anchor: usize) -> Self {
        self.anchor = anchor.min(self.len);
        self
    }

    /// The target reads the newest `tail` positions itself, on top of what is mapped.
    pub fn tail(mut self, tail: usize) -> Self {
        self.read_from = self.read_from.min(self.len - tail.min(self.len));
        self
    }

    /// The target reads everything from position `from` on itself (a question it is
    /// given to read, say), on top of any tail.
    pub fn read_from(mut self, from: usize) -> Self {
        self.read_from = self.read_from.min(from);
        self
    }

    /// The target reads all of it: a re-prefill, past what it holds.
    pub fn reprefill(len: usize) -> Self {
        Self::new(len).tail(len)
    }

    /// The target's cache already holds its first `held` positions and keeps them as
    /// they are: its own positions, or an earlier handoff of the same tokens.
    pub fn holding(mut self, held: usize) -> Self {
        self.held = held.min(self.len);
        self
    }

    /// The target re-reads these spans of the mapped middle (increasing and disjoint)
    /// once it is mapped; parts of them outside the middle are dropped.
    pub fn rereading(mut self, runs: Vec<Range<usize>>) -> Self {
        self.reread = runs;
        self
    }

    /// The target drops these spans of the mapped middle (increasing and disjoint); a
    /// position also re-read is re-read, not dropped, and parts outside the middle are
    /// ignored.
    pub fn dropping(mut self, runs: Vec<Range<usize>>) -> Self {
        self.dropped = runs;
        self
    }

    /// The spans dropped: inside the mapped middle and outside every re-read span.
    pub fn dropped(&self) -> Vec<Range<usize>> {
        let m = self.mapped();
        let mut set = baton_runtime::model::position_set::PositionSet::of(
            self.dropped
                .iter()
                .map(|r| r.start.max(m.start)..r.end.min(m.end))
                .filter(|r| !r.is_empty()),
        );
        for r in self.reread() {
            set.remove(r);
        }
        set.runs().to_vec()
    }

    /// Positions dropped.
    pub fn dropped_count(&self) -> usize {
        self.dropped().iter().map(|r| r.len()).sum()
    }

    /// The same plan with its tail (and anything else it reads after the middle) mapped
    /// instead: a re-read chosen later reads it in the same pass as the chosen spans
    /// ([`HandoffPlan::reread_in`] re-reads what the plan reads after the middle), so the
    /// tail is read once, over the re-read middle.
    pub fn tail_mapped(&self) -> Self {
        Self {
            read_from: self.len,
            ..self.clone()
        }
    }

    /// The spans re-read inside the mapped middle.
    pub fn reread(&self) -> Vec<Range<usize>> {
        let m = self.mapped();
        self.reread
            .iter()
            .map(|r| r.start.max(m.start)..r.end.min(m.end))
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// Positions re-read inside the mapped middle.
    pub fn reread_count(&self) -> usize {
        self.reread().iter().map(|r| r.len()).sum()
    }

    /// Positions in all.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions kept from the cache as it was.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Where the tail the target reads itself starts, whether or not it holds some of it.
    pub fn tail_start(&self) -> usize {
        self.read_from
    }

    /// Leading positions the target computes itself before the map (past those held).
    pub fn own(&self) -> Range<usize> {
        self.held..self.held.max(self.anchor)
    }

    /// Positions mapped from the source's cache (empty when the target reads them all).
    pub fn mapped(&self) -> Range<usize> {
        let start = self.own().end;
        start..self.read_from.max(start)
    }

    /// Positions the target reads itself after the mapped middle.
    pub fn read(&self) -> Range<usize> {
        self.mapped().end..self.len
    }

    /// Positions that are the target's exact own: everything before the first mapped
    /// position, or everything when nothing is mapped.
    pub fn exact_end(&self) -> usize {
        let m = self.mapped();
        if m.is_empty() {
            self.len
        } else {
            m.start
        }
    }

    /// Whether the whole cache is mapped: nothing held, no anchor, no tail, nothing
    /// re-read or dropped.
    pub fn maps_everything(&self) -> bool {
        self.mapped() == (0..self.len) && self.reread().is_empty() && self.dropped().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_cover_every_position_once_in_order() {
        for len in 0..12 {
            for held in 0..14 {
                for anchor in 0..14 {
                    for tail in 0..14 {
                        let p = HandoffPlan::new(len)
                            .anchor(anchor)
                            .tail(tail)
                            .holding(held);
                        let (o, m, r) = (p.own(), p.mapped(), p.read());
                        assert_eq!(o.start, p.held().min(len));
                        assert_eq!(o.end, m.start);
                        assert_eq!(m.end, r.start);
                        assert_eq!(r.end, len);
                        assert!(o.start <= o.end && m.start <= m.end && r.start <= r.end);
                    }
                }
            }
        }
    }

    #[test]
    fn the_anchor_and_the_tail_take_precedence_over_the_map() {
        let p = HandoffPlan::new(100).anchor(1).tail(30);
        assert_eq!((p.own(), p.mapped(), p.read()), (0..1, 1..70, 70..100));
        assert_eq!(p.exact_end(), 1);
        // An anchor past the tail's start: the target computes the anchor, reads the rest.
        let p = HandoffPlan::new(10).anchor(8).tail(5);
        assert_eq!((p.own(), p.mapped(), p.read()), (0..8, 8..8, 8..10));
        assert_eq!(p.exact_end(), 10);
        // Held positions count as computed: the map starts after them.
        let p = HandoffPlan::new(50).anchor(1).holding(20);
        assert_eq!((p.own(), p.mapped(), p.read()), (20..20, 20..50, 50..50));
    }

    #[test]
    fn a_question_read_by_the_target_and_a_tail_take_the_earlier_start() {
        let p = HandoffPlan::new(100).tail(10).read_from(60);
        assert_eq!(p.read(), 60..100);
        let p = HandoffPlan::new(100).tail(50).read_from(60);
        assert_eq!(p.read(), 50..100);
    }

    #[test]
    fn reread_spans_are_kept_inside_the_mapped_middle() {
        let p = HandoffPlan::new(100)
            .anchor(4)
            .tail(10)
            .rereading(vec![0..6, 20..30, 85..95]);
        assert_eq!(p.reread(), vec![4..6, 20..30, 85..90]);
        assert_eq!(p.reread_count(), 17);
        assert!(!HandoffPlan::new(10).rereading(vec![2..3]).maps_everything());
        // A re-prefill maps nothing, so it re-reads nothing of a middle either.
        assert!(HandoffPlan::reprefill(10)
            .rereading(vec![2..3])
            .reread()
            .is_empty());
    }

    #[test]
    fn dropped_spans_stay_inside_the_middle_and_give_way_to_re_read_ones() {
        let p = HandoffPlan::new(100)
            .anchor(4)
            .tail(10)
            .rereading(vec![20..30])
            .dropping(vec![0..8, 25..40, 80..95]);
        assert_eq!(p.dropped(), vec![4..8, 30..40, 80..90]);
        assert_eq!(p.dropped_count(), 24);
        assert!(!HandoffPlan::new(10).dropping(vec![3..4]).maps_everything());
        assert!(HandoffPlan::new(10).dropping(vec![]).maps_everything());
    }

    #[test]
    fn a_reprefill_maps_nothing_and_is_exact_throughout() {
        let p = HandoffPlan::reprefill(40).holding(12);
        assert!(p.mapped().is_empty());
        assert_eq!(p.read(), 12..40);
        assert_eq!(p.exact_end(), 40);
        assert!(HandoffPlan::new(40).maps_everything());
        assert!(!HandoffPlan::new(40).anchor(1).maps_everything());
    }
}
