//! Dropped positions, on two tiny models generated here with their mappers calibrated
//! between them: a dropped position keeps its slot but nothing attends to it, through a
//! re-read, a prefill past it and a plan's build; re-reading every dropped position gives
//! the prefill back, and dropping nothing changes nothing.

// Spans are ranges: a list of one span is a list of one range.
#![allow(clippy::single_range_in_vec_init)]

mod common;

use baton::handoff::HandoffPlan;
use baton::model::{ForwardOptions, KvCache, LayerKv, Model};
use candle_core::Tensor;
use common::handoff_pair::Pair;
use std::ops::Range;

/// What the drop tests build on the shared pair: caches whose slots past an anchor
/// hold chosen layers.
trait Fills {
    fn cache_with(&self, anchor: usize, fill: &[LayerKv]) -> KvCache;
    fn fills(&self, start: usize) -> Vec<(&'static str, Vec<LayerKv>)>;
}

impl Fills for Pair {
    /// The target's exact first `anchor` positions, then `fill`'s layers for the rest.
    fn cache_with(&self, anchor: usize, fill: &[LayerKv]) -> KvCache {
        let mut c = self.truth.try_clone_prefix(anchor).unwrap();
        c.extend_with(fill).unwrap();
        c
    }

    /// Positions `start..` of every layer: mapped, zero or the target's own.
    fn fills(&self, start: usize) -> Vec<(&'static str, Vec<LayerKv>)> {
        let n = self.ids.len();
        let mapped = self
            .mapper
            .map_range(
                &self.src_cache,
                &self.ids,
                self.a.decoder.rope(),
                self.b.decoder.rope(),
                start,
                n,
            )
            .unwrap();
        let own: Vec<LayerKv> = (0..self.truth.shape().n_layer)
            .map(|l| self.truth.layer_range(l, start, n).unwrap())
            .collect();
        let zeros = own
            .iter()
            .map(|kv| LayerKv {
                k: kv.k.zeros_like().unwrap(),
                v: (kv.v.ones_like().unwrap() * 1e4).unwrap(),
            })
            .collect();
        vec![
            ("mapped", mapped),
            ("zero keys, huge values", zeros),
            ("own", own),
        ]
    }
}

/// Largest absolute difference between positions `range` of two caches, over all layers.
fn max_diff(a: &KvCache, b: &KvCache, range: Range<usize>) -> f32 {
    let mut worst = 0f32;
    for l in 0..a.shape().n_layer {
        let (x, y) = (
            a.layer_range(l, range.start, range.end).unwrap(),
            b.layer_range(l, range.start, range.end).unwrap(),
        );
        for (p, q) in [(&x.k, &y.k), (&x.v, &y.v)] {
            let d = (p - q).unwrap().abs().unwrap().flatten_all().unwrap();
            worst = worst.max(d.max(0).unwrap().to_scalar::<f32>().unwrap());
        }
    }
    worst
}

fn logits_after(m: &Model, cache: &KvCache, ids: &[u32]) -> Tensor {
    let mut c = cache.try_clone().unwrap();
    m.decoder.next_logits(ids, &mut c).unwrap()
}

fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn a_cache_whose_dropped_positions_are_all_re_read_is_the_targets_prefill() {
    let pair = Pair::new(60, 11);
    let n = pair.ids.len();
    assert!(n > 40, "the text gives {n} tokens");
    // A prefill and a re-read of the same rows block their products alike only up to
    // rounding, so the tolerance of the prefill's own chunking.
    const CHUNKING: f32 = 1e-4;
    for (what, fill) in pair.fills(1) {
        // Everything past the sink dropped, then all of it re-read.
        let mut c = pair.cache_with(1, &fill);
        c.drop_positions(1..n).unwrap();
        pair.b.decoder.reread(&pair.ids, &[1..n], &mut c).unwrap();
        assert!(!c.has_dropped(), "{what}: a re-read position is back");
        let d = max_diff(&c, &pair.truth, 0..n);
        assert!(d < CHUNKING, "{what}: {d}");
        // Dropped in two places, both re-read along with everything after them.
        let mut c = pair.cache_with(1, &fill);
        c.drop_positions(5..12).unwrap();
        c.drop_positions(20..31).unwrap();
        pair.b.decoder.reread(&pair.ids, &[1..n], &mut c).unwrap();
        let d = max_diff(&c, &pair.truth, 0..n);
        assert!(d < CHUNKING, "{what}, two spans: {d}");
    }
}

#[test]
fn kept_and_re_read_positions_attend_only_to_each_other() {
    let pair = Pair::new(60, 12);
    let n = pair.ids.len();
    let anchor = 3;
    let dropped = [anchor..12, 20..n - 10];
    let reread = [12..20, n - 10..n];
    let message = &pair.ids[n - 4..];
    // What the dropped slots hold never reaches a re-read row nor a later token: three
    // different fills give the very same bits.
    let mut results = Vec::new();
    for (what, fill) in pair.fills(anchor) {
        let mut c = pair.cache_with(anchor, &fill);
        for r in &dropped {
            c.drop_positions(r.clone()).unwrap();
        }
        pair.b.decoder.reread(&pair.ids, &reread, &mut c).unwrap();
        assert_eq!(c.dropped(), &dropped, "{what}");
        results.push((what, c));
    }
    let (_, first) = &results[0];
    for (what, c) in &results[1..] {
        for r in reread.iter().chain([&(0..anchor)]) {
            assert_eq!(max_diff(first, c, r.clone()), 0.0, "{what} {r:?}");
        }
    }
    let logits: Vec<Tensor> = results
        .iter()
        .map(|(_, c)| logits_after(&pair.b, c, message))
        .collect();
    for (l, (what, _)) in logits[1..].iter().zip(&results[1..]) {
        assert_eq!(max_abs(&logits[0], l), 0.0, "{what}: next-token logits");
    }
    // Read over the dropped positions instead (nothing dropped), the same rows differ:
    // the drop is what made them independent of the fill.
    let (_, mapped_fill) = &pair.fills(anchor)[0];
    let mut over = pair.cache_with(anchor, mapped_fill);
    pair.b
        .decoder
        .reread(&pair.ids, &reread, &mut over)
        .unwrap();
    assert!(max_diff(first, &over, reread[0].clone()) > 1e-4);
    // A row at layer 0 reads no other position for its keys: the re-read rows' first
    // layer is the target's own, at their own positions.
    let l0 = |c: &KvCache, r: Range<usize>| c.layer_range(0, r.start, r.end).unwrap().k;
    for r in &reread {
        assert!(max_abs(&l0(first, r.clone()), &l0(&pair.truth, r.clone())) < 1e-5);
    }
}

#[test]
fn positions_after_a_drop_keep_their_own_places() {
    let pair = Pair::new(50, 13);
    let n = pair.ids.len();
    let (_, fill) = pair.fills(1).swap_remove(0);
    let mut c = pair.cache_with(1, &fill);
    c.truncate(n - 6);
    c.drop_positions(4..n - 12).unwrap();
    pair.b
        .decoder
        .forward(&pair.ids[n - 6..], &mut c, &ForwardOptions::cache_only())
        .unwrap();
    assert_eq!(c.len(), n);
    // The first layer's keys carry RoPE at the position: the same as the prefill's only
    // at the true positions.
    let l0 = |c: &KvCache| c.layer_range(0, n - 6, n).unwrap().k;
    assert!(max_abs(&l0(&c), &l0(&pair.truth)) < 1e-5);
    // Truncating into a dropped span forgets the part past the end; a clone keeps it.
    let clone = c.try_clone().unwrap();
    assert_eq!(clone.dropped(), c.dropped());
    c.truncate(10);
    assert_eq!(c.dropped(), &[4..10]);
    // Position 0 and positions past the end are never dropped.
    assert!(c.drop_positions(0..2).is_err());
    assert!(c.drop_positions(5..11).is_err());
}

#[test]
fn dropping_nothing_changes_nothing() {
    let pair = Pair::new(60, 14);
    let n = pair.ids.len();
    let inputs = pair.inputs();
    let plan = HandoffPlan::new(n).anchor(2).rereading(vec![10..20]);
    let (plain, _) = plan.build_new(&inputs).unwrap();
    let (none, _) = plan
        .clone()
        .dropping(Vec::new())
        .build_new(&inputs)
        .unwrap();
    assert!(!none.has_dropped());
    assert_eq!(max_diff(&plain, &none, 0..n), 0.0);
    // A drop inside a re-read span gives way to the re-read: the same bits too.
    let (covered, _) = plan
        .clone()
        .dropping(vec![12..18])
        .build_new(&inputs)
        .unwrap();
    assert!(!covered.has_dropped());
    assert_eq!(max_diff(&plain, &covered, 0..n), 0.0);
    // And a real drop does change what the re-read and later positions hold.
    let (dropped, _) = plan.dropping(vec![2..10]).build_new(&inputs).unwrap();
    assert_eq!(dropped.dropped(), &[2..10]);
    assert!(max_diff(&plain, &dropped, 10..20) > 1e-4);
}

#[test]
fn what_the_source_had_dropped_stays_dropped_unless_re_read() {
    let mut pair = Pair::new(60, 15);
    let n = pair.ids.len();
    pair.src_cache.drop_positions(8..16).unwrap();
    pair.src_cache.drop_positions(30..34).unwrap();
    let inputs = pair.inputs();
    let (mapped, _) = HandoffPlan::new(n).anchor(1).build_new(&inputs).unwrap();
    assert_eq!(mapped.dropped(), &[8..16, 30..34]);
    // A re-read over one of them takes it back; the other stays out.
    let plan = HandoffPlan::new(n).anchor(1).rereading(vec![28..36]);
    let (repaired, _) = plan.build_new(&inputs).unwrap();
    assert_eq!(repaired.dropped(), &[8..16]);
}

#[test]
fn a_handed_caches_fit_is_measured_on_the_positions_it_keeps() {
    use baton::handoff::fidelity::{layer_fidelity, query_grams};
    let pair = Pair::new(50, 16);
    let n = pair.ids.len();
    let fills = pair.fills(1);
    let (mapped, garbage) = (&fills[0].1, &fills[1].1);
    // The mapped fill with positions 5..15 (fill rows 4..14) taken from the garbage one.
    let spliced: Vec<LayerKv> = mapped
        .iter()
        .zip(garbage)
        .map(|(m, g)| {
            let part = |a: &Tensor, b: &Tensor| {
                Tensor::cat(
                    &[
                        a.narrow(1, 0, 4)?,
                        b.narrow(1, 4, 10)?,
                        a.narrow(1, 14, a.dim(1)? - 14)?,
                    ],
                    1,
                )
            };
            LayerKv {
                k: part(&m.k, &g.k).unwrap(),
                v: part(&m.v, &g.v).unwrap(),
            }
        })
        .collect();
    let grams = query_grams(&pair.b).unwrap();
    let fit = |fill: &[LayerKv], drop: bool| {
        let mut c = pair.cache_with(1, fill);
        if drop {
            c.drop_positions(5..15).unwrap();
        }
        let f = layer_fidelity(&pair.b, &grams[1], &pair.truth, &c, n, None, &[], 1).unwrap();
        (f.r2_k, f.r2_v, f.key_error_concentration)
    };
    // Dropped, what the slots hold does not count; kept, it does.
    assert_eq!(fit(mapped, true), fit(&spliced, true));
    assert_ne!(fit(mapped, false), fit(&spliced, false));
}
