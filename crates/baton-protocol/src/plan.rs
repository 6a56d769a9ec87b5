//! The plan at the next message as one typed value: how much of a handed-over history
//! the target re-reads, chosen by what, grown into what, and what becomes of the rest.
//! Its text form (`[up:][KIND:]BUDGET[:SELECTOR[:SPANS]][:LAYERS]`) is what `--plan`,
//! scripts and session files hold; [`RereadSetting`] reads it (`FromStr`) and writes it
//! back (`Display`), and every front end steps it by value.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A budget as the plan's text writes it: `20%` or `150ms`.
impl fmt::Display for RereadBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RereadBudget::Share(s) => write!(f, "{}%", (s * 1000.0).round() / 10.0),
            RereadBudget::Millis(ms) => write!(f, "{ms}ms"),
        }
    }
}

/// A plan's text that does not read, with what would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

/// Which layers the target computes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerSplit {
    /// Its layers from this one on, over a mapped residual stream.
    Upper(usize),
    /// Its layers below this one, over its own; the map gives the rest.
    Lower(usize),
}

impl LayerSplit {
    /// `upper=M` or `lower=M`; `None` for any other key.
    pub fn parse(key: &str, value: &str) -> Option<Result<Self, String>> {
        let m = || {
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("{key}={value:?} is not a layer number"))
        };
        match key.trim() {
            "upper" => Some(m().map(LayerSplit::Upper)),
            "lower" => Some(m().map(LayerSplit::Lower)),
            _ => None,
        }
    }

    /// `upper=M` or `lower=M` as one word; `None` for any other word.
    pub fn parse_word(word: &str) -> Option<Result<Self, String>> {
        let (key, value) = word.split_once('=')?;
        Self::parse(key, value)
    }

    pub fn label(self) -> String {
        match self {
            LayerSplit::Upper(m) => format!("upper layers from {m}"),
            LayerSplit::Lower(m) => format!("lower layers to {m}"),
        }
    }

    /// The layer the split is made at.
    pub fn layer(self) -> usize {
        let (LayerSplit::Upper(m) | LayerSplit::Lower(m)) = self;
        m
    }

    /// Check the layer against the target's `n_layer`.
    pub fn check(self, n_layer: usize) -> Result<(), String> {
        let m = self.layer();
        if m == 0 || m >= n_layer {
            return Err(format!(
                "{}: the target has layers 0 to {}; give a layer from 1 to {}",
                self.label(),
                n_layer.saturating_sub(1),
                n_layer.saturating_sub(1)
            ));
        }
        Ok(())
    }

    /// The share of a prefill of its positions the target computes: (L − m)/L for upper
    /// layers, m/L for lower ones.
    pub fn share_of_prefill(self, n_layer: usize) -> f64 {
        let l = n_layer.max(1) as f64;
        match self {
            LayerSplit::Upper(m) => (l - m as f64).max(0.0) / l,
            LayerSplit::Lower(m) => (m as f64).min(l) / l,
        }
    }
}

impl fmt::Display for LayerSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerSplit::Upper(m) => write!(f, "upper={m}"),
            LayerSplit::Lower(m) => write!(f, "lower={m}"),
        }
    }
}

/// How much to re-read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RereadBudget {
    /// A share of the history's positions, 0 to 1, the opening included.
    Share(f64),
    /// As many positions as the target reads in this many milliseconds, at the speed its
    /// last re-prefill was measured at.
    Millis(f64),
}

/// What ranks the positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selector {
    SourceAttention,
    TargetAttention,
    RoundTrip,
    Deviation,
    Recency,
    /// `source-attention` when the source is the smaller model, `target-attention`
    /// otherwise: the message is read by whichever model reads it more cheaply, so that
    /// choosing never costs a read by the larger model.
    CheaperAttention,
    /// The cheaper model's read, each position scored by what some heads give it beyond
    /// their layer's average: what any message reads (sinks, the template) cancels.
    Contrast,
    /// The message's own words found in the history, spread to the positions around
    /// them ; no model call.
    MessageWords,
    /// The history's sentences ranked by the message's words they hold (each word
    /// weighed by how few sentences say it), the best sentence first ; no
    /// model call.
    MessageSentences,
    /// Numbers and names: the tokens that carry facts; no model call.
    Rare,
    /// `contrast`, `message-words` and `rare` together, each rescaled to at most 1.
    Facts,
    /// The sentence that says most of what the message asks about (by
    /// `message-sentences`' weighing) first, then `facts`.
    SentenceFacts,
}

impl Selector {
    pub const ALL: [Selector; 12] = [
        Selector::SourceAttention,
        Selector::TargetAttention,
        Selector::RoundTrip,
        Selector::Deviation,
        Selector::Recency,
        Selector::CheaperAttention,
        Selector::Contrast,
        Selector::MessageWords,
        Selector::MessageSentences,
        Selector::Rare,
        Selector::Facts,
        Selector::SentenceFacts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Selector::SourceAttention => "source-attention",
            Selector::TargetAttention => "target-attention",
            Selector::RoundTrip => "round-trip",
            Selector::Deviation => "deviation",
            Selector::Recency => "recency",
            Selector::CheaperAttention => "cheaper-attention",
            Selector::Contrast => "contrast",
            Selector::MessageWords => "message-words",
            Selector::MessageSentences => "message-sentences",
            Selector::Rare => "rare",
            Selector::Facts => "facts",
            Selector::SentenceFacts => "sentence-facts",
        }
    }

    pub fn parse(s: &str) -> Result<Self, PlanError> {
        Self::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                PlanError(format!(
                    "unknown re-read selector {s:?}: use one of {}",
                    Self::ALL.map(Selector::name).join(", ")
                ))
            })
    }
}

/// What a chosen position grows into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanGrowth {
    /// The position alone.
    Token,
    /// The word it is part of.
    Word,
    /// The sentence (or line) it is part of.
    Sentence,
}

impl SpanGrowth {
    pub const ALL: [SpanGrowth; 3] = [SpanGrowth::Token, SpanGrowth::Word, SpanGrowth::Sentence];

    pub fn name(self) -> &'static str {
        match self {
            SpanGrowth::Token => "token",
            SpanGrowth::Word => "word",
            SpanGrowth::Sentence => "sentence",
        }
    }
}

/// What a plan does with the mapped positions of the history: the chosen ones (the
/// budget's best) and the rest. Whatever it is, the opening is always kept and the
/// positions the target already held as its own stay as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanKind {
    /// Re-read the chosen positions, keep the rest mapped: the re-read over the map.
    #[default]
    Map,
    /// Re-read the chosen positions, drop the rest: attention never sees them.
    Drop,
    /// Keep the chosen positions as mapped and drop the rest, re-reading nothing: the
    /// cheapest repair there is (eviction, as same-model caches do it).
    Attend,
    /// Re-read the chosen positions, keep mapped the rest the map's predicted error per
    /// position (its round trip) trusts, drop the others.
    Trusted,
    /// `drop` where the message asks about what the history says (the best sentence
    /// re-read whole), `map` otherwise.
    Focus,
}

impl PlanKind {
    pub const ALL: [PlanKind; 5] = [
        PlanKind::Map,
        PlanKind::Drop,
        PlanKind::Attend,
        PlanKind::Trusted,
        PlanKind::Focus,
    ];

    /// The kinds the product offers (the workbench's Ctrl-T steps through them in this
    /// order); the others are experiments, kept for studies and evaluation.
    pub const PRODUCT: [PlanKind; 3] = [PlanKind::Map, PlanKind::Drop, PlanKind::Focus];

    pub fn name(self) -> &'static str {
        match self {
            PlanKind::Map => "map",
            PlanKind::Drop => "drop",
            PlanKind::Attend => "attend",
            PlanKind::Trusted => "trusted",
            PlanKind::Focus => "focus",
        }
    }

    /// Whether the chosen positions are re-read (otherwise they stay as mapped).
    pub fn rereads(self) -> bool {
        self != PlanKind::Attend
    }
}

/// A handoff plan over the positions of the history, once the next message is known:
/// how much is chosen, by what, grown into what, and what becomes of the chosen
/// positions and of the rest ([`PlanKind`]). The re-read over the map is the plan of
/// kind `map`, and its text form (`20%:source-attention:word`) is the one older
/// settings and session files use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RereadSetting {
    pub budget: RereadBudget,
    pub selector: Selector,
    pub spans: SpanGrowth,
    #[serde(default)]
    pub kind: PlanKind,
    /// Only on a switch up, to the model with more weights per token: a switch down
    /// hands the map over as it is (text form: an `up:` before the rest).
    #[serde(default)]
    pub up_only: bool,
    /// The layers the target computes itself over the mapped positions, before the
    /// chosen ones are re-read (text form: `:upper=M` or `:lower=M` at the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<LayerSplit>,
}

impl RereadSetting {
    /// The default plan (docs/plan.md says why): on a switch up, re-read 40% of the
    /// history, chosen by what the message asks about, over the map.
    pub const DEFAULT: RereadSetting = RereadSetting {
        budget: RereadBudget::Share(0.4),
        selector: Selector::Facts,
        spans: SpanGrowth::Word,
        kind: PlanKind::Map,
        up_only: true,
        layers: None,
    };
    /// What a plan that names no selector or span growth takes: the default plan's.
    pub const DEFAULT_SELECTOR: Selector = Self::DEFAULT.selector;
    pub const DEFAULT_SPANS: SpanGrowth = Self::DEFAULT.spans;

    pub fn share(share: f64) -> Self {
        Self {
            budget: RereadBudget::Share(share),
            selector: Self::DEFAULT_SELECTOR,
            spans: Self::DEFAULT_SPANS,
            kind: PlanKind::Map,
            up_only: false,
            layers: None,
        }
    }

    /// Whether the plan runs on a switch from a model with `source_weights` weights per
    /// token to one with `target_weights`.
    pub fn applies_between(&self, source_weights: usize, target_weights: usize) -> bool {
        !self.up_only || target_weights > source_weights
    }

    /// The same setting with the target computing `layers` itself.
    pub fn with_layers(self, layers: Option<LayerSplit>) -> Self {
        Self { layers, ..self }
    }

    /// The same setting as a plan of another kind.
    pub fn of_kind(self, kind: PlanKind) -> Self {
        Self { kind, ..self }
    }

    /// Parse `[up:][KIND:]BUDGET[:SELECTOR[:SPANS]][:LAYERS]`: `up:` runs the plan only on
    /// a switch to the larger model; then a budget of `0.2`, `20%` or `150ms`,
    /// optionally after a plan kind (`map`, the default; `drop`, `attend`, `trusted`, `focus`; or
    /// `tail`, which is `drop` by recency, token by token) and followed by `:SELECTOR` and
    /// `:SPANS` (`drop:0.2:source-attention:word`). `0` or `off` alone is no plan
    /// (`None`); a kind with a budget of 0 keeps only the opening of what was mapped.
    /// `LAYERS` is `upper=M` (the target computes its layers from `M` on over the mapped
    /// residual stream) or `lower=M` (its layers below `M`); with it a budget of 0, or
    /// none (`upper=14`), is a plan of layers alone.
    pub fn parse(s: &str) -> Result<Option<Self>, PlanError> {
        let (up_only, rest) = match s.trim().strip_prefix("up:") {
            Some(rest) => (true, rest),
            None => (false, s.trim()),
        };
        let mut layers = None;
        let mut words = Vec::new();
        for word in rest.split(':') {
            match LayerSplit::parse_word(word) {
                Some(split) if layers.is_none() => {
                    layers = Some(split.map_err(PlanError)?);
                }
                Some(_) => {
                    return Err(PlanError(format!(
                        "plan {s:?} names its layers twice: give one upper=M or lower=M"
                    )))
                }
                None => words.push(word),
            }
        }
        let plan = if words.is_empty() {
            Some(Self::share(0.0))
        } else {
            let plan = Self::parse_plan(&words.join(":"))?;
            match (plan, layers) {
                // Layers alone: nothing re-read on top of them.
                (None, Some(_)) => Some(Self::share(0.0)),
                (plan, _) => plan,
            }
        };
        Ok(plan.map(|p| Self {
            up_only,
            layers,
            ..p
        }))
    }

    fn parse_plan(s: &str) -> Result<Option<Self>, PlanError> {
        let mut parts = s.trim().split(':').peekable();
        let first = parts.peek().map(|p| p.trim()).unwrap_or("");
        let (kind, tail) = match first {
            "tail" => (Some(PlanKind::Drop), true),
            _ => (PlanKind::ALL.into_iter().find(|k| k.name() == first), false),
        };
        if kind.is_some() {
            parts.next();
        }
        let budget = parts.next().unwrap_or("").trim();
        if kind.is_none() && (budget == "off" || budget == "none") {
            return Ok(None);
        }
        let bad = || {
            PlanError(format!(
                "re-read budget {budget:?}: give a share of the history (0.2 or 20%) or a time \
                 (150ms), optionally after a plan (map, drop, focus, attend, trusted or tail) and with \
                 :SELECTOR and :SPANS (drop:0.2:source-attention:word), or 0 for none"
            ))
        };
        // A plan of kind `map` with nothing chosen is the map as handed over: no plan.
        let none_if_map = |b: RereadBudget| match kind {
            None | Some(PlanKind::Map) => None,
            Some(_) => Some(b),
        };
        let budget = if let Some(ms) = budget.strip_suffix("ms") {
            let ms: f64 = ms.trim().parse().map_err(|_| bad())?;
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(bad());
            }
            if ms == 0.0 {
                match none_if_map(RereadBudget::Millis(0.0)) {
                    Some(b) => b,
                    None => return Ok(None),
                }
            } else {
                RereadBudget::Millis(ms)
            }
        } else {
            let (num, scale) = match budget.strip_suffix('%') {
                Some(p) => (p, 100.0),
                None => (budget, 1.0),
            };
            let share: f64 = num.trim().parse::<f64>().map_err(|_| bad())? / scale;
            if !(0.0..=1.0).contains(&share) {
                return Err(bad());
            }
            if share == 0.0 {
                match none_if_map(RereadBudget::Share(0.0)) {
                    Some(b) => b,
                    None => return Ok(None),
                }
            } else {
                RereadBudget::Share(share)
            }
        };
        let selector = match parts.next() {
            Some(s) => Selector::parse(s.trim())?,
            None if tail => Selector::Recency,
            None => Self::DEFAULT_SELECTOR,
        };
        let spans = match parts.next() {
            Some(s) => SpanGrowth::ALL
                .into_iter()
                .find(|g| g.name() == s.trim())
                .ok_or_else(|| {
                    PlanError(format!(
                        "unknown span growth {s:?}: use token, word or sentence"
                    ))
                })?,
            None if tail => SpanGrowth::Token,
            None => Self::DEFAULT_SPANS,
        };
        if let Some(extra) = parts.next() {
            return Err(PlanError(format!(
                "re-read setting {s:?} has an extra part {extra:?}: \
                 [KIND:]BUDGET[:SELECTOR[:SPANS]][:upper=M]"
            )));
        }
        Ok(Some(Self {
            budget,
            selector,
            spans,
            kind: kind.unwrap_or_default(),
            up_only: false,
            layers: None,
        }))
    }

    /// Positions the budget allows in a history of `len`, given the target's measured
    /// speed (milliseconds per position read) for a time budget.
    pub fn positions(&self, len: usize, ms_per_position: Option<f64>) -> Result<usize, PlanError> {
        let n = match self.budget {
            RereadBudget::Share(s) => (s * len as f64).round() as usize,
            RereadBudget::Millis(ms) => match ms_per_position {
                Some(per) if per > 0.0 && per.is_finite() => (ms / per).floor() as usize,
                _ => {
                    return Err(PlanError(
                        "a re-read budget in milliseconds needs the target's measured speed, \
                         and none is known yet: give a share (0.2) instead"
                            .into(),
                    ))
                }
            },
        };
        Ok(n.min(len))
    }
}

impl fmt::Display for RereadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.up_only {
            write!(f, "up:")?;
        }
        // The re-read over the map keeps the form older session files hold.
        if self.kind != PlanKind::Map {
            write!(f, "{}:", self.kind.name())?;
        }
        write!(f, "{}", self.budget)?;
        write!(f, ":{}:{}", self.selector.name(), self.spans.name())?;
        if let Some(layers) = self.layers {
            write!(f, ":{layers}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for RereadSetting {
    type Err = PlanError;

    /// A plan that does something; `0` and `off` (no plan) are an error here, as a value
    /// that is no plan is `Option::None` (see [`RereadSetting::parse`]).
    fn from_str(s: &str) -> Result<Self, PlanError> {
        Self::parse(s)?.ok_or_else(|| {
            PlanError(format!(
                "{s:?} is no plan (the map alone): give a budget such as 40%"
            ))
        })
    }
}

/// A plan held as its text form in a serialized command, `None` as no plan.
pub mod as_text {
    use super::RereadSetting;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(plan: &Option<RereadSetting>, s: S) -> Result<S::Ok, S::Error> {
        match plan {
            Some(p) => s.serialize_some(&p.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RereadSetting>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => RereadSetting::parse(&text).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn settings_parse_and_print_back() {
        let s = RereadSetting::parse("0.2").unwrap().unwrap();
        assert_eq!(s, RereadSetting::share(0.2));
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        let s = RereadSetting::parse("5%:round-trip:sentence")
            .unwrap()
            .unwrap();
        assert_eq!(s.budget, RereadBudget::Share(0.05));
        assert_eq!(
            (s.selector, s.spans),
            (Selector::RoundTrip, SpanGrowth::Sentence)
        );
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        let s = RereadSetting::parse("150ms:deviation").unwrap().unwrap();
        assert_eq!(s.budget, RereadBudget::Millis(150.0));
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        for none in ["0", "off", "0ms", "0%"] {
            assert_eq!(RereadSetting::parse(none).unwrap(), None, "{none}");
        }
        for bad in [
            "1.5",
            "-0.1",
            "abc",
            "0.2:psychic",
            "0.2:recency:page",
            "0.2:recency:word:x",
            "NaNms",
        ] {
            let e = RereadSetting::parse(bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn plans_parse_and_print_back_and_the_map_kind_keeps_the_old_form() {
        let s = RereadSetting::parse("drop:20%").unwrap().unwrap();
        assert_eq!(s, RereadSetting::share(0.2).of_kind(PlanKind::Drop));
        assert_eq!(s.to_string(), "drop:20%:facts:word");
        let s = RereadSetting::parse("tail:0.3").unwrap().unwrap();
        assert_eq!(
            (s.kind, s.selector, s.spans),
            (PlanKind::Drop, Selector::Recency, SpanGrowth::Token)
        );
        for text in [
            "attend:10%:cheaper-attention:token",
            "trusted:40%:source-attention:sentence",
            "drop:0%:recency:token",
            "drop:150ms:recency:word",
        ] {
            let s = RereadSetting::parse(text).unwrap().unwrap();
            assert_eq!(s.to_string(), text);
            assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        }
        // A map plan written out is today's re-read, in its old form.
        let s = RereadSetting::parse("map:20%").unwrap().unwrap();
        assert_eq!(s.to_string(), "20%:facts:word");
        // Nothing chosen: no plan for the map, the opening alone for a drop.
        assert_eq!(RereadSetting::parse("map:0").unwrap(), None);
        let s = RereadSetting::parse("drop:0").unwrap().unwrap();
        assert_eq!(s.positions(100, None).unwrap(), 0);
        for bad in [
            "drop",
            "drop:off",
            "attend:x",
            "evict:20%",
            "drop:20%:recency:word:x",
        ] {
            assert!(RereadSetting::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_plan_names_its_layers_and_prints_them_back() {
        let s = RereadSetting::parse("up:40%:facts:word:upper=14")
            .unwrap()
            .unwrap();
        assert_eq!(s.layers, Some(LayerSplit::Upper(14)));
        assert!(s.up_only);
        assert_eq!(s.selector, Selector::Facts);
        assert_eq!(s.to_string(), "up:40%:facts:word:upper=14");
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        // Layers alone, or over a budget of nothing, are a plan of layers alone.
        for text in ["upper=14", "0:upper=14", "off:upper=14"] {
            let s = RereadSetting::parse(text).unwrap().unwrap();
            assert_eq!(s.budget, RereadBudget::Share(0.0), "{text}");
            assert_eq!(s.layers, Some(LayerSplit::Upper(14)), "{text}");
            assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        }
        let s = RereadSetting::parse("drop:20%:lower=7").unwrap().unwrap();
        assert_eq!(
            (s.kind, s.layers),
            (PlanKind::Drop, Some(LayerSplit::Lower(7)))
        );
        // A setting without layers reads as before and prints as before.
        let s = RereadSetting::parse("up:40%:facts:word").unwrap().unwrap();
        assert_eq!(
            (s.layers, s.to_string().as_str()),
            (None, "up:40%:facts:word")
        );
        for bad in [
            "upper=x",
            "20%:upper=3:lower=4",
            "20%:upper=",
            "middle=3:20%",
        ] {
            assert!(RereadSetting::parse(bad).is_err(), "{bad}");
        }
        // Older session files, without the field, read as no layers.
        let old: RereadSetting =
            serde_json::from_str(r#"{"budget":{"share":0.2},"selector":"facts","spans":"word"}"#)
                .unwrap();
        assert_eq!(old.layers, None);
    }

    #[test]
    fn every_kind_reads_back_from_its_name_and_the_products_are_among_them() {
        for k in PlanKind::ALL {
            let plan = RereadSetting::from_str(&format!("{}:20%", k.name())).unwrap();
            assert_eq!(plan.kind, k);
        }
        assert!(PlanKind::PRODUCT.iter().all(|k| PlanKind::ALL.contains(k)));
        assert_eq!(
            PlanKind::PRODUCT[0],
            PlanKind::Map,
            "Ctrl-T starts from the map"
        );
    }

    #[test]
    fn a_command_carries_the_plan_as_its_text() {
        let c = crate::Command::SetReread {
            setting: Some(RereadSetting::DEFAULT),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#""setting":"up:40%:facts:word""#), "{json}");
        assert_eq!(serde_json::from_str::<crate::Command>(&json).unwrap(), c);
        let off = crate::Command::SetReread { setting: None };
        let json = serde_json::to_string(&off).unwrap();
        assert_eq!(serde_json::from_str::<crate::Command>(&json).unwrap(), off);
    }

    #[test]
    fn a_plan_without_a_selector_takes_the_default_plans() {
        let s = RereadSetting::from_str("40%").unwrap();
        assert_eq!(
            (s.selector, s.spans),
            (
                RereadSetting::DEFAULT.selector,
                RereadSetting::DEFAULT.spans
            )
        );
        assert_eq!(
            RereadSetting::from_str(&RereadSetting::DEFAULT.to_string()),
            Ok(RereadSetting::DEFAULT)
        );
        assert_eq!(RereadSetting::DEFAULT.to_string(), "up:40%:facts:word");
        assert!(
            RereadSetting::from_str("off").is_err(),
            "no plan is not a plan"
        );
    }

    #[test]
    fn a_budget_becomes_positions_and_a_time_needs_a_speed() {
        let s = RereadSetting::share(0.25);
        assert_eq!(s.positions(400, None).unwrap(), 100);
        let t = RereadSetting::parse("100ms").unwrap().unwrap();
        assert_eq!(t.positions(400, Some(2.0)).unwrap(), 50);
        assert_eq!(
            t.positions(30, Some(2.0)).unwrap(),
            30,
            "never past the history"
        );
        let e = t.positions(400, None).unwrap_err().to_string();
        assert!(e.contains("give a share"), "{e}");
    }
}
