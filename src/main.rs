//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

use anyhow::{bail, Context, Result};
use baton::fetch::{self, BarProgress, FetchProgress};
use baton::model::{self, GenerateOptions, Model, Sampling};
use baton::text::ChatMessage;
use candle_core::Device;
use clap::Parser;
use cli::{
    BenchModelArgs, CalibrateArgs, Cli, Command, DirectionArg, EvalArgs, FetchArgs, GenerateArgs,
    InfoArgs, MappersArgs, ReplayArgs, ReportArgs, RunArgs,
};
use std::io::Write;
use std::sync::atomic::AtomicBool;

/// Human-readable output of a command that can also print JSON: with `--json` it goes
/// to stderr, so stdout is one JSON document.
macro_rules! human {
    ($json:expr, $($arg:tt)*) => {
        if $json { eprintln!($($arg)*) } else { println!($($arg)*) }
    };
}

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
            let ordinal: usize = s
                .strip_prefix("cuda:")
                .map(str::parse)
                .transpose()?
                .unwrap_or(0);
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
        None => workbench_cmd(cli::WorkbenchArgs::defaults(), &dev, false),
        Some(Command::Fetch(a)) => fetch_cmd(a),
        Some(Command::Info(a)) => info_cmd(a, &dev),
        Some(Command::Generate(a)) => generate_cmd(a, &dev),
        Some(Command::BenchModel(a)) => bench_model_cmd(a),
        Some(Command::Calibrate(a)) => calibrate_cmd(a, &dev),
        Some(Command::Mappers(a)) => mappers_cmd(a),
        Some(Command::Eval(a)) => eval_cmd(a, &dev),
        Some(Command::Report(a)) => report_cmd(a),
        Some(Command::Run(a)) => run_cmd(a, &dev),
        Some(Command::Replay(a)) => replay_cmd(a, &dev),
        Some(Command::Workbench(a)) => workbench_cmd(a, &dev, false),
        Some(Command::Demo(a)) => workbench_cmd(a, &dev, true),
        Some(Command::Bench(a)) => bench_cmd(a, &dev),
    }
}

/// The workbench on a pair (the default pair unless told otherwise). Models are fetched
/// and missing mappers calibrated by the engine, with progress on screen; a first run
/// gets a quick mapper and a note saying how to fit the full one.
fn workbench_cmd(a: cli::WorkbenchArgs, dev: &Device, demo: bool) -> Result<()> {
    use baton::calibrate::CalibrateOptions;
    use baton::engine::{script, EngineConfig};
    let mut cfg = EngineConfig::new([a.pair.source.clone(), a.pair.target.clone()], dev.clone());
    cfg.mapper_dir = a.pair.mapper_dir.clone();
    cfg.calibrate_missing = Some(CalibrateOptions::quick());
    cfg.settings.max_tokens = a.max_tokens;
    cfg.settings.gate = a.gate;
    cfg.settings.premap = a.premap;
    cfg.settings.reference = !a.no_reference;
    let steps = if demo {
        let s = script::Script::parse(DEMO_SCRIPT, "assets/demo.toml")?;
        s.settings.apply(&mut cfg.settings);
        Some(s.steps)
    } else {
        None
    };
    cfg.record = if a.no_record {
        None
    } else {
        Some(
            a.record
                .clone()
                .unwrap_or_else(|| baton::session::default_session_path(".")),
        )
    };
    let record = cfg.record.clone();
    baton::workbench::run(baton::workbench::WorkbenchOptions {
        engine: cfg,
        loading_note: Some(
            "A first run calibrates a quick mapper on a small sample (a few minutes); \
             `baton calibrate` fits the full one."
                .into(),
        ),
        demo: steps,
    })?;
    if let Some(p) = record.filter(|p| p.exists()) {
        eprintln!("session recorded to {}", p.display());
    }
    Ok(())
}

/// The demo conversation, built in so `baton demo` works from any directory.
const DEMO_SCRIPT: &str = include_str!("../assets/demo.toml");

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
        let (x, y) = manifest
            .pair("default")
            .context("the manifest has no default pair")?;
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
    println!(
        "heads         {} query, {} KV, head width {}",
        c.n_head, c.n_kv_head, c.head_dim
    );
    println!("KV per token  {} per layer for K and for V", c.kv_width());
    println!("ffn           {}", c.ffn);
    println!(
        "rope          theta {}, {:?}{}",
        c.rope.theta,
        c.rope.layout,
        if c.rope.llama3_scaling.is_some() || c.rope.freq_factors.is_some() {
            ", scaled"
        } else {
            ""
        }
    );
    println!("context       {} tokens", c.context_length);
    println!("vocabulary    {}", c.vocab_size);
    println!("tokenizer     {}", m.identity.tokenizer_fingerprint);
    println!(
        "chat template {}",
        if m.template.is_some() { "yes" } else { "no" }
    );
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

fn bench_model_cmd(a: BenchModelArgs) -> Result<()> {
    let names = if a.model.is_empty() {
        vec![
            "qwen2.5-coder-0.5b".to_string(),
            "qwen2.5-coder-1.5b".to_string(),
        ]
    } else {
        a.model.clone()
    };
    let mut all = Vec::new();
    for name in &names {
        let progress = BarProgress::new();
        let resolved = model::resolve(name, &progress)?;
        drop(progress);
        eprintln!(
            "timing {name} ({} prompt tokens, {} decode steps, {} repeats)...",
            a.prompt_len, a.decode_len, a.repeats
        );
        let rows = baton::bench::decoder::bench_model(
            &resolved.path,
            a.prompt_len,
            a.decode_len,
            a.repeats,
        )?;
        for r in &rows {
            if !a.json {
                println!(
                    "{:<22} {:<38} prefill {:>7.1} tokens/s   decode {:>6.1} tokens/s",
                    name, r.engine, r.prefill_tok_s, r.decode_tok_s
                );
            }
        }
        if let (Some(ours), Some(peer)) = (
            rows.iter()
                .find(|r| r.engine == baton::bench::decoder::BATON),
            rows.iter()
                .find(|r| r.engine != baton::bench::decoder::BATON),
        ) {
            if !a.json {
                println!(
                    "{:<22} baton / peer in this run: prefill {:.2}x, decode {:.2}x",
                    name,
                    ours.prefill_tok_s / peer.prefill_tok_s,
                    ours.decode_tok_s / peer.decode_tok_s
                );
            }
        }
        all.push(serde_json::json!({"model": name, "rows": rows}));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}

/// Progress bars for calibration phases, with ETA.
struct CalibrationBars {
    bar: std::cell::RefCell<Option<indicatif::ProgressBar>>,
}

impl baton::calibrate::CalibrationProgress for CalibrationBars {
    fn phase(&self, name: &str, total: u64) {
        if let Some(b) = self.bar.borrow_mut().take() {
            b.finish();
        }
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>28} [{bar:30}] {pos}/{len} elapsed {elapsed} ETA {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(name.to_string());
        *self.bar.borrow_mut() = Some(b);
    }
    fn advance(&self, n: u64) {
        if let Some(b) = self.bar.borrow().as_ref() {
            b.inc(n);
        }
    }
    fn note(&self, msg: &str) {
        match self.bar.borrow().as_ref() {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }
}

fn calibrate_cmd(a: CalibrateArgs, dev: &Device) -> Result<()> {
    use baton::calibrate::{self as cal, CalibrateOptions, Direction};
    use baton::data::corpus;
    use baton::mapper::artifact::{self, CorpusInfo, MapperMeta};
    let cancel = std::sync::Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        // Ctrl-C stops at the next window; artifacts are only written at the very end.
        let _ = ctrlc::set_handler(move || c.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    let (sequences, seq_len) = if a.reference {
        (500, 1024)
    } else {
        (a.sequences, a.seq_len)
    };
    let k_sweep =
        a.k.iter()
            .map(|k| {
                if k == "all" {
                    Ok(usize::MAX)
                } else {
                    k.parse::<usize>()
                        .with_context(|| format!("--k takes numbers or `all`, got `{k}`"))
                }
            })
            .collect::<Result<Vec<_>>>()?;
    let opts = CalibrateOptions {
        sequences,
        seq_len,
        stride: a.stride,
        skip_first: a.skip_first,
        select_sequences: a.select_sequences,
        k_sweep,
        lambdas: a.lambda.clone(),
        max_k: match a.max_k.as_str() {
            "all" => usize::MAX,
            m => m
                .parse()
                .with_context(|| format!("--max-k takes a number or `all`, got `{m}`"))?,
        },
        k_tolerance: a.k_tolerance,
        select_by: match a.select_by {
            cli::SelectByArg::Cosine => baton::calibrate::SelectBy::Cosine,
            cli::SelectByArg::Agreement => baton::calibrate::SelectBy::Agreement,
        },
        standardize: !a.no_standardize,
        rank: match a.rank.as_deref() {
            None => None,
            Some("auto") => Some(baton::calibrate::RankChoice::Auto),
            Some(r) => Some(baton::calibrate::RankChoice::Fixed(
                r.parse()
                    .with_context(|| format!("--rank takes a number or `auto`, got `{r}`"))?,
            )),
        },
        ..CalibrateOptions::default()
    };
    // Before the corpus and the models: a mistaken option should not cost their loading.
    opts.validate()?;
    let files = if a.corpus.is_empty() {
        corpus::default_files()?
    } else {
        corpus::expand_inputs(&a.corpus)?
    };
    if files.is_empty() {
        bail!("--corpus names no readable text files: give .txt/.md/.py/.rs/.html/.jsonl files or directories holding them");
    }
    let docs = corpus::read_documents(&files)?;
    let progress = BarProgress::new();
    let src = Model::open(&a.source, dev, &progress)?;
    let tgt = Model::open(&a.target, dev, &progress)?;
    drop(progress);
    let directions: Vec<Direction> = match a.direction {
        DirectionArg::Both => vec![Direction::Forward, Direction::Backward],
        DirectionArg::SourceToTarget => vec![Direction::Forward],
        DirectionArg::TargetToSource => vec![Direction::Backward],
    };
    let bars = CalibrationBars {
        bar: std::cell::RefCell::new(None),
    };
    let started = std::time::Instant::now();
    let fitted = cal::calibrate(&src, &tgt, &docs, &directions, &opts, &bars, &cancel)?;
    if let Some(b) = bars.bar.borrow_mut().take() {
        b.finish_and_clear();
    }
    let root = fetch::cache_root();
    let mut reports = Vec::new();
    for f in &fitted {
        let (s, t) = if f.source.sha256 == src.identity.sha256 {
            (&src, &tgt)
        } else {
            (&tgt, &src)
        };
        let meta = MapperMeta::for_fitted(
            f,
            (&s.identity, s.config()),
            (&t.identity, t.config()),
            CorpusInfo {
                files: corpus::describe(&files),
                fingerprint: corpus::fingerprint(&docs),
                sequences: opts.sequences,
                seq_len: opts.seq_len,
                observations: f.report.observations,
            },
        );
        let path = match &a.mapper_dir {
            Some(dir) => artifact::artifact_path_in(dir, &meta.source, &meta.target),
            None => artifact::artifact_path(&root, &meta.source, &meta.target),
        };
        artifact::save(f, &meta, &path)?;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        eprintln!(
            "{}: k = {}, lambda = {}, held-out attention cosine {:.4}, R² K {:.3} V {:.3} -> {}",
            meta.direction,
            f.k,
            f.lambda,
            mean(&f.report.cosine),
            mean(&f.report.r2_k),
            mean(&f.report.r2_v),
            path.display()
        );
        reports.push(meta);
    }
    eprintln!("calibration took {:.1} s", started.elapsed().as_secs_f64());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(())
}

fn mappers_cmd(a: MappersArgs) -> Result<()> {
    use baton::mapper::artifact;
    let list = artifact::list(&fetch::cache_root());
    if a.json {
        let v: Vec<serde_json::Value> = list
            .iter()
            .map(|(p, m)| match m {
                Ok(m) => serde_json::json!({"path": p, "meta": m}),
                Err(e) => serde_json::json!({"path": p, "error": e.to_string()}),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no mappers yet: run `baton calibrate` (default pair: qwen2.5-coder-0.5b and qwen2.5-coder-1.5b)");
    }
    for (p, m) in list {
        match m {
            Ok(m) => {
                let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
                println!(
                    "{:<45} k={:<3} lambda={:<6} cosine {:.4}  {} x {} tokens  {}",
                    m.direction,
                    m.k,
                    m.lambda,
                    mean(&m.report.cosine),
                    m.corpus.sequences,
                    m.corpus.seq_len,
                    p.display()
                );
            }
            Err(e) => println!("unreadable: {e}"),
        }
    }
    Ok(())
}

fn eval_cmd(a: EvalArgs, dev: &Device) -> Result<()> {
    use baton::data::corpus::{self, Split};
    use baton::data::tasks;
    use baton::eval::{evaluate, EvalPlan};
    use baton::eval::{tasks::TaskEvalOptions, text::TextEvalOptions};
    // Task names are checked before any model loads: a typo costs nothing.
    let task_list = tasks::parse_specs(&a.tasks, a.task_limit)?;
    let progress = BarProgress::new();
    let mut task_items = Vec::new();
    if !task_list.is_empty() {
        let root = fetch::ensure_by_name("eval-tasks", &progress)?.path;
        for (def, limit) in &task_list {
            task_items.push((*def, tasks::load_items(&root, def, *limit)?));
        }
    }
    let first = Model::open(&a.source, dev, &progress)?;
    let second = Model::open(&a.target, dev, &progress)?;
    drop(progress);
    let len = a.prefix + a.continuation;
    let windows = if a.no_text {
        Vec::new()
    } else if a.texts.is_empty() {
        let docs = corpus::read_documents(&corpus::default_files()?)?;
        corpus::windows(&docs, &first.tokenizer, Split::Eval, len, a.limit)?
    } else {
        let docs = corpus::read_documents(&corpus::expand_inputs(&a.texts)?)?;
        // Named files are held out by the user: all of each file is used, windows taken
        // from each file in turn.
        corpus::windows(&docs, &first.tokenizer, Split::Whole, len, a.limit)?
    };
    if !a.no_text && windows.is_empty() {
        bail!("the evaluation text holds no window of {len} tokens: give longer --texts or a shorter --prefix/--continuation");
    }
    if a.no_text && task_items.is_empty() {
        bail!("--no-text with no --tasks leaves nothing to evaluate: name tasks, e.g. --tasks hellaswag,gsm8k");
    }
    let plan = EvalPlan {
        windows: &windows,
        text: TextEvalOptions {
            prefix: a.prefix,
            continuation: a.continuation,
            anchor: a.anchor,
            ..TextEvalOptions::default()
        },
        tasks: &task_items,
        task_options: TaskEvalOptions {
            anchor: a.anchor,
            tail: a.tail,
            ..TaskEvalOptions::default()
        },
        mapper_dir: a.mapper_dir.as_deref(),
        precision: a.precision.into(),
    };
    let report = evaluate(
        &directions(a.direction, &first, &second),
        &plan,
        &baton::console::PhaseBars::new(a.json),
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The (source, target) pairs a `--direction` asks for.
fn directions<'m>(
    d: DirectionArg,
    first: &'m Model,
    second: &'m Model,
) -> Vec<(&'m Model, &'m Model)> {
    match d {
        DirectionArg::Both => vec![(first, second), (second, first)],
        DirectionArg::SourceToTarget => vec![(first, second)],
        DirectionArg::TargetToSource => vec![(second, first)],
    }
}

fn report_cmd(a: ReportArgs) -> Result<()> {
    use baton::plot;
    use baton::session::{read_session, Report};
    let session = read_session(&a.session)?;
    let report = Report::from_session(&session);
    if a.json {
        // The tables carry the reading warnings themselves; JSON keeps stdout parseable.
        for w in &session.warnings {
            eprintln!("warning: {w}");
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    if let Some(path) = &a.plot {
        plot::write_plot(&report, path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// A switch's map and re-prefill times, and its cosine when measured.
fn measured_line(
    timings: &baton::protocol::SwitchTimings,
    metrics: Option<&baton::protocol::SwitchMetrics>,
) -> String {
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.1} ms")).unwrap_or("-".into());
    format!(
        "map {} (suffix {}) vs re-prefill {} (suffix {}){}",
        opt(timings.map_full_ms),
        opt(timings.map_suffix_ms),
        opt(timings.reprefill_full_ms),
        opt(timings.reprefill_suffix_ms),
        metrics
            .and_then(|m| Some(format!(
                ", attention cosine mean {:.3} min {:.3}",
                m.cosine_mean()?,
                m.cosine_min()?
            )))
            .unwrap_or_default()
    )
}

/// Headless output: answers, switches and comparisons as plain lines.
fn print_event(e: &baton::protocol::Event) {
    use baton::protocol::{Event, PathKind};
    match e {
        Event::Loading { stage, .. } if !stage.is_empty() => {
            // Byte counts repeat the stage; one line per stage is enough.
            thread_local!(static LAST: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) });
            LAST.with(|l| {
                if *l.borrow() != *stage {
                    eprintln!("{stage}");
                    *l.borrow_mut() = stage.clone();
                }
            });
        }
        Event::Ready { models, device, .. } => {
            eprintln!(
                "ready: {} and {} on {device}",
                models[0].name, models[1].name
            )
        }
        Event::UserMessage { turn, text } => println!("\n[turn {turn}] user: {text}"),
        Event::Generation {
            turn,
            path,
            model,
            text,
            timings,
            ..
        } => {
            let label = match path {
                PathKind::Mapped => "answer",
                PathKind::Reference => "reference",
            };
            println!(
                "[turn {turn}] {model} {label} ({:.0} ms to first token, {:.1} tok/s): {}",
                timings.first_token_ms,
                timings.decode_tokens_per_s,
                text.trim()
            );
        }
        Event::Switch {
            index,
            from,
            to,
            context_tokens,
            timings,
            metrics,
            gate,
            measurement_follows,
            ..
        } => {
            let gate = gate
                .map(|g| {
                    format!(
                        ", gate {:.3} vs {:.3}: {:?}",
                        g.estimate, g.threshold, g.used
                    )
                })
                .unwrap_or_default();
            if *measurement_follows {
                println!(
                    "[switch {index}] {from} -> {to}, {context_tokens} tokens handed over in {:.1} ms{gate}",
                    timings.end_to_end_ms
                );
            } else {
                println!(
                    "[switch {index}] {from} -> {to}, {context_tokens} tokens: {}{gate}",
                    measured_line(timings, metrics.as_ref())
                );
            }
        }
        Event::SwitchMeasured {
            index,
            timings,
            metrics,
            stopped,
            ..
        } => println!(
            "[switch {index}] measured: {}{}",
            measured_line(timings, metrics.as_ref()),
            stopped
                .as_ref()
                .map(|s| format!(" (stopped: {s})"))
                .unwrap_or_default()
        ),
        Event::SwitchFollowUp {
            index,
            top1_agreement,
            kl,
            end_to_end_ms,
            ..
        } => println!(
            "[switch {index}] end to end {end_to_end_ms:.0} ms{}",
            match (top1_agreement, kl) {
                (Some(a), Some(k)) => format!(", next-turn top-1 agreement {a:.3}, KL {k:.3}"),
                _ => String::new(),
            }
        ),
        Event::TurnComparison {
            turn,
            identical,
            first_difference,
            agreement,
        } => println!(
            "[turn {turn}] mapped vs reference: {}",
            if *identical {
                "identical".to_string()
            } else {
                format!(
                    "first difference at token {}, agreement {agreement:.3}",
                    first_difference.unwrap_or(0)
                )
            }
        ),
        Event::Notice { message } => eprintln!("{message}"),
        Event::Error { message, fatal } => {
            eprintln!("{}: {message}", if *fatal { "error" } else { "warning" })
        }
        _ => {}
    }
}

fn run_cmd(a: RunArgs, dev: &Device) -> Result<()> {
    use baton::engine::{self, script, EngineConfig};
    let script = script::Script::load(&a.script)?;
    let mut cfg = EngineConfig::new([a.pair.source.clone(), a.pair.target.clone()], dev.clone());
    script.settings.apply(&mut cfg.settings);
    if a.no_reference {
        cfg.settings.reference = false;
    }
    if a.gate.is_some() {
        cfg.settings.gate = a.gate;
    }
    cfg.settings.premap |= a.premap;
    cfg.mapper_dir = a.pair.mapper_dir.clone();
    let record = a
        .record
        .clone()
        .unwrap_or_else(|| baton::session::default_session_path("."));
    cfg.record = Some(record.clone());
    let handle = engine::spawn(cfg);
    let mut on_event = |e: &baton::protocol::Event| print_event(e);
    script::wait_ready(&handle.events, &mut on_event)?;
    script::run_steps(
        &script.steps,
        &|c| handle.send(c),
        &handle.events,
        &mut on_event,
    )?;
    handle.shutdown();
    eprintln!("session recorded to {}", record.display());
    Ok(())
}

fn replay_cmd(a: ReplayArgs, dev: &Device) -> Result<()> {
    use baton::engine::{self, script, EngineConfig, Settings};
    use baton::session::{diff_sessions, read_session, DiffOptions};
    let recorded = read_session(&a.session)?;
    for w in &recorded.warnings {
        eprintln!("warning: {w}");
    }
    let models = &recorded.header.models;
    if models.len() != 2 {
        bail!(
            "{} names {} models, a replay needs two",
            a.session.display(),
            models.len()
        );
    }
    // Manifest names resolve anywhere; a model opened from a path is found there again.
    let manifest = baton::fetch::Manifest::builtin()?;
    let spec = |m: &baton::protocol::ModelInfo| match manifest.entry(&m.name) {
        Some(_) => m.name.clone(),
        None => m.path.clone(),
    };
    let mut cfg = EngineConfig::new([spec(&models[0]), spec(&models[1])], dev.clone());
    cfg.settings = serde_json::from_value::<Settings>(recorded.header.settings.clone())
        .with_context(|| {
            format!(
                "{}: the header's settings are not this baton's",
                a.session.display()
            )
        })?;
    cfg.mapper_dir = a.mapper_dir.clone();
    let record = a
        .record
        .clone()
        .unwrap_or_else(|| baton::session::default_session_path("."));
    cfg.record = Some(record.clone());
    let events: Vec<baton::protocol::Event> = recorded.events().cloned().collect();
    let steps = script::session_commands(&events);
    let handle = engine::spawn(cfg);
    let mut on_event = |e: &baton::protocol::Event| {
        if let baton::protocol::Event::Error { message, .. } = e {
            eprintln!("error: {message}");
        }
    };
    script::wait_ready(&handle.events, &mut on_event)?;
    eprintln!(
        "replaying {} commands from {}",
        steps.len(),
        a.session.display()
    );
    script::run_steps(&steps, &|c| handle.send(c), &handle.events, &mut on_event)?;
    handle.shutdown();
    let replayed = read_session(&record)?;
    let diff = diff_sessions(&recorded, &replayed, &DiffOptions::default());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{diff}");
    }
    eprintln!("new run recorded to {}", record.display());
    Ok(())
}

fn bench_cmd(a: cli::BenchArgs, dev: &Device) -> Result<()> {
    use baton::bench::{
        bench_point, mapper_cost, report, BenchOptions, BenchReport, DirectionBench,
    };
    use baton::mapper::artifact;
    let progress = BarProgress::new();
    let first = Model::open(&a.source, dev, &progress)?;
    let second = Model::open(&a.target, dev, &progress)?;
    drop(progress);
    let max_ctx = first
        .config()
        .context_length
        .min(second.config().context_length);
    if let Some(&too_long) = a.lengths.iter().find(|&&l| l >= max_ctx || l < 2) {
        bail!("--lengths: {too_long} tokens is outside 2..{max_ctx} (the models' context)");
    }
    let opts = BenchOptions {
        repeats: a.repeats.max(1),
        suffix: a.suffix,
    };
    let mut results = Vec::new();
    for (s, t) in directions(a.direction, &first, &second) {
        let (art, mapper) = artifact::open_for(a.mapper_dir.as_deref(), s, t)?;
        let mapper = mapper.with_precision(a.precision.into())?;
        let direction = format!("{} -> {}", s.identity.name, t.identity.name);
        let cost = mapper_cost(&mapper);
        let header = DirectionBench::new(
            direction.clone(),
            art.path.clone(),
            art.meta.k,
            cost,
            Vec::new(),
        );
        human!(a.json, "{}", header.cost_line());
        human!(a.json, "{}", report::table_header());
        let mut points = Vec::new();
        for &n in &a.lengths {
            let p = bench_point(s, t, &mapper, n, &opts)?;
            human!(a.json, "{}", report::table_row(&p));
            points.push(p);
        }
        let d = DirectionBench::new(direction, art.path.clone(), art.meta.k, cost, points);
        if let Some(line) = d.growth_line() {
            human!(a.json, "{line}");
        }
        results.push(d);
    }
    if let Some(p) = &a.plot {
        let series: Vec<_> = results
            .iter()
            .map(|d| baton::plot::BenchSeries {
                direction: &d.direction,
                points: &d.points,
            })
            .collect();
        baton::plot::write_bench_plot(&series, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        let doc = BenchReport {
            format: report::FORMAT.into(),
            version: report::VERSION,
            device: format!("{:?}", dev.location()).to_lowercase(),
            repeats: opts.repeats,
            suffix: opts.suffix,
            results,
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}
