//! An engine on two tiny chat models generated here, with mappers calibrated between
//! them both ways (their statistics kept when asked, as `baton calibrate` does), driven
//! on the test's thread: for the tests of what the engine does between turns (learning,
//! repair).
#![allow(dead_code)]

use super::synthetic::{load as load_model, Tiny};
use baton::calibrate::{
    calibrate_with, corpus_info, save_fitted, saved_stats, CalibrateOptions, CorpusName, Direction,
    NoProgress, Run, TokenFeatures,
};
use baton::data::corpus::{self, Document};
use baton::engine::{self, load, Engine, EngineConfig, Envelope, LearnSetup};
use baton::mapper::CacheMapper;
use baton::model::Model;
use baton::protocol::{Command, Event};
use candle_core::Device;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};

pub fn tiny() -> Tiny {
    Tiny {
        context: 1024,
        ..Tiny::new("qwen2")
    }
}

pub fn docs() -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny().chat_text(2000, 21 + i)))
        .collect()
}

/// Enough text for the calibration slice's two 256-token windows of its selection split.
pub fn slice_docs() -> Vec<Document> {
    (0..3)
        .map(|i| Document::new(format!("s{i}"), tiny().text(4000, 31 + i)))
        .collect()
}

pub fn opts() -> CalibrateOptions {
    CalibrateOptions {
        sequences: 6,
        seq_len: 48,
        stride: 1,
        select_sequences: 2,
        probes: 8,
        k_sweep: vec![2],
        lambdas: vec![0.01],
        max_k: usize::MAX,
        token_features: TokenFeatures::Off,
        ..CalibrateOptions::default()
    }
}

/// Chat models a and b under `dir`, their mappers both ways in `dir/mappers`, with the
/// calibration's statistics when `keep_stats`.
pub fn write_pair(dir: &Path, keep_stats: bool) {
    write_pair_of(&tiny(), dir, keep_stats)
}

/// [`write_pair`] for chat models shaped as `t` says, calibrated on the same text.
pub fn write_pair_of(t: &Tiny, dir: &Path, keep_stats: bool) {
    write_pair_with(t, dir, keep_stats, opts())
}

/// [`write_pair`] with mappers of a trained kind (small heads, a few epochs).
pub fn write_trained_pair(dir: &Path, kind: baton::mapper::nonlinear::MapperKind) {
    let mut o = opts();
    o.train = baton::calibrate::train::TrainOptions {
        kind,
        windows: 4,
        epochs: 2,
        hidden: vec![vec![8]],
        probes: 8,
        ..Default::default()
    };
    write_pair_with(&tiny(), dir, true, o)
}

/// [`write_pair_of`] calibrated with `o`.
pub fn write_pair_with(t: &Tiny, dir: &Path, keep_stats: bool, o: CalibrateOptions) {
    t.write_chat_model(&dir.join("a"), 5);
    t.write_chat_model(&dir.join("b"), 6);
    let (a, b) = models(dir);
    let docs = docs();
    let name = CorpusName {
        files: "synthetic".into(),
        fingerprint: corpus::fingerprint(&docs),
    };
    let run = Run {
        docs: &docs,
        corpus: &name,
        directions: &[Direction::Forward, Direction::Backward],
        opts: &o,
    };
    let done = calibrate_with(
        &a,
        &b,
        &run,
        Vec::new(),
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap();
    let mappers = baton::mapper::dir::MapperDir::named(dir.join("mappers"));
    save_fitted(
        &done.fitted,
        [&a, &b],
        &corpus_info(&[], &name.fingerprint, &o),
        &mappers,
    )
    .unwrap();
    if keep_stats {
        for st in &done.stats {
            let at = mappers.pair(&st.meta.source, &st.meta.target).stats();
            saved_stats::save(st, &at).unwrap();
        }
    }
}

/// The pair written under `dir` by [`write_pair`], with its mappers both ways.
pub fn models_and_mappers(dir: &Path) -> (Model, Model, CacheMapper, CacheMapper) {
    let (a, b) = models(dir);
    let mappers = baton::mapper::dir::MapperDir::named(dir.join("mappers"));
    let (_, forward) = mappers.open_for(&a, &b).unwrap();
    let (_, backward) = mappers.open_for(&b, &a).unwrap();
    (a, b, forward, backward)
}

pub fn models(dir: &Path) -> (Model, Model) {
    (
        load_model(&dir.join("a"), "a"),
        load_model(&dir.join("b"), "b"),
    )
}

pub struct Rig {
    pub engine: Engine,
    /// Kept so that the engine's command channel stays open.
    _tx: Sender<Envelope>,
    pub rx: Receiver<Envelope>,
    pub events: Receiver<Event>,
}

/// An engine on the pair under `dir` that learns, recording to `record`.
pub fn rig(dir: &Path, keep: bool, record: Option<PathBuf>) -> Rig {
    rig_with(dir, |config| {
        config.settings.learn = true;
        config.record = record;
        config.learning = LearnSetup {
            keep,
            use_learned: true,
            slice_docs: Some(slice_docs()),
            background_calibration: false,
        };
    })
}

/// An engine on the pair under `dir`, set up by `setup` (answers of 24 tokens at most).
pub fn rig_with(dir: &Path, setup: impl FnOnce(&mut EngineConfig)) -> Rig {
    let (a, b) = models(dir);
    let mappers = baton::mapper::dir::MapperDir::named(dir.join("mappers"));
    let models = [a, b];
    let loaded = load::load_mappers(&mappers, &models).unwrap();
    let [a, b] = models;
    let mut config = EngineConfig::new(["a".into(), "b".into()], Device::Cpu);
    config.mapper_dir = mappers;
    config.settings.max_tokens = 24;
    // Learning only where `setup` asks for it.
    config.settings.learn = false;
    setup(&mut config);
    let (etx, events) = channel();
    let engine = engine::build(a, b, loaded, config, etx).unwrap();
    let (tx, rx) = channel();
    Rig {
        engine,
        _tx: tx,
        rx,
        events,
    }
}

impl Rig {
    /// The engine on a thread of its own from here on.
    pub fn start(self) -> engine::EngineHandle {
        engine::run_built(self.engine, (self._tx, self.rx), self.events)
    }

    /// Put a command in the engine's channel, for it to find at its next look.
    pub fn queue(&self, c: Command) {
        self._tx.send(c.into()).unwrap();
    }

    pub fn handle(&mut self, c: Command) -> Vec<Event> {
        self.engine.handle(c.into(), &self.rx);
        self.drain()
    }

    pub fn drain(&self) -> Vec<Event> {
        let events: Vec<Event> = self.events.try_iter().collect();
        for e in &events {
            if let Event::Error { message, .. } = e {
                panic!("engine error: {message}");
            }
        }
        events
    }

    /// Everything the learning thread has to say about both directions.
    pub fn settle(&mut self) -> Vec<Event> {
        self.engine.finish_learning(0, &self.rx);
        self.engine.finish_learning(1, &self.rx);
        self.drain()
    }

    /// A long message answered, switched away from and measured: what the engine said.
    pub fn talk_and_switch(&mut self, seed: u64) -> Vec<Event> {
        let mut events = self.talk_and_switch_unsettled(seed);
        events.extend(self.settle());
        events
    }

    /// [`Self::talk_and_switch`] without waiting for the learning it starts.
    pub fn talk_and_switch_unsettled(&mut self, seed: u64) -> Vec<Event> {
        let text = tiny().chat_text(160, seed);
        let _ = self.handle(Command::Submit { text });
        let mut events = self.handle(Command::Switch);
        self.engine.measure_pending(&self.rx);
        events.extend(self.drain());
        events
    }
}
