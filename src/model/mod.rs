//! The model runtime: configs, weights, a decoder whose KV cache the caller owns.
