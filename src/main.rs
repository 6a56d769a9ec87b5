//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

use anyhow::{bail, Context, Result};
use baton::fetch::{self, BarProgress, FetchProgress};
use baton::model::{self, GenerateOptions, Model, Sampling};
use baton::text::ChatMessage;
use candle_core::Device;
use clap::Parser;
use cli::{BenchModelArgs, Cli, Command, FetchArgs, GenerateArgs, InfoArgs};
use std::io::Write;
use std::sync::atomic::AtomicBool;

fn main() {
    let cli = Cli::parse();
    let _log = baton::logging::init_file_logging(&baton::logging::default_log_dir()).ok();
    if let Err(e) = run(cli) {
        tracing::error!("{e:#}");
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn device(spec: &str) -> Result<Device> {
    match spec {
        "cpu" => Ok(Device::Cpu),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal: usize = s.strip_prefix("cuda:").map(str::parse).transpose()?.unwrap_or(0);
            Device::new_cuda(ordinal).with_context(|| {
                format!("cannot open {s}: build with `cargo build --release --features cuda` on a machine with CUDA, or use --device cpu")
            })
        }
        other => bail!("unknown device `{other}`: use cpu, cuda or cuda:N"),
    }
}

fn run(cli: Cli) -> Result<()> {
    let dev = device(&cli.device.device)?;
    match cli.command {
        None => default_job(&dev),
        Some(Command::Fetch(a)) => fetch_cmd(a),
        Some(Command::Info(a)) => info_cmd(a, &dev),
        Some(Command::Generate(a)) => generate_cmd(a, &dev),
        Some(Command::BenchModel(a)) => bench_model_cmd(a),
    }
}

/// What `baton` with no arguments does until the workbench lands: fetch the default pair
/// and stream a chat answer from its source model.
fn default_job(dev: &Device) -> Result<()> {
    fetch_cmd(FetchArgs {
        names: vec![],
        pair: Some("default".into()),
        all: false,
    })?;
    generate_cmd(
        GenerateArgs {
            model: "qwen2.5-coder-0.5b".into(),
            prompt: "Write a Python function that returns the factorial of n.".into(),
            chat: true,
            max_tokens: 200,
            temperature: 0.0,
            top_p: 1.0,
            seed: 42,
        },
        dev,
    )
}

fn fetch_cmd(a: FetchArgs) -> Result<()> {
    let manifest = fetch::Manifest::builtin()?;
    let names: Vec<String> = if a.all {
        manifest.entries().iter().map(|e| e.name.clone()).collect()
    } else if let Some(p) = &a.pair {
        let (x, y) = manifest.pair(p).with_context(|| {
            format!(
                "no pair `{p}` in assets/models.toml (pairs: {})",
                manifest.pair_names().collect::<Vec<_>>().join(", ")
            )
        })?;
        vec![x.name.clone(), y.name.clone()]
    } else if a.names.is_empty() {
        let (x, y) = manifest.pair("default").context("the manifest has no default pair")?;
        vec![x.name.clone(), y.name.clone()]
    } else {
        a.names.clone()
    };
    for name in names {
        let progress = BarProgress::new();
        progress.message(&format!("{name}: checking"));
        let got = fetch::ensure_by_name(&name, &progress)?;
        drop(progress);
        let how = if got.downloaded {
            format!("fetched from {}", got.source_used)
        } else {
            "already in the cache".to_string()
        };
        eprintln!("{name}: {} ({how})", got.path.display());
    }
    Ok(())
}

fn info_cmd(a: InfoArgs, dev: &Device) -> Result<()> {
    let progress = BarProgress::new();
    let m = Model::open(&a.model, dev, &progress)?;
    drop(progress);
    let c = m.config();
    let conv = &m.decoder.weights().conversion;
    if a.json {
        let v = serde_json::json!({
            "identity": m.identity,
            "config": c,
            "kv_width": c.kv_width(),
            "chat_template": m.template.is_some(),
            "load_conversions": conv.converted.iter().map(|(t, n, b, a)| serde_json::json!({
                "from": t, "to": "Q8_0", "tensors": n, "bytes_before": b, "bytes_after": a})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model         {}", m.identity.name);
    println!("path          {}", m.identity.path.display());
    println!("format        {:?}", m.identity.format);
    println!("sha256        {}", m.identity.sha256);
    println!("architecture  {}", c.arch.name());
    println!("layers        {}", c.n_layer);
    println!("hidden        {}", c.hidden);
    println!("heads         {} query, {} KV, head width {}", c.n_head, c.n_kv_head, c.head_dim);
    println!("KV per token  {} per layer for K and for V", c.kv_width());
    println!("ffn           {}", c.ffn);
    println!(
        "rope          theta {}, {:?}{}",
        c.rope.theta,
        c.rope.layout,
        if c.rope.llama3_scaling.is_some() || c.rope.freq_factors.is_some() { ", scaled" } else { "" }
    );
    println!("context       {} tokens", c.context_length);
    println!("vocabulary    {}", c.vocab_size);
    println!("tokenizer     {}", m.identity.tokenizer_fingerprint);
    println!("chat template {}", if m.template.is_some() { "yes" } else { "no" });
    for (t, n, b, a) in &conv.converted {
        println!(
            "converted     {n} {t} tensors to Q8_0 at load ({:.0} MB -> {:.0} MB) for fast CPU kernels",
            *b as f64 / 1e6,
            *a as f64 / 1e6
        );
    }
    Ok(())
}

fn generate_cmd(a: GenerateArgs, dev: &Device) -> Result<()> {
    let progress = BarProgress::new();
    let m = Model::open(&a.model, dev, &progress)?;
    drop(progress);
    let ids = if a.chat {
        m.chat_template()?
            .render_ids(&m.tokenizer, &[ChatMessage::user(a.prompt.clone())], true)?
    } else {
        m.tokenizer.encode(&a.prompt)?
    };
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: Sampling {
            temperature: a.temperature,
            top_p: a.top_p,
            seed: a.seed,
        },
        stop_ids: m.tokenizer.eos_ids().to_vec(),
    };
    let mut cache = m.decoder.new_cache();
    let mut stream = m.tokenizer.stream();
    let stdout = std::io::stdout();
    let cancel = AtomicBool::new(false);
    let mut on_token = |id: u32| -> bool {
        if m.tokenizer.eos_ids().contains(&id) {
            return true;
        }
        if let Ok(text) = stream.push(id) {
            let mut out = stdout.lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        true
    };
    let g = model::generate(&m.decoder, &mut cache, &ids, &opts, &cancel, &mut on_token)?;
    let tail = stream.finish().unwrap_or_default();
    println!("{tail}");
    eprintln!(
        "\n[{}] prefill {} tokens at {:.1} tokens/s; decode {} tokens at {:.1} tokens/s; stopped: {:?}",
        m.identity.name,
        g.prefill.tokens,
        g.prefill.tokens_per_second(),
        g.decode.tokens,
        g.decode.tokens_per_second(),
        g.stop
    );
    Ok(())
}

fn bench_model_cmd(_a: BenchModelArgs) -> Result<()> {
    bail!("bench-model is not wired yet")
}
