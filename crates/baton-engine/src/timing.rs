//! Milliseconds as the engine reports them.

use std::time::Instant;

pub(super) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds since `t` once `dev` has finished its queued work (a GPU runs kernels
/// asynchronously; on the CPU this is a no-op).
pub(super) fn synced_ms(dev: &candle_core::Device, t: Instant) -> f64 {
    if let Err(e) = dev.synchronize() {
        tracing::warn!("device synchronize: {e}");
    }
    ms(t)
}
