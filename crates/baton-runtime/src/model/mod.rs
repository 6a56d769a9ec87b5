//! The model runtime: configs, weights, a decoder whose KV cache the caller owns.

pub mod attention;
pub mod complete;
pub mod compute;
pub mod config;
pub mod decoder;
pub mod error;
pub mod generate;
pub mod kept_residual;
pub mod kv_cache;
pub mod layer_zero;
pub mod load;
pub mod loaded;
pub mod position_set;
pub mod reread;
pub mod residual;
pub mod rope;
pub mod sampler;
pub mod weights;

pub use attention::AttentionPath;
pub use complete::{complete, prompt_ids};
pub use compute::{Compute, Placement};
pub use config::{Arch, ModelConfig, RopeLayout};
pub use decoder::{Decoder, ForwardOptions, ForwardOutput, Logits};
pub use error::{ModelError, Result};
pub use generate::{
    generate, generate_until, generate_watched, GenerateOptions, Generation, StopReason, Throughput,
};
pub use kv_cache::{KvCache, KvShape, LayerKv};
pub use layer_zero::LayerZero;
pub use load::{load_decoder, parse_activations, LoadedDecoder, ModelFormat};
pub use loaded::{DigestCheck, Model, ModelIdentity, ResolvedModel};
pub use sampler::{Sampler, Sampling};
pub use weights::LoadOptions;
