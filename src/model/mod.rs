//! The model runtime: configs, weights, a decoder whose KV cache the caller owns.

pub mod attention;
pub mod config;
pub mod decoder;
pub mod error;
pub mod kv_cache;
pub mod load;
pub mod rope;
pub mod weights;

pub use config::{Arch, ModelConfig, RopeLayout};
pub use decoder::{Decoder, ForwardOptions, ForwardOutput, Logits};
pub use error::{ModelError, Result};
pub use kv_cache::{KvCache, KvShape, LayerKv};
pub use load::{load_decoder, LoadedDecoder, ModelFormat};
pub use weights::LoadOptions;
