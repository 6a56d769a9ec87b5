//! `baton calibrate`: fit the KV-cache mappers between two models, and keep the fit's
//! statistics beside them.

use super::args::TokenFeaturesArg;
use super::common::{count_or_all, print_json, rank, DirectionArgs, Gain, PairArgs};
use anyhow::Result;
use baton::calibrate::saved_stats::{self, SavedStats};
use baton::calibrate::train::TrainOptions;
use baton::calibrate::{self as cal, CalibrateOptions, Direction, RankChoice, SelectBy};
use baton::data::corpus;
use baton::mapper::artifact::ModelRef;
use baton::mapper::dir::MapperDir;
use baton::mapper::nonlinear::{MapperKind, TrainLoss};
use baton::model::Model;
use baton::model::Placement;
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SelectByArg {
    /// Held-out attention-output cosine, mean over target layers.
    Cosine,
    /// Held-out next-token top-1 agreement on the windows' last quarter.
    Agreement,
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    #[command(flatten)]
    pub direction: DirectionArgs,
    /// Calibration text: files (plain text or source code, .html, or .jsonl with a
    /// "text" field) or directories of them; default: the exllamav2 calibration files.
    #[arg(long, num_args = 1..)]
    pub corpus: Vec<PathBuf>,
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
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,12,16,all", value_parser = count_or_all)]
    pub k: Vec<usize>,
    /// Candidate ridge penalties, absolute on the standardised Gram (whose diagonal is
    /// the observation count): every (k, λ) pair is scored on the held-out windows.
    #[arg(long, value_delimiter = ',', default_value = "0.01")]
    pub lambda: Vec<f64>,
    /// The largest k the mapper may use (`all` for no limit). Larger k are still swept
    /// and the report says what they would reach; each doubling of k doubles the map's
    /// time.
    #[arg(long, default_value = "8", value_parser = count_or_all)]
    pub max_k: usize,
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
    pub token_features: TokenFeaturesArg,
    /// Stretch the chosen key maps' predictions away from their mean by this factor
    /// (1: as fitted), folded into the saved weights: ridge predictions are shrunk toward
    /// the mean, which flattens the target's attention. `matched` (the default): per head, the gain that
    /// gives the mapped keys the spread of the true keys on the held-out windows.
    #[arg(long, default_value = "matched")]
    pub key_gain: Gain,
    /// The same for the value maps.
    #[arg(long, default_value = "1")]
    pub value_gain: Gain,
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
    #[arg(long, value_parser = rank)]
    pub rank: Option<RankChoice>,
    /// Do not keep the fit's statistics beside the artifacts. They are kept by default
    /// (in stats/, about 0.6 GB for 0.5B→1.5B and 1.2 GB for 1.5B→0.5B): the mappers
    /// learn from conversations by adding to them, and a later calibration can add
    /// windows to them with --merge-stats instead of capturing again.
    #[arg(long)]
    pub no_save_stats: bool,
    /// Make a mapper the default even when it is worse than no context on its own
    /// held-out windows (by default such a mapper is kept apart, under poor/ in the
    /// mappers directory, and the one in use stays; with none in use it is the default).
    #[arg(long)]
    pub accept_poor: bool,
    /// Kept so that older command lines still run: statistics are saved by default.
    #[arg(long, hide = true, conflicts_with = "no_save_stats")]
    pub save_stats: bool,
    /// Add the statistics saved by an earlier calibration in these mapper directories
    /// (none named: the one being written) to this run's windows, and fit from the sum.
    /// With --sequences 0 nothing new is read: k and λ are chosen again from the saved
    /// statistics in minutes.
    #[arg(long, num_args = 0.., value_name = "MAPPER_DIR")]
    pub merge_stats: Option<Vec<PathBuf>>,
    /// Weight each fit position by the attention the target's own queries give it,
    /// relative to even attention, raised to this power (0: off; 0.5 tempers it, 1 is in
    /// proportion): the map is fitted hardest where the target reads.
    #[arg(long, default_value_t = 0.0)]
    pub attention_weight: f32,
    /// Pass over the corpus's first N fit windows: those that statistics being merged
    /// already hold (their count is in `baton mappers`).
    #[arg(long, default_value_t = 0)]
    pub skip_windows: usize,
    /// The mapper to fit: `ridge` (the closed form), `residual` (ridge plus a trained
    /// bottleneck network per target layer) or `mlp` (a trained network of two hidden
    /// layers of 1024 ReLU units per target layer in place of ridge).
    #[arg(long, default_value = "ridge", value_parser = parse_kind)]
    pub mapper: MapperKind,
    /// What a trained mapper minimises: `attention` (the error of the target's attention
    /// output under its own queries) or `kv-mse` (the keys' and values' error).
    #[arg(long, default_value = "attention", value_parser = parse_loss)]
    pub train_loss: TrainLoss,
    /// Windows a trained mapper reads per epoch.
    #[arg(long, default_value_t = TrainOptions::default().windows)]
    pub train_windows: usize,
    /// Epochs at most (training stops earlier once held-out windows stop improving).
    #[arg(long, default_value_t = TrainOptions::default().epochs)]
    pub train_epochs: usize,
    /// The seed of a trained mapper's initial weights.
    #[arg(long, default_value_t = 0)]
    pub train_seed: u64,
    /// Hidden widths of a trained mapper's networks in place of its kind's, e.g. 128 or
    /// 512,512 (two layers). Given more than once, every width trains on the same windows
    /// and each direction keeps the one that scores best on held-out windows.
    #[arg(long, value_parser = parse_widths)]
    pub train_hidden: Vec<Vec<usize>>,
    /// AdamW's learning rate for a trained mapper.
    #[arg(long, default_value_t = TrainOptions::default().learning_rate)]
    pub train_lr: f64,
    /// Print the calibration report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_kind(s: &str) -> std::result::Result<MapperKind, String> {
    s.parse()
}

fn parse_loss(s: &str) -> std::result::Result<TrainLoss, String> {
    s.parse()
}

/// One network's hidden widths, comma-separated ("512,512").
fn parse_widths(s: &str) -> std::result::Result<Vec<usize>, String> {
    s.split(',')
        .map(|w| {
            w.trim().parse::<usize>().map_err(|_| {
                format!("`{w}` is not a width: give whole numbers, e.g. 256 or 512,512")
            })
        })
        .collect()
}

impl CalibrateArgs {
    /// The calibration these flags ask for; `validate` on the result checks the
    /// combination before any model loads.
    pub fn options(&self) -> CalibrateOptions {
        let (sequences, seq_len) = if self.reference {
            (500, 1024)
        } else {
            (self.sequences, self.seq_len)
        };
        CalibrateOptions {
            sequences,
            seq_len,
            stride: self.stride,
            skip_first: self.skip_first,
            select_sequences: self.select_sequences,
            k_sweep: self.k.clone(),
            lambdas: self.lambda.clone(),
            max_k: self.max_k,
            k_tolerance: self.k_tolerance,
            select_by: match self.select_by {
                SelectByArg::Cosine => SelectBy::Cosine,
                SelectByArg::Agreement => SelectBy::Agreement,
            },
            standardize: !self.no_standardize,
            chat_share: self.chat_share,
            token_features: self.token_features.into(),
            key_gain: self.key_gain.factor(),
            value_gain: self.value_gain.factor(),
            key_gain_matched: self.key_gain.is_matched(),
            value_gain_matched: self.value_gain.is_matched(),
            skip_windows: self.skip_windows,
            attention_weight: self.attention_weight,
            rank: self.rank,
            train: TrainOptions {
                kind: self.mapper,
                loss: self.train_loss,
                windows: self.train_windows,
                epochs: self.train_epochs,
                seed: self.train_seed,
                hidden: self.train_hidden.clone(),
                learning_rate: self.train_lr,
                ..TrainOptions::default()
            },
            ..CalibrateOptions::default()
        }
    }
}

/// Reads the corpus with a bar in MiB, for a corpus large enough to take a while.
fn read_corpus(files: &[PathBuf], bars: &baton::console::PhaseBars) -> Result<corpus::Corpus> {
    const MIB: u64 = 1 << 20;
    let mut shown = false;
    let corpus = corpus::read_corpus(files, &mut |done, total| {
        if total < 64 * MIB {
            return;
        }
        if !shown {
            bars.phase("reading the corpus (MiB)", total.div_ceil(MIB));
            shown = true;
        }
        bars.set_position(done / MIB);
    })?;
    if shown {
        bars.finish(false);
    }
    Ok(corpus)
}

pub fn calibrate(a: CalibrateArgs, on: &Placement) -> Result<()> {
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    // Ctrl-C stops at the next window; artifacts are only written at the very end.
    let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
    let opts = a.options();
    // Before the corpus and the models: a mistaken option should not cost their loading.
    opts.validate_with_prior(a.merge_stats.is_some())?;
    let dir = a.pair.mapper_dir();
    // Before any work: a calibration of a quarter of an hour is never lost to a
    // directory it cannot write.
    dir.check_writable()?;
    for from in a.merge_stats.iter().flatten() {
        if !from.is_dir() {
            anyhow::bail!(
                "--merge-stats {}: no such mappers directory; name one an earlier calibration \
                 wrote (its statistics are in stats/ under it)",
                from.display()
            );
        }
    }
    let files = corpus::files_or_default(&a.corpus)?;
    let bars = baton::console::PhaseBars::new(a.json);
    let text = read_corpus(&files, &bars)?;
    let (src, tgt) = a.pair.open(on)?;
    let directions = a.direction.calibrated();
    let prior = match &a.merge_stats {
        Some(dirs) if dirs.is_empty() => {
            saved_prior(std::slice::from_ref(&dir), &directions, [&src, &tgt])?
        }
        Some(dirs) => {
            let dirs: Vec<MapperDir> = dirs.iter().map(MapperDir::named).collect();
            saved_prior(&dirs, &directions, [&src, &tgt])?
        }
        None => Vec::new(),
    };
    let started = std::time::Instant::now();
    let job = cal::Job {
        dir: &dir,
        files: &files,
        corpus: text,
        directions: &directions,
        opts: &opts,
        prior,
        save_stats: !a.no_save_stats,
        accept_poor: a.accept_poor,
    };
    let done = cal::calibrate_and_save([&src, &tgt], job, &bars, &cancel)?;
    bars.finish(true);
    for s in &done.kept {
        eprintln!("{} -> {}", s.meta.summary_line(), s.path.display());
        // What the mapper it replaced learned stays, bound to that mapper.
        let files = dir.pair(&s.meta.source, &s.meta.target);
        if let Ok(Some(l)) = baton::learn::store::read_meta(&files, Some(&s.meta)) {
            if l.not_applied > 0 {
                eprintln!(
                    "note: {} updates learned on the mapper this one replaces stay in {} \
                     but are not applied to it; `baton mappers --reset-learned` removes them",
                    l.not_applied,
                    files.learned().display()
                );
            }
        }
    }
    for p in &done.poor {
        eprintln!("warning: {}", p.message());
    }
    for (meta, at) in &done.stats {
        eprintln!(
            "statistics of {} -> {}: {} windows, {} observations -> {}",
            meta.source.name,
            meta.target.name,
            meta.windows(),
            meta.observations,
            at.display()
        );
    }
    eprintln!("calibration took {:.1} s", started.elapsed().as_secs_f64());
    if a.json {
        let metas: Vec<_> = done.kept.iter().map(|s| &s.meta).collect();
        print_json(&metas)?;
    }
    Ok(())
}

/// The statistics earlier calibrations saved in `dirs`, for each direction, to be added
/// to this run's.
fn saved_prior(
    dirs: &[MapperDir],
    directions: &[Direction],
    [src, tgt]: [&Model; 2],
) -> Result<Vec<(PathBuf, SavedStats)>> {
    let mut prior = Vec::new();
    for from in dirs {
        for &d in directions {
            let (s, t) = d.pick(src, tgt);
            let (s, t) = (
                ModelRef::new(&s.identity, s.config()),
                ModelRef::new(&t.identity, t.config()),
            );
            let at = from.pair(&s, &t).stats();
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
    Ok(prior)
}
