//! The fused attention kernels (candle-flash-attn) that a build with `--features flash`
//! carries. `scripts/check-cuda --flash` builds them for the shapes the supported models
//! run on a GPU; any other shape stops with a message naming the kernel it lacks (see
//! docs/gpu.md). The attention does not call them yet: the batched path stays the only
//! one until a device check has run both and found them in agreement.

/// The kernels this build carries, for `baton --version`; `None` in a build without them.
pub fn coverage() -> Option<&'static str> {
    #[cfg(feature = "flash")]
    {
        // A build that names the kernels must hold them: keeping the entry point reachable
        // makes the link pull in the kernels' static library, so a missing kernel is a
        // link error of the build, not a surprise on the GPU.
        std::hint::black_box(attend as Attend);
        Some("fused attention (bf16; head dims 64 and 128)")
    }
    #[cfg(not(feature = "flash"))]
    None
}

#[cfg(feature = "flash")]
type Attend = fn(
    &candle_core::Tensor,
    &candle_core::Tensor,
    &candle_core::Tensor,
    f32,
    bool,
) -> candle_core::Result<candle_core::Tensor>;

/// Scaled dot-product attention in one kernel. `q` is [batch, rows, heads, head_dim], `k`
/// and `v` [batch, positions, kv_heads, head_dim], bf16 on a CUDA device; `causal` masks
/// each row to the positions at or before its own, aligned at the end.
#[cfg(feature = "flash")]
pub fn attend(
    q: &candle_core::Tensor,
    k: &candle_core::Tensor,
    v: &candle_core::Tensor,
    scale: f32,
    causal: bool,
) -> candle_core::Result<candle_core::Tensor> {
    candle_flash_attn::flash_attn(q, k, v, scale, causal)
}
