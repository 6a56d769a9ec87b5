//! Trained mappers, for the pairs where the closed-form map falls short: a small network
//! per target layer ([`head::Head`]) on the same input the ridge map reads (the selected
//! source layers' RoPE-stripped features side by side).
//!
//! - `residual`: a bottleneck network (one hidden layer, GELU) whose output is added to
//!   the ridge map's: the ridge map stays and the network corrects what it misses.
//! - `mlp`: the published nonlinear mapper, two hidden layers of 1024 ReLU units, whose
//!   output is the map. The ridge map it was trained beside stays in the artifact (it
//!   chose the source layers and scores the network's gain) but is not applied.
//!
//! Both are trained by calibration (`calibrate::train`) on the error of the target's
//! attention output under its own queries, and stored beside the ridge maps in the
//! artifact ([`stored`]).

pub mod head;
pub mod stored;

pub use head::{Activation, Dense, Head, HeadTensors, HeadUse};
use serde::{Deserialize, Serialize};

/// Which mapper an artifact holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapperKind {
    /// The closed-form ridge map alone.
    #[default]
    Ridge,
    /// Ridge plus a trained bottleneck correction.
    Residual,
    /// A trained network in place of the ridge map.
    Mlp,
}

impl MapperKind {
    pub fn name(self) -> &'static str {
        match self {
            MapperKind::Ridge => "ridge",
            MapperKind::Residual => "residual",
            MapperKind::Mlp => "mlp",
        }
    }

    /// The network shape this kind trains by default: hidden widths, activation, use.
    pub fn architecture(self) -> Option<(Vec<usize>, Activation, HeadUse)> {
        match self {
            MapperKind::Ridge => None,
            MapperKind::Residual => Some((vec![256], Activation::Gelu, HeadUse::Added)),
            MapperKind::Mlp => Some((vec![1024, 1024], Activation::Relu, HeadUse::Alone)),
        }
    }
}

impl std::fmt::Display for MapperKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MapperKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ridge" => Ok(MapperKind::Ridge),
            "residual" => Ok(MapperKind::Residual),
            "mlp" => Ok(MapperKind::Mlp),
            other => Err(format!(
                "unknown mapper kind {other:?}: give ridge, residual or mlp"
            )),
        }
    }
}

/// The trained heads of a mapper, one per target layer for keys and for values.
#[derive(Debug, Clone, PartialEq)]
pub struct Heads {
    pub kind: MapperKind,
    pub keys: Vec<Head>,
    pub values: Vec<Head>,
}

/// What a head's training minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainLoss {
    /// The error of the target's attention output under its own queries at probe
    /// positions, relative to the output's size: what predicts a handoff's quality.
    #[default]
    Attention,
    /// The mean squared error of the mapped keys and values, each in the target's
    /// standardized units.
    KvMse,
}

impl std::str::FromStr for TrainLoss {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "attention" => Ok(TrainLoss::Attention),
            "kv-mse" => Ok(TrainLoss::KvMse),
            other => Err(format!("unknown loss {other:?}: give attention or kv-mse")),
        }
    }
}

impl std::fmt::Display for TrainLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TrainLoss::Attention => "attention",
            TrainLoss::KvMse => "kv-mse",
        })
    }
}

/// How a mapper's heads were trained and what they scored on held-out windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingReport {
    pub loss: TrainLoss,
    pub hidden: Vec<usize>,
    pub activation: Activation,
    pub seed: u64,
    pub learning_rate: f64,
    /// Training windows read per epoch, and their length.
    pub windows: usize,
    pub seq_len: usize,
    pub epochs: usize,
    /// Per target layer, the epoch whose weights were kept (0: none beat the start).
    pub best_epoch: Vec<usize>,
    /// Per target layer, the held-out loss of the ridge map and of the trained map.
    pub heldout_ridge: Vec<f64>,
    pub heldout_trained: Vec<f64>,
    /// The ridge map's held-out attention cosine and next-token agreement, for the
    /// trained map's (in the calibration report) to be read against.
    pub ridge_cosine: f64,
    pub ridge_top1: f64,
    pub seconds: f64,
    /// Every width trained, with the held-out loss its kept weights gave: the chosen
    /// one is the lowest. (Absent in artifacts of one width saved before the choice.)
    #[serde(default)]
    pub candidates: Vec<CandidateScore>,
}

/// One hidden width tried in training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateScore {
    pub hidden: Vec<usize>,
    /// The mean over the target layers of each layer's best held-out loss.
    pub heldout: f64,
    /// Epochs it trained before it stopped.
    pub epochs: usize,
}

impl TrainingReport {
    /// One line: the shape, and the held-out loss against the ridge map's.
    pub fn summary(&self) -> String {
        use crate::metrics::mean;
        format!(
            "trained {:?} {:?} on {} loss, {} epochs of {} windows in {:.0} s: held-out loss {:.4} (ridge {:.4}), ridge cosine {:.4}",
            self.hidden,
            self.activation,
            self.loss,
            self.epochs,
            self.windows,
            self.seconds,
            mean(&self.heldout_trained),
            mean(&self.heldout_ridge),
            self.ridge_cosine
        ) + &self.choice()
    }

    /// The widths tried, where more than one was.
    fn choice(&self) -> String {
        if self.candidates.len() < 2 {
            return String::new();
        }
        let tried: Vec<String> = self
            .candidates
            .iter()
            .map(|c| format!("{:?} {:.4}", c.hidden, c.heldout))
            .collect();
        format!(" (widths tried: {})", tried.join(", "))
    }
}
