//! Command-line surface: subcommands and their options. Parsing only; the work is done
//! by the library, called from main.rs.

use anyhow::{bail, Context, Result};
use baton::calibrate::{CalibrateOptions, RankChoice, SelectBy, TokenFeatures};
use candle_core::Device;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "baton",
    version,
    about = "Hand a conversation from one language model to another without a second prefill",
    long_about = "baton maps one model's KV cache into another's (same tokenizer family) with a fitted \
linear mapper, and measures it against a real re-prefill. Run with no arguments for the default job."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

#[derive(Debug, Args, Clone)]
pub struct DeviceArgs {
    /// Where to run: `cpu`, or `cuda` / `cuda:N` (needs a build with --features cuda).
    #[arg(long, global = true, default_value = "cpu")]
    pub device: String,
}

impl DeviceArgs {
    pub fn device(&self) -> Result<Device> {
        match self.device.as_str() {
            "cpu" => Ok(Device::Cpu),
            s if s == "cuda" || s.starts_with("cuda:") => {
                let ordinal: usize = match s.strip_prefix("cuda:") {
                    Some(n) => n
                        .parse()
                        .with_context(|| format!("--device {s}: `{n}` is not a device number"))?,
                    None => 0,
                };
                Device::new_cuda(ordinal).with_context(|| {
                    format!("cannot open {s}: build with `cargo build --release --features cuda` on a machine with CUDA, or use --device cpu")
                })
            }
            other => bail!("unknown device `{other}`: use cpu, cuda or cuda:N"),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Download models and data into the cache dir (checksummed; nothing is fetched twice).
    Fetch(FetchArgs),
    /// Show a model's architecture, KV geometry, rope, tokenizer fingerprint and checksum.
    Info(InfoArgs),
    /// Generate text from a prompt, streaming, then report prefill and decode speed.
    Generate(GenerateArgs),
    /// Time prefill and decode of baton's decoder next to candle-transformers' own
    /// quantized model on the same file, in one run.
    BenchModel(BenchModelArgs),
    /// Fit the KV-cache mappers between two models (both directions unless --direction).
    Calibrate(CalibrateArgs),
    /// List the mapper artifacts in the cache dir.
    Mappers(MappersArgs),
    /// Measure a calibrated mapper on held-out text: R², attention cosine, next-token
    /// agreement, KL and perplexities against the target's own prefill.
    Eval(EvalArgs),
    /// Summarise a recorded session file: switch latencies and speed-ups, attention
    /// cosine, token agreement, gate decisions; optionally plot the drift across turns.
    Report(ReportArgs),
    /// Run a scripted conversation (TOML: user messages and switches) without the
    /// terminal UI, and record it as a session file.
    Run(RunArgs),
    /// Re-run a recorded session's messages and switches on the current models and
    /// mappers, and report where the new run differs from the recording.
    Replay(ReplayArgs),
    /// The terminal workbench (what `baton` with no arguments opens): chat, switch
    /// models with Tab, and watch the handoff's cost and fidelity live.
    Workbench(WorkbenchArgs),
    /// Play the scripted demo conversation in the workbench, pausing at every switch.
    Demo(WorkbenchArgs),
    /// Time mapping against re-prefill across context lengths, both directions, in
    /// one run: source prefill, full and suffix re-prefill, full and suffix map, switch
    /// end to end; with the fitted growth per token and the mapper's FLOPs and bytes.
    Bench(BenchArgs),
    /// Measure switches over varied text (code, prose, other languages, chat) beside the
    /// estimates the gate can have without a re-prefill, report their correlation with
    /// the measured attention cosine and agreement, and keep the line the gate predicts
    /// the cosine with.
    GateStudy(GateStudyArgs),
}

#[derive(Debug, Args)]
pub struct GateStudyArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    /// Switches to measure (at least 50 for a line worth keeping).
    #[arg(long, default_value_t = 60, value_parser = at_least_one)]
    pub switches: usize,
    /// Draw the estimates against the measured cosine (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Do not keep the fitted line beside the artifact.
    #[arg(long)]
    pub no_save: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub source: String,
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    #[arg(long, value_enum, default_value = "both")]
    pub direction: DirectionArg,
    /// Context lengths in tokens.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128,256,512,1024,2048,4096,8192"
    )]
    pub lengths: Vec<usize>,
    /// Timed repeats per length (after one warm-up).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub repeats: usize,
    /// Tokens of the suffix handoff (what a target already holding the rest needs).
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub suffix: usize,
    /// Read the mappers from here instead of the cache dir's mappers/.
    #[arg(long)]
    pub mapper_dir: Option<std::path::PathBuf>,
    /// Arithmetic of the map: int8 on the CPU's int8 kernels where it has them, or f32.
    #[arg(long, value_enum, default_value = "int8")]
    pub precision: PrecisionArg,
    /// Also draw map and re-prefill time against context length (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
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

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PrecisionArg {
    Int8,
    F32,
}

impl From<PrecisionArg> for baton::mapper::MapPrecision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Int8 => Self::Int8,
            PrecisionArg::F32 => Self::F32,
        }
    }
}

#[derive(Debug, Args, Clone)]
pub struct WorkbenchArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    /// Session file to record to (default: sessions/<start time>.jsonl).
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
    /// Do not record the session.
    #[arg(long, conflicts_with = "record")]
    pub no_record: bool,
    /// Longest answer, in tokens.
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    pub max_tokens: usize,
    /// Re-prefill instead of mapping when the switch's fidelity estimate (mean
    /// attention cosine) is below this.
    #[arg(long)]
    pub gate: Option<f64>,
    /// Map the inactive model's cache after every turn, so a switch finds it ready.
    #[arg(long)]
    pub premap: bool,
    /// Start with the re-prefilled reference path off (Ctrl-R toggles it).
    #[arg(long)]
    pub no_reference: bool,
    /// At a switch, the target reads the newest N tokens of the conversation itself
    /// instead of receiving them mapped: a longer handoff for the facts said last.
    #[arg(long, default_value_t = 0)]
    pub tail: usize,
    /// Do not learn from the conversation: the mappers stay as calibrated (what they
    /// learned in earlier sessions is not used either).
    #[arg(long)]
    pub no_learn: bool,
    /// Learn from the conversation but keep nothing for the next session.
    #[arg(long)]
    pub no_keep_learned: bool,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions (Ctrl-P toggles).
    #[arg(long)]
    pub repair: bool,
}

impl WorkbenchArgs {
    /// The options `baton` with no arguments runs with: every flag at its default.
    pub fn defaults() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            args: WorkbenchArgs,
        }
        Only::parse_from(["baton"]).args
    }
}

#[derive(Debug, Args, Clone)]
pub struct PairArgs {
    /// The model that starts the conversation.
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub source: String,
    /// The model it is handed to at the first switch.
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    /// Read the mappers from here instead of the cache dir's mappers/.
    #[arg(long)]
    pub mapper_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script (see assets/demo.toml).
    #[arg(long)]
    pub script: std::path::PathBuf,
    #[command(flatten)]
    pub pair: PairArgs,
    /// Session file to record to (default: sessions/<start time>.jsonl).
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
    /// Re-prefill instead of mapping when the switch's fidelity estimate (mean
    /// attention cosine) is below this.
    #[arg(long)]
    pub gate: Option<f64>,
    /// Map the inactive model's cache after every turn, so a switch finds it ready.
    #[arg(long)]
    pub premap: bool,
    /// Turn the re-prefilled reference path off.
    #[arg(long)]
    pub no_reference: bool,
    /// At a switch, the target reads the newest N tokens itself (overrides the script's
    /// `tail`).
    #[arg(long)]
    pub tail: Option<usize>,
    /// Do not learn from the conversation: the mappers stay as calibrated (what they
    /// learned in earlier sessions is not used either).
    #[arg(long)]
    pub no_learn: bool,
    /// Learn from the conversation but keep nothing for the next session.
    #[arg(long)]
    pub no_keep_learned: bool,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions (Ctrl-P toggles).
    #[arg(long)]
    pub repair: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The recorded session file; its header names the models.
    pub session: std::path::PathBuf,
    /// Read the mappers from here instead of the cache dir's mappers/.
    #[arg(long)]
    pub mapper_dir: Option<std::path::PathBuf>,
    /// Where to record the new run (default: sessions/<start time>.jsonl).
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub source: String,
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    #[arg(long, value_enum, default_value = "both")]
    pub direction: DirectionArg,
    /// Held-out text: files or directories, as for calibrate --corpus (default: the
    /// evaluation part of the calibration corpus, which calibration never reads).
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
    /// A diagnosis of the recall suite, not a handoff: the mapped cache gets the
    /// target's own keys (true-keys) or values (true-values), to tell which half loses
    /// the facts.
    #[arg(long, value_enum)]
    pub oracle: Option<OracleArg>,
    /// Skip the held-out text evaluation (tasks and conversations only).
    #[arg(long)]
    pub no_text: bool,
    /// Read the mappers from here instead of the cache dir's mappers/.
    #[arg(long)]
    pub mapper_dir: Option<std::path::PathBuf>,
    /// Arithmetic of the map: int8 on the CPU's int8 kernels where it has them, or f32.
    #[arg(long, value_enum, default_value = "int8")]
    pub precision: PrecisionArg,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DirectionArg {
    /// Source to target and target to source.
    Both,
    SourceToTarget,
    TargetToSource,
}

impl DirectionArg {
    /// The calibration directions asked for.
    pub fn calibrated(self) -> Vec<baton::calibrate::Direction> {
        use baton::calibrate::Direction::{Backward, Forward};
        match self {
            Self::Both => vec![Forward, Backward],
            Self::SourceToTarget => vec![Forward],
            Self::TargetToSource => vec![Backward],
        }
    }

    /// The (source, target) pairs asked for, `first` being `--source`.
    pub fn pairs<'m, T>(self, first: &'m T, second: &'m T) -> Vec<(&'m T, &'m T)> {
        match self {
            Self::Both => vec![(first, second), (second, first)],
            Self::SourceToTarget => vec![(first, second)],
            Self::TargetToSource => vec![(second, first)],
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SelectByArg {
    /// Held-out attention-output cosine, mean over target layers.
    Cosine,
    /// Held-out next-token top-1 agreement on the windows' last quarter.
    Agreement,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub source: String,
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    #[arg(long, value_enum, default_value = "both")]
    pub direction: DirectionArg,
    /// Calibration text: files (plain text or source code, .html, or .jsonl with a
    /// "text" field) or directories of them; default: the exllamav2 calibration files.
    #[arg(long, num_args = 1..)]
    pub corpus: Vec<std::path::PathBuf>,
    /// Windows used for fitting (sized for a 2-core CPU; --reference gives 500 × 1024).
    #[arg(long, default_value_t = 64)]
    pub sequences: usize,
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// The reference setting: 500 sequences of 1024 tokens.
    #[arg(long, conflicts_with_all = ["sequences", "seq_len"])]
    pub reference: bool,
    /// Keep every N-th position of a window as an observation.
    #[arg(long, default_value_t = 4)]
    pub stride: usize,
    /// Leave the first N positions of every window out of the fit (attention sinks,
    /// outliers by orders of magnitude) and score held-out windows with the target's own
    /// first N positions: a mapper for use behind `--anchor N` (the workbench anchors 1).
    #[arg(long, default_value_t = 0)]
    pub skip_first: usize,
    /// Held-out windows used to choose k and lambda.
    #[arg(long, default_value_t = 8)]
    pub select_sequences: usize,
    /// Candidate k values (source layers per target layer); `all` for every layer.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,12,16,all")]
    pub k: Vec<String>,
    /// Candidate ridge penalties, absolute on the standardised Gram (whose diagonal is
    /// the observation count): every (k, λ) pair is scored on the held-out windows.
    #[arg(long, value_delimiter = ',', default_value = "0.01")]
    pub lambda: Vec<f64>,
    /// The largest k the mapper may use (`all` for no limit). Larger k are still swept
    /// and the report says what they would reach; each doubling of k doubles the map's
    /// time.
    #[arg(long, default_value = "8")]
    pub max_k: String,
    /// What chooses k and λ on the held-out windows: the attention-output cosine, or the
    /// next-token top-1 agreement of the target continuing from the mapped prefix (both
    /// are always measured and reported).
    #[arg(long, value_enum, default_value = "cosine")]
    pub select_by: SelectByArg,
    /// Share of the fit and selection windows rendered as conversations through the
    /// chat template, as the workbench's caches are (system prompt, role headers,
    /// end-of-turn tokens); the rest is plain text. 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    pub chat_share: f64,
    /// Let maps also read the target's own layer-0 keys and values of the tokens, which
    /// the target computes from the token ids alone (no attention): exact features of
    /// which token stands where, the part of the cache a name or a number rides on.
    /// `all` (the default): every map; `cosine` / `r2`: per layer and half, where the
    /// held-out attention cosine / R² rises; `off`: none.
    #[arg(long, value_enum, num_args = 0..=1, default_value = "all", default_missing_value = "all")]
    pub token_features: TokenFeatures,
    /// Stretch the chosen key maps' predictions away from their mean by this factor
    /// (1: as fitted), folded into the saved weights: ridge predictions are shrunk toward
    /// the mean, which flattens the target's attention. `matched` (the default): per head, the gain that
    /// gives the mapped keys the spread of the true keys on the held-out windows.
    #[arg(long, default_value = "matched")]
    pub key_gain: String,
    /// The same for the value maps.
    #[arg(long, default_value = "1")]
    pub value_gain: String,
    /// Held-out score (in the `--select-by` measure) a smaller, faster k may give up
    /// against the best and still be chosen (e.g. 0.01; default none).
    #[arg(long, default_value_t = 0.0)]
    pub k_tolerance: f64,
    /// Fit on raw instead of standardised features.
    #[arg(long)]
    pub no_standardize: bool,
    /// Fit the reduced mapper: the full ridge map cut to this rank (a multiple of 32) by
    /// reduced-rank regression, or `auto` for the smallest rank whose held-out attention
    /// cosine is within 0.01 of the full map's. Fewer FLOPs per token; see the report.
    #[arg(long)]
    pub rank: Option<String>,
    /// Write the artifacts here instead of the cache dir's mappers/ (e.g. a mapper fitted
    /// on a special corpus, kept apart from the default one).
    #[arg(long)]
    pub mapper_dir: Option<std::path::PathBuf>,
    /// Do not keep the fit's statistics beside the artifacts. They are kept by default
    /// (in stats/, about 0.6 GB for 0.5B→1.5B and 1.2 GB for 1.5B→0.5B): the mappers
    /// learn from conversations by adding to them, and a later calibration can add
    /// windows to them with --merge-stats instead of capturing again.
    #[arg(long)]
    pub no_save_stats: bool,
    /// Kept so that older command lines still run: statistics are saved by default.
    #[arg(long, hide = true, conflicts_with = "no_save_stats")]
    pub save_stats: bool,
    /// Add the statistics saved by an earlier calibration in these mapper directories
    /// (none named: the one being written) to this run's windows, and fit from the sum.
    /// With --sequences 0 nothing new is read: k and λ are chosen again from the saved
    /// statistics in minutes.
    #[arg(long, num_args = 0.., value_name = "MAPPER_DIR")]
    pub merge_stats: Option<Vec<std::path::PathBuf>>,
    /// Weight each fit position by the attention the target's own queries give it,
    /// relative to even attention, raised to this power (0: off; 0.5 tempers it, 1 is in
    /// proportion): the map is fitted hardest where the target reads.
    #[arg(long, default_value_t = 0.0)]
    pub attention_weight: f32,
    /// Pass over the corpus's first N fit windows: those that statistics being merged
    /// already hold (their count is in `baton mappers`).
    #[arg(long, default_value_t = 0)]
    pub skip_windows: usize,
    /// Print the calibration report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MappersArgs {
    #[arg(long)]
    pub json: bool,
    /// Forget what the mappers learned from conversations, returning each to its
    /// calibration (the calibration's own statistics stay).
    #[arg(long)]
    pub reset_learned: bool,
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Manifest names to fetch (see assets/models.toml); default: the default pair.
    pub names: Vec<String>,
    /// A pair name from the manifest (e.g. `default`).
    #[arg(long)]
    pub pair: Option<String>,
    /// Fetch every entry of the manifest (models and data sets).
    #[arg(long, conflicts_with_all = ["names", "pair"])]
    pub all: bool,
    /// Hash every cached file again, whatever its stamp says (a start-up trusts a file
    /// whose size and modification time are unchanged), and fetch again what no longer
    /// matches; without names, every entry in the cache.
    #[arg(long)]
    pub verify: bool,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// A .gguf file, a safetensors directory, hf:OWNER/REPO/FILE, or a manifest name.
    #[arg(long, short)]
    pub model: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A .gguf file, a safetensors directory, hf:OWNER/REPO/FILE, or a manifest name.
    #[arg(long, short, default_value = "qwen2.5-coder-0.5b")]
    pub model: String,
    #[arg(long, short)]
    pub prompt: String,
    /// Wrap the prompt as a user turn with the model's own chat template.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_parser = temperature)]
    pub temperature: f64,
    /// Sample from the smallest set of tokens whose probabilities reach this, in (0, 1].
    #[arg(long, default_value_t = 0.95, value_parser = top_p)]
    pub top_p: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Models to time (default: both models of the default pair).
    #[arg(long, short)]
    pub model: Vec<String>,
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    pub decode_len: usize,
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub repeats: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A session file (.jsonl) written by baton.
    pub session: std::path::PathBuf,
    /// Print the report as JSON (format `baton-report`) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also draw the drift across turns to this file (.svg, or .png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

impl CalibrateArgs {
    /// The calibration these flags ask for; `validate` on the result checks the
    /// combination before any model loads.
    pub fn options(&self) -> Result<CalibrateOptions> {
        let (sequences, seq_len) = if self.reference {
            (500, 1024)
        } else {
            (self.sequences, self.seq_len)
        };
        let k_sweep = self
            .k
            .iter()
            .map(|k| number_or_all(k, "--k"))
            .collect::<Result<Vec<_>>>()?;
        Ok(CalibrateOptions {
            sequences,
            seq_len,
            stride: self.stride,
            skip_first: self.skip_first,
            select_sequences: self.select_sequences,
            k_sweep,
            lambdas: self.lambda.clone(),
            max_k: number_or_all(&self.max_k, "--max-k")?,
            k_tolerance: self.k_tolerance,
            select_by: match self.select_by {
                SelectByArg::Cosine => SelectBy::Cosine,
                SelectByArg::Agreement => SelectBy::Agreement,
            },
            standardize: !self.no_standardize,
            chat_share: self.chat_share,
            token_features: self.token_features,
            key_gain: gain_number(&self.key_gain, "--key-gain")?.unwrap_or(1.0),
            value_gain: gain_number(&self.value_gain, "--value-gain")?.unwrap_or(1.0),
            key_gain_matched: self.key_gain == "matched",
            value_gain_matched: self.value_gain == "matched",
            skip_windows: self.skip_windows,
            attention_weight: self.attention_weight,
            rank: match self.rank.as_deref() {
                None => None,
                Some("auto") => Some(RankChoice::Auto),
                Some(r) => Some(RankChoice::Fixed(r.parse().with_context(|| {
                    format!("--rank takes a number or `auto`, got `{r}`")
                })?)),
            },
            ..CalibrateOptions::default()
        })
    }
}

/// A gain flag's number, or `None` for `matched`.
fn gain_number(v: &str, flag: &str) -> Result<Option<f32>> {
    if v == "matched" {
        return Ok(None);
    }
    v.parse::<f32>().map(Some).with_context(|| {
        format!("{flag} takes a number (1 leaves the maps as fitted) or `matched`, got `{v}`")
    })
}

/// A count where `all` means every layer.
fn number_or_all(v: &str, flag: &str) -> Result<usize> {
    if v == "all" {
        return Ok(usize::MAX);
    }
    v.parse()
        .with_context(|| format!("{flag} takes a number or `all`, got `{v}`"))
}

impl RunArgs {
    /// The command line's settings over the script's.
    pub fn apply(&self, s: &mut baton::engine::Settings) {
        if self.no_reference {
            s.reference = false;
        }
        if self.gate.is_some() {
            s.gate = self.gate;
        }
        s.premap |= self.premap;
        if let Some(t) = self.tail {
            s.tail = t;
        }
        if self.no_learn {
            s.learn = false;
        }
        s.repair |= self.repair;
    }
}

impl GenerateArgs {
    pub fn options(&self, stop_ids: &[u32]) -> baton::model::GenerateOptions {
        baton::model::GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: baton::model::Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                seed: self.seed,
            },
            stop_ids: stop_ids.to_vec(),
        }
    }
}

impl EvalArgs {
    /// The text and task evaluation settings these flags ask for.
    pub fn options(
        &self,
    ) -> (
        baton::eval::text::TextEvalOptions,
        baton::eval::tasks::TaskEvalOptions,
        baton::eval::recall::RecallOptions,
    ) {
        (
            baton::eval::text::TextEvalOptions {
                prefix: self.prefix,
                continuation: self.continuation,
                anchor: self.anchor,
                tail: self.tail,
                ..Default::default()
            },
            baton::eval::tasks::TaskEvalOptions {
                anchor: self.anchor,
                tail: self.tail,
                target_reads_question: self.target_reads_question,
                ..Default::default()
            },
            baton::eval::recall::RecallOptions {
                anchor: self.anchor,
                tail: self.tail,
                oracle: self.oracle.map(|o| match o {
                    OracleArg::TrueKeys => baton::eval::recall::Oracle::TrueKeys,
                    OracleArg::TrueValues => baton::eval::recall::Oracle::TrueValues,
                    OracleArg::TrueBoth => baton::eval::recall::Oracle::TrueBoth,
                }),
                first_conversation: self.skip_conversations,
                ..Default::default()
            },
        )
    }
}

/// A count that must be at least 1 (0 would mean nothing to do, or divide by zero).
fn at_least_one(v: &str) -> std::result::Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{v}` is not a count: {e}")),
    }
}

/// A sampling temperature: finite and not negative (0 is greedy).
fn temperature(v: &str) -> std::result::Result<f64, String> {
    match v.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        Ok(t) => Err(format!("{t} is not a temperature: give 0 (greedy) or more")),
        Err(e) => Err(format!("`{v}` is not a number: {e}")),
    }
}

/// A nucleus-sampling mass in (0, 1].
fn top_p(v: &str) -> std::result::Result<f64, String> {
    match v.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        Ok(p) => Err(format!("{p} is outside (0, 1]")),
        Err(e) => Err(format!("`{v}` is not a number: {e}")),
    }
}

impl EvalArgs {
    /// What the flags cannot ask for together, checked before any model loads.
    pub fn validate(&self) -> Result<()> {
        if self.learn && self.conversations == 0 {
            bail!("--learn learns from the recall suite's conversations: give --conversations N");
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
}

impl BenchArgs {
    /// What the flags cannot ask for together, checked before any model loads.
    pub fn validate(&self) -> Result<()> {
        if let Some(&l) = self.lengths.iter().find(|&&l| l <= self.suffix) {
            bail!(
                "--suffix {} is not shorter than the length {l} in --lengths: the suffix is the new part of a longer context; give a smaller --suffix or longer --lengths",
                self.suffix
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calibrate(args: &[&str]) -> CalibrateArgs {
        let cli = Cli::try_parse_from([&["baton", "calibrate"], args].concat()).unwrap();
        match cli.command {
            Some(Command::Calibrate(a)) => a,
            other => panic!("not calibrate: {other:?}"),
        }
    }

    #[test]
    fn calibrate_flags_become_options_with_all_as_every_layer() {
        let o = calibrate(&["--k", "1", "--k", "all", "--max-k", "all", "--rank", "auto"])
            .options()
            .unwrap();
        assert_eq!(o.k_sweep, vec![1, usize::MAX]);
        assert_eq!(o.max_k, usize::MAX);
        assert_eq!(o.rank, Some(RankChoice::Auto));
        let o = calibrate(&["--reference", "--max-k", "4", "--rank", "16"])
            .options()
            .unwrap();
        assert_eq!((o.sequences, o.seq_len, o.max_k), (500, 1024, 4));
        assert_eq!(o.rank, Some(RankChoice::Fixed(16)));
    }

    fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from([&["baton"], args].concat())
    }

    #[test]
    fn counts_of_zero_and_impossible_sampling_are_refused_when_parsing() {
        for args in [
            &["generate", "-p", "x", "--max-tokens", "0"][..],
            &["generate", "-p", "x", "--temperature", "NaN"],
            &["generate", "-p", "x", "--temperature=-1"],
            &["generate", "-p", "x", "--top-p", "0"],
            &["bench", "--repeats", "0"],
            &["bench", "--suffix", "0"],
            &["eval", "--prefix", "0"],
            &["eval", "--continuation", "0"],
            &["bench-model", "--repeats", "0"],
        ] {
            let e = parse(args).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("invalid value"), "{args:?}: {e}");
        }
        assert!(parse(&["generate", "-p", "x", "--temperature", "0.7"]).is_ok());
    }

    #[test]
    fn an_anchor_past_the_prefix_and_a_suffix_past_a_length_are_refused() {
        let eval = |args: &[&str]| match parse(&[&["eval"], args].concat()).unwrap().command {
            Some(Command::Eval(a)) => a.validate(),
            _ => unreachable!(),
        };
        let e = eval(&["--anchor", "500"]).unwrap_err().to_string();
        assert!(e.contains("--anchor 500") && e.contains("384"), "{e}");
        assert!(eval(&["--anchor", "1"]).is_ok());
        let bench = |args: &[&str]| match parse(&[&["bench"], args].concat()).unwrap().command {
            Some(Command::Bench(a)) => a.validate(),
            _ => unreachable!(),
        };
        let e = bench(&["--lengths", "128", "--suffix", "1000"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--suffix 1000") && e.contains("128"), "{e}");
        assert!(bench(&[]).is_ok());
    }

    #[test]
    fn directions_put_the_source_first() {
        assert_eq!(DirectionArg::Both.pairs(&1, &2), vec![(&1, &2), (&2, &1)]);
        assert_eq!(DirectionArg::TargetToSource.pairs(&1, &2), vec![(&2, &1)]);
    }

    #[test]
    fn an_unknown_device_says_which_ones_exist() {
        let d = |s: &str| DeviceArgs { device: s.into() }.device();
        assert!(d("cpu").unwrap().is_cpu());
        let e = d("tpu").unwrap_err().to_string();
        assert!(e.contains("cpu, cuda or cuda:N"), "{e}");
        let e = d("cuda:x").unwrap_err().to_string();
        assert!(e.contains("`x` is not a device number"), "{e}");
    }

    #[test]
    fn a_bad_count_names_its_flag() {
        let o = calibrate(&["--key-gain", "matched", "--value-gain", "1.5"])
            .options()
            .unwrap();
        assert!(o.key_gain_matched && !o.value_gain_matched);
        assert_eq!(o.value_gain, 1.5);
        let o = calibrate(&[]).options().unwrap();
        assert_eq!(
            o.key_gain_matched,
            baton::calibrate::DEFAULT_KEY_GAIN_MATCHED
        );
        assert!(!o.value_gain_matched);
        let e = calibrate(&["--key-gain", "sharp"])
            .options()
            .unwrap_err()
            .to_string();
        assert!(e.contains("`matched`"), "{e}");
        let e = calibrate(&["--k", "two"])
            .options()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--k") && e.contains("`two`"), "{e}");
        let e = calibrate(&["--rank", "x"])
            .options()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--rank"), "{e}");
    }
}
