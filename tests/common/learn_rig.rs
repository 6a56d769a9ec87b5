//! Learners on tiny models generated here, beside a mapper calibrated between them with
//! its statistics kept, as `baton calibrate` does.

use super::synthetic::Tiny;
use baton::calibrate::saved_stats;
use baton::calibrate::{
    calibrate_with, corpus_info, save_fitted, CalibrateOptions, CorpusName, Direction, NoProgress,
    Run, TokenFeatures,
};
use baton::data::corpus::{self, Document};
use baton::learn::{self, ConversationPair, Learner};
use baton::mapper::artifact::ModelRef;
use baton::metrics::probe_positions;
use baton::model::{ForwardOptions, Logits, Model};
use std::path::Path;
use std::sync::atomic::AtomicBool;

pub const ANCHOR: usize = 1;

pub fn docs(tiny: &Tiny) -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny.text(4000, 21 + i)))
        .collect()
}

pub fn opts() -> CalibrateOptions {
    CalibrateOptions {
        sequences: 4,
        seq_len: 64,
        stride: 1,
        select_sequences: 2,
        probes: 8,
        k_sweep: vec![1, 2],
        lambdas: vec![0.01],
        max_k: usize::MAX,
        token_features: TokenFeatures::All,
        // Matched gains, so that the re-solve must put back per-head gains as well.
        key_gain_matched: true,
        ..CalibrateOptions::default()
    }
}

/// Calibrates a -> b into `dir`, keeping its statistics, as `baton calibrate` does.
pub fn calibrate_into(a: &Model, b: &Model, docs: &[Document], dir: &Path) {
    let o = opts();
    let name = CorpusName {
        files: "tiny".into(),
        fingerprint: corpus::fingerprint(docs),
    };
    let run = Run {
        docs,
        corpus: &name,
        directions: &[Direction::Forward],
        opts: &o,
    };
    let c = calibrate_with(a, b, &run, Vec::new(), &NoProgress, &AtomicBool::new(false)).unwrap();
    save_fitted(
        &c.fitted,
        [a, b],
        &corpus_info(&[], &corpus::fingerprint(docs), &o),
        &baton::mapper::dir::MapperDir::named(dir),
    )
    .unwrap();
    let (sr, tr) = refs(a, b);
    saved_stats::save(
        &c.stats[0],
        &baton::mapper::dir::MapperDir::named(dir)
            .pair(&sr, &tr)
            .stats(),
    )
    .unwrap();
}

pub fn refs(a: &Model, b: &Model) -> (ModelRef, ModelRef) {
    (
        ModelRef::new(&a.identity, a.config()),
        ModelRef::new(&b.identity, b.config()),
    )
}

pub fn open(a: &Model, b: &Model, dir: &Path, use_learned: bool) -> learn::Opened {
    let dir = &baton::mapper::dir::MapperDir::named(dir);
    let art = dir.find_for(a, b).unwrap();
    let mapper = art.cache_mapper(a, b).unwrap();
    let docs = docs_for_slices(a);
    let slices = learn::calibration_slices(a, b, &docs, ANCHOR).unwrap();
    learn::open(a, b, &art, mapper, dir, use_learned, slices, ANCHOR).unwrap()
}

pub fn docs_for_slices(_: &Model) -> Vec<Document> {
    docs(&Tiny::new("llama"))
}

/// Both models' own caches of `ids`, the target's queries at probes, and one step.
pub fn learn_once(
    learner: &mut Learner,
    a: &Model,
    b: &Model,
    ids: &[u32],
) -> Option<learn::LearnOutcome> {
    let probes = probe_positions(ids.len(), 16);
    let mut sc = a.decoder.new_cache();
    a.decoder
        .forward(
            ids,
            &mut sc,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )
        .unwrap();
    let mut tc = b.decoder.new_cache();
    let out = b
        .decoder
        .forward(
            ids,
            &mut tc,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: probes.clone(),
            },
        )
        .unwrap();
    let pair = ConversationPair {
        tokens: ids,
        src: &sc,
        tgt: &tc,
        queries: &out.queries,
        probes: &probes,
        from: 0,
    };
    learner.learn(a, b, &pair).unwrap()
}

pub fn conversation(tiny: &Tiny, a: &Model, seed: u64) -> Vec<u32> {
    let text = tiny.text(400, seed);
    let ids = a.tokenizer.encode(&text).unwrap();
    ids[..ids.len().min(160)].to_vec()
}
