//! Calibration: stream the corpus through both models, accumulate the paired statistics
//! for both directions at once, rank source layers per target layer, then choose k (and
//! λ) by attention-output cosine on held-out windows, not by R².

use super::apply::CacheMapper;
use super::features::all_layer_features;
use super::packed::SourceScales;
use super::ridge::{self, LayerMap, RidgeOptions};
use super::select::{select_layers, single_layer_r2};
use super::stats::PairStats;
use super::MapperError;
use crate::data::corpus::{self, Document, Split};
use crate::metrics::{self, attention_output_cosine, NextTokenAgreement};
use crate::model::{ForwardOptions, KvCache, Logits, Model, ModelError, ModelIdentity};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrateOptions {
    /// Windows used for fitting.
    pub sequences: usize,
    pub seq_len: usize,
    /// Keep every `stride`-th position of a window as an observation.
    pub stride: usize,
    /// Held-out windows used to choose k and λ.
    pub select_sequences: usize,
    /// Query positions per held-out window for the attention-output cosine.
    pub probes: usize,
    /// Candidate k values; values past the source's layer count mean "all layers".
    pub k_sweep: Vec<usize>,
    pub lambdas: Vec<f64>,
    /// The largest k the chosen mapper may use. Larger k are still swept and reported;
    /// each doubling of k doubles the map's work, and the handoff is only worth doing
    /// while the map stays far cheaper than the re-prefill.
    #[serde(default = "default_max_k")]
    pub max_k: usize,
    /// Held-out cosine a smaller k may give up against the best allowed point and still
    /// be chosen for being cheaper.
    #[serde(default)]
    pub k_tolerance: f64,
    pub standardize: bool,
    /// Leading positions of each window left out of the statistics: the first tokens are
    /// attention sinks whose keys and values are outliers by orders of magnitude.
    #[serde(default)]
    pub skip_first: usize,
    /// Fit a reduced (low-rank) mapper after the full one; `None` keeps the full one.
    #[serde(default)]
    pub rank: Option<RankChoice>,
    /// The held-out number k and λ are chosen by.
    #[serde(default)]
    pub select_by: SelectBy,
}

/// How the reduced mapper's rank is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankChoice {
    /// This rank (a multiple of 32, below the target layer's width).
    Fixed(usize),
    /// The smallest of [`AUTO_RANKS`] whose held-out attention cosine is within
    /// [`RANK_TOLERANCE`] of the full mapper's.
    Auto,
}

/// The default largest k: at k = 8 the map of 1024 tokens takes about 150 ms against
/// 8 s of re-prefill on the 1.5B target; k = 16 doubles it.
pub const DEFAULT_MAX_K: usize = 8;
/// Held-out cosine a cheaper point may give up by default: none. Next-token agreement
/// has not been measured to follow small cosine differences between k (they can point
/// the other way, see the λ note above), so trading fidelity for speed is the user's
/// call (`--k-tolerance`).
pub const K_TOLERANCE: f64 = 0.0;

/// Options saved before the cap existed chose among every k.
fn default_max_k() -> usize {
    usize::MAX
}

/// Ranks `RankChoice::Auto` tries: multiples of 32, which the int8 kernels take whole.
pub const AUTO_RANKS: [usize; 5] = [32, 64, 96, 128, 192];
/// Held-out cosine a reduced mapper may give up against the full one under
/// `RankChoice::Auto`.
pub const RANK_TOLERANCE: f64 = 0.01;

/// One reduced rank tried on the held-out windows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankPoint {
    pub rank: usize,
    /// Held-out attention-output cosine, mean over target layers.
    pub cosine: f64,
    #[serde(default)]
    pub agreement: Option<NextTokenAgreement>,
    /// Multiply-adds per mapped token, all target layers, K and V.
    pub macs_per_token: usize,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        Self {
            sequences: 64,
            seq_len: 512,
            stride: 4,
            select_sequences: 8,
            probes: 32,
            k_sweep: vec![1, 2, 4, 8, 12, 16, usize::MAX],
            // λ is absolute on a standardised Gram whose diagonal is the observation
            // count (8192 here): 0.01 is almost none. λ = 1000 raises the held-out
            // attention cosine (0.734 → 0.755 at k = 8, 0.5B→1.5B, on code) but lowers
            // next-token agreement on held-out text (0.864 → 0.845): shrunken keys give
            // flatter attention. The cosine picks λ, so only λ values that are safe for
            // the continuations are offered by default.
            lambdas: vec![0.01],
            max_k: DEFAULT_MAX_K,
            k_tolerance: K_TOLERANCE,
            standardize: true,
            skip_first: 0,
            rank: None,
            select_by: SelectBy::Cosine,
        }
    }
}

impl CalibrateOptions {
    /// A first-run mapper that is ready in a few minutes on a 2-core CPU: a quarter of
    /// the default sample, stride 2 to keep enough observations for k up to 4.
    pub fn quick() -> Self {
        Self {
            sequences: 24,
            seq_len: 256,
            stride: 2,
            select_sequences: 4,
            probes: 16,
            k_sweep: vec![1, 2, 4],
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// First model to second.
    Forward,
    /// Second model to first.
    Backward,
}

/// Progress of a long calibration, for a bar with ETA.
pub trait CalibrationProgress {
    fn phase(&self, name: &str, total: u64);
    fn advance(&self, n: u64);
    fn note(&self, msg: &str);
}

pub struct NoProgress;
impl CalibrationProgress for NoProgress {
    fn phase(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn note(&self, _: &str) {}
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepPoint {
    pub k: usize,
    pub lambda: f64,
    /// Held-out attention-output cosine, mean over target layers and windows.
    pub cosine: f64,
    pub r2_k: f64,
    pub r2_v: f64,
    /// Held-out next-token agreement of the target continuing from the mapped prefix
    /// (absent in artifacts from before it was measured).
    #[serde(default)]
    pub agreement: Option<NextTokenAgreement>,
}

impl SweepPoint {
    /// The number the choice of k and λ maximises.
    pub fn merit(&self, by: SelectBy) -> f64 {
        match by {
            SelectBy::Cosine => self.cosine,
            SelectBy::Agreement => self.agreement.map_or(f64::NEG_INFINITY, |a| a.top1),
        }
    }
}

/// What held-out number chooses k and λ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SelectBy {
    /// Attention-output cosine, mean over target layers.
    #[default]
    Cosine,
    /// Next-token top-1 agreement on the windows' continuations.
    Agreement,
}

impl SelectBy {
    pub fn name(self) -> &'static str {
        match self {
            SelectBy::Cosine => "attention cosine",
            SelectBy::Agreement => "top-1 agreement",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SkippedK {
    pub k: usize,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationReport {
    pub observations: u64,
    pub sequences: usize,
    pub seq_len: usize,
    pub stride: usize,
    /// Leading positions of each window left out of the fit; held-out windows were
    /// scored with the target's own cache of them (the anchor the mapper is meant for).
    #[serde(default)]
    pub skip_first: usize,
    pub select_sequences: usize,
    pub sweep: Vec<SweepPoint>,
    /// Candidate k values not tried, and why.
    #[serde(default)]
    pub skipped_k: Vec<SkippedK>,
    /// The cap on k the choice was made under (`None`: no cap below all layers).
    #[serde(default)]
    pub max_k: Option<usize>,
    /// The best swept point above the cap, when it beats the one chosen: what a larger,
    /// slower mapper would reach.
    #[serde(default)]
    pub best_above_max_k: Option<SweepPoint>,
    /// Per target layer, on the held-out windows, for the chosen k and λ.
    pub r2_k: Vec<f64>,
    pub r2_v: Vec<f64>,
    pub cosine: Vec<f64>,
    /// Held-out next-token agreement of the chosen mapper.
    #[serde(default)]
    pub agreement: Option<NextTokenAgreement>,
    /// Single-layer R² used for ranking, [target layer][source layer].
    pub single_layer_r2_k: Vec<Vec<f64>>,
    pub single_layer_r2_v: Vec<Vec<f64>>,
    pub capture_seconds: f64,
    pub fit_seconds: f64,
    /// Reduced ranks tried (empty for a full mapper), and the full mapper's cosine
    /// they were held against.
    #[serde(default)]
    pub rank_sweep: Vec<RankPoint>,
    #[serde(default)]
    pub full_cosine: Option<f64>,
    /// Bytes of the statistics held during calibration (both directions, K and V).
    pub stats_bytes: usize,
}

/// A fitted mapper for one direction, ready to save or apply.
pub struct Fitted {
    pub source: ModelIdentity,
    pub target: ModelIdentity,
    pub k: usize,
    pub lambda: f64,
    pub standardize: bool,
    pub keys: Vec<LayerMap>,
    pub values: Vec<LayerMap>,
    /// The source features' means and deviations, for the int8 map.
    pub source_scales: SourceScales,
    pub report: CalibrationReport,
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Mapper(#[from] MapperError),
    #[error(transparent)]
    Corpus(#[from] corpus::CorpusError),
    #[error(transparent)]
    Metric(#[from] crate::metrics::MetricError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Tokenizer(#[from] crate::text::TokenizerError),
    #[error("calibration cancelled; nothing was written")]
    Cancelled,
    #[error("{0}")]
    Options(String),
}

/// Key maps, value maps, and how they do on the held-out windows.
type ScoredMaps = (Vec<LayerMap>, Vec<LayerMap>, HeldOut);

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

struct Captured {
    cache: KvCache,
    /// Per layer [n_head, probes, hd], the model's own queries at the probe positions.
    queries: Vec<Tensor>,
}

fn flat(t: &Tensor) -> Result<Vec<f32>, CalibrateError> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

fn capture(m: &Model, ids: &[u32], probes: &[usize]) -> Result<Captured, CalibrateError> {
    let mut cache = m.decoder.new_cache();
    let out = m.decoder.forward(
        ids,
        &mut cache,
        &ForwardOptions {
            logits: Logits::None,
            probe_positions: probes.to_vec(),
        },
    )?;
    Ok(Captured {
        cache,
        queries: out.queries,
    })
}

/// Probe positions spread over a window, skipping the first few (attention sinks).
pub fn probe_positions(len: usize, count: usize) -> Vec<usize> {
    let lo = (len / 8).min(len.saturating_sub(1));
    let span = len - lo;
    let count = count.min(span).max(1);
    (0..count).map(|i| lo + i * span / count).collect()
}

/// Where a held-out window splits into the mapped prefix and the continuation the target
/// reads on top of it: three quarters in, as eval's 384 + 128 tokens of a 512 window.
pub fn continuation_start(seq_len: usize) -> usize {
    seq_len * 3 / 4
}

/// The target's logits over the continuation of one held-out window, read on top of
/// `cache` cut to the prefix (truncating is free; the cache then holds the window again).
fn continuation_logits(
    tgt: &Model,
    cache: &mut KvCache,
    window: &[u32],
) -> Result<Tensor, CalibrateError> {
    let start = continuation_start(window.len());
    cache.truncate(start);
    let out = tgt.decoder.forward(
        &window[start..],
        cache,
        &ForwardOptions {
            logits: Logits::All,
            probe_positions: vec![],
        },
    )?;
    out.logits
        .ok_or_else(|| CalibrateError::Options("no logits for the continuation".into()))
}

/// How a map does on the held-out windows.
struct HeldOut {
    /// Attention-output cosine per target layer, mean over windows.
    cosine: Vec<f64>,
    /// Next-token agreement of the target continuing from the mapped prefix with the
    /// target continuing from its own, over every window's continuation.
    agreement: NextTokenAgreement,
}

/// Map each held-out window with `mapper` and score it against the true target cache:
/// attention cosine at the probes, and next-token agreement on the continuation.
#[allow(clippy::too_many_arguments)]
fn heldout_scores(
    mapper: &CacheMapper,
    src: &Model,
    tgt: &Model,
    windows: &[Vec<u32>],
    src_caps: &[Captured],
    tgt_caps: &[Captured],
    true_logits: &[Tensor],
    probes: &[usize],
    anchor: usize,
) -> Result<HeldOut, CalibrateError> {
    let l_t = tgt.config().n_layer;
    let mut per_layer = vec![0f64; l_t];
    let (mut top1, mut kl, mut positions) = (0.0, 0.0, 0);
    for (((s, t), w), truth) in src_caps.iter().zip(tgt_caps).zip(windows).zip(true_logits) {
        // A mapper fitted without the first positions is used behind an anchor: the
        // target's own cache of them, as the workbench and eval hold it.
        let mut mapped = if anchor == 0 {
            mapper.map_cache(&s.cache, src.decoder.rope(), tgt.decoder.rope())?
        } else {
            let mut c = t.cache.try_clone_prefix(anchor)?;
            c.extend_with(&mapper.map_range(
                &s.cache,
                src.decoder.rope(),
                tgt.decoder.rope(),
                anchor,
                s.cache.len(),
            )?)?;
            c
        };
        for (l, slot) in per_layer.iter_mut().enumerate() {
            let tr = t.cache.layer(l)?;
            let mp = mapped.layer(l)?;
            *slot += attention_output_cosine(&t.queries[l], probes, &tr.k, &tr.v, &mp.k, &mp.v)?;
        }
        // The mapped cache is not needed after this, so it is cut in place, not copied.
        let a = metrics::logits::agreement(truth, &continuation_logits(tgt, &mut mapped, w)?)?;
        top1 += a.top1 * a.positions as f64;
        kl += a.kl * a.positions as f64;
        positions += a.positions;
    }
    let n = src_caps.len().max(1) as f64;
    let p = positions.max(1) as f64;
    Ok(HeldOut {
        cosine: per_layer.into_iter().map(|c| c / n).collect(),
        agreement: NextTokenAgreement {
            top1: top1 / p,
            kl: kl / p,
            positions,
        },
    })
}

fn to_cache_mapper(
    src: &Model,
    tgt: &Model,
    keys: &[LayerMap],
    values: &[LayerMap],
    scales: &SourceScales,
) -> Result<CacheMapper, CalibrateError> {
    Ok(CacheMapper::from_layer_maps(
        src,
        tgt,
        keys,
        values,
        Some(scales),
    )?)
}

/// Calibrate the mappers between `a` and `b` for the requested directions.
pub fn calibrate(
    a: &Model,
    b: &Model,
    docs: &[Document],
    directions: &[Direction],
    opts: &CalibrateOptions,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<Vec<Fitted>, CalibrateError> {
    crate::text::ensure_same_tokenizer(&a.tokenizer, &b.tokenizer)
        .map_err(|e| CalibrateError::Model(e.into()))?;
    if directions.is_empty() || opts.sequences == 0 || opts.seq_len < 16 || opts.stride == 0 {
        return Err(CalibrateError::Options(
            "need at least one direction, one sequence, a window of 16+ tokens and a stride of 1+"
                .into(),
        ));
    }
    // Probes start at an eighth of the window; skipped positions must stay before them.
    if opts.skip_first >= opts.seq_len / 8 {
        return Err(CalibrateError::Options(format!(
            "--skip-first {} leaves too little of a {}-token window; use fewer than {}",
            opts.skip_first,
            opts.seq_len,
            opts.seq_len / 8
        )));
    }
    let check_cancel = || {
        if cancel.load(Ordering::Relaxed) {
            Err(CalibrateError::Cancelled)
        } else {
            Ok(())
        }
    };
    let fit_windows =
        corpus::windows(docs, &a.tokenizer, Split::Fit, opts.seq_len, opts.sequences)?;
    let sel_windows = corpus::windows(
        docs,
        &a.tokenizer,
        Split::Select,
        opts.seq_len,
        opts.select_sequences,
    )?;
    let pick = |d: Direction| match d {
        Direction::Forward => (a, b),
        Direction::Backward => (b, a),
    };
    // [direction] -> (K stats, V stats)
    let mut stats: Vec<(PairStats, PairStats)> = Vec::new();
    for &d in directions {
        let (s, t) = pick(d);
        let (ls, ds, lt, dt) = (
            s.config().n_layer,
            s.config().kv_width(),
            t.config().n_layer,
            t.config().kv_width(),
        );
        stats.push((
            PairStats::new(ls, ds, lt, dt)?,
            PairStats::new(ls, ds, lt, dt)?,
        ));
    }
    let stats_bytes: usize = stats
        .iter()
        .map(|(k, v)| k.memory_bytes() + v.memory_bytes())
        .sum();
    tracing::info!(stats_bytes, "calibration statistics allocated");

    // Capture: both models read each window once; every direction uses the pair.
    let t0 = Instant::now();
    progress.phase("capture", fit_windows.len() as u64);
    for w in &fit_windows {
        check_cancel()?;
        let ca_ = capture(a, w, &[])?;
        let cb_ = capture(b, w, &[])?;
        let fa = all_layer_features(
            &ca_.cache,
            a.decoder.rope(),
            opts.skip_first,
            w.len(),
            opts.stride,
        )?;
        let fb = all_layer_features(
            &cb_.cache,
            b.decoder.rope(),
            opts.skip_first,
            w.len(),
            opts.stride,
        )?;
        let rows = fa.0.dim(0)?;
        let (ak, av, bk, bv) = (flat(&fa.0)?, flat(&fa.1)?, flat(&fb.0)?, flat(&fb.1)?);
        for (&d, (sk, sv)) in directions.iter().zip(stats.iter_mut()) {
            match d {
                Direction::Forward => {
                    sk.update(&ak, &bk, rows)?;
                    sv.update(&av, &bv, rows)?;
                }
                Direction::Backward => {
                    sk.update(&bk, &ak, rows)?;
                    sv.update(&bv, &av, rows)?;
                }
            }
        }
        progress.advance(1);
    }

    // Held-out windows: true caches and each model's own queries at probe positions.
    let probes = probe_positions(opts.seq_len, opts.probes);
    progress.phase("held-out", sel_windows.len() as u64);
    let mut held_a = Vec::new();
    let mut held_b = Vec::new();
    for w in &sel_windows {
        check_cancel()?;
        held_a.push(capture(a, w, &probes)?);
        held_b.push(capture(b, w, &probes)?);
        progress.advance(1);
    }
    let capture_seconds = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut out = Vec::new();
    for (&d, (sk, sv)) in directions.iter().zip(&stats) {
        let (src, tgt) = pick(d);
        let (src_caps, tgt_caps) = match d {
            Direction::Forward => (&held_a, &held_b),
            Direction::Backward => (&held_b, &held_a),
        };
        // Held-out statistics give held-out R² per layer without touching raw rows again.
        let (ls, ds, lt, dt) = (sk.l_s(), sk.d_s(), sk.l_t(), sk.d_t());
        let mut hk = PairStats::new(ls, ds, lt, dt)?;
        let mut hv = PairStats::new(ls, ds, lt, dt)?;
        for (s, t) in src_caps.iter().zip(tgt_caps.iter()) {
            let fs = all_layer_features(
                &s.cache,
                src.decoder.rope(),
                opts.skip_first,
                s.cache.len(),
                opts.stride,
            )?;
            let ft = all_layer_features(
                &t.cache,
                tgt.decoder.rope(),
                opts.skip_first,
                t.cache.len(),
                opts.stride,
            )?;
            let rows = fs.0.dim(0)?;
            hk.update(&flat(&fs.0)?, &flat(&ft.0)?, rows)?;
            hv.update(&flat(&fs.1)?, &flat(&ft.1)?, rows)?;
        }
        let base = RidgeOptions {
            lambda: opts.lambdas.first().copied().unwrap_or(0.01),
            standardize: opts.standardize,
            ..RidgeOptions::default()
        };
        let scales = SourceScales::from_stats(sk, sv);
        let r2k = single_layer_r2(sk, &base)?;
        let r2v = single_layer_r2(sv, &base)?;
        // The target's own continuations of the held-out windows, once per direction.
        let true_logits: Vec<Tensor> = tgt_caps
            .iter()
            .zip(&sel_windows)
            .map(|(t, w)| {
                let mut own = t.cache.try_clone_prefix(continuation_start(w.len()))?;
                continuation_logits(tgt, &mut own, w)
            })
            .collect::<Result<_, _>>()?;
        // Score maps on the held-out windows as they will run.
        let score = |keys: &[LayerMap], values: &[LayerMap]| -> Result<HeldOut, CalibrateError> {
            let mapper = to_cache_mapper(src, tgt, keys, values, &scales)?;
            heldout_scores(
                &mapper,
                src,
                tgt,
                &sel_windows,
                src_caps,
                tgt_caps,
                &true_logits,
                &probes,
                opts.skip_first,
            )
        };
        // Fit every target layer from its top-k source layers, and score the result.
        let fit_and_score = |k: usize, lambda: f64| -> Result<ScoredMaps, CalibrateError> {
            let ro = RidgeOptions { lambda, ..base };
            let (sel_k, sel_v) = (select_layers(&r2k, k), select_layers(&r2v, k));
            let keys: Vec<LayerMap> = (0..lt)
                .map(|j| ridge::fit_layer(sk, j, &sel_k[j], &ro))
                .collect::<Result<_, _>>()?;
            let values: Vec<LayerMap> = (0..lt)
                .map(|j| ridge::fit_layer(sv, j, &sel_v[j], &ro))
                .collect::<Result<_, _>>()?;
            let held = score(&keys, &values)?;
            Ok((keys, values, held))
        };
        let mut ks: Vec<usize> = opts.k_sweep.iter().map(|&k| k.min(ls)).collect();
        ks.sort_unstable();
        ks.dedup();
        // With more features than about half the observations a ridge at small λ learns
        // the noise (held-out R² far below zero), so such k are not tried at all.
        let max_features = (sk.count() / 2) as usize;
        let (ks, skipped): (Vec<usize>, Vec<usize>) = ks
            .into_iter()
            .partition(|&k| k == 1 || k * ds <= max_features);
        let skipped_k: Vec<SkippedK> = skipped
            .into_iter()
            .map(|k| {
                let reason = format!("{} features for {} observations", k * ds, sk.count());
                progress.note(&format!(
                    "k={k:<3} skipped: {reason} (calibrate on more sequences to try it)"
                ));
                SkippedK { k, reason }
            })
            .collect();
        // With every candidate too wide for the data, one source layer per target layer
        // is still well posed; better that than nothing after the expensive capture.
        let ks = if ks.is_empty() {
            progress.note("no k in the sweep fits the observations: using k=1");
            vec![1]
        } else {
            ks
        };
        let total = (ks.len() * opts.lambdas.len()) as u64;
        progress.phase(
            &format!("sweep {} -> {}", src.identity.name, tgt.identity.name),
            total,
        );
        let mut sweep: Vec<SweepPoint> = Vec::new();
        // (merit, k, λ, maps and their held-out scores) of the best allowed point.
        let mut best: Option<(f64, usize, f64, ScoredMaps)> = None;
        for &k in &ks {
            check_cancel()?;
            for &lambda in &opts.lambdas {
                let scored = fit_and_score(k, lambda)?;
                let (keys, values, held) = &scored;
                let mean_r2 = |st: &PairStats, maps: &[LayerMap]| -> Result<f64, CalibrateError> {
                    let mut s = 0.0;
                    for (j, m) in maps.iter().enumerate() {
                        s += ridge::r2(st, j, m)?;
                    }
                    Ok(s / maps.len() as f64)
                };
                let point = SweepPoint {
                    k,
                    lambda,
                    cosine: mean(&held.cosine),
                    r2_k: mean_r2(&hk, keys)?,
                    r2_v: mean_r2(&hv, values)?,
                    agreement: Some(held.agreement),
                };
                tracing::info!(?point, "sweep point");
                progress.note(&format!(
                    "k={k:<3} λ={lambda:<8} held-out cosine {:.4}  top-1 {:.4}  KL {:.3}  R² K {:.3} V {:.3}",
                    point.cosine, held.agreement.top1, held.agreement.kl, point.r2_k, point.r2_v
                ));
                let merit = point.merit(opts.select_by);
                sweep.push(point);
                let allowed = k <= opts.max_k || k == ks[0];
                if allowed && best.as_ref().is_none_or(|b| merit > b.0) {
                    best = Some((merit, k, lambda, scored));
                }
                progress.advance(1);
            }
        }
        let Some((mut best_merit, mut k, mut lambda, (mut keys, mut values, mut held))) = best
        else {
            return Err(CalibrateError::Options("empty k sweep".into()));
        };
        let by = opts.select_by;
        let best_above_max_k = sweep
            .iter()
            .filter(|p| p.k > k && p.k > opts.max_k && p.merit(by) > best_merit)
            .max_by(|a, b| a.merit(by).total_cmp(&b.merit(by)))
            .cloned();
        // The cheapest point close enough to the best allowed one: a larger k must buy
        // more than the tolerance to be worth its map time.
        if let Some(cheaper) = sweep
            .iter()
            .filter(|p| p.k < k && p.merit(by) >= best_merit - opts.k_tolerance)
            .min_by(|a, b| a.k.cmp(&b.k).then(b.merit(by).total_cmp(&a.merit(by))))
            .cloned()
        {
            progress.note(&format!(
                "k={} λ={} chosen over k={k} λ={lambda}: held-out {} {:.4} against {:.4}, \
                 within {} at less map time",
                cheaper.k,
                cheaper.lambda,
                by.name(),
                cheaper.merit(by),
                best_merit,
                opts.k_tolerance
            ));
            // Fitted again rather than kept from the sweep: holding every point's maps
            // would cost hundreds of MB for a choice only a tolerance makes.
            (keys, values, held) = fit_and_score(cheaper.k, cheaper.lambda)?;
            (best_merit, k, lambda) = (cheaper.merit(by), cheaper.k, cheaper.lambda);
        }
        if let Some(p) = &best_above_max_k {
            progress.note(&format!(
                "k={} λ={} would reach a held-out {} of {:.4} (+{:.4}) at {:.1}x the map's \
                 work; calibrate with --max-k {} to choose it",
                p.k,
                p.lambda,
                by.name(),
                p.merit(by),
                p.merit(by) - best_merit,
                p.k as f64 / k as f64,
                p.k
            ));
        }
        let full_mean = mean(&held.cosine);
        let (keys, values, held, rank_sweep) = match opts.rank {
            None => (keys, values, held, Vec::new()),
            Some(choice) => {
                let dt = tgt.config().kv_width();
                let ranks: Vec<usize> = match choice {
                    RankChoice::Fixed(r) => {
                        if r == 0 || !r.is_multiple_of(32) || r >= dt {
                            return Err(CalibrateError::Options(format!(
                                "--rank {r}: the rank must be a multiple of 32 below the target's \
                                 key/value width {dt}"
                            )));
                        }
                        vec![r]
                    }
                    RankChoice::Auto => AUTO_RANKS.iter().copied().filter(|&r| r < dt).collect(),
                };
                progress.phase(
                    &format!("rank {} -> {}", src.identity.name, tgt.identity.name),
                    ranks.len() as u64,
                );
                let mut sweep = Vec::new();
                let mut chosen = None;
                for &r in &ranks {
                    check_cancel()?;
                    let reduce = |st: &PairStats, maps: &[LayerMap]| {
                        maps.iter()
                            .enumerate()
                            .map(|(j, m)| super::low_rank::reduce_rank(st, j, m, r).map(|x| x.0))
                            .collect::<Result<Vec<_>, _>>()
                    };
                    let rk = reduce(sk, &keys)?;
                    let rv = reduce(sv, &values)?;
                    let held_r = score(&rk, &rv)?;
                    let cos_mean = mean(&held_r.cosine);
                    let macs = rk
                        .iter()
                        .chain(&rv)
                        .filter_map(|m| m.factors.as_ref().map(|f| f.macs()))
                        .sum();
                    progress.note(&format!(
                        "rank {r:<4} held-out cosine {cos_mean:.4} (full {full_mean:.4}), top-1 {:.4}, \
                         {:.1} MFLOP/token",
                        held_r.agreement.top1,
                        2.0 * macs as f64 / 1e6
                    ));
                    sweep.push(RankPoint {
                        rank: r,
                        cosine: cos_mean,
                        agreement: Some(held_r.agreement),
                        macs_per_token: macs,
                    });
                    progress.advance(1);
                    let good = match choice {
                        RankChoice::Fixed(_) => true,
                        RankChoice::Auto => cos_mean >= full_mean - RANK_TOLERANCE,
                    };
                    if good {
                        chosen = Some((rk, rv, held_r));
                        break;
                    }
                }
                match chosen {
                    Some((rk, rv, held_r)) => (rk, rv, held_r, sweep),
                    None => {
                        progress.note(&format!(
                            "no rank in {ranks:?} comes within {RANK_TOLERANCE} of the full \
                             mapper's cosine: keeping the full mapper"
                        ));
                        (keys, values, held, sweep)
                    }
                }
            }
        };
        let r2_k = keys
            .iter()
            .enumerate()
            .map(|(j, m)| ridge::r2(&hk, j, m))
            .collect::<Result<Vec<_>, _>>()?;
        let r2_v = values
            .iter()
            .enumerate()
            .map(|(j, m)| ridge::r2(&hv, j, m))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Fitted {
            source: src.identity.clone(),
            target: tgt.identity.clone(),
            k,
            lambda,
            standardize: opts.standardize,
            keys,
            values,
            source_scales: scales,
            report: CalibrationReport {
                observations: sk.count(),
                sequences: opts.sequences,
                seq_len: opts.seq_len,
                stride: opts.stride,
                skip_first: opts.skip_first,
                select_sequences: opts.select_sequences,
                sweep,
                skipped_k,
                max_k: (opts.max_k < ls).then_some(opts.max_k),
                best_above_max_k,
                r2_k,
                r2_v,
                cosine: held.cosine,
                agreement: Some(held.agreement),
                single_layer_r2_k: r2k,
                single_layer_r2_v: r2v,
                capture_seconds,
                fit_seconds: 0.0,
                stats_bytes,
                rank_sweep,
                full_cosine: Some(full_mean),
            },
        });
    }
    let fit_seconds = t1.elapsed().as_secs_f64();
    for f in &mut out {
        f.report.fit_seconds = fit_seconds;
    }
    Ok(out)
}

impl Fitted {
    pub fn cache_mapper(&self, src: &Model, tgt: &Model) -> Result<CacheMapper, CalibrateError> {
        to_cache_mapper(src, tgt, &self.keys, &self.values, &self.source_scales)
    }
}
