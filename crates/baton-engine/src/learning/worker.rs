//! The learning thread: it sets up each direction's learner (in the background, at
//! start) and runs the learning steps it is sent, one at a time at the lowest priority,
//! replying with what changed.

use super::calibration::{self, Windows};
use crate::config::LearnSetup;
use baton_data::corpus::{self, Document};
use baton_method::calibrate::CalibrateError;
use baton_method::learn::{self, ConversationPair, LearnOutcome, Opened};
use baton_method::mapper::artifact::CorpusInfo;
use baton_method::mapper::dir::MapperDir;
use baton_method::mapper::CacheMapper;
use baton_runtime::model::{KvCache, Model, ModelError};
use candle_core::Tensor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// Both models' own caches of one conversation, for the learner of `source -> other`.
pub(crate) struct Job {
    /// The slot mapped from; the learner maps its cache into the other slot's.
    pub source: usize,
    /// The switch whose measurement produced the caches, and its turn.
    pub index: u32,
    pub turn: u32,
    /// Where the text came from, as recorded with what was learned.
    pub label: String,
    pub tokens: Arc<Vec<u32>>,
    pub src: Arc<KvCache>,
    pub tgt: Arc<KvCache>,
    /// The target's own queries at `probes`, per layer.
    pub queries: Arc<Vec<Tensor>>,
    pub probes: Arc<Vec<usize>>,
    /// The conversation is learned up to here in this direction.
    pub from: usize,
}

/// What the learning thread is asked to do.
pub(crate) enum Task {
    /// Set up the learner of `source -> other` (at start, so that a mapper that learned
    /// in earlier sessions is in use from the first switch).
    Open {
        source: usize,
    },
    Learn(Job),
    /// Read the next calibration window for the mapper of `source -> other`.
    Calibrate {
        source: usize,
    },
}

pub(crate) enum Reply {
    /// The learner is ready; `mapper` is set when it starts from what earlier sessions
    /// learned, and is then the mapper to use instead of the calibrated one.
    Opened {
        source: usize,
        mapper: Option<Box<CacheMapper>>,
        learned_tokens: u64,
        updates: usize,
        /// Updates kept beside the mapper that are not its own (see
        /// [`baton_method::learn::store::LearnedMeta::not_applied`]).
        not_applied: usize,
    },
    /// A learning step ran; `mapper` is the new mapper in use when it was accepted.
    Learned {
        source: usize,
        index: u32,
        turn: u32,
        outcome: Box<LearnOutcome>,
        mapper: Option<Box<CacheMapper>>,
        /// Where what was learned is kept, or why keeping it failed; None: not kept.
        kept: Option<Result<PathBuf, String>>,
    },
    /// Too little new text, or no probe among the newest positions: nothing to learn yet.
    NothingNew {
        source: usize,
    },
    /// This direction cannot learn (no saved statistics, say); it is not asked again.
    Unavailable {
        source: usize,
        reason: String,
    },
    Failed {
        source: usize,
        reason: String,
    },
    /// A calibration window was read and weighed; `mapper` as for `Learned`. `windows`
    /// of `full` are read.
    Calibrated {
        source: usize,
        windows: usize,
        full: usize,
        outcome: Option<Box<LearnOutcome>>,
        mapper: Option<Box<CacheMapper>>,
        kept: Option<Result<PathBuf, String>>,
    },
    /// A message or a switch came while a window was read: it is read again later.
    GaveWay {
        source: usize,
    },
    /// Nothing left to read in the background for this direction; `read_elsewhere` of
    /// the windows were read by another reader of the same mapper directory.
    CalibrationDone {
        source: usize,
        read_elsewhere: usize,
    },
}

impl Task {
    fn source(&self) -> usize {
        match self {
            Task::Open { source } => *source,
            Task::Learn(job) => job.source,
            Task::Calibrate { source } => *source,
        }
    }
}

impl Reply {
    fn source(&self) -> usize {
        match self {
            Reply::Opened { source, .. }
            | Reply::Learned { source, .. }
            | Reply::NothingNew { source }
            | Reply::Unavailable { source, .. }
            | Reply::Failed { source, .. }
            | Reply::Calibrated { source, .. }
            | Reply::GaveWay { source }
            | Reply::CalibrationDone { source, .. } => *source,
        }
    }
}

pub(crate) struct Worker {
    jobs: Sender<Task>,
    replies: Receiver<Reply>,
    /// Tasks sent and not answered, per source slot.
    in_flight: [usize; 2],
    /// Set when a message or a switch is waiting: a calibration window being read stops.
    give_way: Arc<AtomicBool>,
}

impl Worker {
    pub fn spawn(
        models: [Arc<Model>; 2],
        mapper_dir: MapperDir,
        setup: LearnSetup,
        anchor: usize,
    ) -> Option<Self> {
        let (jobs, job_rx) = channel::<Task>();
        let (reply_tx, replies) = channel();
        let give_way = Arc::new(AtomicBool::new(false));
        let mut state = State {
            models,
            mapper_dir,
            setup,
            anchor,
            learners: [None, None],
            learned_to: [0, 0],
            docs: None,
            windows: [None, None],
            corpora: [None, None],
            give_way: Arc::clone(&give_way),
        };
        std::thread::Builder::new()
            .name("baton-learning".into())
            .spawn(move || {
                lower_priority();
                let pool = background_pool();
                for task in job_rx {
                    let work = || match task {
                        Task::Open { source } => state.opened(source),
                        Task::Learn(job) => state.run(job),
                        Task::Calibrate { source } => state.calibrate(source),
                    };
                    let reply = match &pool {
                        Some(p) => p.install(work),
                        None => work(),
                    };
                    if reply_tx.send(reply).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| tracing::error!("learning thread: {e}"))
            .ok()?;
        let mut worker = Self {
            jobs,
            replies,
            in_flight: [0; 2],
            give_way,
        };
        for source in 0..2 {
            worker.send(Task::Open { source });
        }
        Some(worker)
    }

    /// A message or a switch is waiting: stop reading a calibration window.
    pub fn give_way(&self) {
        self.give_way.store(true, Ordering::Relaxed);
    }

    pub fn send(&mut self, task: Task) {
        if matches!(task, Task::Calibrate { .. }) {
            self.give_way.store(false, Ordering::Relaxed);
        }
        let source = task.source();
        if self.jobs.send(task).is_ok() {
            self.in_flight[source] += 1;
        }
    }

    pub fn busy(&self) -> bool {
        self.in_flight.iter().any(|&n| n > 0)
    }

    /// Whether the mapper of `source -> other` has work in flight.
    pub fn busy_with(&self, source: usize) -> bool {
        self.in_flight[source] > 0
    }

    /// A reply if one is there, waiting up to `wait` for it.
    pub fn reply(&mut self, wait: Duration) -> Option<Reply> {
        if !self.busy() {
            return None;
        }
        match self.replies.recv_timeout(wait) {
            Ok(r) => {
                let n = &mut self.in_flight[r.source()];
                *n = n.saturating_sub(1);
                Some(r)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                // The thread is gone: nothing it held will come back.
                self.in_flight = [0; 2];
                None
            }
        }
    }
}

/// A thread pool for the solves, whose threads run at the lowest priority: on a machine
/// with few cores the learner would otherwise take half of them from a turn that is
/// generating (the first token after a switch came 6x later in one measured run).
fn background_pool() -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("baton-learning-{i}"))
        .start_handler(|_| lower_priority())
        .build()
        .map_err(|e| tracing::warn!("learning thread pool: {e}"))
        .ok()
}

/// Make the calling thread the last to get a core (Linux keeps a nice value per thread).
fn lower_priority() {
    if !baton_runtime::os::lower_thread_priority() {
        tracing::warn!("could not lower the learning thread's priority");
    }
}

struct State {
    models: [Arc<Model>; 2],
    mapper_dir: MapperDir,
    setup: LearnSetup,
    anchor: usize,
    /// Per source slot: the learner, or why there is none.
    learners: [Option<Result<Opened, String>>; 2],
    /// Per source slot: where the conversation's positions not learned yet begin, as
    /// this thread last found. A job carries the engine's view, which lags while a
    /// reply is on its way: two switches in quick succession would otherwise learn the
    /// same positions twice.
    learned_to: [usize; 2],
    /// The calibration text, read once.
    docs: Option<Vec<Document>>,
    /// Per source slot: the calibration windows left to read in the background (`None`:
    /// not looked at yet, or none).
    windows: [Option<Windows>; 2],
    /// Per source slot: the corpus its artifact was calibrated on, from when it was
    /// opened (where background calibration goes on from).
    corpora: [Option<CorpusInfo>; 2],
    give_way: Arc<AtomicBool>,
}

impl State {
    fn pair(&self, source: usize) -> (Arc<Model>, Arc<Model>) {
        (
            Arc::clone(&self.models[source]),
            Arc::clone(&self.models[1 - source]),
        )
    }

    fn opened(&mut self, source: usize) -> Reply {
        let (src, tgt) = self.pair(source);
        let opened = self.open(&src, &tgt).map(|(opened, corpus)| {
            self.corpora[source] = Some(corpus);
            opened
        });
        let reply = match &opened {
            Ok(o) => Reply::Opened {
                source,
                mapper: (o.learner.learned_tokens() > 0)
                    .then(|| Box::new(o.learner.mapper().clone())),
                learned_tokens: o.learner.learned_tokens(),
                updates: o.meta.steps.len(),
                not_applied: o.meta.not_applied,
            },
            Err(reason) => Reply::Unavailable {
                source,
                reason: reason.clone(),
            },
        };
        self.learners[source] = Some(opened);
        reply
    }

    fn run(&mut self, job: Job) -> Reply {
        let source = job.source;
        let (src, tgt) = self.pair(source);
        let opened = match self.learners[source].as_mut() {
            Some(Ok(o)) => o,
            Some(Err(reason)) => {
                return Reply::Unavailable {
                    source,
                    reason: reason.clone(),
                }
            }
            None => {
                return Reply::Failed {
                    source,
                    reason: "the learner was not set up".into(),
                }
            }
        };
        let pair = ConversationPair {
            tokens: &job.tokens,
            src: &job.src,
            tgt: &job.tgt,
            queries: &job.queries,
            probes: &job.probes,
            from: job.from.max(self.learned_to[source]),
        };
        let outcome = match opened.learner.learn(&src, &tgt, &pair) {
            Ok(Some(o)) => o,
            Ok(None) => return Reply::NothingNew { source },
            Err(e) => {
                tracing::error!("learning: {e}");
                return Reply::Failed {
                    source,
                    reason: e.to_string(),
                };
            }
        };
        self.learned_to[source] = outcome.learned_to;
        let mut kept = None;
        let mut mapper = None;
        if outcome.accepted {
            mapper = Some(Box::new(opened.learner.mapper().clone()));
            // Kept only once its shard is on disk whole; "kept" is never said of less.
            if self.setup.keep {
                kept = match opened.keep(&job.label, &outcome) {
                    Ok(Some(path)) => Some(Ok(path)),
                    Ok(None) => None,
                    Err(e) => Some(Err(e.to_string())),
                };
            } else {
                opened.learner.take_update();
            }
        }
        Reply::Learned {
            source,
            index: job.index,
            turn: job.turn,
            outcome: Box::new(outcome),
            mapper,
            kept,
        }
    }

    /// The calibration text: the set-up's, or the default corpus, read on first use.
    fn docs(&mut self) -> Result<&[Document], String> {
        if self.docs.is_none() {
            self.docs = Some(match &self.setup.slice_docs {
                Some(d) => d.clone(),
                None => corpus::default_files()
                    .and_then(|f| corpus::read_documents(&f))
                    .map_err(|e| e.to_string())?,
            });
        }
        Ok(self.docs.as_deref().unwrap_or_default())
    }

    /// Read the next calibration window of `source -> other` and learn from it.
    fn calibrate(&mut self, source: usize) -> Reply {
        let (src, tgt) = self.pair(source);
        if self.windows[source].is_none() {
            let (Some(Ok(opened)), Some(corpus)) =
                (self.learners[source].as_ref(), self.corpora[source].clone())
            else {
                return Reply::CalibrationDone {
                    source,
                    read_elsewhere: 0,
                };
            };
            let learned = opened.meta.clone();
            let docs = match self.docs() {
                Ok(d) => d,
                Err(reason) => return Reply::Failed { source, reason },
            };
            match Windows::open(&corpus, &learned, &tgt, docs) {
                Ok(Some(w)) => self.windows[source] = Some(w),
                Ok(None) => {
                    return Reply::CalibrationDone {
                        source,
                        read_elsewhere: 0,
                    }
                }
                Err(reason) => return Reply::Failed { source, reason },
            }
        }
        let (Some(windows), Some(Ok(opened))) = (
            self.windows[source].as_mut(),
            self.learners[source].as_mut(),
        ) else {
            return Reply::CalibrationDone {
                source,
                read_elsewhere: 0,
            };
        };
        // Claimed before it is read, so that a window is read once for this mapper
        // whoever reads it (another workbench on this directory may be reading too).
        // Where nothing can be written, nothing can be kept either: it is read unclaimed.
        let (number, tokens, claim) = loop {
            let Some((number, tokens)) = windows.current() else {
                return Reply::CalibrationDone {
                    source,
                    read_elsewhere: windows.read_elsewhere(),
                };
            };
            match opened
                .files()
                .claim_window(&opened.mapper.identity(), number)
            {
                Ok(Some(claim)) => break (number, tokens.to_vec(), Some(claim)),
                Ok(None) => windows.read_by_another(),
                Err(e) => {
                    tracing::warn!("calibration window {number} read unclaimed: {e}");
                    break (number, tokens.to_vec(), None);
                }
            }
        };
        let give_way = Arc::clone(&self.give_way);
        let stop = move || give_way.load(Ordering::Relaxed);
        let read = match calibration::read(&src, &tgt, &tokens, self.anchor, &stop) {
            Ok(r) => r,
            Err(CalibrateError::Model(ModelError::Interrupted)) => {
                return Reply::GaveWay { source }
            }
            Err(e) => {
                return Reply::Failed {
                    source,
                    reason: e.to_string(),
                }
            }
        };
        let pair = ConversationPair {
            tokens: &tokens,
            src: &read.src,
            tgt: &read.tgt,
            queries: &read.queries,
            probes: &read.probes,
            from: 0,
        };
        let outcome = match opened.learner.learn(&src, &tgt, &pair) {
            Ok(o) => o,
            Err(e) => {
                return Reply::Failed {
                    source,
                    reason: e.to_string(),
                }
            }
        };
        windows.advance();
        let (read_so_far, full) = windows.progress();
        let mut kept = None;
        let mut mapper = None;
        if let Some(o) = outcome.as_ref().filter(|o| o.accepted) {
            mapper = Some(Box::new(opened.learner.mapper().clone()));
            if self.setup.keep {
                let label = format!("{}{number}", learn::store::CALIBRATION_WINDOW);
                kept = match opened.keep(&label, o) {
                    Ok(Some(path)) => Some(Ok(path)),
                    Ok(None) => None,
                    Err(e) => Some(Err(e.to_string())),
                };
            } else {
                opened.learner.take_update();
            }
        }
        // Read for good once what it gave is kept, or it gave nothing to keep; a taken
        // update that could not be kept leaves the window to a later session.
        let weighed = outcome.as_ref().is_some_and(|o| !o.accepted)
            || (self.setup.keep && matches!(kept, Some(Ok(_))));
        if let (Some(claim), true) = (claim, weighed) {
            if let Err(e) = claim.read() {
                tracing::warn!("calibration window {number}: {e}");
            }
        }
        Reply::Calibrated {
            source,
            windows: read_so_far,
            full,
            outcome: outcome.map(Box::new),
            mapper,
            kept,
        }
    }

    /// The learner of `src -> tgt`, and the corpus its artifact was calibrated on.
    fn open(&mut self, src: &Model, tgt: &Model) -> Result<(Opened, CorpusInfo), String> {
        let anchor = self.anchor;
        let opened = self.docs().and_then(|docs| {
            learn::calibration_slices(src, tgt, docs, anchor).map_err(|e| e.to_string())
        });
        let opened = opened.and_then(|slices| {
            let (art, mapper) = self
                .mapper_dir
                .open_for(src, tgt)
                .map_err(|e| e.to_string())?;
            learn::open(
                src,
                tgt,
                &art,
                mapper,
                &self.mapper_dir,
                self.setup.use_learned,
                slices,
                anchor,
            )
            .map(|o| (o, art.meta.corpus.clone()))
            .map_err(|e| e.to_string())
        });
        if let Err(e) = &opened {
            tracing::warn!("learning off for {}: {e}", src.identity.name);
        }
        opened
    }
}
