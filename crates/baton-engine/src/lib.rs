//! The handoff engine: two models, their caches, both mapper directions and the switch,
//! on a thread of its own. Callers (the workbench, the headless runner, tests) talk to
//! it only through [`baton_protocol`]: commands in, events out. Loading failures come
//! back as a fatal `Error` event, never as a panic on the caller's side.

pub mod compare;
pub mod config;
pub mod conversation;
mod core;
pub mod headless;
mod layers;
pub mod learning;
pub mod load;
mod measure;
mod outbox;
mod repair;
mod reread;
mod schedule;
pub mod setting_checks;
mod slot;
pub mod switch;
mod timing;
mod turn;

pub use config::{EngineConfig, LearnSetup, RereadOverride, Settings, SettingsOverrides};
pub use core::Engine;
pub use outbox::{Envelope, Outbox};
pub use repair::REPAIR_CHUNK;
pub use slot::Slot;

use baton_protocol::{Command, Event, ModelInfo};
use baton_runtime::model::Placement;
use baton_session::{SessionHeader, SessionWriter};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] baton_runtime::model::ModelError),
    #[error(transparent)]
    Template(#[from] baton_runtime::text::ChatTemplateError),
    #[error(transparent)]
    Tokenizer(#[from] baton_runtime::text::TokenizerError),
    #[error(transparent)]
    Artifact(#[from] baton_method::mapper::artifact::ArtifactError),
    #[error(transparent)]
    Calibrate(#[from] baton_method::calibrate::CalibrateError),
    #[error(transparent)]
    Corpus(#[from] baton_data::corpus::CorpusError),
    #[error(transparent)]
    Metric(#[from] baton_method::metrics::MetricError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Fetch(#[from] baton_fetch::FetchError),
    #[error(transparent)]
    Open(#[from] baton_fetch::OpenError),
    #[error(transparent)]
    Session(#[from] baton_session::SessionError),
    #[error(transparent)]
    Fidelity(#[from] baton_method::handoff::fidelity::FidelityError),
    #[error("the message was not sent: the conversation would be {tokens} tokens with it, more than the {max} that {model} can hold (its context length)")]
    TooLong {
        model: String,
        tokens: usize,
        max: usize,
    },
    #[error("engine: {0}")]
    Internal(String),
}

/// The caller's side of a running engine.
pub struct EngineHandle {
    commands: Sender<Envelope>,
    pub events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Send a command, stamped with the time it was sent.
    pub fn send(&self, c: Command) {
        // A stopped engine has already said why (a fatal Error event).
        let _ = self.commands.send(c.into());
    }

    /// Ask the engine to stop and wait for its thread.
    pub fn shutdown(mut self) {
        self.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.send(Command::Shutdown);
    }
}

/// Run an engine built with [`build`] on a thread of its own, serving `commands` (whose
/// sender may already hold commands) and sending events to the `events` it was built
/// with.
pub fn run_built(
    engine: Engine,
    commands: (Sender<Envelope>, Receiver<Envelope>),
    events: Receiver<Event>,
) -> EngineHandle {
    let (ctx, crx) = commands;
    let thread = std::thread::Builder::new()
        .name("baton-engine".into())
        .spawn(move || engine.run(crx))
        .ok();
    EngineHandle {
        commands: ctx,
        events,
        thread,
    }
}

/// Start an engine; it loads both models and mappers, then sends `Ready` (or a fatal
/// `Error`) and serves commands.
pub fn spawn(config: EngineConfig) -> EngineHandle {
    let (ctx, crx) = channel();
    let (etx, erx) = channel();
    let thread = std::thread::Builder::new()
        .name("baton-engine".into())
        .spawn(move || match start(config, etx.clone()) {
            Ok(engine) => engine.run(crx),
            Err(e) => {
                tracing::error!("engine failed to start: {e}");
                let _ = etx.send(Event::Error {
                    message: e.to_string(),
                    fatal: true,
                });
            }
        })
        .ok();
    EngineHandle {
        commands: ctx,
        events: erx,
        thread,
    }
}

fn model_info(m: &baton_runtime::model::Model) -> ModelInfo {
    let c = m.config();
    ModelInfo {
        name: m.identity.name.as_str().into(),
        path: m.identity.path.display().to_string(),
        sha256: m.identity.sha256.clone(),
        arch: format!("{:?}", c.arch).to_lowercase(),
        n_layer: c.n_layer,
        n_kv_head: c.n_kv_head,
        head_dim: c.head_dim,
    }
}

/// Load everything and build the engine (on the engine thread).
pub fn start(config: EngineConfig, events: Sender<Event>) -> Result<Engine, EngineError> {
    let progress = load::LoadingEvents::new(&events);
    let mut models = Vec::with_capacity(2);
    for spec in &config.models {
        progress.stage(&format!("loading {spec}"), 0);
        let on = Placement {
            device: config.device.clone(),
            compute: config.compute,
        };
        models.push(baton_fetch::open_model_on(spec, &on, &progress)?);
    }
    let (Some(second), Some(first)) = (models.pop(), models.pop()) else {
        return Err(EngineError::Internal("two models are needed".into()));
    };
    baton_runtime::text::ensure_same_tokenizer(&first.tokenizer, &second.tokenizer)?;
    let models = [first, second];
    let dir = config.mapper_dir.clone();
    if let Some(opts) = &config.calibrate_missing {
        load::calibrate_missing(&models, &dir, opts, &progress, &AtomicBool::new(false))?;
    }
    progress.stage("loading mappers", 0);
    let mappers = load::load_mappers(&dir, &models)?;
    progress.stage("preparing metrics", 0);
    let [first, second] = models;
    build(first, second, mappers, config, events)
}

/// The engine from loaded parts; opens the session file when recording.
pub fn build(
    first: baton_runtime::model::Model,
    second: baton_runtime::model::Model,
    mappers: [load::LoadedMapper; 2],
    config: EngineConfig,
    events: Sender<Event>,
) -> Result<Engine, EngineError> {
    let infos = [model_info(&first), model_info(&second)];
    let g0 = baton_method::handoff::fidelity::query_grams(&first)?;
    let g1 = baton_method::handoff::fidelity::query_grams(&second)?;
    let slots = [
        Slot::new(first, g0, infos[0].clone()),
        Slot::new(second, g1, infos[1].clone()),
    ];
    let device = slots[0].model.decoder.device_label();
    let mappers_info = vec![mappers[0].info.clone(), mappers[1].info.clone()];
    let ready = Event::Ready {
        models: infos.to_vec(),
        active: 0,
        mappers: mappers_info,
        device: device.clone(),
    };
    let recorder = match &config.record {
        Some(path) => {
            let settings = serde_json::to_value(&config.settings)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
            let header = SessionHeader::from_ready(&ready, settings)
                .ok_or_else(|| EngineError::Internal("no header for the session".into()))?;
            Some(SessionWriter::create(path, &header)?)
        }
        None => None,
    };
    let mut out = Outbox::new(events, recorder);
    out.emit(ready);
    if let Some(caveat) = baton_protocol::unverified_baseline(config.device.is_cpu()) {
        out.emit(Event::Notice {
            message: caveat.to_string(),
        });
    }
    let full = baton_method::calibrate::CalibrateOptions::default().sequences;
    for m in &mappers {
        if let Some(problem) = &m.gate_problem {
            out.emit(Event::Notice {
                message: format!(
                    "the gate's line for {} -> {} is not used: {problem}",
                    m.info.source, m.info.target
                ),
            });
        }
        if !m.has_source_scales
            && config.device.is_cpu()
            && baton_runtime::model::weights::fast_cpu_kernels()
        {
            out.emit(Event::Notice {
                message: format!(
                    "mapper {} -> {} predates the int8 map (it has no source statistics), so it maps in f32, several times slower; `baton calibrate` refits it",
                    m.info.source, m.info.target
                ),
            });
        }
        if let Some((mapped, none)) = m.worse_than_no_context {
            // Said on screen, not only in the log: every answer after a switch reads it.
            out.emit(Event::Notice {
                message: format!(
                    "mapper {} -> {} hands over a context worth less than none on its own held-out windows (next-token KL {mapped:.3} against {none:.3} with no context); `baton calibrate` with more text (--sequences, --seq-len) fits a better one",
                    m.info.source, m.info.target
                ),
            });
        }
        if m.sequences < full {
            // With background calibration the quick mapper grows while idle; the
            // notice says so, so a newcomer knows what the status line's count is.
            let grows = if config.settings.learn && config.learning.background_calibration {
                "; it reads more calibration text while the workbench is idle, or"
            } else {
                ";"
            };
            out.emit(Event::Notice {
                message: format!(
                    "mapper {} -> {} is a quick one ({} calibration windows){grows} `baton calibrate` fits the full one ({full})",
                    m.info.source, m.info.target, m.sequences
                ),
            });
        }
    }
    let learn = config.settings.learn;
    if learn && config.learning.keep {
        // Said at start-up: what is learned is then used for the session alone, and
        // nothing later calls it kept.
        if let Err(e) = config.mapper_dir.check_writable() {
            out.emit(Event::Notice {
                message: format!(
                    "what the mappers learn this session is used but cannot be kept for the next: {e}"
                ),
            });
        }
    }
    let mut engine = Engine::new(slots, mappers, config.settings, device, out);
    engine.mapper_dir = Some(config.mapper_dir.clone());
    engine.prepare_layers();
    if config.paced_repair {
        engine.pace_repair();
    }
    if let Some(name) = config.record.as_ref().and_then(|p| p.file_name()) {
        engine.learning.session_label = format!("session {}", name.to_string_lossy());
    }
    if learn {
        engine.start_learning(config.mapper_dir.clone(), config.learning);
    }
    Ok(engine)
}
