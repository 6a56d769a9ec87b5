//! Mapping against re-prefill, timed honestly: for each context length, the source's
//! prefill, the target's full re-prefill, the full map, and for a suffix (the last
//! `suffix` tokens) the suffix map against the suffix re-prefill, plus the switch end to
//! end (map + the target's first token). Everything runs in one process, warmed up,
//! device-synchronised, repeated with the variants interleaved so machine noise hits
//! them alike; rows report the median and the spread (min–max).

use crate::bench::decoder::bench_tokens;
use baton_method::handoff::reread::{decide, RereadSetting, SelectInputs};
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::mapper::CacheMapper;
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::model::{ForwardOptions, KvCache, Model, ModelError};
use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Spread {
    pub fn of(samples: &[f64]) -> Self {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self {
                median_ms: f64::NAN,
                min_ms: f64::NAN,
                max_ms: f64::NAN,
            };
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Self {
            median_ms: median,
            min_ms: v[0],
            max_ms: v[n - 1],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchPoint {
    pub tokens: usize,
    pub suffix: usize,
    pub source_prefill: Spread,
    pub reprefill_full: Spread,
    pub map_full: Spread,
    pub map_suffix: Spread,
    pub reprefill_suffix: Spread,
    /// Map of the suffix onto the target's cache, then its first token.
    pub switch_end_to_end: Spread,
    /// Median re-prefill over median map.
    pub speedup_full: f64,
    pub speedup_suffix: f64,
    /// With a re-read: the whole map, then choosing and re-reading with a message of
    /// [`REREAD_MESSAGE`] tokens known (the handoff a first message waits for), and that
    /// as a share of the full re-prefill's median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_with_reread: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reread_share_of_reprefill: Option<f64>,
}

/// The message a benched re-read is chosen for, in tokens.
pub const REREAD_MESSAGE: usize = 32;

/// Cost of one mapped token, to set the time against the floor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MapperCost {
    /// Multiply-adds ×2 per mapped token (all target layers, K and V, their trained heads,
    /// and the target's layer-0 projections when the maps read the token block).
    pub flops_per_token: f64,
    /// Mapper weights read per map call, in the precision the map runs in (not counting
    /// the target's own layer-0 projections, which its prefill reads too).
    pub weight_bytes: f64,
    /// Source features read and target K/V written per token (f32).
    pub activation_bytes_per_token: f64,
    pub precision: baton_method::mapper::MapPrecision,
    /// The reduced mapper's rank; `None` for the full one.
    pub rank: Option<usize>,
}

pub fn mapper_cost(m: &CacheMapper) -> MapperCost {
    let precision = m.precision();
    // Q8_0 stores 32 weights in 34 bytes.
    let per_weight = match precision {
        baton_method::mapper::MapPrecision::Int8 => 34.0 / 32.0,
        baton_method::mapper::MapPrecision::F32 => 4.0,
    };
    let mut macs = 0usize;
    let mut weights = 0f64;
    let mut rank = None;
    let mut reads = std::collections::BTreeSet::new();
    for t in m.keys().iter().chain(m.values()) {
        let (rows, cols) = t.weight.dims2().unwrap_or((0, 0));
        let n = match &t.factors {
            Some((_, right)) => {
                let r = right.dims2().map(|d| d.0).unwrap_or(0);
                rank = Some(r);
                rows * r + r * cols
            }
            None => rows * cols,
        };
        // An mlp head replaces the ridge product, which then does not run; a residual
        // head's products come on top of it.
        let head = t.head.as_ref();
        if head.is_none_or(|h| h.used == baton_method::mapper::nonlinear::HeadUse::Added) {
            macs += n;
            weights += per_weight * n as f64 + 4.0 * cols as f64;
        }
        for (w, b) in head.map_or(&[][..], |h| &h.layers[..]) {
            let (r, c) = w.dims2().unwrap_or((0, 0));
            macs += r * c;
            weights += per_weight * (r * c) as f64 + 4.0 * b.elem_count() as f64;
        }
        reads.extend(t.sources.iter().copied());
    }
    let src_width = m.source().n_kv_head * m.source().head_dim;
    let tgt_width = m.target().n_kv_head * m.target().head_dim;
    macs += m.layer_zero().map_or(0, |lz| lz.macs_per_token());
    MapperCost {
        flops_per_token: 2.0 * macs as f64,
        weight_bytes: weights,
        activation_bytes_per_token: 4.0
            * (2 * reads.len() * src_width + 2 * m.target().n_layer * tgt_width) as f64,
        precision,
        rank,
    }
}

/// Least-squares slope and intercept of `y` against `x` (ms per token, ms).
pub fn linear_fit(x: &[f64], y: &[f64]) -> (f64, f64) {
    let n = x.len().min(y.len()) as f64;
    if n < 2.0 {
        return (f64::NAN, f64::NAN);
    }
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { f64::NAN };
    (slope, my - slope * mx)
}

fn sync(m: &Model) {
    if let Err(e) = m.decoder.device().synchronize() {
        tracing::warn!("device synchronize: {e}");
    }
}

fn prefill(m: &Model, ids: &[u32], cache: &mut KvCache) -> Result<f64, ModelError> {
    let t = Instant::now();
    m.decoder
        .forward(ids, cache, &ForwardOptions::cache_only())?;
    sync(m);
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

#[derive(Debug, Clone, Copy)]
pub struct BenchOptions {
    pub repeats: usize,
    pub suffix: usize,
    /// Also time the handoff with this re-read (see [`BenchPoint::handoff_with_reread`]).
    pub reread: Option<RereadSetting>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            repeats: 3,
            suffix: 64,
            reread: None,
        }
    }
}

/// Time one direction at one context length.
pub fn bench_point(
    src: &Model,
    tgt: &Model,
    mapper: &CacheMapper,
    tokens: usize,
    opts: &BenchOptions,
) -> Result<BenchPoint, ModelError> {
    let suffix = opts.suffix;
    if suffix == 0 || suffix >= tokens {
        return Err(ModelError::Unsupported(format!(
            "a suffix of {suffix} tokens must be at least 1 and shorter than the {tokens}-token context"
        )));
    }
    let with_message = bench_tokens(
        tokens + REREAD_MESSAGE,
        tgt.config().vocab_size.min(src.config().vocab_size),
        7,
    );
    let ids = &with_message[..tokens];
    let head = tokens - suffix;
    let (mut s_pre, mut t_full, mut m_full, mut m_suf, mut t_suf, mut e2e) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut with_reread = Vec::new();
    // One warm-up pass of everything, then the repeats.
    for rep in 0..=opts.repeats {
        let mut src_cache = src.decoder.new_cache();
        let sp = prefill(src, ids, &mut src_cache)?;
        let mut tgt_cache = tgt.decoder.new_cache();
        let tf = prefill(tgt, ids, &mut tgt_cache)?;

        let inputs = HandoffInputs {
            source: src,
            source_cache: &src_cache,
            target: tgt,
            mapper,
            tokens: ids,
            exact: None,
        };
        let t = Instant::now();
        let (mut mapped, built) = HandoffPlan::new(tokens).build_new(&inputs)?;
        let mf = built.map_ms;
        if let Some(setting) = &opts.reread {
            let select = SelectInputs {
                source: src,
                source_cache: &src_cache,
                target: tgt,
                handed: &mapped,
                mapper,
                // The bench loads one direction's mapper: no round trip.
                reverse: None,
                tokens: &with_message,
                history: tokens,
            };
            let per = tf / tokens as f64;
            // The opening is the target's own at a switch (the anchor), never chosen.
            let choice = decide(
                setting,
                &select,
                &PositionSet::of([1.min(tokens)..tokens]),
                Some(per),
            )
            .map_err(|e| ModelError::Unsupported(e.to_string()))?;
            choice.apply(tgt, ids, &mut mapped)?;
            sync(tgt);
            if rep > 0 {
                with_reread.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        drop(mapped);

        // The target already holds the head (its own prefill); only the suffix moves.
        let mut head_cache = tgt_cache.try_clone()?;
        head_cache.truncate(head);
        let mut reprefilled = head_cache.try_clone()?;
        let ts = prefill(tgt, &ids[head..], &mut reprefilled)?;

        let t = Instant::now();
        let built = HandoffPlan::new(tokens)
            .holding(head)
            .build(&inputs, &mut head_cache)?;
        let ms_ = built.map_ms;
        // The switch as a user sees it: the mapped cache, then the target's first token
        // for one new id.
        let logits = tgt.decoder.next_logits(&ids[..1], &mut head_cache)?;
        let _ = logits.dims();
        sync(tgt);
        let e = t.elapsed().as_secs_f64() * 1e3;
        if rep > 0 {
            s_pre.push(sp);
            t_full.push(tf);
            m_full.push(mf);
            t_suf.push(ts);
            m_suf.push(ms_);
            e2e.push(e);
        }
    }
    let p = BenchPoint {
        tokens,
        suffix,
        source_prefill: Spread::of(&s_pre),
        reprefill_full: Spread::of(&t_full),
        map_full: Spread::of(&m_full),
        map_suffix: Spread::of(&m_suf),
        reprefill_suffix: Spread::of(&t_suf),
        switch_end_to_end: Spread::of(&e2e),
        speedup_full: 0.0,
        speedup_suffix: 0.0,
        handoff_with_reread: None,
        reread_share_of_reprefill: None,
    };
    let handoff_with_reread = (!with_reread.is_empty()).then(|| Spread::of(&with_reread));
    Ok(BenchPoint {
        speedup_full: p.reprefill_full.median_ms / p.map_full.median_ms,
        speedup_suffix: p.reprefill_suffix.median_ms / p.map_suffix.median_ms,
        reread_share_of_reprefill: handoff_with_reread
            .map(|h| h.median_ms / p.reprefill_full.median_ms),
        handoff_with_reread,
        ..p
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_median_and_the_range() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median_ms, 2.5);
        assert!(Spread::of(&[]).median_ms.is_nan());
    }

    #[test]
    fn a_line_is_fitted_exactly() {
        let x = [128.0, 256.0, 512.0, 1024.0];
        let y: Vec<f64> = x.iter().map(|v| 0.25 * v + 3.0).collect();
        let (slope, icpt) = linear_fit(&x, &y);
        assert!((slope - 0.25).abs() < 1e-12 && (icpt - 3.0).abs() < 1e-9);
        assert!(linear_fit(&[1.0], &[2.0]).0.is_nan());
    }
}
