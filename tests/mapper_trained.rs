//! Trained mappers (`residual`, `mlp`) on two tiny unrelated models generated here: the
//! heads train, beat the ridge map on held-out windows, are stored and read back whole,
//! run in the map as a reference forward of the same weights computes them, and the same
//! seed gives the same heads.

mod common;

use common::prefill;

use baton::calibrate::train::TrainOptions;
use baton::calibrate::{calibrate, CalibrateOptions, Direction, Fitted, NoProgress};
use baton::data::corpus::Document;
use baton::mapper::artifact::{self, CorpusInfo};
use baton::mapper::nonlinear::{Activation, Head, HeadUse, MapperKind, TrainLoss};
use baton::mapper::MapPrecision;
use baton::model::Model;
use common::synthetic::{model_pair, Tiny};
use std::sync::atomic::AtomicBool;

fn docs(tiny: &Tiny) -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny.text(4000, 11 + i)))
        .collect()
}

fn opts(kind: MapperKind, loss: TrainLoss, seed: u64) -> CalibrateOptions {
    CalibrateOptions {
        sequences: 8,
        seq_len: 64,
        stride: 1,
        select_sequences: 3,
        probes: 8,
        k_sweep: vec![2],
        lambdas: vec![0.01],
        token_features: baton::calibrate::TokenFeatures::Off,
        key_gain_matched: false,
        train: TrainOptions {
            kind,
            loss,
            windows: 8,
            epochs: 12,
            patience: 12,
            learning_rate: 1e-2,
            seed,
            hidden: vec![vec![16]],
            probes: 16,
        },
        ..CalibrateOptions::default()
    }
}

fn fit(a: &Model, b: &Model, tiny: &Tiny, o: &CalibrateOptions) -> Fitted {
    calibrate(
        a,
        b,
        &docs(tiny),
        &[Direction::Forward],
        o,
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap()
    .remove(0)
}

fn pair() -> (tempfile::TempDir, Tiny, Model, Model) {
    let tiny = Tiny::new("llama");
    let (dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    (dir, tiny, a, b)
}

/// `f` saved as calibration saves it, in `dir`: the artifact's path.
fn save(f: &Fitted, a: &Model, b: &Model, dir: &std::path::Path) -> std::path::PathBuf {
    let corpus = CorpusInfo {
        files: "synthetic".into(),
        fingerprint: "x".into(),
        sequences: 8,
        seq_len: 64,
        observations: 0,
    };
    let saved = baton::calibrate::save_fitted(
        [f],
        [a, b],
        &corpus,
        &baton::mapper::dir::MapperDir::named(dir),
    )
    .unwrap();
    saved[0].path.clone()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn a_residual_mapper_trains_beats_ridge_held_out_and_reproduces_from_its_seed() {
    let (_d, tiny, a, b) = pair();
    let f = fit(
        &a,
        &b,
        &tiny,
        &opts(MapperKind::Residual, TrainLoss::Attention, 5),
    );
    let t = f.training.as_ref().expect("a training report");
    let heads = f.heads.as_ref().expect("trained heads");
    assert_eq!(heads.kind, MapperKind::Residual);
    assert_eq!(heads.keys.len(), b.config().n_layer);
    assert!(heads
        .keys
        .iter()
        .all(|h| h.used == HeadUse::Added && h.hidden() == vec![16]));
    // Held-out loss: never above ridge (epoch 0 is ridge itself), and below it in the mean.
    for (j, (r, m)) in t.heldout_ridge.iter().zip(&t.heldout_trained).enumerate() {
        assert!(m <= r, "layer {j}: trained {m} above ridge {r}");
    }
    assert!(
        mean(&t.heldout_trained) < 0.98 * mean(&t.heldout_ridge),
        "trained {:?} vs ridge {:?} (best epochs {:?})",
        t.heldout_trained,
        t.heldout_ridge,
        t.best_epoch
    );
    // The same inputs and seed give the same heads; another seed other ones.
    let again = fit(
        &a,
        &b,
        &tiny,
        &opts(MapperKind::Residual, TrainLoss::Attention, 5),
    );
    assert_eq!(again.heads, f.heads);
    let other = fit(
        &a,
        &b,
        &tiny,
        &opts(MapperKind::Residual, TrainLoss::Attention, 6),
    );
    assert_ne!(other.heads, f.heads);
}

#[test]
fn an_mlp_mapper_replaces_the_ridge_map_and_kv_mse_trains_too() {
    let (_d, tiny, a, b) = pair();
    let f = fit(&a, &b, &tiny, &opts(MapperKind::Mlp, TrainLoss::KvMse, 1));
    let heads = f.heads.as_ref().unwrap();
    assert!(heads
        .values
        .iter()
        .all(|h| h.used == HeadUse::Alone && h.activation == Activation::Relu));
    let t = f.training.as_ref().unwrap();
    assert_eq!(t.loss, TrainLoss::KvMse);
    assert!(
        t.best_epoch.iter().any(|&e| e > 0),
        "training improved on the initial weights somewhere: {:?}",
        t.best_epoch
    );
}

/// The map of one target layer computed by hand in f64 from the stored weights: the ridge
/// product, plus (or replaced by) the head.
fn by_hand(x: &[f32], weight: &[f32], bias: &[f32], head: &Head) -> Vec<f64> {
    let cols = bias.len();
    let rows = x.len();
    let linear: Vec<f64> = (0..cols)
        .map(|c| {
            f64::from(bias[c])
                + (0..rows)
                    .map(|r| f64::from(x[r]) * f64::from(weight[r * cols + c]))
                    .sum::<f64>()
        })
        .collect();
    let mut z: Vec<f64> = x
        .iter()
        .zip(&head.in_mean)
        .zip(&head.in_scale)
        .map(|((x, m), s)| (f64::from(*x) - f64::from(*m)) * f64::from(*s))
        .collect();
    for (i, l) in head.layers.iter().enumerate() {
        let mut out: Vec<f64> = (0..l.cols)
            .map(|c| {
                f64::from(l.bias[c])
                    + (0..l.rows)
                        .map(|r| z[r] * f64::from(l.weight[r * l.cols + c]))
                        .sum::<f64>()
            })
            .collect();
        if i + 1 < head.layers.len() {
            for o in &mut out {
                *o = match head.activation {
                    Activation::Relu => o.max(0.0),
                    Activation::Gelu => {
                        0.5 * *o
                            * (1.0
                                + ((2.0 / std::f64::consts::PI).sqrt()
                                    * (*o + 0.044715 * o.powi(3)))
                                .tanh())
                    }
                };
            }
        }
        z = out;
    }
    let net: Vec<f64> = z
        .iter()
        .zip(&head.out_scale)
        .zip(&head.out_mean)
        .map(|((z, s), m)| z * f64::from(*s) + f64::from(*m))
        .collect();
    match head.used {
        HeadUse::Added => linear.iter().zip(&net).map(|(a, b)| a + b).collect(),
        HeadUse::Alone => net,
    }
}

#[test]
fn a_trained_mapper_is_stored_read_back_whole_and_maps_as_its_weights_say() {
    let (_d, tiny, a, b) = pair();
    for kind in [MapperKind::Residual, MapperKind::Mlp] {
        let f = fit(&a, &b, &tiny, &opts(kind, TrainLoss::Attention, 2));
        let dir = tempfile::tempdir().unwrap();
        let path = save(&f, &a, &b, dir.path());
        let art = artifact::load(&path).unwrap();
        assert_eq!(art.meta.kind, kind);
        assert_eq!(art.meta.version, artifact::VERSION);
        assert_eq!(art.heads, f.heads, "{kind}: heads read back bit for bit");
        assert!(art.meta.summary_line().contains(&format!("{kind} mapper")));
        assert!(art.meta.list_line(&path).contains(kind.name()));
        // `baton mappers --mapper-dir` lists a directory apart from the cache's, by kind.
        let listed = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["mappers", "--json", "--mapper-dir"])
            .arg(dir.path())
            .env("BATON_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap();
        assert!(listed.status.success(), "{listed:?}");
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        assert_eq!(
            listed["mappers"][0]["meta"]["kind"].as_str(),
            Some(kind.name()),
            "{listed}"
        );

        // Mapping a fresh window: each target layer's output against the hand forward.
        let ids: Vec<u32> = a.tokenizer.encode(&tiny.text(60, 99)).unwrap();
        let cache = prefill(&a, &ids);
        let mapper = art
            .cache_mapper(&a, &b)
            .unwrap()
            .with_precision(MapPrecision::F32)
            .unwrap();
        assert!(mapper.has_heads());
        // The cost `baton bench` reports counts the heads, and no ridge product where an
        // mlp replaces it.
        let heads = art.heads.as_ref().unwrap();
        let head_macs: usize = heads
            .keys
            .iter()
            .chain(&heads.values)
            .flat_map(|h| &h.layers)
            .map(|l| l.rows * l.cols)
            .sum();
        let ridge_macs: usize = art
            .keys
            .iter()
            .chain(&art.values)
            .map(|m| m.weight.len())
            .sum();
        let cost = baton::lab::bench::mapper_cost(&mapper).flops_per_token;
        let alone = baton::lab::bench::mapper_cost(&mapper.clone().without_heads().unwrap())
            .flops_per_token;
        let expected = match kind {
            MapperKind::Mlp => alone + 2.0 * (head_macs as f64 - ridge_macs as f64),
            _ => alone + 2.0 * head_macs as f64,
        };
        assert_eq!(cost, expected, "{kind}");
        let inputs = mapper
            .layer_inputs(&cache, &ids, a.decoder.rope(), 0, ids.len())
            .unwrap();
        let mapped = mapper
            .map_range(
                &cache,
                &ids,
                a.decoder.rope(),
                b.decoder.rope(),
                0,
                ids.len(),
            )
            .unwrap();
        for (j, layer) in mapped.iter().enumerate() {
            // Values carry no rotation: compare them directly, row by row.
            let v = baton::mapper::features::heads_to_rows(&layer.v).unwrap();
            let got = v.to_vec2::<f32>().unwrap();
            let x = inputs[j].1.to_vec2::<f32>().unwrap();
            let m = &art.values[j];
            for (row, xr) in x.iter().enumerate() {
                let want = by_hand(xr, &m.weight, &m.bias, &heads.values[j]);
                for (c, w) in want.iter().enumerate() {
                    let g = f64::from(got[row][c]);
                    assert!(
                        (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{kind} layer {j} row {row} col {c}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// The artifact at `path` rewritten as version 1 wrote it: no kind, version 1.
fn as_version_1(path: &std::path::Path) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let baton = header["__metadata__"]["baton"]
        .as_str()
        .unwrap()
        .to_string();
    let mut meta: serde_json::Value = serde_json::from_str(&baton).unwrap();
    meta["version"] = 1.into();
    meta.as_object_mut().unwrap().remove("kind");
    meta.as_object_mut().unwrap().remove("training");
    header["__metadata__"]["baton"] = meta.to_string().into();
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_version_1_artifact_still_loads_as_a_ridge_mapper() {
    let (_d, tiny, a, b) = pair();
    let f = fit(
        &a,
        &b,
        &tiny,
        &opts(MapperKind::Ridge, TrainLoss::Attention, 0),
    );
    assert!(f.heads.is_none() && f.training.is_none());
    let dir = tempfile::tempdir().unwrap();
    let path = &save(&f, &a, &b, dir.path());
    let before = artifact::load(path).unwrap();
    as_version_1(path);
    let art = artifact::load(path).unwrap();
    assert_eq!((art.meta.version, art.meta.kind), (1, MapperKind::Ridge));
    assert!(art.heads.is_none());
    assert_eq!(art.keys, before.keys);
    assert!(art.meta.list_line(path).contains("ridge"));
}

#[test]
fn widths_trained_side_by_side_keep_the_best_held_out_and_train_as_each_would_alone() {
    let (_d, tiny, a, b) = pair();
    let with = |hidden: Vec<Vec<usize>>| {
        let mut o = opts(MapperKind::Residual, TrainLoss::Attention, 5);
        o.train.hidden = hidden;
        o.train.patience = 1;
        fit(&a, &b, &tiny, &o)
    };
    let both = with(vec![vec![2], vec![32]]);
    let t = both.training.as_ref().unwrap();
    assert_eq!(t.candidates.len(), 2);
    let best = t
        .candidates
        .iter()
        .min_by(|x, y| x.heldout.total_cmp(&y.heldout))
        .unwrap();
    assert_eq!(t.hidden, best.hidden);
    assert!((mean(&t.heldout_trained) - best.heldout).abs() < 1e-12);
    let heads = both.heads.as_ref().unwrap();
    assert!(heads.keys.iter().all(|h| h.hidden() == best.hidden));
    // Sharing the windows changes nothing in a width's training: alone it ends with the
    // same held-out loss and, when it is the one kept, the same weights.
    for c in &t.candidates {
        let alone = with(vec![c.hidden.clone()]);
        let ta = alone.training.as_ref().unwrap();
        assert_eq!(ta.candidates.len(), 1);
        assert_eq!(ta.candidates[0], *c);
        if c.hidden == best.hidden {
            assert_eq!(alone.heads, both.heads);
        }
    }
}

#[test]
fn trained_heads_run_on_the_int8_kernels_within_quantization_of_f32() {
    let (_d, tiny, a, b) = pair();
    for kind in [MapperKind::Residual, MapperKind::Mlp] {
        let mut o = opts(kind, TrainLoss::Attention, 3);
        // Widths the int8 kernels take (multiples of 32).
        o.train.hidden = vec![vec![32; kind.architecture().unwrap().0.len()]];
        o.train.epochs = 4;
        let f = fit(&a, &b, &tiny, &o);
        let int8 = f.cache_mapper(&a, &b).unwrap();
        assert!(int8.has_heads());
        if !common::int8_or_skipped(&int8, "trained heads on int8 against f32") {
            return;
        }
        assert_eq!(int8.precision(), MapPrecision::Int8, "{kind}");
        let f32m = int8.clone().with_precision(MapPrecision::F32).unwrap();
        let ids: Vec<u32> = a.tokenizer.encode(&tiny.text(70, 98)).unwrap();
        let cache = prefill(&a, &ids);
        let (ra, rb) = (a.decoder.rope(), b.decoder.rope());
        // A residual head is a small correction on the ridge map: compare what the head
        // adds, or a fault in it would hide under the ridge map's share.
        let ridge = int8.clone().without_heads().unwrap();
        let ridge32 = ridge.clone().with_precision(MapPrecision::F32).unwrap();
        let run = |m: &baton::mapper::CacheMapper, start: usize| {
            m.map_range(&cache, &ids, ra, rb, start, ids.len()).unwrap()
        };
        for start in [0, 23] {
            let (x, y) = (run(&int8, start), run(&f32m, start));
            let (x0, y0) = (run(&ridge, start), run(&ridge32, start));
            for l in 0..x.len() {
                for (s, t, s0, t0) in [
                    (&x[l].k, &y[l].k, &x0[l].k, &y0[l].k),
                    (&x[l].v, &y[l].v, &x0[l].v, &y0[l].v),
                ] {
                    let (s, t) = match kind {
                        MapperKind::Mlp => (s.clone(), t.clone()),
                        _ => ((s - s0).unwrap(), (t - t0).unwrap()),
                    };
                    let err = (&s - &t).unwrap().sqr().unwrap().sum_all().unwrap();
                    let norm = t.sqr().unwrap().sum_all().unwrap();
                    let (err, norm) = (
                        err.to_scalar::<f32>().unwrap(),
                        norm.to_scalar::<f32>().unwrap(),
                    );
                    // A layer whose head never beat the ridge map keeps a zero last layer:
                    // nothing added on either path.
                    let rel = if norm == 0.0 {
                        err.sqrt()
                    } else {
                        (err / norm).sqrt()
                    };
                    // Q8_0 keeps about two significant digits: measured here up to 0.009
                    // (residual heads) and 0.021 (mlp); a head packed without its feature
                    // means moved into the bias gave 0.084.
                    assert!(
                        rel < 0.04,
                        "{kind} layer {l} from {start}: relative error {rel}"
                    );
                }
            }
        }
    }
}
