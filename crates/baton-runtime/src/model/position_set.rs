//! A set of cache positions as increasing, disjoint, non-adjacent ranges: the positions a
//! cache holds a slot for but attention must not see (dropped at a handoff).

use std::ops::Range;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PositionSet {
    runs: Vec<Range<usize>>,
}

impl PositionSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// The set of the positions of `runs`, in any order, overlapping or not.
    pub fn of(runs: impl IntoIterator<Item = Range<usize>>) -> Self {
        let mut s = Self::new();
        for r in runs {
            s.insert(r);
        }
        s
    }

    /// The runs, increasing, disjoint and never touching.
    pub fn runs(&self) -> &[Range<usize>] {
        &self.runs
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Positions in the set.
    pub fn count(&self) -> usize {
        self.runs.iter().map(|r| r.len()).sum()
    }

    /// Positions in the set before `end`.
    pub fn count_before(&self, end: usize) -> usize {
        self.runs
            .iter()
            .map(|r| r.end.min(end).saturating_sub(r.start))
            .sum()
    }

    /// The smallest range holding every position of the set (empty when it is empty).
    pub fn span(&self) -> Range<usize> {
        match (self.runs.first(), self.runs.last()) {
            (Some(a), Some(b)) => a.start..b.end,
            _ => 0..0,
        }
    }

    pub fn contains(&self, p: usize) -> bool {
        self.runs.iter().any(|r| r.contains(&p))
    }

    /// Add every position of `r`.
    pub fn insert(&mut self, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        let mut out = Vec::with_capacity(self.runs.len() + 1);
        let mut placed = false;
        for x in self.runs.drain(..) {
            if x.end < start {
                out.push(x);
            } else if x.start > end {
                if !placed {
                    out.push(start..end);
                    placed = true;
                }
                out.push(x);
            } else {
                start = start.min(x.start);
                end = end.max(x.end);
            }
        }
        if !placed {
            out.push(start..end);
        }
        self.runs = out;
    }

    /// Take every position of `r` out.
    pub fn remove(&mut self, r: Range<usize>) {
        if r.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.runs.len() + 1);
        for x in self.runs.drain(..) {
            if x.end <= r.start || x.start >= r.end {
                out.push(x);
                continue;
            }
            if x.start < r.start {
                out.push(x.start..r.start);
            }
            if x.end > r.end {
                out.push(r.end..x.end);
            }
        }
        self.runs = out;
    }

    /// Forget every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.remove(len..usize::MAX);
    }

    /// The positions of the set inside `within`, moved by `to - within.start`: what a
    /// copy of `within` placed at `to` holds.
    pub fn moved(&self, within: Range<usize>, to: usize) -> Self {
        let runs = self
            .runs
            .iter()
            .map(|r| r.start.max(within.start)..r.end.min(within.end))
            .filter(|r| !r.is_empty())
            .map(|r| r.start - within.start + to..r.end - within.start + to)
            .collect();
        Self { runs }
    }

    /// The runs of `within` that are not in the set, in order.
    pub fn gaps(&self, within: Range<usize>) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut at = within.start;
        for r in &self.runs {
            if r.end <= at {
                continue;
            }
            if r.start >= within.end {
                break;
            }
            if r.start > at {
                out.push(at..r.start);
            }
            at = r.end;
        }
        if at < within.end {
            out.push(at..within.end);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(s: &PositionSet, n: usize) -> Vec<bool> {
        (0..n).map(|p| s.contains(p)).collect()
    }

    #[test]
    fn counts_before_a_position_and_spans_the_set() {
        let s = PositionSet::of([2..5, 8..10]);
        assert_eq!(s.count_before(0), 0);
        assert_eq!(s.count_before(4), 2);
        assert_eq!(s.count_before(9), 4);
        assert_eq!(s.count_before(100), 5);
        assert_eq!(s.span(), 2..10);
        assert_eq!(PositionSet::new().span(), 0..0);
    }

    #[test]
    fn inserts_and_removes_agree_with_a_plain_bitmap() {
        // A fixed pseudo-random walk of inserts and removes against a Vec<bool>.
        let n = 40;
        let mut s = PositionSet::new();
        let mut want = vec![false; n];
        let mut x = 12345u32;
        for step in 0..400 {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            let a = (x >> 8) as usize % n;
            let b = (a + ((x >> 20) as usize % 9)).min(n);
            if step % 3 == 0 {
                s.remove(a..b);
                want[a..b].fill(false);
            } else {
                s.insert(a..b);
                want[a..b].fill(true);
            }
            assert_eq!(members(&s, n), want, "step {step}");
            assert_eq!(s.count(), want.iter().filter(|&&w| w).count());
            for w in s.runs().windows(2) {
                assert!(w[0].end < w[1].start, "runs touch: {:?}", s.runs());
            }
            assert!(s.runs().iter().all(|r| !r.is_empty()));
        }
    }

    #[test]
    fn gaps_moves_counts_and_truncation() {
        let s = PositionSet::of([8..10, 2..4, 3..5]);
        assert_eq!(s.runs(), &[2..5, 8..10]);
        assert_eq!(s.gaps(0..12), vec![0..2, 5..8, 10..12]);
        assert_eq!(s.gaps(3..9), vec![5..8]);
        assert_eq!(s.gaps(2..5), Vec::<Range<usize>>::new());
        assert_eq!(s.moved(4..9, 20).runs(), &[20..21, 24..25]);
        let mut t = s.clone();
        t.truncate(9);
        assert_eq!(t.runs(), &[2..5, 8..9]);
        t.truncate(0);
        assert!(t.is_empty());
    }
}
