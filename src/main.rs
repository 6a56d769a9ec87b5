//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

use anyhow::{bail, Context, Result};
use baton::fetch::{self, BarProgress, FetchProgress};
use baton::model::{self, GenerateOptions, Model, Sampling};
use baton::session;
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
    let m = baton::fetch::open_model(&a.model, dev, &progress)?;
    drop(progress);
    let summary = baton::console::info::ModelSummary::of(&m);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}

fn generate_cmd(a: GenerateArgs, dev: &Device) -> Result<()> {
    let progress = BarProgress::new();
    let m = baton::fetch::open_model(&a.model, dev, &progress)?;
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
        let resolved = baton::fetch::resolve_model(name, &progress)?;
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
        let bench = baton::bench::decoder::ModelBench {
            model: name.clone(),
            rows,
        };
        for line in bench.lines() {
            human!(a.json, "{line}");
        }
        all.push(bench);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}

fn calibrate_cmd(a: CalibrateArgs, dev: &Device) -> Result<()> {
    use baton::calibrate::{self as cal, Direction};
    use baton::data::corpus;
    use baton::mapper::artifact::{self, CorpusInfo};
    let cancel = std::sync::Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        // Ctrl-C stops at the next window; artifacts are only written at the very end.
        let _ = ctrlc::set_handler(move || c.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    let opts = a.options()?;
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
    let src = baton::fetch::open_model(&a.source, dev, &progress)?;
    let tgt = baton::fetch::open_model(&a.target, dev, &progress)?;
    drop(progress);
    let directions: Vec<Direction> = match a.direction {
        DirectionArg::Both => vec![Direction::Forward, Direction::Backward],
        DirectionArg::SourceToTarget => vec![Direction::Forward],
        DirectionArg::TargetToSource => vec![Direction::Backward],
    };
    let bars = baton::console::PhaseBars::new(a.json);
    let started = std::time::Instant::now();
    let fitted = cal::calibrate(&src, &tgt, &docs, &directions, &opts, &bars, &cancel)?;
    bars.finish(true);
    let corpus = CorpusInfo {
        files: corpus::describe(&files),
        fingerprint: corpus::fingerprint(&docs),
        sequences: opts.sequences,
        seq_len: opts.seq_len,
        observations: 0,
    };
    let dir = a
        .mapper_dir
        .clone()
        .unwrap_or_else(|| artifact::mappers_dir(&fetch::cache_root()));
    let saved = cal::save_fitted(&fitted, [&src, &tgt], &corpus, &dir)?;
    for s in &saved {
        eprintln!("{} -> {}", s.meta.summary_line(), s.path.display());
    }
    eprintln!("calibration took {:.1} s", started.elapsed().as_secs_f64());
    if a.json {
        let metas: Vec<_> = saved.iter().map(|s| &s.meta).collect();
        println!("{}", serde_json::to_string_pretty(&metas)?);
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
            Ok(m) => println!("{}", m.list_line(&p)),
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
    let first = baton::fetch::open_model(&a.source, dev, &progress)?;
    let second = baton::fetch::open_model(&a.target, dev, &progress)?;
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

fn run_cmd(a: RunArgs, dev: &Device) -> Result<()> {
    use baton::engine::{replay, script, EngineConfig};
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
        .unwrap_or_else(|| session::default_session_path("."));
    cfg.record = Some(record.clone());
    let mut printer = baton::console::EventPrinter::new();
    replay::run_headless(cfg, &script.steps, &mut |e| printer.print(e))?;
    eprintln!("session recorded to {}", record.display());
    Ok(())
}

fn replay_cmd(a: ReplayArgs, dev: &Device) -> Result<()> {
    use baton::engine::replay;
    let recorded = session::read_session(&a.session)?;
    for w in &recorded.warnings {
        eprintln!("warning: {w}");
    }
    let mut cfg = replay::replay_config(&recorded, &a.session, dev.clone())?;
    cfg.mapper_dir = a.mapper_dir.clone();
    let record = a
        .record
        .clone()
        .unwrap_or_else(|| session::default_session_path("."));
    cfg.record = Some(record.clone());
    let steps = replay::replay_steps(&recorded);
    eprintln!(
        "replaying {} commands from {}",
        steps.len(),
        a.session.display()
    );
    replay::run_headless(cfg, &steps, &mut |e| {
        if let baton::protocol::Event::Error { message, .. } = e {
            eprintln!("error: {message}");
        }
    })?;
    let replayed = session::read_session(&record)?;
    let diff = session::diff_sessions(&recorded, &replayed, &session::DiffOptions::default());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{diff}");
    }
    eprintln!("new run recorded to {}", record.display());
    Ok(())
}

fn bench_cmd(a: cli::BenchArgs, dev: &Device) -> Result<()> {
    use baton::bench::{sweep, BenchOptions, SweepPlan};
    let progress = BarProgress::new();
    let first = baton::fetch::open_model(&a.source, dev, &progress)?;
    let second = baton::fetch::open_model(&a.target, dev, &progress)?;
    drop(progress);
    let plan = SweepPlan {
        lengths: &a.lengths,
        options: BenchOptions {
            repeats: a.repeats,
            suffix: a.suffix,
        },
        mapper_dir: a.mapper_dir.as_deref(),
        precision: a.precision.into(),
        device: format!("{:?}", dev.location()).to_lowercase(),
    };
    let directions = directions(a.direction, &first, &second);
    let doc = sweep(&directions, &plan, &mut |line| human!(a.json, "{line}"))?;
    if let Some(p) = &a.plot {
        let series: Vec<_> = doc
            .results
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
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}
