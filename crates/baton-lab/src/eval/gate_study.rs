//! The gate study: switches over varied text (each file of the calibration corpus's
//! held-out split, and the same prose wrapped in the chat template), each measured as a
//! switch is (attention-output cosine of the handed-over cache against the target's own,
//! next-token agreement on the text that follows) beside the estimates the gate can have
//! without a re-prefill ([`baton_method::gate`]). It reports how well each estimate follows the
//! measured values and fits the line the gate predicts the cosine with.

use super::text::{eval_text, TextEvalOptions};
use super::EvalError;
use baton_data::corpus::{self, Document, Split};
use baton_method::gate::estimate::{round_trip_range, RoundTrip};
use baton_method::gate::fit::{self, GateFit};
use baton_method::gate::{feature_distance, round_trip};
use baton_method::mapper::artifact::ModelRef;
use baton_method::mapper::CacheMapper;
use baton_runtime::model::{ForwardOptions, Logits, Model};
use baton_runtime::text::ChatMessage;
use serde::{Deserialize, Serialize};

/// Prefix lengths taken in turn: conversations of several sizes.
pub const PREFIXES: [usize; 3] = [128, 256, 512];
/// Tokens after the prefix the next-token agreement is measured on.
pub const CONTINUATION: usize = 32;

/// One number read off a measured switch.
type Reading = fn(&StudySwitch) -> Option<f64>;

/// One measured switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StudySwitch {
    /// Which text it came from (a corpus file, or `chat:` and one).
    pub text: String,
    pub tokens: usize,
    pub feature_distance: Option<f64>,
    pub round_trip: Option<f64>,
    /// Mean over target layers of the attention-output cosine at the prefix's probes.
    pub cosine: f64,
    /// Teacher-forced top-1 agreement of the mapped cache with the target's own on the
    /// continuation.
    pub agreement: f64,
}

/// How well one estimate follows the measured values, over every switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correlation {
    pub estimator: String,
    pub pearson_cosine: Option<f64>,
    pub spearman_cosine: Option<f64>,
    pub pearson_agreement: Option<f64>,
    pub spearman_agreement: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateStudy {
    pub direction: String,
    pub switches: Vec<StudySwitch>,
    pub correlations: Vec<Correlation>,
    /// The line from each estimate to the cosine (even switches fitted, odd ones
    /// checked).
    pub lines: Vec<GateFit>,
    /// The one of them with the smallest error on the checked half: the gate's.
    pub fit: Option<GateFit>,
}

/// Token windows of every kind the study covers, `count` in all, taken in turn: each
/// corpus file's held-out part, and prose as a chat user message.
pub fn study_windows(
    tgt: &Model,
    docs: &[Document],
    count: usize,
) -> Result<Vec<(String, Vec<u32>)>, EvalError> {
    let longest = PREFIXES[PREFIXES.len() - 1] + CONTINUATION;
    let per_kind = count.div_ceil(docs.len() + 1).max(1);
    let mut kinds: Vec<Vec<(String, Vec<u32>)>> = Vec::new();
    for d in docs {
        let one = std::slice::from_ref(d);
        let w = corpus::windows(one, &tgt.tokenizer, Split::Eval, longest, per_kind)?;
        kinds.push(w.into_iter().map(|w| (d.name.clone(), w)).collect());
    }
    if let (Some(template), Some(first)) = (tgt.template.as_ref(), docs.first()) {
        let one = std::slice::from_ref(first);
        let w = corpus::windows(one, &tgt.tokenizer, Split::Eval, longest, per_kind)?;
        let mut chat = Vec::new();
        for ids in w {
            let text = tgt.tokenizer.decode(&ids)?;
            let rendered = template
                .render_ids(&tgt.tokenizer, &[ChatMessage::user(text)], true)
                .map_err(|e| EvalError::Input(e.to_string()))?;
            if rendered.len() >= longest {
                chat.push((format!("chat:{}", first.name), rendered));
            }
        }
        kinds.push(chat);
    }
    let mut out = Vec::with_capacity(count);
    let mut iters: Vec<_> = kinds.into_iter().map(Vec::into_iter).collect();
    while out.len() < count {
        let before = out.len();
        for it in iters.iter_mut() {
            if out.len() < count {
                if let Some(w) = it.next() {
                    out.push(w);
                }
            }
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
}

/// Measure each window as a switch `src -> tgt` with `forward`, beside the estimates
/// (`reverse` maps back for the round trip). `anchor` as the engine hands over.
pub fn study(
    src: &Model,
    tgt: &Model,
    forward: &CacheMapper,
    reverse: &CacheMapper,
    windows: &[(String, Vec<u32>)],
    anchor: usize,
    on_switch: &mut dyn FnMut(usize, &StudySwitch),
) -> Result<GateStudy, EvalError> {
    let pair = StudyPair {
        src,
        tgt,
        forward,
        reverse,
        anchor,
    };
    let mut switches = Vec::with_capacity(windows.len());
    for (i, (text, w)) in windows.iter().enumerate() {
        let p = PREFIXES[i % PREFIXES.len()].min(w.len().saturating_sub(CONTINUATION));
        let s = pair.measure(text, w, p)?;
        on_switch(i, &s);
        switches.push(s);
    }
    let correlations = ESTIMATORS
        .iter()
        .map(|&(name, f)| correlation(&switches, name, f))
        .collect();
    // A line per estimate, fitted on the even switches and checked on the odd ones;
    // the gate keeps the one that predicts the checked half best.
    let lines: Vec<GateFit> = ESTIMATORS
        .iter()
        .filter_map(|&(name, f)| {
            let points = pairs(&switches, f, |s| s.cosine);
            fitted_line(src, tgt, name, &points)
        })
        .collect();
    let fit = lines
        .iter()
        .filter(|l| l.held_out_mae.is_finite())
        .min_by(|a, b| a.held_out_mae.total_cmp(&b.held_out_mae))
        .cloned();
    Ok(GateStudy {
        direction: format!("{} -> {}", src.identity.name, tgt.identity.name),
        switches,
        correlations,
        lines,
        fit,
    })
}

/// The estimates the study compares with the measured values, by name.
const ESTIMATORS: [(&str, Reading); 2] = [
    (fit::FEATURE_DISTANCE, |s| s.feature_distance),
    (fit::ROUND_TRIP, |s| s.round_trip),
];

/// The two models and their mappers each way, as the study's switches use them.
struct StudyPair<'a> {
    src: &'a Model,
    tgt: &'a Model,
    forward: &'a CacheMapper,
    reverse: &'a CacheMapper,
    anchor: usize,
}

impl StudyPair<'_> {
    /// One switch after the first `p` tokens of `w`: the estimates from the source's
    /// cache, then the cosine and agreement the switch measures.
    fn measure(&self, text: &str, w: &[u32], p: usize) -> Result<StudySwitch, EvalError> {
        let (src, tgt, anchor) = (self.src, self.tgt, self.anchor);
        let prefix = &w[..p];
        let mut cache = src.decoder.new_cache();
        src.decoder.forward(
            prefix,
            &mut cache,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )?;
        let rope = src.decoder.rope();
        let distance = feature_distance(self.forward, &cache, rope, anchor.min(p), p)
            .map_err(|e| EvalError::Input(e.to_string()))?;
        let (rs, re) = round_trip_range(anchor.min(p), p);
        let inputs = RoundTrip {
            forward: self.forward,
            reverse: self.reverse,
            src: &cache,
            tokens: prefix,
            src_rope: rope,
            tgt_rope: tgt.decoder.rope(),
        };
        let trip = round_trip(inputs, rs, re).map_err(|e| EvalError::Input(e.to_string()))?;
        let opts = TextEvalOptions {
            prefix: p,
            continuation: CONTINUATION,
            probes: 32,
            anchor,
            tail: 0,
            reread: None,
        };
        let r = eval_text(
            src,
            tgt,
            self.forward,
            &[w[..p + CONTINUATION].to_vec()],
            &opts,
        )?;
        Ok(StudySwitch {
            text: text.to_string(),
            tokens: p,
            feature_distance: distance,
            round_trip: trip,
            cosine: baton_method::metrics::mean(&r.cosine_prefix),
            agreement: r.scores.agreement.top1,
        })
    }
}

/// (estimate, measured value) of every switch that has the estimate, both finite.
fn pairs(
    switches: &[StudySwitch],
    estimate: Reading,
    measured: fn(&StudySwitch) -> f64,
) -> Vec<(f64, f64)> {
    switches
        .iter()
        .filter_map(|s| estimate(s).map(|x| (x, measured(s))))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

/// How well the estimate `f` follows the cosine and the agreement.
fn correlation(switches: &[StudySwitch], name: &str, f: Reading) -> Correlation {
    let c = pairs(switches, f, |s| s.cosine);
    let a = pairs(switches, f, |s| s.agreement);
    Correlation {
        estimator: name.to_string(),
        pearson_cosine: fit::pearson(&c),
        spearman_cosine: fit::spearman(&c),
        pearson_agreement: fit::pearson(&a),
        spearman_agreement: fit::spearman(&a),
    }
}

/// The least-squares line from an estimate to the cosine over the even points, with its
/// correlation and mean absolute error on the odd ones.
fn fitted_line(
    src: &Model,
    tgt: &Model,
    estimator: &str,
    points: &[(f64, f64)],
) -> Option<GateFit> {
    let fit_half: Vec<(f64, f64)> = points.iter().step_by(2).copied().collect();
    let check_half: Vec<(f64, f64)> = points.iter().skip(1).step_by(2).copied().collect();
    let (a, b) = fit::line(&fit_half)?;
    let mae = check_half
        .iter()
        .map(|(x, y)| ((a + b * x).clamp(-1.0, 1.0) - y).abs())
        .sum::<f64>()
        / check_half.len().max(1) as f64;
    Some(GateFit {
        format: fit::FORMAT.into(),
        version: fit::VERSION,
        source: ModelRef::new(&src.identity, src.config()),
        target: ModelRef::new(&tgt.identity, tgt.config()),
        estimator: estimator.into(),
        intercept: a,
        slope: b,
        fitted_on: fit_half.len(),
        checked_on: check_half.len(),
        held_out_r: fit::pearson(&check_half).unwrap_or(f64::NAN),
        held_out_mae: if check_half.is_empty() { f64::NAN } else { mae },
        mapper: None,
        reverse_mapper: None,
    })
}
