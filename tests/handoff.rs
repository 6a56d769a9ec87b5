//! The handed-over cache built from a plan, on two tiny models generated here with their
//! mappers calibrated between them: each part of the plan is what it says (the target's
//! own prefill, the mapper's image, the target reading over the mapped middle), what it
//! holds stays, and the target's exact cache is copied only where the plan is exact.

// Re-read spans are ranges: a list of one span is a list of one range.
#![allow(clippy::single_range_in_vec_init)]

mod common;

use baton::handoff::HandoffPlan;
use baton::model::{ForwardOptions, KvCache};
use candle_core::Tensor;
use common::handoff_pair::Pair;

/// Largest absolute difference between positions `range` of two caches, over all layers.
fn max_diff(a: &KvCache, b: &KvCache, start: usize, end: usize) -> f32 {
    let mut worst = 0f32;
    for l in 0..a.shape().n_layer {
        let (x, y) = (
            a.layer_range(l, start, end).unwrap(),
            b.layer_range(l, start, end).unwrap(),
        );
        for (p, q) in [(&x.k, &y.k), (&x.v, &y.v)] {
            let d = (p - q).unwrap().abs().unwrap().flatten_all().unwrap();
            let d = d.max(0).unwrap().to_scalar::<f32>().unwrap();
            worst = worst.max(d);
        }
    }
    worst
}

/// A cache made of positions `0..start` of `base` followed by `layers`.
fn with_layers(base: &KvCache, start: usize, layers: &[baton::model::LayerKv]) -> KvCache {
    let mut c = base.try_clone_prefix(start).unwrap();
    c.extend_with(layers).unwrap();
    c
}

#[test]
fn each_part_of_a_plan_is_built_as_it_says() {
    let pair = Pair::new(60, 3);
    let Pair {
        a,
        b,
        mapper,
        ids,
        src_cache,
        truth,
        ..
    } = &pair;
    let n = ids.len();
    assert!(n > 30, "the text gives {n} tokens");
    let inputs = pair.inputs();

    // Anchor 3, tail 8: the target's own first 3, the mapper's image of the middle, and
    // the target reading the last 8 over both.
    let plan = HandoffPlan::new(n).anchor(3).tail(8);
    let (built, timings) = plan.build_new(&inputs).unwrap();
    assert_eq!(built.len(), n);
    assert!(timings.map_ms > 0.0);
    // A prefill of 3 tokens and one of n block their products differently.
    const CHUNKING: f32 = 1e-4;
    assert!(
        max_diff(&built, truth, 0, 3) < CHUNKING,
        "the anchor is the prefill's"
    );
    let middle = mapper
        .map_range(src_cache, ids, a.decoder.rope(), b.decoder.rope(), 3, n - 8)
        .unwrap();
    let mut expected = with_layers(truth, 3, &middle);
    assert_eq!(
        max_diff(&built, &expected, 3, n - 8),
        0.0,
        "the middle is mapped"
    );
    b.decoder
        .forward(&ids[n - 8..], &mut expected, &ForwardOptions::cache_only())
        .unwrap();
    assert!(
        max_diff(&built, &expected, n - 8, n) < CHUNKING,
        "the tail is read over the mapped middle"
    );
    // Read over a mapped middle, the tail is not the target's truth.
    assert!(max_diff(&built, truth, n - 8, n) > 1e-4);
}

#[test]
fn a_plan_the_target_reads_whole_is_its_prefill_and_an_exact_cache_is_copied() {
    let pair = Pair::new(40, 5);
    let Pair { ids, truth, .. } = &pair;
    let n = ids.len();
    let mut inputs = pair.inputs();
    let (read, t) = HandoffPlan::reprefill(n).build_new(&inputs).unwrap();
    assert_eq!(t.map_ms, 0.0, "nothing is mapped");
    assert_eq!(max_diff(&read, truth, 0, n), 0.0);

    // Given the truth of the first 10 positions, the rest is computed on top of it.
    let part = truth.try_clone_prefix(10).unwrap();
    inputs.exact = Some(&part);
    let (copied, _) = HandoffPlan::reprefill(n).build_new(&inputs).unwrap();
    assert!(max_diff(&copied, truth, 0, n) < 1e-4);

    // An anchor is copied from the exact cache: the same as computing it.
    let (mapped, _) = HandoffPlan::new(n).anchor(4).build_new(&inputs).unwrap();
    inputs.exact = None;
    let (computed, _) = HandoffPlan::new(n).anchor(4).build_new(&inputs).unwrap();
    assert!(max_diff(&mapped, &computed, 0, n) < 1e-4);
}

#[test]
fn held_positions_stay_the_whole_map_takes_the_mappers_own_path_and_edits_reach_only_the_map() {
    let pair = Pair::new(40, 7);
    let Pair {
        a,
        b,
        mapper,
        ids,
        src_cache,
        truth,
        ..
    } = &pair;
    let n = ids.len();
    let inputs = pair.inputs();
    let (rb, ra) = (b.decoder.rope(), a.decoder.rope());
    let whole = mapper.map_cache(src_cache, ids, ra, rb).unwrap();
    let (built, _) = HandoffPlan::new(n).build_new(&inputs).unwrap();
    assert_eq!(max_diff(&built, &whole, 0, n), 0.0);

    // The target holds its truth of the first 12 positions and more: it keeps 12.
    let mut dst = truth.try_clone().unwrap();
    HandoffPlan::new(n)
        .anchor(1)
        .holding(12)
        .build(&inputs, &mut dst)
        .unwrap();
    assert_eq!(dst.len(), n);
    assert_eq!(max_diff(&dst, truth, 0, 12), 0.0);
    let rest = mapper.map_range(src_cache, ids, ra, rb, 12, n).unwrap();
    assert_eq!(max_diff(&dst, &with_layers(truth, 12, &rest), 12, n), 0.0);

    // A cache shorter than what the plan keeps is refused.
    let mut short = truth.try_clone_prefix(5).unwrap();
    let err = HandoffPlan::new(n)
        .holding(12)
        .build(&inputs, &mut short)
        .unwrap_err();
    assert!(err.to_string().contains("holds 5 positions"), "{err}");

    // An edit sees exactly the mapped range, and only the mapped positions change.
    let mut seen = None;
    let mut zero = |layers: &mut [baton::model::LayerKv], r: std::ops::Range<usize>| {
        seen = Some(r);
        for layer in layers.iter_mut() {
            layer.v = Tensor::zeros_like(&layer.v)?;
        }
        Ok(())
    };
    let mut edited = b.decoder.new_cache();
    HandoffPlan::new(n)
        .anchor(2)
        .tail(5)
        .build_edited(&inputs, &mut edited, Some(&mut zero))
        .unwrap();
    assert_eq!(seen, Some(2..n - 5));
    let v = edited.layer_range(0, 2, n - 5).unwrap().v;
    let total = v
        .abs()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(total, 0.0);
    assert!(
        max_diff(&edited, truth, 0, 2) < 1e-4,
        "the anchor is the target's own"
    );
}

/// The whole text mapped from a to b.
fn mapped_whole(pair: &Pair) -> KvCache {
    let (c, _) = HandoffPlan::new(pair.ids.len())
        .build_new(&pair.inputs())
        .unwrap();
    c
}

#[test]
fn a_reread_of_every_position_is_the_prefill_and_of_none_changes_nothing() {
    let pair = Pair::new(60, 11);
    let Pair { b, ids, truth, .. } = &pair;
    let n = ids.len();
    let mapped = mapped_whole(&pair);
    assert!(
        max_diff(&mapped, truth, 0, n) > 1e-3,
        "the map is not exact"
    );

    let mut all = mapped.try_clone().unwrap();
    b.decoder.reread(ids, &[0..n], &mut all).unwrap();
    assert_eq!(max_diff(&all, truth, 0, n), 0.0, "every position re-read");

    let mut none = mapped.try_clone().unwrap();
    b.decoder.reread(ids, &[], &mut none).unwrap();
    assert_eq!(max_diff(&none, &mapped, 0, n), 0.0, "nothing re-read");

    // Every position, given as many runs: the same rows, cut differently.
    let mut runs = mapped.try_clone().unwrap();
    b.decoder
        .reread(ids, &[0..5, 5..6, 6..n], &mut runs)
        .unwrap();
    assert!(max_diff(&runs, truth, 0, n) < 1e-4);
}

#[test]
fn a_reread_prefix_is_the_anchor_a_reread_suffix_is_the_tail_and_a_middle_span_reads_over_the_map()
{
    let pair = Pair::new(60, 13);
    let Pair { b, ids, truth, .. } = &pair;
    let n = ids.len();
    let mapped = mapped_whole(&pair);

    // A prefix attends only over itself: the target's own positions.
    let mut prefix = mapped.try_clone().unwrap();
    b.decoder.reread(ids, &[0..6], &mut prefix).unwrap();
    assert!(max_diff(&prefix, truth, 0, 6) < 1e-4);
    assert_eq!(
        max_diff(&prefix, &mapped, 6, n),
        0.0,
        "the rest stays mapped"
    );

    // A suffix is the target reading the tail over the mapped rest, as a plan's tail.
    let mut suffix = mapped.try_clone().unwrap();
    b.decoder.reread(ids, &[n - 8..n], &mut suffix).unwrap();
    let mut tail = mapped.try_clone_prefix(n - 8).unwrap();
    b.decoder
        .forward(&ids[n - 8..], &mut tail, &ForwardOptions::cache_only())
        .unwrap();
    assert_eq!(max_diff(&suffix, &tail, 0, n), 0.0);

    // Two spans in the middle: each reads the mapped positions around it and the spans
    // before it as re-read at every layer; positions outside them keep their map.
    let (s1, s2) = (10..14, 30..35);
    let mut spans = mapped.try_clone().unwrap();
    b.decoder
        .reread(ids, &[s1.clone(), s2.clone()], &mut spans)
        .unwrap();
    for (a, z) in [(0, s1.start), (s1.end, s2.start), (s2.end, n)] {
        assert_eq!(max_diff(&spans, &mapped, a, z), 0.0, "{a}..{z} unchanged");
    }
    // The second span, taken alone after the first, gives the very same cache.
    let mut stepwise = mapped.try_clone().unwrap();
    b.decoder
        .reread(ids, std::slice::from_ref(&s1), &mut stepwise)
        .unwrap();
    b.decoder
        .reread(ids, std::slice::from_ref(&s2), &mut stepwise)
        .unwrap();
    assert!(max_diff(&spans, &stepwise, 0, n) < 1e-4);
    // Read over a mapped context, a span is neither its map nor the target's truth.
    assert!(max_diff(&spans, &mapped, s2.start, s2.end) > 1e-4);
    assert!(max_diff(&spans, truth, s2.start, s2.end) > 1e-4);
}

#[test]
fn leading_layers_are_the_prefills_first_layers() {
    let pair = Pair::new(40, 17);
    let Pair { b, ids, truth, .. } = &pair;
    let n = ids.len();
    let lead = b.decoder.leading_layers(ids, 1).unwrap();
    assert_eq!(lead.len(), 1);
    let own = truth.layer(0).unwrap();
    let d = (&lead[0].k - &own.k)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap();
    assert_eq!(d.max(0).unwrap().to_scalar::<f32>().unwrap(), 0.0);
    assert_eq!(lead[0].k.dim(1).unwrap(), n);
}

#[test]
fn every_selector_chooses_within_its_budget_inside_the_map_and_the_reread_changes_only_that() {
    use baton::handoff::reread::{choose, RereadSetting, SelectInputs, Selector, SpanGrowth};
    let pair = Pair::new(70, 19);
    let Pair {
        a,
        b,
        ids,
        src_cache,
        ..
    } = &pair;
    // The history is all but the last 6 tokens, which stand for the next message.
    let h = ids.len() - 6;
    let mut source = src_cache.try_clone_prefix(h).unwrap();
    let plan = HandoffPlan::new(h).anchor(2);
    let mut inputs = pair.inputs();
    inputs.tokens = &ids[..h];
    let (mapped, _) = plan.build_new(&inputs).unwrap();
    // The source's cache of the history only (the message is the selectors' to read).
    source.truncate(h);
    let select = SelectInputs {
        source: a,
        source_cache: &source,
        target: b,
        handed: &mapped,
        mapper: &pair.mapper,
        reverse: Some(&pair.reverse),
        tokens: ids,
        history: h,
    };
    for selector in Selector::ALL {
        for spans in SpanGrowth::ALL {
            let setting = RereadSetting {
                budget: baton::handoff::reread::RereadBudget::Share(0.25),
                selector,
                spans,
                kind: baton::handoff::reread::PlanKind::Map,
                up_only: false,
                layers: None,
            };
            let choice = choose(
                &setting,
                &select,
                &baton::model::position_set::PositionSet::of([plan.mapped()]),
                None,
            )
            .unwrap();
            let what = format!("{} {}", selector.name(), spans.name());
            let budget = (0.25 * h as f64).round() as usize;
            assert!(
                choice.count() <= budget,
                "{what}: {} > {budget}",
                choice.count()
            );
            assert!(
                choice.count() > budget / 2,
                "{what}: only {} of {budget}",
                choice.count()
            );
            assert!(
                choice.runs.windows(2).all(|w| w[0].end < w[1].start),
                "{what}"
            );
            assert!(
                choice.runs.iter().all(|r| r.start >= 2 && r.end <= h),
                "{what}"
            );
            let mut cache = mapped.try_clone().unwrap();
            let planned = plan.clone().rereading(choice.runs.clone());
            planned.reread_in(b, &ids[..h], &mut cache).unwrap();
            let first = choice.runs[0].start;
            assert_eq!(max_diff(&cache, &mapped, 0, first), 0.0, "{what}");
            assert!(
                max_diff(&cache, &mapped, first, choice.runs[0].end) > 0.0,
                "{what}"
            );
        }
    }
    // Recency takes the newest positions, as a tail would.
    let setting = RereadSetting::parse("0.25:recency:token").unwrap().unwrap();
    let choice = choose(
        &setting,
        &select,
        &baton::model::position_set::PositionSet::of([plan.mapped()]),
        None,
    )
    .unwrap();
    let budget = (0.25 * h as f64).round() as usize;
    assert_eq!(choice.runs, vec![h - budget..h]);
    // A time budget spends the given speed: 2 ms a position, 10 ms, 5 positions.
    let setting = RereadSetting::parse("10ms:recency:token").unwrap().unwrap();
    let choice = choose(
        &setting,
        &select,
        &baton::model::position_set::PositionSet::of([plan.mapped()]),
        Some(2.0),
    )
    .unwrap();
    assert_eq!(choice.count(), 5);
}

#[test]
fn a_tail_mapped_first_and_re_read_with_the_spans_is_the_plan_built_in_one_pass() {
    let pair = Pair::new(60, 17);
    let (b, ids) = (&pair.b, &pair.ids);
    let n = ids.len();
    let spans = vec![10..14, 30..35];
    // The plan with its spans known before it is built: map, re-read, then the tail.
    let plan = HandoffPlan::new(n).anchor(2).tail(8);
    let (whole, _) = plan
        .clone()
        .rereading(spans.clone())
        .build_new(&pair.inputs())
        .unwrap();
    // The tail mapped, the spans chosen afterwards: one re-read reads spans and tail.
    let (mut later, _) = plan.tail_mapped().build_new(&pair.inputs()).unwrap();
    let chosen = plan.clone().rereading(spans);
    chosen.reread_in(b, ids, &mut later).unwrap();
    assert!(max_diff(&later, &whole, 0, n) < 1e-4);
    assert_eq!(chosen.reread_count(), 9);
    // Nothing chosen: the tail is still read, not left mapped.
    let (mut none, _) = plan.tail_mapped().build_new(&pair.inputs()).unwrap();
    plan.reread_in(b, ids, &mut none).unwrap();
    let (read, _) = plan.build_new(&pair.inputs()).unwrap();
    assert!(max_diff(&none, &read, 0, n) < 1e-4);
}

#[test]
fn a_handed_cache_says_which_positions_the_target_did_not_compute_until_it_re_reads_them() {
    let pair = Pair::new(50, 23);
    let n = pair.ids.len();
    let plan = HandoffPlan::new(n).anchor(4).tail(5);
    let (mut c, _) = plan.build_new(&pair.inputs()).unwrap();
    // The anchor and the tail are the target's reading; only the middle was mapped.
    assert_eq!(c.foreign().runs(), &[4..n - 5]);
    let (whole, _) = HandoffPlan::new(n).build_new(&pair.inputs()).unwrap();
    assert_eq!(
        whole.foreign().runs(),
        &[0..n],
        "a whole map is all foreign"
    );
    // Re-read, positions are the target's own; the rest stays foreign.
    pair.b.decoder.reread(&pair.ids, &[10..20], &mut c).unwrap();
    assert_eq!(c.foreign().runs(), &[4..10, 20..n - 5]);
    // A prefill past the end is the target's own too.
    let mut longer = c.try_clone().unwrap();
    longer.truncate(n - 3);
    let more = pair.ids[n - 3..].to_vec();
    pair.b
        .decoder
        .forward(
            &more,
            &mut longer,
            &baton::model::ForwardOptions::cache_only(),
        )
        .unwrap();
    assert_eq!(longer.foreign().runs(), &[4..10, 20..n - 5]);
}

#[test]
fn upper_layers_over_the_targets_own_residual_are_its_prefill_whatever_the_layers_below_hold() {
    let pair = Pair::new(60, 29);
    let n = pair.ids.len();
    let layers = pair.b.config().n_layer;
    let m = layers / 2;
    let mut own = pair.b.decoder.new_cache();
    let kept = pair
        .b
        .decoder
        .forward_keeping(&pair.ids, &mut own, &[m, 0, layers])
        .unwrap();
    assert_eq!(kept.len(), 3);
    for k in &kept {
        assert_eq!(k.dims2().unwrap(), (n, pair.b.config().hidden));
    }
    // Keeping the stream changes nothing of the prefill itself.
    let d = max_abs_diff(&own, &pair.truth, 0, layers);
    assert!(d < 1e-4, "{d}");
    // Below m the whole map; from m on, the target's layers over its own residual.
    let (mut c, _) = HandoffPlan::new(n).build_new(&pair.inputs()).unwrap();
    pair.b
        .decoder
        .upper_layers(&kept[0], &[0..n], m, &mut c)
        .unwrap();
    let upper = max_abs_diff(&c, &pair.truth, m, layers);
    assert!(upper < 1e-4, "upper layers differ by {upper}");
    let lower = max_abs_diff(&c, &pair.truth, 0, m);
    assert!(lower > 1e-2, "the layers below m stay mapped ({lower})");
    // A residual of the wrong shape is refused, naming it.
    let e = pair
        .b
        .decoder
        .upper_layers(&kept[0].narrow(0, 0, n - 1).unwrap(), &[0..n], m, &mut c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("residual"), "{e}");
}

/// Largest absolute difference of keys and values over layers `from..to`.
fn max_abs_diff(a: &KvCache, b: &KvCache, from: usize, to: usize) -> f32 {
    let mut worst = 0f32;
    for l in from..to {
        let (x, y) = (a.layer(l).unwrap(), b.layer(l).unwrap());
        for (p, q) in [(&x.k, &y.k), (&x.v, &y.v)] {
            let d = (p - q).unwrap().abs().unwrap().flatten_all().unwrap();
            worst = worst.max(d.max(0).unwrap().to_scalar::<f32>().unwrap());
        }
    }
    worst
}
