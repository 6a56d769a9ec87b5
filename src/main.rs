//! The `baton` binary: argument parsing and error reporting at the edge; everything else
//! lives in the library.

mod cli;

use anyhow::{bail, Result};
use baton::fetch::{self, BarProgress, FetchProgress};
use baton::model;
use baton::session;
use candle_core::Device;
use clap::Parser;
use cli::{
    BenchModelArgs, CalibrateArgs, Cli, Command, EvalArgs, FetchArgs, GenerateArgs, InfoArgs,
    MappersArgs, ReplayArgs, ReportArgs, RunArgs,
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
    // Libraries (candle) capture a backtrace into their errors when RUST_BACKTRACE is
    // set, and print it as part of the message; a user's error stays one clear line.
    // Panics still honour RUST_BACKTRACE. Set before any thread starts.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    let cli = Cli::parse();
    let _log = baton::logging::init_file_logging(&baton::logging::default_log_dir()).ok();
    if let Err(e) = run(cli) {
        tracing::error!("{e:#}");
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The two models of a pair command, with download and load progress.
fn open_pair(source: &str, target: &str, dev: &Device) -> Result<(model::Model, model::Model)> {
    let progress = BarProgress::new();
    let first = fetch::open_model(source, dev, &progress)?;
    Ok((first, fetch::open_model(target, dev, &progress)?))
}

fn run(cli: Cli) -> Result<()> {
    let dev = cli.device.device()?;
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
        Some(Command::GateStudy(a)) => gate_study_cmd(a, &dev),
    }
}

/// The workbench on a pair (the default pair unless told otherwise). Models are fetched
/// and missing mappers calibrated by the engine, with progress on screen; a first run
/// gets a quick mapper and a note saying how to fit the full one.
fn workbench_cmd(a: cli::WorkbenchArgs, dev: &Device, demo: bool) -> Result<()> {
    use baton::engine::{script::Script, EngineConfig};
    let mut cfg = EngineConfig::new([a.pair.source.clone(), a.pair.target.clone()], dev.clone());
    cfg.mapper_dir = a.pair.mapper_dir.clone();
    cfg.calibrate_missing = Some(baton::calibrate::CalibrateOptions::quick());
    cfg.settings.max_tokens = a.max_tokens;
    cfg.settings.gate = a.gate;
    cfg.settings.premap = a.premap;
    cfg.settings.reference = !a.no_reference;
    cfg.settings.tail = a.tail;
    cfg.settings.learn = !a.no_learn;
    cfg.settings.repair = a.repair;
    cfg.learning.keep = !a.no_keep_learned;
    let steps = match demo {
        true => {
            let s = Script::demo()?;
            s.settings.apply(&mut cfg.settings);
            Some(s.steps)
        }
        false => None,
    };
    cfg.record = (!a.no_record).then(|| {
        a.record
            .clone()
            .unwrap_or_else(|| session::default_session_path("."))
    });
    let record = cfg.record.clone();
    if let Some(p) = &record {
        session::check_record_path(p)?;
    }
    let result = baton::workbench::run(baton::workbench::WorkbenchOptions {
        engine: cfg,
        loading_note: Some(
            "A first run calibrates a quick mapper on a small sample (a few minutes); \
             `baton calibrate` fits the full one."
                .into(),
        ),
        demo: steps,
    });
    if let Some(p) = record.filter(|p| p.exists()) {
        eprintln!("session recorded to {}", p.display());
    }
    Ok(result?)
}

fn gate_study_cmd(a: cli::GateStudyArgs, dev: &Device) -> Result<()> {
    use baton::data::corpus;
    use baton::eval::gate_study;
    use baton::gate::fit;
    use baton::mapper::artifact::{self, ModelRef};
    let (src, tgt) = open_pair(&a.pair.source, &a.pair.target, dev)?;
    let dir = baton::engine::load::mapper_dir(&a.pair.mapper_dir);
    let (_, forward) = artifact::open_for(Some(&dir), &src, &tgt)?;
    let (_, reverse) = artifact::open_for(Some(&dir), &tgt, &src)?;
    let docs = corpus::read_documents(&corpus::default_files()?)?;
    let windows = gate_study::study_windows(&tgt, &docs, a.switches)?;
    eprintln!(
        "{} switches over {} kinds of text",
        windows.len(),
        docs.len() + 1
    );
    let anchor = baton::mapper::DEFAULT_ANCHOR;
    let study = gate_study::study(
        &src,
        &tgt,
        &forward,
        &reverse,
        &windows,
        anchor,
        &mut |i, s| {
            eprintln!(
            "{:>3} {:<24} {:>4} tokens  distance {}  round trip {}  cosine {:.3}  agreement {:.3}",
            i + 1,
            s.text,
            s.tokens,
            s.feature_distance.map_or("-".into(), |d| format!("{d:.3}")),
            s.round_trip.map_or("-".into(), |d| format!("{d:.3}")),
            s.cosine,
            s.agreement
        )
        },
    )?;
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:+.3}"));
    for c in &study.correlations {
        eprintln!(
            "{}: with the attention cosine Pearson {} Spearman {}; with next-token agreement Pearson {} Spearman {}",
            c.estimator,
            show(c.pearson_cosine),
            show(c.spearman_cosine),
            show(c.pearson_agreement),
            show(c.spearman_agreement)
        );
    }
    for f in &study.lines {
        eprintln!(
            "line from {}: cosine ≈ {:.4} {:+.4} × estimate (fitted on {}, checked on {}: r {:.3}, mean absolute error {:.3})",
            f.estimator, f.intercept, f.slope, f.fitted_on, f.checked_on, f.held_out_r, f.held_out_mae
        );
    }
    match &study.fit {
        Some(f) => {
            eprintln!("the gate keeps the line from {}", f.estimator);
            if !a.no_save {
                let path = fit::path_in(
                    &dir,
                    &ModelRef::new(&src.identity, src.config()),
                    &ModelRef::new(&tgt.identity, tgt.config()),
                );
                fit::save(&path, f)?;
                eprintln!("kept in {}", path.display());
            }
        }
        None => eprintln!("no gate line: too few switches to fit one"),
    }
    if let Some(p) = &a.plot {
        baton::plot::gate::write_gate_plot(&study, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&study)?);
    }
    Ok(())
}

fn fetch_cmd(a: FetchArgs) -> Result<()> {
    if a.verify {
        return verify_cmd(a);
    }
    let names = fetch::Manifest::builtin()?.selection(a.all, a.pair.as_deref(), &a.names)?;
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

fn verify_cmd(a: FetchArgs) -> Result<()> {
    let every = a.names.is_empty() && a.pair.is_none();
    let names =
        fetch::Manifest::builtin()?.selection(a.all || every, a.pair.as_deref(), &a.names)?;
    let mut damaged = 0usize;
    for name in names {
        let progress = BarProgress::new();
        let v = fetch::verify_by_name(&name, &progress)?;
        drop(progress);
        match v {
            fetch::Verified::Intact { path } => {
                eprintln!("{name}: {} (every byte checked: intact)", path.display())
            }
            fetch::Verified::Refetched { path, problem } => {
                damaged += 1;
                eprintln!("{name}: {problem}; fetched again to {}", path.display())
            }
            fetch::Verified::Absent { .. } if every => {}
            fetch::Verified::Absent { path } => {
                eprintln!(
                    "{name}: not in the cache ({}); `baton fetch {name}` fetches it",
                    path.display()
                )
            }
        }
    }
    if damaged > 0 {
        eprintln!("{damaged} damaged entries were replaced");
    }
    Ok(())
}

fn info_cmd(a: InfoArgs, dev: &Device) -> Result<()> {
    let m = fetch::open_model(&a.model, dev, &BarProgress::new())?;
    let summary = baton::console::info::ModelSummary::of(&m);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}

fn generate_cmd(a: GenerateArgs, dev: &Device) -> Result<()> {
    let m = fetch::open_model(&a.model, dev, &BarProgress::new())?;
    let opts = a.options(m.tokenizer.eos_ids());
    let stdout = std::io::stdout();
    let mut show = |text: &str| {
        let mut out = stdout.lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    };
    let cancel = AtomicBool::new(false);
    let g = model::complete(&m, &a.prompt, a.chat, &opts, &cancel, &mut show)?;
    println!();
    eprintln!("\n[{}] {}", m.identity.name, g.summary_line());
    Ok(())
}

fn bench_model_cmd(a: BenchModelArgs) -> Result<()> {
    // Nothing named: both models of the default pair.
    let names = fetch::Manifest::builtin()?.selection(false, None, &a.model)?;
    if !baton::bench::decoder::PEER_BUILT {
        eprintln!("timing baton alone: this build has no peer to compare with (cargo run --release --features peer-bench -- bench-model)");
    }
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
    use baton::calibrate as cal;
    use baton::calibrate::saved_stats;
    use baton::data::corpus;
    use baton::mapper::artifact::{self, ModelRef};
    let cancel = std::sync::Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    // Ctrl-C stops at the next window; artifacts are only written at the very end.
    let _ = ctrlc::set_handler(move || c.store(true, std::sync::atomic::Ordering::Relaxed));
    let opts = a.options()?;
    // Before the corpus and the models: a mistaken option should not cost their loading.
    opts.validate_with_prior(a.merge_stats.is_some())?;
    let files = corpus::files_or_default(&a.corpus)?;
    let docs = corpus::read_documents(&files)?;
    let (src, tgt) = open_pair(&a.source, &a.target, dev)?;
    let directions = a.direction.calibrated();
    let dir = a
        .mapper_dir
        .clone()
        .unwrap_or_else(|| artifact::mappers_dir(&fetch::cache_root()));
    let mut prior = Vec::new();
    if let Some(dirs) = &a.merge_stats {
        let dirs = if dirs.is_empty() {
            vec![dir.clone()]
        } else {
            dirs.clone()
        };
        for from in &dirs {
            for &d in &directions {
                let (s, t) = d.pick(&src, &tgt);
                let (s, t) = (
                    ModelRef::new(&s.identity, s.config()),
                    ModelRef::new(&t.identity, t.config()),
                );
                let at = saved_stats::stats_dir_in(from, &s, &t);
                let loaded = saved_stats::load(&at, d, &s, &t)?;
                eprintln!(
                    "adding saved statistics of {} -> {}: {} windows, {} observations ({})",
                    s.name,
                    t.name,
                    loaded.meta.windows(),
                    loaded.meta.observations,
                    at.display()
                );
                prior.push((at, loaded));
            }
        }
    }
    let bars = baton::console::PhaseBars::new(a.json);
    let started = std::time::Instant::now();
    let name = cal::CorpusName {
        files: corpus::describe(&files),
        fingerprint: corpus::fingerprint(&docs),
    };
    let run = cal::Run {
        docs: &docs,
        corpus: &name,
        directions: &directions,
        opts: &opts,
    };
    let done = cal::calibrate_with(&src, &tgt, &run, prior, &bars, &cancel)?;
    bars.finish(true);
    let corpus = cal::corpus_info(&files, &docs, &opts);
    let saved = cal::save_fitted(&done.fitted, [&src, &tgt], &corpus, &dir)?;
    for s in &saved {
        eprintln!("{} -> {}", s.meta.summary_line(), s.path.display());
    }
    if !a.no_save_stats {
        for st in &done.stats {
            let at = saved_stats::stats_dir_in(&dir, &st.meta.source, &st.meta.target);
            saved_stats::save(st, &at)?;
            eprintln!(
                "statistics of {} -> {}: {} windows, {} observations -> {}",
                st.meta.source.name,
                st.meta.target.name,
                st.meta.windows(),
                st.meta.observations,
                at.display()
            );
        }
    }
    eprintln!("calibration took {:.1} s", started.elapsed().as_secs_f64());
    if a.json {
        let metas: Vec<_> = saved.iter().map(|s| &s.meta).collect();
        println!("{}", serde_json::to_string_pretty(&metas)?);
    }
    Ok(())
}

fn mappers_cmd(a: MappersArgs) -> Result<()> {
    use baton::calibrate::saved_stats;
    use baton::learn::store;
    use baton::mapper::artifact;
    let list = artifact::list(&fetch::cache_root());
    // What each mapper's saved statistics hold, read from their description only.
    let stats_of = |p: &std::path::Path, m: &artifact::MapperMeta| {
        let dir = p.parent().unwrap_or(std::path::Path::new("."));
        saved_stats::read_meta(&saved_stats::stats_dir_in(dir, &m.source, &m.target))
    };
    let learned_dir = |p: &std::path::Path, m: &artifact::MapperMeta| {
        let dir = p.parent().unwrap_or(std::path::Path::new("."));
        store::learned_dir_in(dir, &m.source, &m.target)
    };
    if a.reset_learned {
        let mut forgot = 0;
        for (p, m) in &list {
            if let Ok(m) = m {
                if store::reset(&learned_dir(p, m))? {
                    println!("{}: back to its calibration", m.direction);
                    forgot += 1;
                }
            }
        }
        if forgot == 0 {
            println!("no mapper has learned anything: nothing to reset");
        }
        return Ok(());
    }
    if a.json {
        let mut rows = Vec::new();
        for row in artifact::listing(&list) {
            let mut v = serde_json::to_value(&row)?;
            if let (Some(m), Some(obj)) = (row.meta, v.as_object_mut()) {
                let stats = match stats_of(row.path, m) {
                    Ok(s) => serde_json::to_value(s)?,
                    Err(e) => serde_json::json!({ "error": e.to_string() }),
                };
                obj.insert("stats".into(), stats);
                let learned = match store::read_meta(&learned_dir(row.path, m)) {
                    Ok(l) => serde_json::to_value(l)?,
                    Err(e) => serde_json::json!({ "error": e.to_string() }),
                };
                obj.insert("learned".into(), learned);
            }
            rows.push(v);
        }
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no mappers yet: run `baton calibrate` (default pair: qwen2.5-coder-0.5b and qwen2.5-coder-1.5b)");
    }
    for (p, m) in list {
        match m {
            Ok(m) => {
                println!("{}", m.list_line(&p));
                match stats_of(&p, &m) {
                    Ok(Some(s)) => println!("    {}", s.summary()),
                    Ok(None) => {}
                    Err(e) => println!("    {e}"),
                }
                match store::read_meta(&learned_dir(&p, &m)) {
                    Ok(Some(l)) => println!("    {}", l.summary()),
                    Ok(None) => {}
                    Err(e) => println!("    {e}"),
                }
            }
            Err(e) => println!("unreadable: {e}"),
        }
    }
    Ok(())
}

fn eval_cmd(a: EvalArgs, dev: &Device) -> Result<()> {
    a.validate()?;
    use baton::data::corpus;
    use baton::data::tasks;
    use baton::eval::{evaluate, EvalPlan};
    // Task names are checked before any model loads: a typo costs nothing.
    let task_list = tasks::parse_specs(&a.tasks, a.task_limit)?;
    if a.no_text && task_list.is_empty() && a.conversations == 0 {
        bail!("--no-text with no --tasks and no --conversations leaves nothing to evaluate: name tasks (e.g. --tasks hellaswag,gsm8k) or ask for --conversations 12");
    }
    let task_items = tasks::load_all(&task_list, &BarProgress::new())?;
    let conversations = if a.conversations == 0 {
        Vec::new()
    } else {
        let root = baton::fetch::ensure_by_name("eval-tasks", &BarProgress::new())?.path;
        let skip = a.skip_conversations;
        let mut c = baton::data::recall::load_conversations(&root, skip + a.conversations)?;
        if c.len() <= skip {
            bail!(
                "--skip-conversations {skip} passes over the whole suite ({} conversations): skip fewer",
                c.len()
            );
        }
        c.drain(..skip);
        if c.len() < a.conversations {
            eprintln!(
                "the suite has {} conversations past the first {skip}, fewer than --conversations {}: evaluating those",
                c.len(),
                a.conversations
            );
        }
        c
    };
    let (first, second) = open_pair(&a.source, &a.target, dev)?;
    let len = a.prefix + a.continuation;
    let windows = if a.no_text {
        Vec::new()
    } else {
        corpus::eval_windows(&a.texts, &first.tokenizer, len, a.limit)?
    };
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
    let plan = EvalPlan {
        windows: &windows,
        text,
        tasks: &task_items,
        task_options,
        conversations: &conversations,
        recall,
        mapper_dir: a.mapper_dir.as_deref(),
        precision: a.precision.into(),
        gains: baton::eval::Gains {
            key: a.key_gain,
            value: a.value_gain,
        },
        learn: a.learn,
    };
    let report = evaluate(
        &a.direction.pairs(&first, &second),
        &plan,
        &baton::console::PhaseBars::new(a.json),
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
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
    // Learning is on unless the script or the command line turns it off.
    cfg.settings.learn = true;
    script.settings.apply(&mut cfg.settings);
    a.apply(&mut cfg.settings);
    cfg.learning.keep = !a.no_keep_learned;
    cfg.mapper_dir = a.pair.mapper_dir.clone();
    let record = a
        .record
        .clone()
        .unwrap_or_else(|| session::default_session_path("."));
    session::check_record_path(&record)?;
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
    // A replay learns as the recording did, but keeps nothing: it is a measurement.
    cfg.learning.keep = false;
    let record = a
        .record
        .clone()
        .unwrap_or_else(|| session::default_session_path("."));
    session::check_record_path(&record)?;
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
    a.validate()?;
    use baton::bench::{sweep, BenchOptions, SweepPlan};
    let (first, second) = open_pair(&a.source, &a.target, dev)?;
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
    let directions = a.direction.pairs(&first, &second);
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
