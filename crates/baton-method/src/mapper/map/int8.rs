//! The map on the CPU's int8 kernels (the ones the decoder's prefill runs on), so a map
//! is measured against the re-prefill on equal terms. Weights are quantized to Q8_0 once
//! at load; each call quantizes its features per 32 values with their own scale. Keys
//! leave the product and are rotated into the target's head layout in one pass.

use super::dense::TargetLayerMap;
use super::packed_head::{pack_head, PackedHead};
use super::packing::{mean_into_bias, packed_linear, unscale_rows, vec2};
use super::{MapInput, SourceScales};
use crate::mapper::features::layer_features;
use crate::mapper::nonlinear::HeadUse;
use baton_runtime::model::config::RopeLayout;
use baton_runtime::model::rope::Rope;
use baton_runtime::model::weights::Linear;
use baton_runtime::model::{KvCache, KvShape, LayerKv, ModelError};
use candle_core::{Device, Tensor};
use std::collections::BTreeMap;

/// One map (K or V of one target layer), packed: the full product, or a reduced map's
/// two factors (features → rank, rank → target, bias on the second).
#[derive(Debug, Clone)]
enum PackedMap {
    Full(Linear),
    Factored {
        left: Linear,
        right: Linear,
        rank: usize,
    },
}

impl PackedMap {
    fn forward(&self, parts: &[&[f32]], width: usize, rows: usize) -> Result<Vec<f32>, ModelError> {
        match self {
            PackedMap::Full(l) => l.forward_parts(parts, width, rows)?.ok_or_else(not_packed),
            PackedMap::Factored { left, right, rank } => {
                let mid = left
                    .forward_parts(parts, width, rows)?
                    .ok_or_else(not_packed)?;
                right
                    .forward_parts(&[&mid], *rank, rows)?
                    .ok_or_else(not_packed)
            }
        }
    }

    /// The map and `beside` (another product on the same features, a residual head's
    /// first layer) in one pass over the features, so they are quantized once and the
    /// head's first layer rounds the same int8 features as the map it corrects.
    fn forward_beside(
        &self,
        beside: &Linear,
        parts: &[&[f32]],
        width: usize,
        rows: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let first = match self {
            PackedMap::Full(l) => l,
            PackedMap::Factored { left, .. } => left,
        };
        let mut outs = Linear::forward_parts_fused(&[first, beside], parts, width, rows)?
            .ok_or_else(not_packed)?
            .into_iter();
        let (Some(y), Some(b)) = (outs.next(), outs.next()) else {
            return Err(not_packed());
        };
        let y = match self {
            PackedMap::Full(_) => y,
            PackedMap::Factored { right, rank, .. } => right
                .forward_parts(&[&y], *rank, rows)?
                .ok_or_else(not_packed)?,
        };
        Ok((y, b))
    }
}

fn not_packed() -> ModelError {
    ModelError::Cache("a packed mapper layer is not packed".into())
}

/// One target layer's K and V maps, packed, with their trained heads if any.
#[derive(Debug, Clone)]
pub struct PackedLayer {
    k: PackedSide,
    v: PackedSide,
}

/// The keys' or the values' map of one target layer: the ridge map, its trained head, or
/// both (a residual head adds to the map; an mlp head replaces it, so no map is kept).
#[derive(Debug, Clone)]
struct PackedSide {
    map: Option<PackedMap>,
    head: Option<PackedHead>,
}

impl PackedSide {
    /// `m` packed, or `None` where the kernels do not take one of its shapes.
    fn pack(
        m: &TargetLayerMap,
        scales: &SourceScales,
        width: usize,
        keys: bool,
    ) -> Result<Option<Self>, ModelError> {
        let head = match &m.head {
            None => None,
            Some(h) => match pack_head(h, &m.sources, scales, width, keys)? {
                Some(p) => Some(p),
                None => return Ok(None),
            },
        };
        let map = if head.as_ref().is_some_and(|h| h.used() == HeadUse::Alone) {
            None
        } else {
            match pack_one(m, scales, width, keys)? {
                Some(p) => Some(p),
                None => return Ok(None),
            }
        };
        Ok(Some(Self { map, head }))
    }

    fn forward(&self, parts: &[&[f32]], width: usize, rows: usize) -> Result<Vec<f32>, ModelError> {
        match (&self.map, &self.head) {
            (Some(pm), None) => pm.forward(parts, width, rows),
            (None, Some(h)) => h.forward(parts, width, rows),
            (Some(pm), Some(h)) => {
                let (mut y, first) = pm.forward_beside(h.first(), parts, width, rows)?;
                let out = h.forward_after_first(first, rows)?;
                for (y, o) in y.iter_mut().zip(&out) {
                    *y += o;
                }
                Ok(y)
            }
            (None, None) => Err(not_packed()),
        }
    }
}

/// The map rewritten for conditioned features `z = (x − μ)·s`: rows of W divided by
/// `s`, and `μ·W` moved into the bias, so `z·W' + b' = x·W + b`. A reduced map's factors
/// the same way: the rows of `left` divided by `s`, `μ·W` (W their product) into the
/// bias of `right`.
fn pack_one(
    m: &TargetLayerMap,
    scales: &SourceScales,
    width: usize,
    keys: bool,
) -> Result<Option<PackedMap>, ModelError> {
    let d_t = m.bias.dims1()?;
    let rows = m.sources.len() * width;
    let w = vec2(&m.weight)?;
    let mut b = vec2(&m.bias)?;
    mean_into_bias(&m.sources, scales, width, keys, &w, &mut b);
    match &m.factors {
        None => {
            let mut w = w;
            unscale_rows(&m.sources, scales, width, keys, &mut w, d_t);
            Ok(packed_linear(w, rows, d_t, Some(&b))?.map(PackedMap::Full))
        }
        Some((left, right)) => {
            let rank = right.dims2()?.0;
            if !rank.is_multiple_of(32) {
                return Ok(None);
            }
            let mut l = vec2(left)?;
            unscale_rows(&m.sources, scales, width, keys, &mut l, rank);
            match (
                packed_linear(l, rows, rank, None)?,
                packed_linear(vec2(right)?, rank, d_t, Some(&b))?,
            ) {
                (Some(left), Some(right)) => Ok(Some(PackedMap::Factored { left, right, rank })),
                _ => Ok(None),
            }
        }
    }
}

/// Everything the int8 path needs: the packed layers and the source's conditioning.
#[derive(Debug, Clone)]
pub struct PackedMapper {
    layers: Vec<PackedLayer>,
    scales: SourceScales,
}

/// Packs every target layer, or `None` when the int8 kernels do not run here.
pub fn pack(
    keys: &[TargetLayerMap],
    values: &[TargetLayerMap],
    scales: &SourceScales,
    source: KvShape,
) -> Result<Option<PackedMapper>, ModelError> {
    if keys
        .iter()
        .chain(values)
        .any(|m| !m.weight.device().is_cpu())
    {
        return Ok(None);
    }
    let width = source.n_kv_head * source.head_dim;
    // Source layers past the cache's own are the token block's pieces, with their own
    // scales.
    let layers = keys
        .iter()
        .chain(values)
        .flat_map(|m| m.sources.iter().map(|&s| s + 1))
        .max()
        .unwrap_or(0)
        .max(source.n_layer);
    if !scales.fits(layers, width) {
        return Err(ModelError::Cache(format!(
            "the mapper's source scales do not cover {layers} layers of {width} features"
        )));
    }
    let mut out = Vec::with_capacity(keys.len());
    for (km, vm) in keys.iter().zip(values) {
        match (
            PackedSide::pack(km, scales, width, true)?,
            PackedSide::pack(vm, scales, width, false)?,
        ) {
            (Some(k), Some(v)) => out.push(PackedLayer { k, v }),
            _ => return Ok(None),
        }
    }
    Ok(Some(PackedMapper {
        layers: out,
        scales: scales.clone(),
    }))
}

/// Piece `l − l_s` of the token block (rows of `[K̄⁰ | V⁰]`), conditioned by the scales of
/// source layer `l` for keys and for values, written as rows of `width` into `kr` and
/// `vr`.
fn block_rows_into(
    block: Option<&[f32]>,
    scales: &SourceScales,
    l: usize,
    l_s: usize,
    width: usize,
    kr: &mut [f32],
    vr: &mut [f32],
) -> Result<(), ModelError> {
    let block = block.ok_or_else(|| {
        ModelError::Cache(format!(
            "source layer {l} is a piece of the token block, which this map was not given"
        ))
    })?;
    let rows = kr.len() / width.max(1);
    let row_width = block.len() / rows.max(1);
    let off = (l - l_s) * width;
    if off + width > row_width || rows * row_width != block.len() {
        return Err(ModelError::Cache(format!(
            "the token block of {row_width} values a row has no piece {}",
            l - l_s
        )));
    }
    let (km, ks) = scales.layer(l, width, true);
    let (vm, vs) = scales.layer(l, width, false);
    for r in 0..rows {
        let x = &block[r * row_width + off..][..width];
        let (ko, vo) = (&mut kr[r * width..][..width], &mut vr[r * width..][..width]);
        for i in 0..width {
            ko[i] = (x[i] - km[i]) * ks[i];
            vo[i] = (x[i] - vm[i]) * vs[i];
        }
    }
    Ok(())
}

/// Un-rotated, conditioned keys and values of source layer `l` at `start..end`, written
/// as rows [end − start, heads·hd] into `kr` and `vr`, read straight from the cache where
/// it is f32 on the CPU.
#[allow(clippy::too_many_arguments)]
fn source_rows_into(
    src: &KvCache,
    rope: &Rope,
    tables: &(Vec<f32>, Vec<f32>),
    scales: &SourceScales,
    l: usize,
    start: usize,
    end: usize,
    kr: &mut [f32],
    vr: &mut [f32],
) -> Result<(), ModelError> {
    let shape = src.shape();
    let (heads, hd) = (shape.n_kv_head, shape.head_dim);
    let width = heads * hd;
    let rows = end - start;
    let (km, ks) = scales.layer(l, width, true);
    let (vm, vs) = scales.layer(l, width, false);
    let direct = rope.half_width() * 2 == hd
        && src
            .with_layer_f32(l, |k, v, cap| {
                let half = hd / 2;
                let (cos, sin) = tables;
                for r in 0..rows {
                    let (c, s) = (&cos[r * half..][..half], &sin[r * half..][..half]);
                    for h in 0..heads {
                        let at = (h * cap + start + r) * hd;
                        let (ki, vi) = (&k[at..at + hd], &v[at..at + hd]);
                        let o = r * width + h * hd;
                        let ko = &mut kr[o..o + hd];
                        let (kmh, ksh) = (&km[h * hd..][..hd], &ks[h * hd..][..hd]);
                        // Rotation by the negated angle, then centring and scaling.
                        match rope.layout() {
                            RopeLayout::RotateHalf => {
                                for i in 0..half {
                                    let (a, b) = (ki[i], ki[i + half]);
                                    ko[i] = (a * c[i] + b * s[i] - kmh[i]) * ksh[i];
                                    ko[i + half] =
                                        (b * c[i] - a * s[i] - kmh[i + half]) * ksh[i + half];
                                }
                            }
                            RopeLayout::Interleaved => {
                                for i in 0..half {
                                    let (a, b) = (ki[2 * i], ki[2 * i + 1]);
                                    ko[2 * i] = (a * c[i] + b * s[i] - kmh[2 * i]) * ksh[2 * i];
                                    ko[2 * i + 1] =
                                        (b * c[i] - a * s[i] - kmh[2 * i + 1]) * ksh[2 * i + 1];
                                }
                            }
                        }
                        let vo = &mut vr[o..o + hd];
                        let (vmh, vsh) = (&vm[h * hd..][..hd], &vs[h * hd..][..hd]);
                        for i in 0..hd {
                            vo[i] = (vi[i] - vmh[i]) * vsh[i];
                        }
                    }
                }
            })?
            .is_some();
    if !direct {
        let f = layer_features(src, rope, l, start, end, 1)?;
        for (out, x, m, s) in [
            (&mut *kr, f32_rows(&f.k)?, &km, &ks),
            (&mut *vr, f32_rows(&f.v)?, &vm, &vs),
        ] {
            for (o, r) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
                for i in 0..width {
                    o[i] = (r[i] - m[i]) * s[i];
                }
            }
        }
    }
    Ok(())
}

fn f32_rows(t: &Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// [rows, heads·hd] → [heads, cap, hd] (rows `0..rows` written), rotating each row at
/// position `row` of the tables. Rows are spread over the thread pool: the output is
/// fresh memory, and its first touch costs about as much as the arithmetic.
fn rotate_into_heads(
    y: &[f32],
    rows: usize,
    cap: usize,
    heads: usize,
    hd: usize,
    tables: Option<(&[f32], &[f32], RopeLayout)>,
) -> Vec<f32> {
    // Zeroed by the allocator (calloc): the unused capacity costs no writes.
    let mut out = vec![0f32; cap * heads * hd];
    let half = hd / 2;
    let one = |r: usize, h: usize, dst: &mut [f32]| {
        let src = &y[r * heads * hd + h * hd..][..hd];
        match tables {
            None => dst.copy_from_slice(src),
            Some((cos, sin, layout)) => {
                let (c, s) = (&cos[r * half..][..half], &sin[r * half..][..half]);
                match layout {
                    RopeLayout::RotateHalf => {
                        for i in 0..half {
                            let (a, b) = (src[i], src[i + half]);
                            dst[i] = a * c[i] - b * s[i];
                            dst[i + half] = b * c[i] + a * s[i];
                        }
                    }
                    RopeLayout::Interleaved => {
                        for i in 0..half {
                            let (a, b) = (src[2 * i], src[2 * i + 1]);
                            dst[2 * i] = a * c[i] - b * s[i];
                            dst[2 * i + 1] = a * s[i] + b * c[i];
                        }
                    }
                }
            }
        }
    };
    let parallel = rows * heads * hd >= 1 << 16;
    baton_runtime::kernels::par::for_each_row_of_heads(
        &mut out,
        (heads, cap, hd),
        rows,
        parallel,
        one,
    );
    out
}

thread_local! {
    /// Source features of the last map on this thread, kept for the next one: fresh
    /// pages cost a fault each on first touch, as much as the un-rotation itself.
    static FEATURES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
/// Larger feature buffers are returned to the allocator after the map.
const KEEP_FEATURES: usize = 32 << 20;

/// Positions `start..end` of the source mapped, as the dense path's
/// [`super::dense::map_layers`] returns them.
pub fn map_layers(
    packed: &PackedMapper,
    input: &MapInput<'_>,
    start: usize,
    end: usize,
) -> Result<Vec<LayerKv>, ModelError> {
    let rows = end - start;
    let t = input.target;
    let shape = (t.n_kv_head, rows, t.head_dim);
    let dtype = input.src.dtype();
    map_buffers(packed, input, start, end, rows)?
        .into_iter()
        .map(|(k, v)| {
            Ok(LayerKv {
                k: Tensor::from_vec(k, shape, &Device::Cpu)?.to_dtype(dtype)?,
                v: Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)?,
            })
        })
        .collect()
}

/// The whole source cache mapped, written straight into the new cache's buffers.
pub fn map_into_cache(packed: &PackedMapper, input: &MapInput<'_>) -> Result<KvCache, ModelError> {
    let len = input.src.len();
    let cap = KvCache::initial_capacity(len);
    let bufs = map_buffers(packed, input, 0, len, cap)?;
    KvCache::from_f32_buffers(input.target, len, cap, bufs)
}

/// One target layer's keys and values, each laid out [heads, cap, hd].
type LayerBuffers = (Vec<f32>, Vec<f32>);

/// Per target layer, keys and values laid out [heads, cap, hd] with rows
/// `0..end − start` written.
fn map_buffers(
    packed: &PackedMapper,
    input: &MapInput<'_>,
    start: usize,
    end: usize,
    cap: usize,
) -> Result<Vec<LayerBuffers>, ModelError> {
    let hd = input.target.head_dim;
    if input.tgt_rope.half_width() * 2 != hd {
        return Err(ModelError::Cache(format!(
            "the target's rotary tables are {} wide for heads of {hd}",
            input.tgt_rope.half_width()
        )));
    }
    let layers = input.source_layers();
    let shape = input.src.shape();
    let per = (end - start) * shape.n_kv_head * shape.head_dim;
    let mut buf = FEATURES.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if buf.len() < 2 * per * layers.len() {
        buf = vec![0f32; 2 * per * layers.len()];
    }
    conditioned_features(packed, input, &layers, start, end, &mut buf)?;
    let out = products(packed, input, &layers, &buf, start, end, cap)?;
    if buf.len() <= KEEP_FEATURES {
        FEATURES.with(|c| *c.borrow_mut() = buf);
    }
    Ok(out)
}

/// Source layer `layers[i]`'s un-rotated, conditioned keys and values at `start..end`,
/// written into chunk `i` of `buf` (keys, then values, rows [end − start, heads·hd]
/// each), the layers spread over the thread pool.
fn conditioned_features(
    packed: &PackedMapper,
    input: &MapInput<'_>,
    layers: &[usize],
    start: usize,
    end: usize,
    buf: &mut [f32],
) -> Result<(), ModelError> {
    let MapInput {
        layer_zero,
        tokens,
        src,
        src_rope,
        ..
    } = *input;
    let rows = end - start;
    let src_tables = src_rope.tables(start, rows)?;
    let width = src.shape().n_kv_head * src.shape().head_dim;
    let per = rows * width;
    let l_s = src.shape().n_layer;
    let block = match layer_zero {
        Some(lz) if layers.iter().any(|&l| l >= l_s) => {
            let (k0, v0) = lz.features(&tokens[start..end])?;
            Some(Tensor::cat(&[k0, v0], 1)?.flatten_all()?.to_vec1::<f32>()?)
        }
        _ => None,
    };
    let failed = std::sync::Mutex::new(None);
    let one = |i: usize, part: &mut [f32]| {
        let (kr, vr) = part.split_at_mut(per);
        let r = if layers[i] >= l_s {
            block_rows_into(
                block.as_deref(),
                &packed.scales,
                layers[i],
                l_s,
                width,
                kr,
                vr,
            )
        } else {
            source_rows_into(
                src,
                src_rope,
                &src_tables,
                &packed.scales,
                layers[i],
                start,
                end,
                kr,
                vr,
            )
        };
        if let Err(e) = r {
            if let Ok(mut f) = failed.lock() {
                f.get_or_insert(e);
            }
        }
    };
    baton_runtime::kernels::par::for_each_chunk(buf, 2 * per, layers.len(), per >= 1 << 14, one);
    match failed.into_inner().ok().flatten() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every target layer's packed products on the conditioned features in `buf` (as
/// [`conditioned_features`] wrote them for `layers`), keys rotated by the target's RoPE,
/// both laid out [heads, cap, hd].
fn products(
    packed: &PackedMapper,
    input: &MapInput<'_>,
    layers: &[usize],
    buf: &[f32],
    start: usize,
    end: usize,
    cap: usize,
) -> Result<Vec<LayerBuffers>, ModelError> {
    let rows = end - start;
    let width = input.src.shape().n_kv_head * input.src.shape().head_dim;
    let per = rows * width;
    let feats: BTreeMap<usize, (&[f32], &[f32])> = layers
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let k = &buf[2 * i * per..(2 * i + 1) * per];
            let v = &buf[(2 * i + 1) * per..(2 * i + 2) * per];
            (l, (k, v))
        })
        .collect();
    let (cos, sin) = input.tgt_rope.tables(start, rows)?;
    let layout = input.tgt_rope.layout();
    let run = |side: &PackedSide, m: &TargetLayerMap, keys: bool| -> Result<Vec<f32>, ModelError> {
        let parts: Vec<&[f32]> = m
            .sources
            .iter()
            .map(|s| {
                let f = &feats[s];
                if keys {
                    f.0
                } else {
                    f.1
                }
            })
            .collect();
        side.forward(&parts, width, rows)
    };
    let (heads, hd) = (input.target.n_kv_head, input.target.head_dim);
    let (keys, values) = input.maps;
    let mut out = Vec::with_capacity(packed.layers.len());
    for ((p, km), vm) in packed.layers.iter().zip(keys).zip(values) {
        let k = run(&p.k, km, true)?;
        let k = rotate_into_heads(&k, rows, cap, heads, hd, Some((&cos, &sin, layout)));
        let v = run(&p.v, vm, false)?;
        let v = rotate_into_heads(&v, rows, cap, heads, hd, None);
        out.push((k, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_heads_and_rotation_matches_the_rope_module() -> Result<(), ModelError> {
        use baton_runtime::model::config::RopeConfig;
        for layout in [RopeLayout::RotateHalf, RopeLayout::Interleaved] {
            let cfg = RopeConfig {
                theta: 10_000.0,
                layout,
                dim: 8,
                llama3_scaling: None,
                freq_factors: None,
            };
            let rope = Rope::new(&cfg, 64, candle_core::DType::F32, &Device::Cpu)?;
            let (rows, heads, hd, start) = (5, 2, 8, 17);
            let y = Tensor::randn(0f32, 1.0, (rows, heads * hd), &Device::Cpu)?;
            let expect = rope.rotate(&crate::mapper::features::rows_to_heads(&y, heads)?, start)?;
            let (cos, sin) = rope.tables(start, rows)?;
            let got = rotate_into_heads(
                &f32_rows(&y)?,
                rows,
                rows,
                heads,
                hd,
                Some((&cos, &sin, layout)),
            );
            let got = Tensor::from_vec(got, (heads, rows, hd), &Device::Cpu)?;
            let err = (got - expect)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{layout:?}: {err}");
        }
        Ok(())
    }
}
