//! `baton generate`: text from a prompt, streamed, with the prefill and decode speed.

use super::common::at_least_one;
use anyhow::Result;
use baton::fetch::{self, BarProgress};
use baton::model;
use baton::model::Placement;
use clap::Args;
use std::io::Write;
use std::sync::atomic::AtomicBool;

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
    /// Also write the prompt's token ids and the logits of its last position to FILE
    /// (JSON), to compare the runtime with another on the same ids.
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<std::path::PathBuf>,
}

impl GenerateArgs {
    pub fn options(&self, stop_ids: &[u32]) -> model::GenerateOptions {
        model::GenerateOptions {
            max_tokens: self.max_tokens,
            sampling: model::Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                seed: self.seed,
            },
            stop_ids: stop_ids.to_vec(),
        }
    }
}

/// A sampling temperature: finite and not negative (0 is greedy).
fn temperature(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        Ok(t) => Err(format!("{t} is not a temperature: give 0 (greedy) or more")),
        Err(e) => Err(format!("`{v}` is not a number: {e}")),
    }
}

/// A nucleus-sampling mass in (0, 1].
fn top_p(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        Ok(p) => Err(format!("{p} is outside (0, 1]")),
        Err(e) => Err(format!("`{v}` is not a number: {e}")),
    }
}

pub fn generate(a: GenerateArgs, on: &Placement) -> Result<()> {
    let m = fetch::open_model_on(&a.model, on, &BarProgress::new())?;
    let opts = a.options(m.tokenizer.eos_ids());
    let stdout = std::io::stdout();
    let mut show = |text: &str| {
        let mut out = stdout.lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    };
    if let Some(path) = &a.logits_out {
        write_logits(&m, &a.prompt, a.chat, path)?;
    }
    let cancel = AtomicBool::new(false);
    let g = model::complete(&m, &a.prompt, a.chat, &opts, &cancel, &mut show)?;
    println!();
    eprintln!("\n[{}] {}", m.identity.name, g.summary_line());
    Ok(())
}

/// The prompt's ids and its last position's logits, as JSON at `path`.
fn write_logits(m: &model::Model, prompt: &str, chat: bool, path: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    let ids = model::prompt_ids(m, prompt, chat)?;
    let mut cache = m.decoder.new_cache();
    let logits: Vec<f32> = m
        .decoder
        .next_logits(&ids, &mut cache)?
        .flatten_all()?
        .to_vec1()?;
    let doc = serde_json::json!({ "ids": ids, "logits": logits });
    std::fs::write(path, doc.to_string())
        .with_context(|| format!("cannot write the logits to {}", path.display()))?;
    Ok(())
}
