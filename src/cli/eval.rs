//! `baton eval`: a calibrated mapper measured on held-out text, benchmark tasks and the
//! multi-turn recall suite, against the target's own prefill.

use super::common::{at_least_one, DirectionArgs, PairArgs, PrecisionArgs};
use anyhow::{bail, Result};
use baton::data::recall::RecallConversation;
use baton::data::tasks;
use baton::fetch::BarProgress;
use baton::lab::eval::{evaluate, recall, EvalPlan};
use baton::model::Placement;
use clap::Args;

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    #[command(flatten)]
    pub direction: DirectionArgs,
    /// Held-out text: files or directories, as for calibrate --corpus, or prose of the
    /// evaluation package that calibration never sees: eval:coqa (stories of five
    /// kinds, a few hundred words each: use --prefix 192 --continuation 64) and
    /// eval:lambada (book passages). Default: the evaluation part of the calibration
    /// corpus, which calibration never reads.
    #[arg(long, num_args = 1..)]
    pub texts: Vec<std::path::PathBuf>,
    /// Windows of prefix + continuation tokens.
    #[arg(long, default_value_t = 16)]
    pub limit: usize,
    #[arg(long, default_value_t = 384, value_parser = at_least_one)]
    pub prefix: usize,
    #[arg(long, default_value_t = 128, value_parser = at_least_one)]
    pub continuation: usize,
    /// Leading positions the target computes itself (attention sinks) instead of
    /// receiving them mapped, in text windows and task contexts, as the workbench does
    /// by default; 0 maps everything.
    #[arg(long, default_value_t = baton::mapper::DEFAULT_ANCHOR)]
    pub anchor: usize,
    /// The target reads the last N tokens of each text prefix and task context itself,
    /// on top of the mapped rest (as the workbench's `--tail` does at a switch); their
    /// cost counts as mapping time. 0 maps everything.
    #[arg(long, default_value_t = 0)]
    pub tail: usize,
    /// Stretch the mapped keys away from their mean prediction by this factor (1: as
    /// fitted); ridge predictions are shrunk toward the mean, which flattens attention.
    #[arg(long, default_value_t = 1.0)]
    pub key_gain: f32,
    /// The same for the mapped values.
    #[arg(long, default_value_t = 1.0)]
    pub value_gain: f32,
    /// Task retention on these benchmarks, comma-separated, each `name` or `name:items`
    /// (hellaswag, arc_challenge, arc_easy, winogrande, piqa, gsm8k; `all` for every one).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Generation tasks (GSM8K): the target reads each final question itself, as it
    /// reads a user's new message, and only the few-shot examples before it are mapped.
    #[arg(long)]
    pub target_reads_question: bool,
    /// Items per task where `--tasks` gives no count.
    #[arg(long, default_value_t = 100)]
    pub task_limit: usize,
    /// The multi-turn recall suite on this many conversations (SQuAD passages with
    /// two to four questions each, 165 in all): the passage read in the first turn, one
    /// question a turn after a switch, scored against the reference answers and the
    /// re-prefilled answer. 0 runs none.
    #[arg(long, default_value_t = 0)]
    pub conversations: usize,
    /// Start the recall suite after its first N conversations: an independent check of
    /// a setting chosen on the first ones.
    #[arg(long, default_value_t = 0)]
    pub skip_conversations: usize,
    /// The recall suite's mapper learns from each conversation once its questions are
    /// answered, so later conversations are answered with what it learned (it needs the
    /// calibration's statistics, which `baton calibrate` keeps). Starts from the
    /// calibration and keeps nothing.
    #[arg(long)]
    pub learn: bool,
    /// Measure the mapper as the workbench starts it: its calibration with what it
    /// learned and kept beside it (from conversations, and from calibration text read
    /// while the workbench was idle), instead of the calibration alone.
    #[arg(long)]
    pub learned: bool,
    /// A diagnosis of the recall suite, not a handoff: the mapped cache gets the
    /// target's own keys (true-keys) or values (true-values), to tell which half loses
    /// the facts.
    #[arg(long, value_enum)]
    pub oracle: Option<OracleArg>,
    /// The target re-reads part of the mapped context once it knows what it reads next
    /// (the recall suite's question; a task's question with --target-reads-question or
    /// its tail; a text window's --tail): a share (0.2 or 20%) or a time (150ms),
    /// optionally with the selector and the spans chosen positions grow into
    /// (0.2:facts:word; selectors source-attention, target-attention, cheaper-attention,
    /// contrast, message-words, message-sentences, rare, facts, sentence-facts,
    /// round-trip, deviation, recency; spans token, word, sentence). 0 re-reads nothing.
    #[arg(long)]
    pub reread: Option<baton::engine::RereadOverride>,
    /// Also hand each recall turn over this way, in the same run (repeatable): map,
    /// tail=N, reread=BUDGET[:SELECTOR[:SPANS]], opening (the target holds the system
    /// turn as its own), upper=LAYER (its layers from LAYER on over the mapped residual
    /// stream), lower=LAYER (its own layers below LAYER), or several joined by commas
    /// (opening,reread=0.4:facts:word). Each is scored against the same source-alone and
    /// re-prefilled answers and timed against the same re-prefill.
    #[arg(long = "handoff", value_parser = parse_handoff)]
    pub handoffs: Vec<recall::HandoffVariant>,
    /// Skip the held-out text evaluation (tasks and conversations only).
    #[arg(long)]
    pub no_text: bool,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
// The names are the flag's values (true-keys, …).
#[allow(clippy::enum_variant_names)]
pub enum OracleArg {
    TrueKeys,
    TrueValues,
    /// Both halves the target's own: checks the diagnosis itself.
    TrueBoth,
}

impl From<OracleArg> for recall::Oracle {
    fn from(o: OracleArg) -> Self {
        match o {
            OracleArg::TrueKeys => Self::TrueKeys,
            OracleArg::TrueValues => Self::TrueValues,
            OracleArg::TrueBoth => Self::TrueBoth,
        }
    }
}

fn parse_handoff(s: &str) -> Result<recall::HandoffVariant, String> {
    recall::HandoffVariant::parse(s).map_err(|e| e.to_string())
}

impl EvalArgs {
    /// What the flags cannot ask for together, checked before any model loads.
    pub fn validate(&self) -> Result<()> {
        if !self.handoffs.is_empty() && self.conversations == 0 {
            bail!("--handoff hands the recall suite's turns over: give --conversations N");
        }
        let rereads = self.reread.is_some_and(|r| r.0.is_some());
        if rereads && !self.no_text && self.tail == 0 {
            bail!(
                "--reread in text windows chooses with the prefix's newest tokens as the message the target reads itself: give --tail N (32, say), or --no-text"
            );
        }
        if rereads && !self.tasks.is_empty() && self.tail == 0 && !self.target_reads_question {
            bail!(
                "--reread in task contexts chooses with what the target reads itself: give --target-reads-question (generation tasks) or --tail N"
            );
        }
        if self.learn && self.conversations == 0 {
            bail!("--learn learns from the recall suite's conversations: give --conversations N");
        }
        if self.learned && (self.key_gain != 1.0 || self.value_gain != 1.0) {
            bail!("--learned solves the maps again with the gains they were calibrated with: leave out --key-gain and --value-gain");
        }
        if self.learn && (self.key_gain != 1.0 || self.value_gain != 1.0) {
            bail!("--learn solves the maps again with the gains they were calibrated with: leave out --key-gain and --value-gain");
        }
        if !self.no_text && self.anchor >= self.prefix {
            bail!(
                "--anchor {} leaves nothing of the {}-token prefix to map: give an anchor below --prefix",
                self.anchor,
                self.prefix
            );
        }
        Ok(())
    }

    /// The text, task and recall evaluation settings these flags ask for.
    pub fn options(
        &self,
    ) -> (
        baton::lab::eval::text::TextEvalOptions,
        baton::lab::eval::tasks::TaskEvalOptions,
        recall::RecallOptions,
    ) {
        (
            baton::lab::eval::text::TextEvalOptions {
                prefix: self.prefix,
                continuation: self.continuation,
                anchor: self.anchor,
                tail: self.tail,
                reread: self.reread.and_then(|r| r.0),
                ..Default::default()
            },
            baton::lab::eval::tasks::TaskEvalOptions {
                anchor: self.anchor,
                tail: self.tail,
                target_reads_question: self.target_reads_question,
                reread: self.reread.and_then(|r| r.0),
                ..Default::default()
            },
            recall::RecallOptions {
                anchor: self.anchor,
                tail: self.tail,
                reread: self.reread.and_then(|r| r.0),
                oracle: self.oracle.map(Into::into),
                first_conversation: self.skip_conversations,
                ..Default::default()
            },
        )
    }

    /// The recall suite's conversations asked for (none without `--conversations`).
    fn load_conversations(&self) -> Result<Vec<RecallConversation>> {
        if self.conversations == 0 {
            return Ok(Vec::new());
        }
        super::common::recall_conversations(self.skip_conversations, self.conversations)
    }
}

pub fn eval(a: EvalArgs, on: &Placement) -> Result<()> {
    a.validate()?;
    // Task names are checked before any model loads: a typo costs nothing.
    let task_list = tasks::parse_specs(&a.tasks, a.task_limit)?;
    if a.no_text && task_list.is_empty() && a.conversations == 0 {
        bail!("--no-text with no --tasks and no --conversations leaves nothing to evaluate: name tasks (e.g. --tasks hellaswag,gsm8k) or ask for --conversations 12");
    }
    let task_items = tasks::load_all(&task_list, &BarProgress::new())?;
    let conversations = a.load_conversations()?;
    // Read before the models: a path that holds no text is refused in a moment, not
    // after seconds of loading.
    let text = if a.no_text {
        None
    } else {
        Some(baton::data::held_out::eval_text(&a.texts)?)
    };
    let (first, second) = a.pair.open(on)?;
    let len = a.prefix + a.continuation;
    let windows = match &text {
        Some(t) => t.windows(&first.tokenizer, len, a.limit)?,
        None => Vec::new(),
    };
    drop(text);
    if !a.no_text && windows.len() < a.limit {
        eprintln!(
            "the text holds {} windows of {len} tokens, fewer than --limit {}: evaluating those",
            windows.len(),
            a.limit
        );
    }
    if windows.is_empty() && task_items.is_empty() && conversations.is_empty() {
        bail!("nothing to evaluate: --limit 0 asks for no text windows; ask for some, or name --tasks");
    }
    let (text, task_options, recall) = a.options();
    let mapper_dir = a.pair.mapper_dir();
    let plan = EvalPlan {
        windows: &windows,
        text,
        tasks: &task_items,
        task_options,
        conversations: &conversations,
        recall,
        handoffs: &a.handoffs,
        mapper_dir: &mapper_dir,
        precision: a.precision.precision.into(),
        gains: baton::lab::eval::Gains {
            key: a.key_gain,
            value: a.value_gain,
        },
        learn: a.learn,
        learned: a.learned,
    };
    let report = evaluate(
        &a.direction.pairs(&first, &second),
        &plan,
        &baton::console::PhaseBars::new(a.json),
    )?;
    if a.json {
        super::common::print_json(&report)?;
    }
    Ok(())
}
