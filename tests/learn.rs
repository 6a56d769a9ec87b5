//! Learning from conversations on tiny models generated here: a re-solve with the
//! calibration's structure gives back the calibrated maps, an update is taken exactly
//! when it does not lower the held-out cosine, what was learned is kept, found again and
//! reset, and a mapper without saved statistics is refused with the fix.

mod common;

use baton::calibrate::saved_stats;
use baton::calibrate::Direction;
use baton::learn::{self, store, Structure};
use baton::mapper::dir::MapperDir;
use common::learn_rig::{calibrate_into, conversation, docs, learn_once, open, refs, ANCHOR};
use common::synthetic::{model_pair, Tiny};

#[test]
fn a_re_solve_with_the_calibrations_structure_gives_back_the_calibrated_maps() {
    let tiny = Tiny::new("llama");
    let (_m, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let dir = tempfile::tempdir().unwrap();
    calibrate_into(&a, &b, &docs(&tiny), dir.path());
    let art = baton::mapper::dir::MapperDir::named(dir.path())
        .find_for(&a, &b)
        .unwrap();
    assert!(
        art.meta
            .report
            .matched_key_gains
            .iter()
            .flatten()
            .any(|&g| g > 1.0),
        "the calibration chose gains above 1, so the test sees them put back"
    );
    let (sr, tr) = refs(&a, &b);
    let stats = saved_stats::load(
        &baton::mapper::dir::MapperDir::named(dir.path())
            .pair(&sr, &tr)
            .stats(),
        Direction::Forward,
        &sr,
        &tr,
    )
    .unwrap()
    .stats;
    let s = Structure::of(
        &art.keys,
        &art.values,
        art.meta.lambda,
        art.meta.standardize,
        &art.meta.report,
        a.config().kv_width(),
        b.config().head_dim,
    )
    .unwrap();
    let r = s.refit(&stats).unwrap();
    let (mut diff, mut scale) = (0f32, 0f32);
    for (m, n) in art
        .keys
        .iter()
        .chain(&art.values)
        .zip(r.keys.iter().chain(&r.values))
    {
        assert_eq!(m.sources, n.sources);
        for (p, q) in m
            .weight
            .iter()
            .chain(&m.bias)
            .zip(n.weight.iter().chain(&n.bias))
        {
            diff = diff.max((p - q).abs());
            scale = scale.max(p.abs());
        }
    }
    // The same f64 solve of the statistics as saved, whose matrices are rounded to f32:
    // 2e-4 here, the rounding amplified by the Gram's conditioning.
    assert!(
        diff / scale < 2e-3,
        "re-solved maps differ by {}",
        diff / scale
    );
}

#[test]
fn an_update_is_taken_exactly_when_it_does_not_score_lower_and_is_kept_found_again_and_reset() {
    let tiny = Tiny::new("llama");
    let (_m, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let dir = tempfile::tempdir().unwrap();
    calibrate_into(&a, &b, &docs(&tiny), dir.path());
    let mut opened = open(&a, &b, dir.path(), true);
    assert_eq!(opened.learner.learned_tokens(), 0);

    let mut accepted = 0u64;
    let mut taken = None;
    for seed in [101, 102, 103] {
        let ids = conversation(&tiny, &a, seed);
        let before = opened.learner.learned_tokens();
        let o = learn_once(&mut opened.learner, &a, &b, &ids).expect("enough text to learn from");
        assert_eq!(
            o.accepted,
            o.after.combined() >= o.before.combined(),
            "{o:?}"
        );
        assert!(
            o.before.calibration.is_some(),
            "judged on calibration text too"
        );
        assert_eq!(o.held_out + o.tokens + ANCHOR, ids.len());
        let grown = opened.learner.learned_tokens() - before;
        assert_eq!(grown, if o.accepted { o.tokens as u64 } else { 0 });
        if o.accepted {
            accepted += o.tokens as u64;
            let kept = opened.keep("test", &o).unwrap().expect("an update to keep");
            assert!(kept.exists());
            taken = Some(o);
        }
    }
    let o =
        taken.expect("an update of this text was taken: the tiny pair is fitted on the same kind");
    assert!(o.after.conversation >= 0.0 && o.after.conversation <= 1.0 + 1e-9);
    assert_eq!(opened.learner.learned_tokens(), accepted);

    // Too little new text is left for the next time.
    let short = conversation(&tiny, &a, 104)[..ANCHOR + 8].to_vec();
    assert!(learn_once(&mut opened.learner, &a, &b, &short).is_none());

    assert_eq!(opened.meta.tokens, accepted);
    let again = open(&a, &b, dir.path(), true);
    assert_eq!(again.learner.learned_tokens(), accepted);
    assert_eq!(again.meta.tokens, accepted);
    assert!(again
        .meta
        .summary()
        .contains(&format!("learned from {accepted} positions")));
    // Starting from the calibration ignores it; a reset forgets it.
    assert_eq!(open(&a, &b, dir.path(), false).learner.learned_tokens(), 0);
    assert!(store::reset(&MapperDir::named(dir.path()), &opened.files()).unwrap());
    assert!(!store::reset(&MapperDir::named(dir.path()), &opened.files()).unwrap());
    assert_eq!(open(&a, &b, dir.path(), true).learner.learned_tokens(), 0);
}

#[test]
fn a_mapper_without_saved_statistics_is_refused_with_the_flag_that_keeps_them() {
    let tiny = Tiny::new("llama");
    let (_m, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let dir = tempfile::tempdir().unwrap();
    calibrate_into(&a, &b, &docs(&tiny), dir.path());
    let (sr, tr) = refs(&a, &b);
    std::fs::remove_dir_all(
        baton::mapper::dir::MapperDir::named(dir.path())
            .pair(&sr, &tr)
            .stats(),
    )
    .unwrap();
    let art = baton::mapper::dir::MapperDir::named(dir.path())
        .find_for(&a, &b)
        .unwrap();
    let mapper = art.cache_mapper(&a, &b).unwrap();
    let e = learn::open(
        &a,
        &b,
        &art,
        mapper,
        &baton::mapper::dir::MapperDir::named(dir.path()),
        true,
        Vec::new(),
        ANCHOR,
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("--no-save-stats"), "{e}");
}
