//! Bringing the engine up: both models, both mapper directions (calibrated on the spot
//! when asked and missing), progress reported as `Loading` events.

use super::EngineError;
use baton_data::corpus;
use baton_fetch::FetchProgress;
use baton_method::calibrate::{self, CalibrateOptions, CalibrationProgress, Direction};
use baton_method::gate::{self, fit::FitMapper};
use baton_method::mapper::artifact::ModelRef;
use baton_method::mapper::dir::MapperDir;
use baton_method::mapper::CacheMapper;
use baton_protocol::{Event, MapperInfo};
use baton_runtime::model::Model;
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::time::Instant;

/// Turns fetch and calibration progress into `Loading` events with an ETA.
pub struct LoadingEvents<'a> {
    events: &'a Sender<Event>,
    state: RefCell<(String, u64, u64, Instant)>,
}

impl<'a> LoadingEvents<'a> {
    pub fn new(events: &'a Sender<Event>) -> Self {
        Self {
            events,
            state: RefCell::new((String::new(), 0, 0, Instant::now())),
        }
    }

    fn send(&self) {
        let s = self.state.borrow();
        let elapsed = s.3.elapsed().as_secs_f64();
        let eta = (s.1 > 0 && s.2 > s.1 && elapsed > 0.5)
            .then(|| elapsed * (s.2 - s.1) as f64 / s.1 as f64);
        let _ = self.events.send(Event::Loading {
            stage: s.0.clone(),
            done: s.1,
            total: s.2,
            eta_seconds: eta,
        });
    }

    pub fn stage(&self, name: &str, total: u64) {
        *self.state.borrow_mut() = (name.to_string(), 0, total, Instant::now());
        self.send();
    }
}

impl FetchProgress for LoadingEvents<'_> {
    fn message(&self, msg: &str) {
        tracing::info!("{msg}");
        self.stage(msg, 0);
    }
    fn bytes(&self, done: u64, total: Option<u64>) {
        {
            let mut s = self.state.borrow_mut();
            s.1 = done;
            s.2 = total.unwrap_or(0);
        }
        self.send();
    }
}

impl CalibrationProgress for LoadingEvents<'_> {
    fn phase(&self, name: &str, total: u64) {
        self.stage(&format!("calibrating: {name}"), total);
    }
    fn advance(&self, n: u64) {
        self.state.borrow_mut().1 += n;
        self.send();
    }
    fn note(&self, msg: &str) {
        tracing::info!("{msg}");
    }
}

pub struct LoadedMapper {
    pub mapper: CacheMapper,
    pub info: MapperInfo,
    /// The artifact's SHA-256 and kind, as a gate line names the mapper it was measured on.
    pub artifact: FitMapper,
    /// Mean held-out attention cosine from calibration: the gate's estimate when no
    /// reference cache is at hand.
    pub calibration_cosine: f64,
    /// Calibration windows it was fitted on (a quick first-run mapper has few).
    pub sequences: usize,
    /// Whether the artifact holds the source statistics the int8 map needs (older
    /// artifacts map in f32).
    pub has_source_scales: bool,
    /// The gate study's line from feature distance to attention cosine, when one was
    /// kept for this pair (`baton gate-study`).
    pub gate: Option<baton_method::gate::GateFit>,
    /// Why a kept line could not be read (it is then not used).
    pub gate_problem: Option<String>,
    /// The mapped cache's and no context's next-token KL on the calibration's own
    /// held-out windows, when the map did no better than no context there.
    pub worse_than_no_context: Option<(f64, f64)>,
}

fn path_for(dir: &MapperDir, s: &Model, t: &Model) -> PathBuf {
    dir.pair(
        &ModelRef::new(&s.identity, s.config()),
        &ModelRef::new(&t.identity, t.config()),
    )
    .artifact()
}

/// Calibrate the directions whose artifacts are missing, on the default corpus.
pub fn calibrate_missing(
    models: &[Model; 2],
    dir: &MapperDir,
    opts: &CalibrateOptions,
    progress: &LoadingEvents<'_>,
    cancel: &AtomicBool,
) -> Result<(), EngineError> {
    let mut directions = Vec::new();
    if !path_for(dir, &models[0], &models[1]).is_file() {
        directions.push(Direction::Forward);
    }
    if !path_for(dir, &models[1], &models[0]).is_file() {
        directions.push(Direction::Backward);
    }
    if directions.is_empty() {
        return Ok(());
    }
    progress.stage("reading the calibration corpus", 0);
    let files = corpus::default_files()?;
    let text = corpus::read_corpus(&files, &mut |_, _| {})?;
    // The statistics are kept as `baton calibrate` keeps them (learning from
    // conversations adds to them), and a poor map follows the same rule; the mapper's
    // own notice says so on screen once it is loaded.
    let job = calibrate::Job {
        dir,
        files: &files,
        corpus: text,
        directions: &directions,
        opts,
        prior: Vec::new(),
        save_stats: true,
        accept_poor: false,
    };
    let done = calibrate::calibrate_and_save([&models[0], &models[1]], job, progress, cancel)?;
    for p in &done.poor {
        tracing::warn!("{}", p.message());
    }
    Ok(())
}

/// Both directions' mappers between `models`, each with the gate's line kept for it
/// when that line was measured on these mappers.
pub fn load_mappers(
    dir: &MapperDir,
    models: &[Model; 2],
) -> Result<[LoadedMapper; 2], EngineError> {
    let mut pair = [
        load_mapper(dir, &models[0], &models[1])?,
        load_mapper(dir, &models[1], &models[0])?,
    ];
    let measured_on = pair.each_ref().map(|m| m.artifact.clone());
    for (i, m) in pair.iter_mut().enumerate() {
        let (s, t) = (&models[i], &models[1 - i]);
        let (sr, tr) = (
            ModelRef::new(&s.identity, s.config()),
            ModelRef::new(&t.identity, t.config()),
        );
        match gate::fit::load(dir, &sr, &tr, &measured_on[i], &measured_on[1 - i]) {
            Ok(g) => m.gate = g,
            Err(e) => m.gate_problem = Some(e.to_string()),
        }
    }
    Ok(pair)
}

/// The mapper from `s` to `t`, checked against both models; without a gate line, which
/// [`load_mappers`] reads knowing both directions' mappers.
pub fn load_mapper(dir: &MapperDir, s: &Model, t: &Model) -> Result<LoadedMapper, EngineError> {
    let (art, mapper) = dir.open_for(s, t)?;
    let path = &art.path;
    let artifact = FitMapper::of(&art)?;
    let cos = &art.meta.report.cosine;
    Ok(LoadedMapper {
        mapper,
        info: MapperInfo {
            id: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            source: s.identity.name.as_str().into(),
            target: t.identity.name.as_str().into(),
            sha256: artifact.sha256.clone(),
            k: art.meta.k,
        },
        artifact,
        calibration_cosine: cos.iter().sum::<f64>() / cos.len().max(1) as f64,
        sequences: art.meta.corpus.sequences,
        has_source_scales: art.source_scales.is_some(),
        gate: None,
        gate_problem: None,
        worse_than_no_context: art.meta.report.worse_than_no_context(),
    })
}
