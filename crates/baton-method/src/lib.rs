//! The handoff method: the fitted KV mapper and its artifacts, calibration, learning
//! from use, the gate's fidelity estimate, the handoff of a cache from one model to
//! another, and the metrics that judge it.

pub mod calibrate;
pub mod gate;
pub mod handoff;
pub mod learn;
pub mod mapper;
pub mod metrics;
