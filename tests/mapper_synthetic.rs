//! The mapper on tiny models generated here: mapping a model to itself is near exact, a
//! target whose KV cache is a known linear function of the source's is recovered, the
//! artifact round-trips and refuses other models, and a cancel leaves nothing behind.

#![allow(clippy::needless_range_loop)] // layers index several parallel tables

mod common;

use common::prefill;

use baton::calibrate::{
    calibrate, CalibrateError, CalibrateOptions, Direction, Fitted, NoProgress, SelectBy,
};
use baton::data::corpus::Document;
use baton::mapper::artifact::{self, CorpusInfo, MapperMeta, ModelRef};
use baton::model::Model;
use candle_core::{Device, Tensor};
use common::synthetic::{model_pair, Tiny};
use std::sync::atomic::AtomicBool;

fn docs(tiny: &Tiny) -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny.text(4000, 11 + i)))
        .collect()
}

fn opts(k: Vec<usize>) -> CalibrateOptions {
    CalibrateOptions {
        sequences: 8,
        seq_len: 64,
        stride: 1,
        select_sequences: 3,
        probes: 8,
        k_sweep: k,
        lambdas: vec![0.01],
        max_k: usize::MAX,
        k_tolerance: 0.0,
        standardize: true,
        skip_first: 0,
        rank: None,
        select_by: SelectBy::Cosine,
        chat_share: 0.0,
        token_features: baton::calibrate::TokenFeatures::Off,
        key_gain: 1.0,
        key_gain_matched: false,
        value_gain: 1.0,
        ..CalibrateOptions::default()
    }
}

fn forward(
    a: &Model,
    b: &Model,
    tiny: &Tiny,
    o: &CalibrateOptions,
) -> Result<Fitted, CalibrateError> {
    let mut f = calibrate(
        a,
        b,
        &docs(tiny),
        &[Direction::Forward],
        o,
        &NoProgress,
        &AtomicBool::new(false),
    )?;
    Ok(f.remove(0))
}

fn run(a: &Model, b: &Model, k: Vec<usize>, tiny: &Tiny) -> Fitted {
    forward(a, b, tiny, &opts(k)).unwrap()
}

/// Two tiny models of one shape with different weights: no source layer explains a
/// target layer exactly.
fn two_unrelated_models() -> (tempfile::TempDir, Tiny, Model, Model) {
    let tiny = Tiny::new("llama");
    let (dir, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    (dir, tiny, a, b)
}

/// One tiny model written and loaded twice, as a source and a target.
fn same_model_twice() -> (tempfile::TempDir, Tiny, Model, Model) {
    let tiny = Tiny::new("llama");
    let w = tiny.weights(3);
    let (dir, a, b) = model_pair(&tiny, &w, &w);
    (dir, tiny, a, b)
}

#[test]
fn mapping_a_model_to_itself_with_all_layers_is_near_exact() {
    let (_dir, tiny, a, b) = same_model_twice();
    let f = run(&a, &b, vec![usize::MAX], &tiny);
    let r = &f.report;
    eprintln!("R² K {:?} V {:?} cosine {:?}", r.r2_k, r.r2_v, r.cosine);
    assert!(
        r.r2_k.iter().chain(&r.r2_v).all(|&x| x > 0.999),
        "{:?} {:?}",
        r.r2_k,
        r.r2_v
    );
    assert!(r.cosine.iter().all(|&c| c > 0.999), "{:?}", r.cosine);
    // The target continues from the mapped prefix as from its own.
    let agreement = r.agreement.expect("held-out agreement is measured");
    assert!(agreement.positions > 0);
    assert!(agreement.top1 > 0.99, "{agreement:?}");
    assert!(agreement.kl < 1e-3, "{agreement:?}");
}

#[test]
fn selecting_by_agreement_chooses_the_point_the_continuations_prefer() {
    let (_dir, tiny, a, b) = two_unrelated_models();
    let fit = |select_by: SelectBy| {
        let o = CalibrateOptions {
            select_by,
            ..opts(vec![1, 2, usize::MAX])
        };
        forward(&a, &b, &tiny, &o).unwrap()
    };
    let f = fit(SelectBy::Agreement);
    let r = &f.report;
    eprintln!("{:?}", r.sweep);
    let top1 = |p: &baton::calibrate::SweepPoint| p.agreement.unwrap().top1;
    let best = r
        .sweep
        .iter()
        .max_by(|x, y| top1(x).total_cmp(&top1(y)))
        .unwrap();
    let chosen = r.sweep.iter().find(|p| p.k == f.k).unwrap();
    assert_eq!(top1(chosen), top1(best), "{:?}", r.sweep);
    assert_eq!(r.agreement, chosen.agreement);
    // Unrelated models: the mapped continuations do disagree somewhere.
    assert!(r.sweep.iter().all(|p| top1(p) < 1.0), "{:?}", r.sweep);
    // By cosine the same sweep is scored alike and the cosine's best is chosen.
    let c = fit(SelectBy::Cosine);
    let best_cos = c
        .report
        .sweep
        .iter()
        .max_by(|x, y| x.cosine.total_cmp(&y.cosine))
        .unwrap();
    assert_eq!(c.k, best_cos.k);
    for (x, y) in c.report.sweep.iter().zip(&r.sweep) {
        assert_eq!(x.agreement, y.agreement);
    }
}

#[test]
fn k_above_the_cap_is_swept_and_reported_but_not_chosen() {
    // Two unrelated models: one source layer explains a target layer less well than all.
    let (_dir, tiny, a, b) = two_unrelated_models();
    let all = a.config().n_layer;
    let fit = |max_k: usize, k_tolerance: f64| {
        let o = CalibrateOptions {
            max_k,
            k_tolerance,
            ..opts(vec![1, usize::MAX])
        };
        forward(&a, &b, &tiny, &o).unwrap()
    };
    let capped = fit(1, 0.0);
    let r = &capped.report;
    eprintln!("{:?}", r.sweep);
    assert_eq!(capped.k, 1);
    assert_eq!(r.sweep.len(), 2, "both k are swept: {:?}", r.sweep);
    let above = r
        .best_above_max_k
        .as_ref()
        .expect("the better k is reported");
    assert_eq!(above.k, all);
    let one = r.sweep.iter().find(|p| p.k == 1).unwrap();
    assert!(above.cosine > one.cosine + 0.01, "{:?}", r.sweep);
    assert_eq!(r.max_k, Some(1));

    // Without a cap the best wins; with a tolerance wider than the gap the cheaper k
    // wins, and its report is that of the k actually fitted.
    assert_eq!(fit(usize::MAX, 0.0).k, all);
    let tolerant = fit(usize::MAX, 1.0);
    assert_eq!(tolerant.k, 1);
    let mean = tolerant.report.cosine.iter().sum::<f64>() / tolerant.report.cosine.len() as f64;
    assert!((mean - one.cosine).abs() < 1e-6, "{mean} vs {}", one.cosine);
    assert!(tolerant.report.best_above_max_k.is_none());
}

#[test]
fn a_mapper_fitted_behind_an_anchor_skips_the_first_positions() {
    let (_dir, tiny, a, b) = same_model_twice();
    let fit = |skip_first: usize| {
        let o = CalibrateOptions {
            skip_first,
            ..opts(vec![usize::MAX])
        };
        forward(&a, &b, &tiny, &o)
    };
    let f = fit(2).unwrap();
    assert_eq!(f.report.skip_first, 2);
    // Two positions fewer per window at stride 1.
    let plain = fit(0).unwrap();
    assert_eq!(
        plain.report.observations - f.report.observations,
        2 * plain.report.sequences as u64
    );
    assert!(
        f.report.cosine.iter().all(|&c| c > 0.999),
        "{:?}",
        f.report.cosine
    );
    match fit(8) {
        Err(e) => assert!(e.to_string().contains("--skip-first 8"), "{e}"),
        Ok(_) => panic!("a skip past the first probe was accepted"),
    }
}

#[test]
fn a_known_linear_relation_between_caches_is_recovered() {
    // The target is the source re-parameterised: keys of layer l scaled by c_l (queries by
    // 1/c_l, which commutes with RoPE), values of each KV head multiplied by an invertible
    // matrix M (undone in the output projection). It computes the same function, and its
    // cache is exactly K_t = c_l K_s, V_t = M V_s per layer.
    let tiny = Tiny::new("llama");
    let src_w = tiny.weights(5);
    let mut tgt_w = src_w.clone();
    let dev = Device::Cpu;
    let hd = tiny.head_dim;
    let group = tiny.n_head / tiny.n_kv_head;
    let m = (Tensor::eye(hd, candle_core::DType::F32, &dev).unwrap() * 1.5)
        .unwrap()
        .broadcast_add(&(Tensor::randn(0f32, 0.2, (hd, hd), &dev).unwrap()))
        .unwrap();
    // Inverse through the normal equations: small and well conditioned.
    let m_inv = {
        let a: Vec<Vec<f32>> = m.to_vec2().unwrap();
        invert(&a)
    };
    let m_inv = Tensor::new(m_inv, &dev).unwrap();
    let scales = [2.0f64, 0.5];
    for l in 0..tiny.n_layer {
        let p = format!("model.layers.{l}.self_attn");
        let c = scales[l];
        let k = (&src_w[&format!("{p}.k_proj.weight")] * c).unwrap();
        let q = (&src_w[&format!("{p}.q_proj.weight")] / c).unwrap();
        tgt_w.insert(format!("{p}.k_proj.weight"), k);
        tgt_w.insert(format!("{p}.q_proj.weight"), q);
        let v = &src_w[&format!("{p}.v_proj.weight")];
        let heads: Vec<Tensor> = (0..tiny.n_kv_head)
            .map(|h| m.matmul(&v.narrow(0, h * hd, hd).unwrap()).unwrap())
            .collect();
        tgt_w.insert(
            format!("{p}.v_proj.weight"),
            Tensor::cat(&heads, 0).unwrap(),
        );
        let o = &src_w[&format!("{p}.o_proj.weight")];
        let cols: Vec<Tensor> = (0..tiny.n_head)
            .map(|h| {
                let _ = h / group;
                o.narrow(1, h * hd, hd).unwrap().matmul(&m_inv).unwrap()
            })
            .collect();
        tgt_w.insert(format!("{p}.o_proj.weight"), Tensor::cat(&cols, 1).unwrap());
    }
    let (_dir, s, t) = model_pair(&tiny, &src_w, &tgt_w);
    let f = run(&s, &t, vec![1], &tiny);
    let r = &f.report;
    eprintln!("R² K {:?} V {:?} cosine {:?}", r.r2_k, r.r2_v, r.cosine);
    for j in 0..tiny.n_layer {
        assert_eq!(
            f.keys[j].sources,
            vec![j],
            "target layer {j} keys come from source layer {j}"
        );
        assert_eq!(f.values[j].sources, vec![j]);
        // Keys: W = c·I on each feature.
        let width = tiny.n_kv_head * hd;
        let w = &f.keys[j].weight;
        let mut worst = 0f32;
        for a in 0..width {
            for b in 0..width {
                let want = if a == b { scales[j] as f32 } else { 0.0 };
                worst = worst.max((w[a * width + b] - want).abs());
            }
        }
        assert!(worst < 1e-3, "layer {j}: key map is off by {worst}");
    }
    assert!(
        r.r2_k.iter().chain(&r.r2_v).all(|&x| x > 0.9999),
        "{:?} {:?}",
        r.r2_k,
        r.r2_v
    );
    assert!(r.cosine.iter().all(|&c| c > 0.9999), "{:?}", r.cosine);
}

fn invert(a: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let n = a.len();
    let mut m: Vec<Vec<f64>> = a
        .iter()
        .map(|r| r.iter().map(|&x| x as f64).collect())
        .collect();
    let mut inv: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| if i == j { 1.0 } else { 0.0 }).collect())
        .collect();
    for c in 0..n {
        let p = (c..n)
            .max_by(|&x, &y| m[x][c].abs().total_cmp(&m[y][c].abs()))
            .unwrap();
        m.swap(c, p);
        inv.swap(c, p);
        let d = m[c][c];
        for j in 0..n {
            m[c][j] /= d;
            inv[c][j] /= d;
        }
        for r in 0..n {
            if r != c {
                let f = m[r][c];
                for j in 0..n {
                    m[r][j] -= f * m[c][j];
                    inv[r][j] -= f * inv[c][j];
                }
            }
        }
    }
    inv.into_iter()
        .map(|r| r.into_iter().map(|x| x as f32).collect())
        .collect()
}

#[test]
fn artifact_round_trips_and_refuses_other_models() {
    let tiny = Tiny::new("qwen2");
    let (dir, a, b) = model_pair(&tiny, &tiny.weights(1), &tiny.weights(2));
    let f = run(&a, &b, vec![1, 2], &tiny);
    let (sr, tr) = (
        ModelRef::new(&a.identity, a.config()),
        ModelRef::new(&b.identity, b.config()),
    );
    let meta = MapperMeta {
        format: artifact::FORMAT.into(),
        version: artifact::VERSION,
        direction: "a -> b".into(),
        source: sr.clone(),
        target: tr.clone(),
        k: f.k,
        lambda: f.lambda,
        standardize: f.standardize,
        rank: None,
        key_sources: f.keys.iter().map(|m| m.sources.clone()).collect(),
        value_sources: f.values.iter().map(|m| m.sources.clone()).collect(),
        token_features: false,
        kind: Default::default(),
        training: None,
        corpus: CorpusInfo {
            files: "synthetic".into(),
            fingerprint: "x".into(),
            sequences: 8,
            seq_len: 64,
            observations: f.report.observations,
        },
        report: f.report.clone(),
        created_unix: 0,
        baton_version: "test".into(),
        id: "test".into(),
    };
    let files = baton::mapper::dir::MapperDir::named(dir.path().join("mappers")).pair(&sr, &tr);
    let path = files.artifact();
    let maps = artifact::Maps {
        heads: None,
        keys: &f.keys,
        values: &f.values,
        source_scales: &f.source_scales,
    };
    artifact::save(maps, &meta, &path, &files.readable()).unwrap();
    assert!(files.readable().is_file());
    // Damaged copies of it are read or refused, never a panic; the damage lands in the
    // length prefix and the JSON header, where the reader is led by the file.
    let seed = std::fs::read(&path).unwrap();
    let fuzzed = dir.path().join("fuzzed.safetensors");
    let read = |b: &[u8]| {
        std::fs::write(&fuzzed, b).unwrap();
        artifact::load(&fuzzed).is_ok()
    };
    common::fuzz::fuzz("mapper artifact", &seed, 4096, common::fuzz::cases(), &read);
    let back = artifact::load(&path).unwrap();
    for (x, y) in f
        .keys
        .iter()
        .zip(&back.keys)
        .chain(f.values.iter().zip(&back.values))
    {
        assert_eq!(x.sources, y.sources);
        assert_eq!(x.weight, y.weight);
        assert_eq!(x.bias, y.bias);
    }
    assert_eq!(back.source_scales.as_ref(), Some(&f.source_scales));
    back.check(&sr, &tr).unwrap();
    // Swapped direction: the source is not the model the mapper was made for.
    let err = back.check(&tr, &sr).unwrap_err().to_string();
    assert!(
        err.contains("source model") && err.contains("baton calibrate"),
        "{err}"
    );
    // Same weights, other tokenizer (on both sides, so the pair itself is one family).
    let (mut s2, mut t2) = (sr.clone(), tr.clone());
    s2.tokenizer_fingerprint = "0".repeat(64);
    t2.tokenizer_fingerprint = "0".repeat(64);
    let err = back.check(&s2, &t2).unwrap_err().to_string();
    assert!(err.contains("source tokenizer"), "{err}");
    // A pair whose tokenizers differ: no calibration could help, and the error says so
    // instead of suggesting one.
    let err = back.check(&sr, &t2).unwrap_err().to_string();
    assert!(err.contains("different tokenizers"), "{err}");
    assert!(!err.contains("baton calibrate"), "{err}");
    // Numbers that are not numbers: refused with the tensor's name, never applied.
    for (name, bad) in [
        ("keys.1.weight", f32::NAN),
        ("values.0.bias", f32::INFINITY),
        ("source.key_std", f32::NAN),
    ] {
        let poisoned = dir.path().join("poisoned.safetensors");
        std::fs::copy(&path, &poisoned).unwrap();
        common::poison_tensor(&poisoned, name, 3, &bad.to_le_bytes());
        let e = artifact::load(&poisoned)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains(&format!("`{name}`")) && e.contains("not a finite number"),
            "{e}"
        );
        assert!(e.contains("baton calibrate"), "{e}");
        std::fs::remove_file(&poisoned).unwrap();
    }
    // A file that is not an artifact.
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"not safetensors").unwrap();
    assert!(artifact::load(&junk).is_err());
    assert_eq!(
        baton::mapper::dir::MapperDir::named(dir.path().join("mappers"))
            .list()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_cancelled_calibration_returns_cancelled() {
    let tiny = Tiny::new("qwen3");
    let (_dir, a, b) = model_pair(&tiny, &tiny.weights(1), &tiny.weights(2));
    let e = calibrate(
        &a,
        &b,
        &docs(&tiny),
        &[Direction::Forward],
        &opts(vec![1]),
        &NoProgress,
        &AtomicBool::new(true),
    );
    assert!(matches!(e, Err(CalibrateError::Cancelled)));
}

#[test]
fn task_retention_of_a_model_mapped_to_itself_is_complete() {
    use baton::data::tasks::{task_def, Choice, TaskItem};
    use baton::lab::eval::tasks::{eval_task, TaskEvalOptions};
    let (_dir, tiny, a, b) = same_model_twice();
    let f = run(&a, &b, vec![usize::MAX], &tiny);
    let mapper = f.cache_mapper(&a, &b).unwrap();
    // A few-shot block shared by every context exercises the shared-prefix path.
    let shots = tiny.text(30, 5);
    let items: Vec<TaskItem> = (0..6u64)
        .map(|i| TaskItem::MultipleChoice {
            doc_id: i,
            choices: (0..3u64)
                .map(|c| Choice {
                    context: format!("{shots} {}", tiny.text(8, 100 + i)),
                    continuation: format!(" {}", tiny.text(3, 200 + 10 * i + c)),
                })
                .collect(),
            gold: (i % 3) as usize,
        })
        .collect();
    let def = task_def("arc_challenge").unwrap();
    let r = eval_task(
        &a,
        &b,
        &mapper,
        def,
        &items,
        &TaskEvalOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.items, 6);
    assert_eq!(r.answer_agreement, 1.0, "{:?}", r.outcomes);
    assert_eq!(r.accuracy_reference.value, r.accuracy_mapped.value);

    let gen: Vec<TaskItem> = (0..2u64)
        .map(|i| TaskItem::Generate {
            doc_id: i,
            context: format!("{shots} {}", tiny.text(6, 300 + i)),
            stop: vec!["\n\n".into()],
            max_tokens: 6,
            answer: "1".into(),
        })
        .collect();
    let def = task_def("gsm8k").unwrap();
    let r = eval_task(
        &a,
        &b,
        &mapper,
        def,
        &gen,
        &TaskEvalOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    assert!(
        r.outcomes
            .iter()
            .all(|o| o.identical_generation == Some(true)),
        "{:?}",
        r.outcomes
    );
}

#[test]
fn a_context_the_target_rereads_whole_matches_its_own_prefill() {
    use baton::data::tasks::{task_def, TaskItem};
    use baton::lab::eval::tasks::{eval_task, TaskEvalOptions};
    // Unrelated models and one source layer per target layer: a poor map, so only the
    // target's own reading of the context can make the two paths agree.
    let (_dir, tiny, a, b) = two_unrelated_models();
    let mapper = run(&a, &b, vec![1], &tiny).cache_mapper(&a, &b).unwrap();
    let shots = tiny.text(30, 5);
    let gen: Vec<TaskItem> = (0..3u64)
        .map(|i| TaskItem::Generate {
            doc_id: i,
            context: format!("{shots} {}", tiny.text(6, 300 + i)),
            stop: vec![],
            max_tokens: 8,
            answer: "1".into(),
        })
        .collect();
    let def = task_def("gsm8k").unwrap();
    let eval = |anchor: usize, tail: usize| {
        let o = TaskEvalOptions {
            anchor,
            tail,
            ..TaskEvalOptions::default()
        };
        eval_task(&a, &b, &mapper, def, &gen, &o, &mut |_| {})
    };
    let whole = eval(2, 10_000).unwrap();
    assert!(
        whole
            .outcomes
            .iter()
            .all(|o| o.identical_generation == Some(true)),
        "{:?}",
        whole.outcomes
    );
    let texts = whole.outcomes[0].generations.as_ref().unwrap();
    assert_eq!(texts.reference, texts.mapped);
    // The mapped path without the re-read differs somewhere, or the test shows nothing.
    let mapped = eval(0, 0).unwrap();
    assert!(
        mapped
            .outcomes
            .iter()
            .any(|o| o.identical_generation == Some(false)),
        "{:?}",
        mapped.outcomes
    );
    let err = eval(100_000, 0).unwrap_err().to_string();
    assert!(err.contains("--anchor"), "{err}");
}

#[test]
fn the_int8_map_agrees_with_the_f32_map() {
    for token_features in [false, true] {
        int8_agrees_with_f32(token_features);
    }
}

/// With `token_features`, every map also reads the target's layer-0 block, which both
/// paths compute from the token ids.
fn int8_agrees_with_f32(token_features: bool) {
    use baton::mapper::MapPrecision;
    let (_dir, tiny, a, b) = same_model_twice();
    let o = CalibrateOptions {
        token_features: if token_features {
            baton::calibrate::TokenFeatures::All
        } else {
            baton::calibrate::TokenFeatures::Off
        },
        ..opts(vec![2])
    };
    let f = forward(&a, &b, &tiny, &o).unwrap();
    let int8 = f.cache_mapper(&a, &b).unwrap();
    assert_eq!(int8.reads_tokens(), token_features);
    if !common::int8_or_skipped(&int8, "the int8-against-f32 comparison") {
        return;
    }
    assert_eq!(int8.precision(), MapPrecision::Int8);
    let f32m = int8.clone().with_precision(MapPrecision::F32).unwrap();
    assert_eq!(f32m.precision(), MapPrecision::F32);
    let ids = a.tokenizer.encode_raw(&tiny.text(90, 11)).unwrap();
    let cache = prefill(&a, &ids);
    let (ra, rb) = (a.decoder.rope(), b.decoder.rope());
    // The same maps as a rank-D_t product W·I run the factored int8 path (two products).
    let factored = |maps: &[baton::mapper::LayerMap]| -> Vec<baton::mapper::LayerMap> {
        maps.iter()
            .map(|m| {
                let dt = m.bias.len();
                let mut eye = vec![0f32; dt * dt];
                for i in 0..dt {
                    eye[i * dt + i] = 1.0;
                }
                let mut m = m.clone();
                m.factors = Some(baton::mapper::ridge::Factors {
                    rank: dt,
                    left: m.weight.clone(),
                    right: eye,
                });
                m
            })
            .collect()
    };
    let int8_factored = baton::mapper::CacheMapper::from_layer_maps(
        &a,
        &b,
        &factored(&f.keys),
        &factored(&f.values),
        Some(&f.source_scales),
    )
    .unwrap();
    assert_eq!(int8_factored.precision(), MapPrecision::Int8);
    // The whole-cache path writes straight into the new cache's buffers.
    let c8 = int8.map_cache(&cache, &ids, ra, rb).unwrap();
    let c32 = f32m.map_cache(&cache, &ids, ra, rb).unwrap();
    assert_eq!(c8.len(), ids.len());
    for l in 0..b.decoder.kv_shape().n_layer {
        let (p, q) = (c8.layer(l).unwrap(), c32.layer(l).unwrap());
        for (s, t) in [(&p.k, &q.k), (&p.v, &q.v)] {
            let err = (s - t).unwrap().sqr().unwrap().sum_all().unwrap();
            let norm = t.sqr().unwrap().sum_all().unwrap();
            let rel = (err.to_scalar::<f32>().unwrap() / norm.to_scalar::<f32>().unwrap()).sqrt();
            assert!(rel < 0.03, "whole cache, layer {l}: relative error {rel}");
        }
    }
    // A suffix starting mid-cache exercises the positions of both rotations.
    for (start, end, int8) in [
        (0, ids.len(), &int8),
        (37, ids.len(), &int8),
        (0, ids.len(), &int8_factored),
    ] {
        let x = int8.map_range(&cache, &ids, ra, rb, start, end).unwrap();
        let y = f32m.map_range(&cache, &ids, ra, rb, start, end).unwrap();
        for (l, (p, q)) in x.iter().zip(&y).enumerate() {
            for (name, s, t) in [("K", &p.k, &q.k), ("V", &p.v, &q.v)] {
                assert_eq!(s.dims(), t.dims());
                let err = (s - t).unwrap().sqr().unwrap().sum_all().unwrap();
                let norm = t.sqr().unwrap().sum_all().unwrap();
                let rel =
                    (err.to_scalar::<f32>().unwrap() / norm.to_scalar::<f32>().unwrap()).sqrt();
                // Q8_0 keeps ~2 significant digits per value; 3% is a few quantization
                // steps, far below the mapping error itself (R² 0.7 ≈ 55% relative).
                assert!(
                    rel < 0.03,
                    "{start}..{end} layer {l} {name}: relative error {rel}"
                );
            }
        }
    }
}

#[test]
fn a_text_evaluation_with_the_whole_prefix_as_tail_is_the_targets_own_reading() {
    use baton::data::corpus::{windows, Split};
    use baton::lab::eval::text::{eval_text, TextEvalOptions};
    let (_dir, tiny, a, b) = two_unrelated_models();
    let f = run(&a, &b, vec![1], &tiny);
    let mapper = f.cache_mapper(&a, &b).unwrap();
    let w = windows(&docs(&tiny), &a.tokenizer, Split::Whole, 48, 2).unwrap();
    let eval = |tail: usize| {
        eval_text(
            &a,
            &b,
            &mapper,
            &w,
            &TextEvalOptions {
                prefix: 32,
                continuation: 16,
                probes: 8,
                anchor: 0,
                tail,
                reread: None,
            },
        )
        .unwrap()
    };
    let own = eval(32);
    assert!(own.scores.agreement.top1 > 0.999, "{:?}", own.scores);
    assert!(own.scores.agreement.kl < 1e-6, "{:?}", own.scores);
    let mapped = eval(0);
    assert!(
        mapped.scores.agreement.kl > own.scores.agreement.kl,
        "{:?}",
        mapped.scores
    );
}

#[test]
fn a_k_past_the_source_layer_count_is_refused_before_any_capture() {
    let (_dir, tiny, a, b) = two_unrelated_models();
    let e = forward(&a, &b, &tiny, &opts(vec![1, tiny.n_layer + 5]))
        .err()
        .expect("refused");
    let msg = e.to_string();
    assert!(matches!(e, CalibrateError::Options(_)), "{msg}");
    assert!(
        msg.contains(&format!("--k {}", tiny.n_layer + 5)) && msg.contains("`all`"),
        "{msg}"
    );
    // `all` is every layer, not a number past them.
    assert!(forward(&a, &b, &tiny, &opts(vec![usize::MAX])).is_ok());
}

#[test]
fn the_layer_zero_of_the_tokens_is_the_layer_zero_of_a_prefill() {
    use baton::mapper::features::layer_features;
    let tiny = Tiny::new("qwen2");
    let (_dir, a, _b) = model_pair(&tiny, &tiny.weights(1), &tiny.weights(2));
    let ids = a.tokenizer.encode_raw(&tiny.text(60, 5)).unwrap();
    let cache = prefill(&a, &ids);
    let own = layer_features(&cache, a.decoder.rope(), 0, 0, ids.len(), 1).unwrap();
    let lz = baton::model::LayerZero::of(&a.decoder).unwrap();
    let (k, v) = lz.features(&ids).unwrap();
    // The cache's keys went through RoPE and back: rounding only.
    for (name, x, y) in [("K", &k, &own.k), ("V", &v, &own.v)] {
        assert_eq!(x.dims(), y.dims());
        let err = (x - y).unwrap().abs().unwrap().max_all().unwrap();
        let err = err.to_scalar::<f32>().unwrap();
        assert!(err < 1e-4, "{name}: {err}");
    }
}

#[test]
fn with_token_features_the_targets_layer_zero_comes_out_exact() {
    use baton::calibrate::TokenFeatures;
    for by in [TokenFeatures::Cosine, TokenFeatures::R2] {
        layer_zero_exact(by);
    }
}

fn layer_zero_exact(by: baton::calibrate::TokenFeatures) {
    let (_dir, tiny, a, b) = two_unrelated_models();
    let plain = run(&a, &b, vec![1], &tiny);
    let o = CalibrateOptions {
        token_features: by,
        ..opts(vec![1])
    };
    let f = forward(&a, &b, &tiny, &o).unwrap();
    let chosen = f
        .report
        .token_block
        .clone()
        .expect("the choice is reported");
    // Unrelated weights: the source's layer 0 predicts the target's poorly, the target's
    // own layer 0 of the tokens is its layer 0.
    assert!(plain.report.cosine[0] < 0.99, "{:?}", plain.report.cosine);
    assert!(f.report.cosine[0] > 0.999, "{:?}", f.report.cosine);
    assert!(
        chosen.keys.contains(&0) && chosen.values.contains(&0),
        "{chosen:?}"
    );
    // Chosen by cosine, no layer does worse on it than with the block nowhere.
    if by == baton::calibrate::TokenFeatures::Cosine {
        assert!(
            f.report.cosine.iter().sum::<f64>() / f.report.cosine.len() as f64
                >= chosen.cosine_nowhere - 1e-9
        );
    }
    let l_s = a.config().n_layer;
    assert!(f.keys[0].sources.iter().any(|&s| s >= l_s));
    // A map that reads the tokens refuses a call that does not give them.
    let mapper = f.cache_mapper(&a, &b).unwrap();
    assert!(mapper.reads_tokens());
    let ids = a.tokenizer.encode_raw(&tiny.text(40, 9)).unwrap();
    let cache = prefill(&a, &ids);
    let (ra, rb) = (a.decoder.rope(), b.decoder.rope());
    let err = mapper
        .map_cache(&cache, &ids[..3], ra, rb)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokens"), "{err}");
    mapper.map_cache(&cache, &ids, ra, rb).unwrap();
}

#[test]
fn a_calibration_gain_is_folded_into_the_saved_key_maps_and_reported() {
    let (_dir, tiny, a, b) = two_unrelated_models();
    let plain = run(&a, &b, vec![1], &tiny);
    let o = CalibrateOptions {
        key_gain: 1.5,
        ..opts(vec![1])
    };
    let f = forward(&a, &b, &tiny, &o).unwrap();
    assert_eq!((f.report.key_gain, f.report.value_gain), (1.5, 1.0));
    for (x, y) in plain.keys.iter().zip(&f.keys) {
        assert_eq!(x.sources, y.sources);
        for (p, q) in x.weight.iter().zip(&y.weight) {
            assert!((1.5 * p - q).abs() <= 1e-5 * p.abs().max(1.0), "{p} {q}");
        }
    }
    for (x, y) in plain.values.iter().zip(&f.values) {
        assert_eq!(x.weight, y.weight);
    }
    // The held-out numbers are those of the maps as saved, so they differ.
    assert_ne!(plain.report.cosine, f.report.cosine);
    let bad = CalibrateOptions {
        key_gain: 0.0,
        ..opts(vec![1])
    };
    let Err(e) = forward(&a, &b, &tiny, &bad) else {
        panic!("a gain of 0 was accepted");
    };
    let e = e.to_string();
    assert!(e.contains("--key-gain"), "{e}");
}
