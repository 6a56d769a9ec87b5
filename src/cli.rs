//! Command-line surface: subcommands and their options. Parsing only; the work is done
//! by the library, called from main.rs.

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
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 0.95)]
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
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    #[arg(long)]
    pub json: bool,
}
