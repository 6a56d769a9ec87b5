//! Command-line surface: a file per command, each with its flags and the function that
//! calls the library and prints; what several commands share is in [`common`].

mod args;
mod bench;
mod bench_model;
mod calibrate;
mod common;
mod environment;
mod error_line;
mod eval;
mod fetch;
mod gate_study;
mod generate;
mod help;
mod info;
pub mod library_switches;
mod mappers;
mod replay;
mod report;
mod run;
mod study;
#[cfg(test)]
mod tests;
mod workbench;

use anyhow::Result;
use baton::model::{AttentionPath, Compute, Placement};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use common::DeviceArg;

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
    /// Where to run: `cpu`, or `cuda` / `cuda:N` (needs a build with --features cuda).
    #[arg(long, global = true, env = "BATON_DEVICE", default_value = "cpu")]
    pub device: DeviceArg,
    /// The activations' dtype: `auto` (f32 on the CPU, bf16 on a GPU), `f32`, `bf16` or
    /// `f16`. `bf16` on the CPU runs the arithmetic a GPU runs, slowly.
    #[arg(long, global = true, env = "BATON_ACTIVATIONS", default_value = "auto", value_name = "DTYPE", value_parser = activations)]
    pub activations: String,
    /// How attention runs off the CPU's f32 kernels: `batched` (masked matmuls) or
    /// `fused` (one kernel; a GPU build from scripts/check-cuda --flash).
    #[arg(long, global = true, env = "BATON_ATTENTION", default_value = "batched", value_name = "PATH", value_parser = attention)]
    pub attention: String,
}

impl Cli {
    /// Where and how the models of this command run, as the flags (or the variables
    /// they come from) say.
    pub fn placement(&self) -> Result<Placement> {
        let compute = Compute {
            activations: baton::model::parse_activations(&self.activations)
                .map_err(anyhow::Error::msg)?,
            attention: AttentionPath::parse(&self.attention).map_err(anyhow::Error::msg)?,
        };
        Ok(Placement {
            device: self.device.open()?,
            compute,
        })
    }
}

fn attention(s: &str) -> Result<String, String> {
    baton::model::AttentionPath::parse(s).map(|p| p.name().to_string())
}

fn activations(s: &str) -> Result<String, String> {
    baton::model::parse_activations(s).map(|_| s.trim().to_ascii_lowercase())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Download models and data into the cache dir (checksummed; nothing is fetched twice).
    Fetch(fetch::FetchArgs),
    /// Show a model's architecture, KV geometry, rope, tokenizer fingerprint and checksum.
    Info(info::InfoArgs),
    /// Generate text from a prompt, streaming, then report prefill and decode speed.
    Generate(generate::GenerateArgs),
    /// Time prefill and decode of baton's decoder next to candle-transformers' own
    /// quantized model on the same file, in one run.
    BenchModel(bench_model::BenchModelArgs),
    /// Fit the KV-cache mappers between two models (both directions unless --direction).
    Calibrate(calibrate::CalibrateArgs),
    /// List the mapper artifacts in the cache dir.
    Mappers(mappers::MappersArgs),
    /// Measure a calibrated mapper on held-out text: R², attention cosine, next-token
    /// agreement, KL and perplexities against the target's own prefill.
    Eval(eval::EvalArgs),
    /// Summarise a recorded session file: switch latencies and speed-ups, attention
    /// cosine, token agreement, gate decisions; optionally plot the drift across turns.
    Report(report::ReportArgs),
    /// Run a scripted conversation (TOML: user messages and switches) without the
    /// terminal UI, and record it as a session file.
    Run(run::RunArgs),
    /// Re-run a recorded session's messages and switches on the current models and
    /// mappers, and report where the new run differs from the recording.
    Replay(replay::ReplayArgs),
    /// The terminal workbench (what `baton` with no arguments opens): chat, switch
    /// models with Tab, and watch the handoff's cost and fidelity live.
    Workbench(workbench::WorkbenchArgs),
    /// Play the scripted demo conversation in the workbench, pausing at every switch.
    Demo(workbench::WorkbenchArgs),
    /// Time mapping against re-prefill across context lengths, both directions, in
    /// one run: source prefill, full and suffix re-prefill, full and suffix map, switch
    /// end to end; with the fitted growth per token and the mapper's FLOPs and bytes.
    Bench(bench::BenchArgs),
    /// Measure switches over varied text (code, prose, other languages, chat) beside the
    /// estimates the gate can have without a re-prefill, report their correlation with
    /// the measured attention cosine and agreement, and keep the line the gate predicts
    /// the cosine with.
    GateStudy(gate_study::GateStudyArgs),
    /// Drift studies over many scripted conversations: `plan` expands a study file into
    /// its work items (scripts × pairs × directions × variants × repeats).
    Study(study::StudyArgs),
}

pub use error_line::error_line;

/// The command line, laid out for a person (`help`), read from the process's arguments;
/// a mistake or `-h` prints and exits as clap does.
pub fn parse() -> Cli {
    let mut cmd = help::shape(Cli::command());
    if let Some(kernels) = baton::model::attention::fused::coverage() {
        // Once, at start: clap keeps a version for the process's life.
        let version = format!("{} with {kernels}", env!("CARGO_PKG_VERSION"));
        cmd = cmd.version(&*Box::leak(version.into_boxed_str()));
    }
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = cmd
        .clone()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| environment::name_the_source(e, &cmd, &args).exit());
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

pub use environment::check as check_environment;

/// Carry out the command line.
pub fn run(cli: Cli) -> Result<()> {
    let on = cli.placement()?;
    match cli.command {
        None => workbench::workbench(workbench::WorkbenchArgs::defaults(), &on, false),
        Some(Command::Fetch(a)) => fetch::fetch(a),
        Some(Command::Info(a)) => info::info(a, &on),
        Some(Command::Generate(a)) => generate::generate(a, &on),
        Some(Command::BenchModel(a)) => bench_model::bench_model(a),
        Some(Command::Calibrate(a)) => calibrate::calibrate(a, &on),
        Some(Command::Mappers(a)) => mappers::mappers(a),
        Some(Command::Eval(a)) => eval::eval(a, &on),
        Some(Command::Report(a)) => report::report(a),
        Some(Command::Run(a)) => run::run(a, &on),
        Some(Command::Replay(a)) => replay::replay(a, &on),
        Some(Command::Workbench(a)) => workbench::workbench(a, &on, false),
        Some(Command::Demo(a)) => workbench::workbench(a, &on, true),
        Some(Command::Bench(a)) => bench::bench(a, &on),
        Some(Command::GateStudy(a)) => gate_study::gate_study(a, &on),
        Some(Command::Study(a)) => study::study(a, &on),
    }
}
