//! Calibration statistics on tiny models generated here: statistics saved from some
//! windows and merged with those of others fit the maps one calibration on all the
//! windows fits, a refit from saved statistics alone reads no fit window, merges that
//! would count a window twice or mix token blocks are refused before any capture, and
//! attention weights change the fit and are recorded, and gains matched to the held-out
//! statistics' spread are chosen per head within their bounds.

mod common;

use baton::calibrate::saved_stats::{self, SavedStats};
use baton::calibrate::{
    calibrate_with, CalibrateOptions, Calibrated, CorpusName, Direction, Fitted, NoProgress, Run,
    TokenFeatures,
};
use baton::data::corpus::{self, Document};
use baton::mapper::artifact::ModelRef;
use baton::model::Model;
use common::synthetic::{model_pair, Tiny};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn docs(tiny: &Tiny) -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny.text(4000, 21 + i)))
        .collect()
}

fn opts(sequences: usize, skip_windows: usize) -> CalibrateOptions {
    CalibrateOptions {
        sequences,
        skip_windows,
        seq_len: 64,
        stride: 1,
        select_sequences: 2,
        probes: 8,
        k_sweep: vec![1, 2],
        lambdas: vec![0.01],
        max_k: usize::MAX,
        token_features: TokenFeatures::All,
        key_gain: 1.0,
        key_gain_matched: false,
        ..CalibrateOptions::default()
    }
}

fn run(
    a: &Model,
    b: &Model,
    docs: &[Document],
    o: &CalibrateOptions,
    prior: Vec<(PathBuf, SavedStats)>,
) -> Result<Calibrated, baton::calibrate::CalibrateError> {
    let name = CorpusName {
        files: "tiny".into(),
        fingerprint: corpus::fingerprint(docs),
    };
    let r = Run {
        docs,
        corpus: &name,
        directions: &[Direction::Forward],
        opts: o,
    };
    calibrate_with(a, b, &r, prior, &NoProgress, &AtomicBool::new(false))
}

fn refs(a: &Model, b: &Model) -> (ModelRef, ModelRef) {
    (
        ModelRef::new(&a.identity, a.config()),
        ModelRef::new(&b.identity, b.config()),
    )
}

/// Largest difference between the two mappers' weights and biases, against the largest
/// weight: the fits run in f64 from statistics equal up to rounding, so they agree far
/// below f32 resolution of the stored maps times the ridge system's conditioning.
fn relative_difference(x: &Fitted, y: &Fitted) -> f32 {
    let mut diff = 0.0f32;
    let mut scale = 0.0f32;
    for (m, n) in x
        .keys
        .iter()
        .chain(&x.values)
        .zip(y.keys.iter().chain(&y.values))
    {
        assert_eq!(m.sources, n.sources, "the same source layers are chosen");
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
    diff / scale
}

#[test]
fn statistics_saved_from_some_windows_and_merged_with_others_fit_one_calibrations_maps() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let docs = docs(&tiny);
    let store = tempfile::tempdir().unwrap();
    let (sr, tr) = refs(&a, &b);
    let at = baton::mapper::dir::MapperDir::named(store.path())
        .pair(&sr, &tr)
        .stats();

    let first = run(&a, &b, &docs, &opts(3, 0), Vec::new()).unwrap();
    saved_stats::save(&first.stats[0], &at).unwrap();
    let loaded = saved_stats::load(&at, Direction::Forward, &sr, &tr).unwrap();
    assert_eq!(loaded.meta.windows(), 3);
    assert_eq!(loaded.meta.token_layers, first.stats[0].meta.token_layers);
    assert!(loaded.meta.token_layers > 0, "token features were captured");

    let merged = run(&a, &b, &docs, &opts(3, 3), vec![(at.clone(), loaded)]).unwrap();
    let whole = run(&a, &b, &docs, &opts(6, 0), Vec::new()).unwrap();
    let (m, w) = (&merged.fitted[0], &whole.fitted[0]);
    assert_eq!(m.report.observations, w.report.observations);
    assert_eq!(m.report.sequences, 6);
    assert_eq!(merged.stats[0].meta.windows(), 6);
    assert_eq!(
        merged.stats[0]
            .meta
            .sources
            .iter()
            .map(|s| (s.first_window, s.windows))
            .collect::<Vec<_>>(),
        vec![(0, 3), (3, 3)]
    );
    assert_eq!((m.k, m.lambda), (w.k, w.lambda));
    let d = relative_difference(m, w);
    // Saved statistics keep their matrices in f32: a rounding of 6e-8 per entry that the
    // solve amplifies by the Gram's conditioning (7e-5 here).
    assert!(d < 1e-3, "merged and single-pass maps differ by {d}");
    // And the merge did something: the first three windows alone fit other maps.
    let alone = relative_difference(&first.fitted[0], w);
    assert!(alone > 10.0 * d.max(1e-6), "{alone} vs {d}");
}

#[test]
fn a_refit_from_saved_statistics_alone_gives_the_maps_they_were_fitted_to() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let docs = docs(&tiny);
    let first = run(&a, &b, &docs, &opts(3, 0), Vec::new()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let (sr, tr) = refs(&a, &b);
    let at = baton::mapper::dir::MapperDir::named(store.path())
        .pair(&sr, &tr)
        .stats();
    saved_stats::save(&first.stats[0], &at).unwrap();
    let loaded = saved_stats::load(&at, Direction::Forward, &sr, &tr).unwrap();
    let again = run(&a, &b, &docs, &opts(0, 0), vec![(at.clone(), loaded)]).unwrap();
    let (x, y) = (&first.fitted[0], &again.fitted[0]);
    assert_eq!(x.report.observations, y.report.observations);
    assert_eq!(y.report.sequences, 3);
    let d = relative_difference(x, y);
    // The f32 matrices of saved statistics, amplified by the solve (4e-4 here).
    assert!(d < 2e-3, "refit differs by {d}");
    // A NaN in the saved statistics is refused with the tensor's name, not solved into
    // maps that are NaN everywhere.
    common::poison_tensor(
        &at.join("keys.safetensors"),
        "mean_x",
        2,
        &f64::NAN.to_le_bytes(),
    );
    let e = saved_stats::load(&at, Direction::Forward, &sr, &tr)
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("`mean_x`") && e.contains("not a finite number"),
        "{e}"
    );
}

#[test]
fn merges_that_would_not_add_up_are_refused_before_any_capture() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let docs = docs(&tiny);
    let first = run(&a, &b, &docs, &opts(3, 0), Vec::new()).unwrap();
    let prior = || {
        vec![(
            PathBuf::from("saved"),
            SavedStats {
                stats: baton::calibrate::DirectionStats {
                    direction: Direction::Forward,
                    keys: first.stats[0].stats.keys.clone(),
                    values: first.stats[0].stats.values.clone(),
                    token_layers: first.stats[0].stats.token_layers,
                },
                meta: first.stats[0].meta.clone(),
            },
        )]
    };
    // The same windows again would count every one twice.
    let e = run(&a, &b, &docs, &opts(2, 1), prior()).err().unwrap();
    assert!(e.to_string().contains("--skip-windows 3"), "{e}");
    // Statistics with the token block do not add up with statistics without it.
    let mut off = opts(2, 3);
    off.token_features = TokenFeatures::Off;
    let e = run(&a, &b, &docs, &off, prior()).err().unwrap();
    assert!(e.to_string().contains("--token-features all"), "{e}");
    // Nothing to fit from at all.
    let e = run(&a, &b, &docs, &opts(0, 0), Vec::new()).err().unwrap();
    assert!(e.to_string().contains("--merge-stats"), "{e}");
}

#[test]
fn attention_weights_change_the_fit_and_the_report_and_the_statistics_record_them() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let docs = docs(&tiny);
    let plain = run(&a, &b, &docs, &opts(3, 0), Vec::new()).unwrap();
    let mut o = opts(3, 0);
    o.attention_weight = 1.0;
    let weighted = run(&a, &b, &docs, &o, Vec::new()).unwrap();
    let (p, w) = (&plain.fitted[0], &weighted.fitted[0]);
    // The same windows and positions, each counted once, fitted with other weights.
    assert_eq!(p.report.observations, w.report.observations);
    assert_eq!(w.report.attention_weight, 1.0);
    assert_eq!(weighted.stats[0].meta.attention_weight, 1.0);
    let other_sources = p
        .keys
        .iter()
        .chain(&p.values)
        .zip(w.keys.iter().chain(&w.values))
        .any(|(m, n)| m.sources != n.sources);
    assert!(
        other_sources || relative_difference(p, w) > 1e-3,
        "weights left the maps as they were"
    );
    // Unweighted statistics do not add up with weighted ones.
    let mut more = opts(3, 3);
    more.attention_weight = 1.0;
    let prior = vec![(
        PathBuf::from("saved"),
        plain.stats.into_iter().next().unwrap(),
    )];
    let e = run(&a, &b, &docs, &more, prior).err().unwrap();
    assert!(e.to_string().contains("--attention-weight 0"), "{e}");
}

#[test]
fn matched_key_gains_are_chosen_per_layer_and_head_from_the_held_out_spread() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let docs = docs(&tiny);
    let plain = run(&a, &b, &docs, &opts(3, 0), Vec::new()).unwrap();
    let mut o = opts(3, 0);
    o.key_gain_matched = true;
    let matched = run(&a, &b, &docs, &o, Vec::new()).unwrap();
    let (p, m) = (&plain.fitted[0], &matched.fitted[0]);
    let gains = &m.report.matched_key_gains;
    assert_eq!(gains.len(), b.config().n_layer);
    assert!(gains.iter().all(|l| l.len() == b.config().n_kv_head));
    assert!(
        gains.iter().flatten().all(|g| (1.0..=2.0).contains(g)),
        "{gains:?}"
    );
    // Unrelated models: the ridge shrinks, so some head needs more than a gain of 1.
    assert!(gains.iter().flatten().any(|&g| g > 1.01), "{gains:?}");
    assert!(m.report.matched_value_gains.is_empty());
    // Same fit, then the gains: the values are untouched and the keys stretched.
    assert_eq!(p.values[0].weight, m.values[0].weight);
    assert!(relative_difference(p, m) > 1e-3);
}

#[test]
fn the_report_says_when_a_map_is_worse_than_no_context() {
    let tiny = Tiny::new("llama");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let f = run(&a, &b, &docs(&tiny), &opts(3, 0), Vec::new()).unwrap();
    let r = &f.fitted[0].report;
    let none = r
        .agreement_no_context
        .expect("measured beside the map's own");
    assert!(
        none.kl.is_finite() && none.kl > 0.0 && none.positions > 0,
        "{none:?}"
    );
    assert_eq!(none.positions, r.agreement.unwrap().positions);
    // The verdict follows the two KLs, whichever side the map is on.
    let mut v = serde_json::to_value(r).unwrap();
    v["agreement"]["kl"] = serde_json::json!(none.kl * 2.0);
    let worse: baton::calibrate::CalibrationReport = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(
        worse.worse_than_no_context(),
        Some((none.kl * 2.0, none.kl))
    );
    v["agreement"]["kl"] = serde_json::json!(none.kl / 2.0);
    let better: baton::calibrate::CalibrationReport = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(better.worse_than_no_context(), None);
    // A report from before the measure gives no verdict.
    v.as_object_mut().unwrap().remove("agreement_no_context");
    let old: baton::calibrate::CalibrationReport = serde_json::from_value(v).unwrap();
    assert_eq!(old.worse_than_no_context(), None);
}
