//! How a process runs the models it loads: the device, the activations' dtype and the
//! attention path, chosen once (by the binary's flags) and handed to every load, never
//! read from the environment behind the caller's back.

use super::attention::AttentionPath;
use candle_core::{DType, Device};

/// How a loaded model computes, beyond its device: the activations' dtype (`None`: f32
/// on the CPU, bf16 on a GPU; `bf16` on a CPU runs the arithmetic a GPU runs, so that a
/// machine without one can test it) and how attention runs off the CPU's f32 kernel.
/// A process chooses it once, from the binary's flags, and hands it to every load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compute {
    pub activations: Option<DType>,
    pub attention: AttentionPath,
}

impl Compute {
    /// The activations' dtype on `device`.
    pub fn activation_dtype(&self, device: &Device) -> DType {
        match self.activations {
            Some(d) => d,
            None if device.is_cpu() => DType::F32,
            None => DType::BF16,
        }
    }
}

/// Where a process runs the models it loads, and how they compute there.
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    pub compute: Compute,
}

impl Placement {
    /// The device with the default arithmetic.
    pub fn on(device: Device) -> Self {
        Self {
            device,
            compute: Compute::default(),
        }
    }
}
