//! What several commands share: the pair of models and the directions between them, the
//! mapper directory, the device, the map's arithmetic, and the typed values their flags
//! take (parsed once, by clap).

use super::args::SettingsArgs;
use anyhow::{Context, Result};
use baton::calibrate::RankChoice;
use baton::engine::{EngineConfig, SettingsOverrides};
use baton::fetch::{self, BarProgress};
use baton::mapper::dir::MapperDir;
use baton::model::{Model, Placement};
use baton::session;
use candle_core::Device;
use clap::Args;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where the commands run: `--device cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    /// A CUDA device by its number.
    Cuda(usize),
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(Self::Cuda)
                    .map_err(|_| format!("`{n}` is not a device number (cuda:N)")),
                None => Err(format!("unknown device `{s}`: use cpu, cuda or cuda:N")),
            },
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceArg {
    /// Open the device (CUDA needs a build with `--features cuda`).
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(n) => Device::new_cuda(n).with_context(|| {
                format!("cannot open {self}: build with `cargo build --release --features cuda` on a machine with CUDA, or use --device cpu")
            }),
        }
    }
}

/// `--mapper-dir`, for every command that reads or writes mappers.
#[derive(Debug, Args, Clone)]
pub struct MapperDirArgs {
    /// Mappers directory to use instead of the cache dir's mappers/ (where `calibrate`
    /// writes the artifacts and the other commands read them), e.g. for a mapper fitted
    /// on a special corpus, kept apart from the default one.
    #[arg(long, env = "BATON_MAPPER_DIR", value_parser = parse_mapper_dir)]
    pub mapper_dir: Option<PathBuf>,
}

impl MapperDirArgs {
    /// The mapper directory these flags (or the environment) name, or the default one.
    pub fn dir(&self) -> MapperDir {
        MapperDir::resolve(self.mapper_dir.as_deref())
    }
}

/// A mappers directory: one that exists, or a path where one can be made. Checked when
/// the flags are read, so that a file named by mistake costs no calibration and gets
/// no advice to calibrate.
fn parse_mapper_dir(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    match std::fs::metadata(&p) {
        Ok(m) if !m.is_dir() => Err(format!(
            "{s} is a file, not a directory: name a directory for the mappers (it is made if missing)"
        )),
        _ => Ok(p),
    }
}

/// The two models a command works on, and where their mappers are.
#[derive(Debug, Args, Clone)]
pub struct PairArgs {
    /// The source model: the one that starts the conversation.
    #[arg(long, default_value = "qwen2.5-coder-0.5b")]
    pub source: String,
    /// The target model: the one it is handed to at the first switch.
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub target: String,
    #[command(flatten)]
    pub mappers: MapperDirArgs,
}

impl PairArgs {
    pub fn mapper_dir(&self) -> MapperDir {
        self.mappers.dir()
    }

    /// Both models, source first, with download and load progress.
    pub fn open(&self, on: &Placement) -> Result<(Model, Model)> {
        let progress = BarProgress::new();
        let first = fetch::open_model_on(&self.source, on, &progress)?;
        Ok((first, fetch::open_model_on(&self.target, on, &progress)?))
    }
}

/// `--direction`, for the commands that work on one direction of the pair or both.
#[derive(Debug, Args, Clone, Copy)]
pub struct DirectionArgs {
    #[arg(long, value_enum, default_value = "both")]
    pub direction: DirectionArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DirectionArg {
    /// Source to target and target to source.
    Both,
    SourceToTarget,
    TargetToSource,
}

impl DirectionArgs {
    /// The calibration directions asked for.
    pub fn calibrated(self) -> Vec<baton::calibrate::Direction> {
        self.direction.calibrated()
    }

    /// The (source, target) pairs asked for, `first` being `--source`.
    pub fn pairs<'m, T>(self, first: &'m T, second: &'m T) -> Vec<(&'m T, &'m T)> {
        self.direction.pairs(first, second)
    }
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

/// `--precision`, for the commands that map.
#[derive(Debug, Args, Clone, Copy)]
pub struct PrecisionArgs {
    /// Arithmetic of the map: int8 on the CPU's int8 kernels where it has them, or f32.
    #[arg(long, value_enum, default_value = "int8")]
    pub precision: PrecisionArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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

/// A gain folded into the maps: a factor (1 leaves them as fitted), or `matched`, the
/// gain per head that gives the mapped side the spread of the true one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gain {
    Factor(f32),
    Matched,
}

impl FromStr for Gain {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        if v == "matched" {
            return Ok(Self::Matched);
        }
        v.parse().map(Self::Factor).map_err(|_| {
            format!("expected a number (1 leaves the maps as fitted) or `matched`, got `{v}`")
        })
    }
}

impl Gain {
    /// The factor, 1 where the gain is matched (the calibration finds it).
    pub fn factor(self) -> f32 {
        match self {
            Self::Factor(g) => g,
            Self::Matched => 1.0,
        }
    }

    pub fn is_matched(self) -> bool {
        self == Self::Matched
    }
}

/// A count where `all` means no limit (every layer).
pub fn count_or_all(v: &str) -> Result<usize, String> {
    if v == "all" {
        return Ok(usize::MAX);
    }
    v.parse()
        .map_err(|_| format!("expected a number or `all`, got `{v}`"))
}

/// A rank for the reduced mapper, or `auto`.
pub fn rank(v: &str) -> Result<RankChoice, String> {
    if v == "auto" {
        return Ok(RankChoice::Auto);
    }
    v.parse()
        .map(RankChoice::Fixed)
        .map_err(|_| format!("expected a number or `auto`, got `{v}`"))
}

pub use baton::engine::config::at_least_one;

/// Output of a command that can also print JSON: with `--json` it goes to stderr, so
/// that stdout is one JSON document.
pub fn human(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// The recall suite's conversations `skip..skip + count` (fewer, said, where the suite
/// ends first), for `eval --conversations` and `study recall-scripts`.
pub fn recall_conversations(
    skip: usize,
    count: usize,
) -> Result<Vec<baton::data::recall::RecallConversation>> {
    let root = fetch::ensure_by_name("eval-tasks", &BarProgress::new())?.path;
    let mut c = baton::data::recall::load_conversations(&root, skip + count)?;
    if c.len() <= skip {
        anyhow::bail!(
            "--skip-conversations {skip} passes over the whole suite ({} conversations): skip fewer",
            c.len()
        );
    }
    c.drain(..skip);
    if c.len() < count {
        eprintln!(
            "the suite has {} conversations past the first {skip}, fewer than the {count} asked: using those",
            c.len()
        );
    }
    Ok(c)
}

/// A JSON document on stdout.
pub fn print_json<T: serde::Serialize + ?Sized>(doc: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(doc)?);
    Ok(())
}

/// What a conversation is started with, in the workbench, the demo and `baton run`: the
/// pair, the session file, and the settings.
#[derive(Debug, Args, Clone)]
pub struct ConversationArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    /// Session file to record to (default: sessions/<start time>.jsonl).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Learn from the conversation but keep nothing for the next session.
    #[arg(long)]
    pub no_keep_learned: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

impl ConversationArgs {
    /// The engine's set-up: the settings' defaults, then what a script sets, then what
    /// the command line sets.
    pub fn engine_config(
        &self,
        on: &Placement,
        script: Option<&SettingsOverrides>,
    ) -> EngineConfig {
        let models = [self.pair.source.clone(), self.pair.target.clone()];
        let mut cfg = EngineConfig::new(models, on.device.clone());
        cfg.compute = on.compute;
        cfg.mapper_dir = self.pair.mappers.dir();
        if let Some(s) = script {
            cfg.settings.apply(s);
        }
        cfg.settings.apply(&SettingsOverrides::from(&self.settings));
        cfg.learning.keep = !self.no_keep_learned;
        cfg
    }
}

/// The session file a run records to: `record`, or a new one under sessions/; refused
/// before anything loads when it cannot be written.
pub fn record_path(record: Option<&Path>) -> Result<PathBuf> {
    let path = record
        .map(Path::to_path_buf)
        .unwrap_or_else(|| session::default_session_path("."));
    session::check_record_path(&path)?;
    Ok(path)
}
