//! Learning from the conversation, on a thread of its own: after a switch's measurement
//! the engine holds both models' own caches of the conversation (the re-prefills it
//! compared against), and hands them here; each direction's learner adds them to its
//! statistics, solves the maps again and keeps the update only if the held-out cosine
//! does not drop (see [`crate::learn`]). The engine takes the new mapper when the reply
//! comes back, so a re-solve (seconds) never holds up a message or a switch: a switch maps
//! with the mapper as it stands and records which state it used (`MapperState`).
//!
//! Both directions' learners are set up when the engine starts, from the calibration's
//! saved statistics beside the artifact and what earlier sessions learned: a mapper that
//! learned before is solved again from both and replaces the calibrated one before the
//! first switch. A pair calibrated without statistics cannot learn, which is said once
//! and leaves the engine as it was.

use super::core::{Engine, Envelope};
use crate::data::corpus::{self, Document};
use crate::learn::{self, ConversationPair, LearnOutcome, Opened};
use crate::mapper::artifact;
use crate::mapper::CacheMapper;
use crate::model::{KvCache, Model};
use crate::protocol::{CacheOrigin, Command, Event, MapperState};
use candle_core::Tensor;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

/// How the engine learns, beyond whether it does (`Settings::learn`).
#[derive(Debug, Clone)]
pub struct LearnSetup {
    /// Keep what is learned beside the artifacts, for the next session to start from.
    pub keep: bool,
    /// Start from what earlier sessions learned (else from the calibration alone).
    pub use_learned: bool,
    /// The text the fixed calibration slice is cut from (None: the default corpus).
    pub slice_docs: Option<Vec<Document>>,
}

impl Default for LearnSetup {
    fn default() -> Self {
        Self {
            keep: true,
            use_learned: true,
            slice_docs: None,
        }
    }
}

/// Both models' own caches of one conversation, for the learner of `source -> other`.
pub(super) struct Job {
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
pub(super) enum Task {
    /// Set up the learner of `source -> other` (at start, so that a mapper that learned
    /// in earlier sessions is in use from the first switch).
    Open {
        source: usize,
    },
    Learn(Job),
}

pub(super) enum Reply {
    /// The learner is ready; `mapper` is set when it starts from what earlier sessions
    /// learned, and is then the mapper to use instead of the calibrated one.
    Opened {
        source: usize,
        mapper: Option<Box<CacheMapper>>,
        learned_tokens: u64,
        updates: usize,
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
}

impl Task {
    fn source(&self) -> usize {
        match self {
            Task::Open { source } => *source,
            Task::Learn(job) => job.source,
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
            | Reply::Failed { source, .. } => *source,
        }
    }
}

pub(super) struct Worker {
    jobs: Sender<Task>,
    replies: Receiver<Reply>,
    /// Tasks sent and not answered, per source slot.
    in_flight: [usize; 2],
}

impl Worker {
    pub fn spawn(
        models: [Arc<Model>; 2],
        mapper_dir: PathBuf,
        setup: LearnSetup,
        anchor: usize,
    ) -> Option<Self> {
        let (jobs, job_rx) = channel::<Task>();
        let (reply_tx, replies) = channel();
        let mut state = State {
            models,
            mapper_dir,
            setup,
            anchor,
            learners: [None, None],
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
        };
        for source in 0..2 {
            worker.send(Task::Open { source });
        }
        Some(worker)
    }

    pub fn send(&mut self, task: Task) {
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
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id; nothing is shared.
        let done = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19)
        };
        if done != 0 {
            tracing::warn!("could not lower the learning thread's priority");
        }
    }
}

struct State {
    models: [Arc<Model>; 2],
    mapper_dir: PathBuf,
    setup: LearnSetup,
    anchor: usize,
    /// Per source slot: the learner, or why there is none.
    learners: [Option<Result<Opened, String>>; 2],
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
        let opened = self.open(&src, &tgt);
        let reply = match &opened {
            Ok(o) => Reply::Opened {
                source,
                mapper: (o.learner.learned_tokens() > 0)
                    .then(|| Box::new(o.learner.mapper().clone())),
                learned_tokens: o.learner.learned_tokens(),
                updates: o.meta.steps.len(),
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
            from: job.from,
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
        let mut kept = None;
        let mut mapper = None;
        if outcome.accepted {
            opened.meta.record(&job.label, &outcome);
            mapper = Some(Box::new(opened.learner.mapper().clone()));
            if self.setup.keep {
                kept = Some(
                    learn::store::save(&opened.dir, opened.learner.learned(), &opened.meta)
                        .map(|()| opened.dir.clone())
                        .map_err(|e| e.to_string()),
                );
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

    fn open(&self, src: &Model, tgt: &Model) -> Result<Opened, String> {
        let open = || -> Result<Opened, String> {
            let (art, mapper) =
                artifact::open_for(Some(&self.mapper_dir), src, tgt).map_err(|e| e.to_string())?;
            let docs = match &self.setup.slice_docs {
                Some(d) => d.clone(),
                None => corpus::default_files()
                    .and_then(|f| corpus::read_documents(&f))
                    .map_err(|e| e.to_string())?,
            };
            let slices = learn::calibration_slices(src, tgt, &docs, self.anchor)
                .map_err(|e| e.to_string())?;
            learn::open(
                src,
                tgt,
                &art,
                mapper,
                &self.mapper_dir,
                self.setup.use_learned,
                slices,
                self.anchor,
            )
            .map_err(|e| e.to_string())
        };
        let opened = open();
        if let Err(e) = &opened {
            tracing::warn!("learning off for {}: {e}", src.identity.name);
        }
        opened
    }
}

/// Both models' own caches of a switch's first `n` ids, from its measurement: the
/// target's re-prefill and the source's, each with its queries at `probes`.
pub(super) struct OwnCaches {
    pub index: u32,
    pub turn: u32,
    pub source: usize,
    pub n: usize,
    pub probes: Vec<usize>,
    pub target_own: (KvCache, Vec<Tensor>),
    pub source_own: (KvCache, Vec<Tensor>),
}

impl Engine {
    /// Start the learning thread; both directions' learners are set up on it at once.
    pub(super) fn start_learning(&mut self, mapper_dir: PathBuf, setup: LearnSetup) {
        let models = [
            Arc::clone(&self.slots[0].model),
            Arc::clone(&self.slots[1].model),
        ];
        self.learning = Worker::spawn(models, mapper_dir, setup, self.settings.anchor);
        self.can_learn = [self.learning.is_some(); 2];
    }

    /// Whether a switch measured now would be learned from (in either direction).
    pub(super) fn will_learn(&self) -> bool {
        self.settings.learn && self.learning.is_some() && self.can_learn.iter().any(|&c| c)
    }

    /// Whether the mapper of `source -> other` is being set up or taught.
    pub(super) fn learning_with(&self, source: usize) -> bool {
        self.learning.as_ref().is_some_and(|w| w.busy_with(source))
    }

    /// Whether the learning thread has work in flight for either direction.
    pub fn learning_in_flight(&self) -> bool {
        self.learning_busy()
    }

    pub(super) fn learning_busy(&self) -> bool {
        self.learning.as_ref().is_some_and(Worker::busy)
    }

    /// Take the learning thread's replies that are there, waiting up to `wait` for one.
    pub(super) fn take_learned(&mut self, wait: Duration) {
        let mut wait = wait;
        while let Some(reply) = self.learning.as_mut().and_then(|w| w.reply(wait)) {
            self.apply_learned(reply);
            wait = Duration::ZERO;
        }
    }

    /// Wait for what the learning thread is doing for the mapper of `source -> other`,
    /// so that a switch that way maps with everything learned before it. Commands that
    /// arrive meanwhile wait their turn; a shutdown stops the wait.
    pub fn finish_learning(&mut self, source: usize, commands: &Receiver<Envelope>) {
        while self.learning_with(source) && !self.shutdown {
            self.take_learned(Duration::from_millis(100));
            while let Ok(e) = commands.try_recv() {
                match e.command {
                    Command::Shutdown => self.shutdown = true,
                    _ => self.inbox.push_back(e),
                }
            }
        }
    }

    /// Hand a measured switch's caches to the learning thread: the direction of the
    /// next switch (target to source) first, then the one just used, so that the next
    /// switch is the likelier to find its own direction's update ready.
    pub(super) fn learn_from(&mut self, own: OwnCaches) -> Result<(), super::EngineError> {
        let OwnCaches {
            index,
            turn,
            source,
            n,
            probes,
            target_own,
            source_own,
        } = own;
        let target = 1 - source;
        let (tc, tq) = target_own;
        let (sc, sq) = source_own;
        // Each is its model's own cache of the first `n` ids: where a truth holds less,
        // it saves the next reference path that work.
        for (slot, cache) in [(target, &tc), (source, &sc)] {
            if self.slots[slot].truth.len() < cache.len() {
                self.slots[slot].truth = cache.try_clone()?;
            }
        }
        let Some(worker) = self.learning.as_mut() else {
            return Ok(());
        };
        let tokens = Arc::new(self.conv.history[..n].to_vec());
        let probes = Arc::new(probes);
        let (tc, sc) = (Arc::new(tc), Arc::new(sc));
        let ways = [(target, &tc, &sc, sq), (source, &sc, &tc, tq)];
        for (from_slot, src, tgt, queries) in ways {
            if !self.can_learn[from_slot] {
                continue;
            }
            worker.send(Task::Learn(Job {
                source: from_slot,
                index,
                turn,
                label: format!("{}, switch {index}", self.session_label),
                tokens: Arc::clone(&tokens),
                src: Arc::clone(src),
                tgt: Arc::clone(tgt),
                queries: Arc::new(queries),
                probes: Arc::clone(&probes),
                from: self.learned_to[from_slot],
            }));
        }
        Ok(())
    }

    /// Hand a completed repair to the learning thread: the repaired cache is the target's
    /// own, with its queries at the positions it kept them; the other model's own cache
    /// of a prefix (its primary if it computed it all, else its truth) is the source's.
    pub(super) fn learn_from_repair(
        &mut self,
        job: super::repair::Repair,
    ) -> Result<(), super::EngineError> {
        let target = job.slot;
        let source = 1 - target;
        if !self.settings.learn || !self.can_learn[source] || job.probes.is_empty() {
            return Ok(());
        }
        let Some(worker) = self.learning.as_mut() else {
            return Ok(());
        };
        let src = &self.slots[source];
        let own = match src.origin {
            CacheOrigin::True => &src.primary,
            _ => &src.truth,
        };
        let n = own.len().min(self.slots[target].primary.len());
        let keep: Vec<u32> = (0..job.probes.len())
            .filter(|&i| job.probes[i] < n)
            .map(|i| i as u32)
            .collect();
        if n < crate::learn::MIN_NEW_POSITIONS || keep.is_empty() {
            return Ok(());
        }
        let probes: Vec<usize> = keep.iter().map(|&i| job.probes[i as usize]).collect();
        let mut queries = Vec::with_capacity(job.queries.len());
        for per_chunk in &job.queries {
            let all = Tensor::cat(per_chunk, 1)?;
            let index = Tensor::new(keep.as_slice(), all.device())?;
            queries.push(all.index_select(&index, 1)?);
        }
        worker.send(Task::Learn(Job {
            source,
            index: job.index,
            turn: job.turn,
            label: format!("{}, repair after switch {}", self.session_label, job.index),
            tokens: Arc::new(self.conv.history[..n].to_vec()),
            src: Arc::new(own.try_clone_prefix(n)?),
            tgt: Arc::new(self.slots[target].primary.try_clone_prefix(n)?),
            queries: Arc::new(queries),
            probes: Arc::new(probes),
            from: self.learned_to[source],
        }));
        Ok(())
    }

    fn direction_name(&self, source: usize) -> (String, String) {
        (self.slots[source].name(), self.slots[1 - source].name())
    }

    fn apply_learned(&mut self, reply: Reply) {
        match reply {
            Reply::Opened {
                source,
                mapper,
                learned_tokens,
                updates,
            } => {
                if let Some(m) = mapper {
                    self.mappers[source].mapper = *m;
                    self.mapper_state[source] = MapperState {
                        updates: u32::try_from(updates).unwrap_or(u32::MAX),
                        learned_tokens,
                    };
                    let (a, b) = self.direction_name(source);
                    self.out.emit(Event::Notice {
                        message: format!(
                            "mapper {a} -> {b} starts from what it learned before: {learned_tokens} positions in {updates} updates (`baton mappers --reset-learned` returns it to its calibration)"
                        ),
                    });
                }
            }
            Reply::Learned {
                source,
                index,
                turn,
                outcome,
                mapper,
                kept,
            } => {
                self.learned_to[source] = outcome.learned_to;
                if let Some(m) = mapper {
                    self.mappers[source].mapper = *m;
                    let state = &mut self.mapper_state[source];
                    state.updates = state.updates.saturating_add(1);
                    state.learned_tokens = outcome.learned_tokens;
                }
                let (from, to) = self.direction_name(source);
                let mut saved = false;
                match kept {
                    Some(Ok(dir)) => {
                        tracing::info!("learned statistics kept in {}", dir.display());
                        saved = true;
                    }
                    Some(Err(e)) => self.out.emit(Event::Error {
                        message: format!(
                            "what {from} -> {to} learned is in use but could not be kept for the next session: {e}"
                        ),
                        fatal: false,
                    }),
                    None => {}
                }
                let o = *outcome;
                self.out.emit(Event::MapperLearned {
                    index,
                    turn,
                    from,
                    to,
                    tokens: o.tokens,
                    held_out: o.held_out,
                    before: o.before.combined(),
                    after: o.after.combined(),
                    conversation_before: o.before.conversation,
                    conversation_after: o.after.conversation,
                    calibration_before: o.before.calibration,
                    calibration_after: o.after.calibration,
                    accepted: o.accepted,
                    learned_tokens: o.learned_tokens,
                    seconds: o.seconds,
                    kept: saved,
                });
            }
            Reply::NothingNew { source } => {
                tracing::info!("learning: too little new text for slot {source}'s mapper");
            }
            Reply::Unavailable { source, reason } => {
                self.can_learn[source] = false;
                let (a, b) = self.direction_name(source);
                self.out.emit(Event::Notice {
                    message: format!("{a} -> {b} does not learn: {reason}"),
                });
            }
            Reply::Failed { source, reason } => {
                let (a, b) = self.direction_name(source);
                self.out.emit(Event::Error {
                    message: format!(
                        "learning {a} -> {b} failed (the mapper is as it was): {reason}"
                    ),
                    fatal: false,
                });
            }
        }
    }
}
