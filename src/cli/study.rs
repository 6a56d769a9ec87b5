//! `baton study`: drift studies over many scripted conversations. `plan` expands a study
//! file into its work items and saves the manifest.

use super::common::{print_json, MapperDirArgs};
use anyhow::{bail, Result};
use baton::lab::study::run::Outcome;
use baton::lab::study::{self, Shard, Study};
use baton::model::Placement;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct StudyArgs {
    #[command(subcommand)]
    pub command: StudyCommand,
}

#[derive(Debug, Subcommand)]
pub enum StudyCommand {
    /// Expand a study file (TOML: scripts, pairs, directions, named variants, repeats)
    /// into work items with stable ids; print them and, with --out, save the manifest.
    Plan(PlanArgs),
    /// Run the items of a study (of one shard of it) not finished yet, each recorded as
    /// a session under OUT/items/; a rerun skips what is finished.
    Run(RunArgs),
    /// Sum a study's output directory up: missing items, fidelity by turn per variant and
    /// direction with 95% intervals over conversations, a paired comparison with
    /// --against, and the items whose repeats answered differently.
    Report(ReportArgs),
    /// Write the recall suite's conversations (SQuAD passages, a question a turn after a
    /// switch each, with the reference answers as `expect`) as study scripts.
    RecallScripts(RecallScriptsArgs),
}

#[derive(Debug, Args)]
pub struct RecallScriptsArgs {
    /// How many conversations.
    #[arg(long, default_value_t = 40, value_parser = baton::engine::config::at_least_one)]
    pub conversations: usize,
    /// Pass over the suite's first N conversations.
    #[arg(long, default_value_t = 0)]
    pub skip_conversations: usize,
    /// The directory to write the scripts to (created; existing scripts are kept).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The study's output directory (as given to `baton study run --out`).
    pub out: PathBuf,
    /// Compare every other variant with this one, conversation by conversation.
    #[arg(long)]
    pub against: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Draw the drift curves by turn (per variant and direction, with intervals) to this
    /// .svg or .png file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The study file.
    pub study: PathBuf,
    /// The study's output directory (its manifest is saved there first).
    #[arg(long)]
    pub out: PathBuf,
    /// Run one part of the items: INDEX/COUNT (from 0), or `auto` to read a Slurm array
    /// task's (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed
    /// Job's (JOB_COMPLETION_INDEX, with --shards).
    #[arg(long, default_value = "0/1")]
    pub shard: String,
    /// The number of shards, for `--shard auto` where the scheduler does not say it.
    #[arg(long)]
    pub shards: Option<usize>,
    /// Items run at once (default: what the machine's cores and memory hold).
    #[arg(long, value_parser = baton::engine::config::at_least_one)]
    pub jobs: Option<usize>,
    // For the variants that name no `mapper_dir` of their own.
    #[command(flatten)]
    pub mappers: MapperDirArgs,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The study file.
    pub study: PathBuf,
    /// Save the manifest in this directory (where `baton study run` records the
    /// items); a directory holding another study's manifest is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the manifest as JSON instead of a line per item.
    #[arg(long)]
    pub json: bool,
}

pub fn study(a: StudyArgs, on: &Placement) -> Result<()> {
    match a.command {
        StudyCommand::Plan(p) => plan(p),
        StudyCommand::Run(r) => run(r, on),
        StudyCommand::Report(r) => report(r),
        StudyCommand::RecallScripts(r) => recall_scripts(r),
    }
}

fn recall_scripts(a: RecallScriptsArgs) -> Result<()> {
    use baton::lab::study::recall_scripts::{script_name, script_text};
    let skip = a.skip_conversations;
    let all = super::common::recall_conversations(skip, a.conversations)?;
    std::fs::create_dir_all(&a.out)?;
    let (mut written, mut kept) = (0, 0);
    for (k, c) in all.iter().enumerate() {
        let path = a.out.join(script_name(skip + k, c));
        if path.exists() {
            kept += 1;
            continue;
        }
        std::fs::write(&path, script_text(c))?;
        written += 1;
    }
    eprintln!(
        "{written} scripts written, {kept} already there, in {}",
        a.out.display()
    );
    Ok(())
}

fn report(a: ReportArgs) -> Result<()> {
    let Some(manifest) = study::read_manifest(&a.out)? else {
        bail!(
            "{} holds no study manifest: run `baton study run STUDY --out {}` first",
            a.out.display(),
            a.out.display()
        );
    };
    let r = study::report::report(&manifest, &a.out, a.against.as_deref())?;
    for u in &r.unreadable {
        eprintln!("warning: item {} skipped: {}", u.id, u.reason);
    }
    if let Some(path) = &a.plot {
        baton::lab::plot::study::write_study_plot(&r, path)?;
        eprintln!("drift curves drawn to {}", path.display());
    }
    if a.json {
        return print_json(&r);
    }
    print!("{}", study::report::render(&r));
    Ok(())
}

fn run(a: RunArgs, on: &Placement) -> Result<()> {
    let shard = match a.shard.as_str() {
        "auto" => Shard::auto(&|k| std::env::var(k).ok(), a.shards)?,
        s => Shard::parse(s)?,
    };
    let mut s = Study::load(&a.study)?;
    s.mapper_dir = a.mappers.mapper_dir;
    let manifest = study::plan(&s);
    study::save_manifest(&a.out, &manifest)?;
    let jobs = a.jobs.unwrap_or_else(study::run::default_jobs);
    let mine = shard.items(&manifest).len();
    eprintln!(
        "study {}: shard {}/{} holds {mine} of {} items; {jobs} at a time",
        s.name,
        shard.index,
        shard.count,
        manifest.items.len()
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    let results = study::run::run_items(&s, &manifest, &a.out, shard, jobs, on, &|item, o| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let what = match o {
            Outcome::Done { seconds } => format!("recorded in {seconds:.0} s"),
            Outcome::Finished => "finished before: skipped".into(),
            Outcome::Failed(e) => format!("FAILED: {e}"),
        };
        eprintln!("[{n}/{mine}] {}: {what}", item.id);
    })?;
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
        .map(|(id, _)| id.as_str())
        .collect();
    let skipped = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Finished))
        .count();
    eprintln!(
        "{} recorded, {skipped} finished before, {} failed; sessions in {}",
        results.len() - skipped - failed.len(),
        failed.len(),
        a.out.join(study::run::ITEMS_DIR).display()
    );
    if !failed.is_empty() {
        bail!(
            "{} item(s) failed ({}); run the same command again to retry them",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

fn plan(a: PlanArgs) -> Result<()> {
    let s = Study::load(&a.study)?;
    let manifest = study::plan(&s);
    let saved = match &a.out {
        Some(dir) => Some(study::save_manifest(dir, &manifest)?),
        None => None,
    };
    if a.json {
        print_json(&manifest)?;
    } else {
        let n =
            |count: usize, one: &str| format!("{count} {one}{}", if count == 1 { "" } else { "s" });
        println!(
            "study {}: {} ({} × {} × {} × {} × {})",
            s.name,
            n(manifest.items.len(), "item"),
            n(s.scripts.len(), "script"),
            n(s.pairs.len(), "pair"),
            n(s.directions.len(), "direction"),
            n(s.variants.len(), "variant"),
            n(s.repeats as usize, "repeat")
        );
        for item in &manifest.items {
            let expected = item.expected.len();
            println!(
                "  {}{}",
                item.id,
                if expected > 0 {
                    format!("  ({expected} expected answers)")
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(path) = saved {
        eprintln!("manifest saved to {}", path.display());
    }
    Ok(())
}
