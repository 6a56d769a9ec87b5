//! What a calibration measured, saved in the artifact next to the maps so that a mapper
//! can be judged (and its k and λ understood) without calibrating again. The types live
//! with the artifact that stores them; calibration fills them in.

use crate::metrics::NextTokenAgreement;
use serde::{Deserialize, Serialize};

/// One swept (k, λ), fitted on the calibration windows and scored on the held-out ones.
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

/// A candidate k that was not swept.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SkippedK {
    pub k: usize,
    pub reason: String,
}

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
    /// The same for the target continuing with no context at all: a map whose KL is not
    /// below this hands over a context worth less than none.
    #[serde(default)]
    pub agreement_no_context: Option<NextTokenAgreement>,
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
    /// With token features: the target layers whose key maps, and whose value maps, read
    /// the token block (chosen per layer by held-out attention cosine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_block: Option<BlockLayers>,
    /// Gains folded into the key and value maps after the fit (1: as fitted); the
    /// held-out numbers above are those of the maps with them.
    #[serde(default = "crate::mapper::gain::unit")]
    pub key_gain: f32,
    #[serde(default = "crate::mapper::gain::unit")]
    pub value_gain: f32,
    /// The power of the attention weights on the fit positions (0: unweighted).
    #[serde(default)]
    pub attention_weight: f32,
    /// Per target layer and head, the gains `--key-gain matched` chose (empty for a
    /// fixed gain, which `key_gain` gives).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched_key_gains: Vec<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched_value_gains: Vec<Vec<f32>>,
}

impl CalibrationReport {
    /// When the map continues its own held-out windows further from the target than no
    /// context does (KL of the mapped continuation, KL with no context): a mapper that
    /// hands over a context worth less than none. `None` when it does better, or when
    /// the report predates the measure.
    pub fn worse_than_no_context(&self) -> Option<(f64, f64)> {
        let (mapped, none) = (self.agreement?, self.agreement_no_context?);
        (mapped.kl >= none.kl).then_some((mapped.kl, none.kl))
    }
}

/// Which target layers' maps read the token block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockLayers {
    pub keys: Vec<usize>,
    pub values: Vec<usize>,
    /// Held-out attention cosine (mean over layers) with the block in every map, and
    /// without it in any, at the chosen k and λ.
    pub cosine_everywhere: f64,
    pub cosine_nowhere: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_saved_before_agreement_was_measured_still_reads() {
        let json = r#"{"k":2,"lambda":0.01,"cosine":0.7,"r2_k":0.4,"r2_v":0.3}"#;
        let p: SweepPoint = serde_json::from_str(json).unwrap();
        assert_eq!((p.k, p.agreement), (2, None));
    }
}
