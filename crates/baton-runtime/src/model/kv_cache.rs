//! The KV cache as a value the caller owns: exported per layer, imported, truncated,
//! extended and cloned. Mapping between models reads and writes it through these calls.

use super::error::{ModelError, Result};
use super::kept_residual::KeptResidual;
use super::position_set::PositionSet;
use candle_core::{DType, Device, Tensor};
use std::ops::Range;

/// One layer's keys (after RoPE, and after the k-norm where the architecture has one) and
/// values, each [kv_heads, len, head_dim].
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: Tensor,
    pub v: Tensor,
}

/// Geometry a cache must have to be used with a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// Per-layer buffers with spare capacity so a decode step writes in place instead of
/// copying the whole history; only `[.., 0..len, ..]` is meaningful.
///
/// A position may be dropped: it keeps its slot (so every later position keeps its own
/// RoPE position and the cache its length), but no attention ever reads it, as if the
/// model had never seen that token. Writing a position (a re-read of it) takes it back.
///
/// A position may also be foreign: its entries were put there from outside (mapped from
/// another model) rather than computed by the model that reads the cache. A re-read of
/// it makes it the model's own; positions the model computes as it reads are its own.
/// Which positions are foreign travels with the entries (copies, truncation, splices),
/// so a later plan can tell what the model never computed, however many switches ago
/// it was mapped.
#[derive(Debug)]
pub struct KvCache {
    shape: KvShape,
    dtype: DType,
    device: Device,
    buffers: Vec<LayerKv>,
    len: usize,
    capacity: usize,
    dropped: PositionSet,
    foreign: PositionSet,
    /// The residual stream entering one layer, where the caller asked for it (see
    /// [`super::kept_residual`], which reads and writes it).
    residual: Option<KeptResidual>,
}

impl KvCache {
    pub fn new(shape: KvShape, dtype: DType, device: &Device) -> Self {
        Self {
            shape,
            dtype,
            device: device.clone(),
            buffers: Vec::new(),
            len: 0,
            capacity: 0,
            dropped: PositionSet::new(),
            foreign: PositionSet::new(),
            residual: None,
        }
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes held by the meaningful part of the cache.
    pub fn bytes(&self) -> usize {
        2 * self.shape.n_layer
            * self.shape.n_kv_head
            * self.shape.head_dim
            * self.len
            * self.dtype.size_in_bytes()
    }

    /// The positions no attention reads (increasing, disjoint spans inside the cache).
    pub fn dropped(&self) -> &[Range<usize>] {
        self.dropped.runs()
    }

    /// Whether any position is dropped.
    pub fn has_dropped(&self) -> bool {
        !self.dropped.is_empty()
    }

    /// Drop the positions of `r` (inside the cache): from now on attention skips them.
    /// The first position of a cache cannot be dropped: a row must have something to
    /// attend to, and position 0 is the attention sink every model leans on.
    pub fn drop_positions(&mut self, r: Range<usize>) -> Result<()> {
        if r.is_empty() {
            return Ok(());
        }
        if r.start == 0 || r.end > self.len {
            return Err(ModelError::Cache(format!(
                "dropping positions {}..{} of a cache of {} positions: position 0 stays and \
                 nothing past the end can be dropped",
                r.start, r.end, self.len
            )));
        }
        self.dropped.insert(r);
        Ok(())
    }

    /// The positions whose entries came from outside the model (increasing, disjoint
    /// spans inside the cache): what it has not computed itself.
    pub fn foreign(&self) -> &PositionSet {
        &self.foreign
    }

    /// Say that the positions of `r` (inside the cache) hold entries the model did not
    /// compute (a map from another model wrote them).
    pub fn mark_foreign(&mut self, r: Range<usize>) -> Result<()> {
        if r.end > self.len {
            return Err(ModelError::Cache(format!(
                "marking positions {}..{} of a cache of {} positions as mapped",
                r.start, r.end, self.len
            )));
        }
        self.foreign.insert(r);
        Ok(())
    }

    /// The model computed the positions of `r` itself (it re-read them).
    pub(crate) fn mark_own(&mut self, r: Range<usize>) {
        self.foreign.remove(r);
    }

    /// Take positions back into attention (the caller has written them).
    pub(crate) fn undrop(&mut self, r: Range<usize>) {
        self.dropped.remove(r);
    }

    /// Keys and values of layer `l` for positions `0..len` (views, not copies).
    pub fn layer(&self, l: usize) -> Result<LayerKv> {
        self.layer_range(l, 0, self.len)
    }

    /// Keys and values of layer `l` for positions `start..end`.
    pub fn layer_range(&self, l: usize, start: usize, end: usize) -> Result<LayerKv> {
        if end > self.len || start > end {
            return Err(ModelError::Cache(format!(
                "range {start}..{end} is outside a cache of {} positions",
                self.len
            )));
        }
        let b = self.buffers.get(l).ok_or_else(|| {
            ModelError::Cache(format!("layer {l} of a {}-layer cache", self.shape.n_layer))
        })?;
        Ok(LayerKv {
            k: b.k.narrow(1, start, end - start)?,
            v: b.v.narrow(1, start, end - start)?,
        })
    }

    /// Contiguous copies of every layer, positions `0..len`. Dropped positions are in
    /// it as their slots hold them: which ones are dropped is [`Self::dropped`], and a
    /// cache imported from these layers drops nothing.
    pub fn export(&self) -> Result<Vec<LayerKv>> {
        self.export_prefix(self.len)
    }

    /// Contiguous copies of every layer, positions `0..len` (at most the cache's own).
    fn export_prefix(&self, len: usize) -> Result<Vec<LayerKv>> {
        let len = len.min(self.len);
        (0..self.shape.n_layer)
            .map(|l| {
                let kv = self.layer_range(l, 0, len)?;
                Ok(LayerKv {
                    k: kv.k.contiguous()?,
                    v: kv.v.contiguous()?,
                })
            })
            .collect()
    }

    /// A CPU f32 cache made of per-layer buffers already laid out as the cache keeps them
    /// ([kv_heads, capacity, head_dim] keys and values, positions `0..len` written), so a
    /// kernel that produces a whole cache writes it once instead of through a copy.
    pub fn from_f32_buffers(
        shape: KvShape,
        len: usize,
        capacity: usize,
        layers: Vec<(Vec<f32>, Vec<f32>)>,
    ) -> Result<Self> {
        let n = shape.n_kv_head * capacity * shape.head_dim;
        if layers.len() != shape.n_layer || len > capacity {
            return Err(ModelError::Cache(format!(
                "{} layers of {len} positions in a capacity of {capacity} for a {}-layer cache",
                layers.len(),
                shape.n_layer
            )));
        }
        let dims = (shape.n_kv_head, capacity, shape.head_dim);
        let mut buffers = Vec::with_capacity(layers.len());
        for (k, v) in layers {
            if k.len() != n || v.len() != n {
                return Err(ModelError::Cache(format!(
                    "layer buffers of {} and {} values, expected {n}",
                    k.len(),
                    v.len()
                )));
            }
            buffers.push(LayerKv {
                k: Tensor::from_vec(k, dims, &Device::Cpu)?,
                v: Tensor::from_vec(v, dims, &Device::Cpu)?,
            });
        }
        Ok(Self {
            shape,
            dtype: DType::F32,
            device: Device::Cpu,
            buffers,
            len,
            capacity,
            dropped: PositionSet::new(),
            foreign: PositionSet::new(),
            residual: None,
        })
    }

    /// The capacity a cache of `len` positions is given when it is first allocated.
    pub fn initial_capacity(len: usize) -> usize {
        len.max(256).next_multiple_of(64)
    }

    /// A cache holding exactly `layers` (e.g. a mapped cache).
    pub fn import(
        shape: KvShape,
        layers: Vec<LayerKv>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut cache = Self::new(shape, dtype, device);
        cache.extend_with(&layers)?;
        Ok(cache)
    }

    /// Append positions given per layer (e.g. a mapped suffix) after the current ones.
    pub fn extend_with(&mut self, layers: &[LayerKv]) -> Result<()> {
        if layers.len() != self.shape.n_layer {
            return Err(ModelError::Cache(format!(
                "{} layers given for a {}-layer cache",
                layers.len(),
                self.shape.n_layer
            )));
        }
        let t = layers[0].k.dim(1)?;
        for (l, kv) in layers.iter().enumerate() {
            for (name, x) in [("keys", &kv.k), ("values", &kv.v)] {
                let dims = x.dims3()?;
                if dims != (self.shape.n_kv_head, t, self.shape.head_dim) {
                    return Err(ModelError::Cache(format!(
                        "layer {l} {name} have shape {dims:?}, expected ({}, {t}, {})",
                        self.shape.n_kv_head, self.shape.head_dim
                    )));
                }
            }
        }
        self.reserve(t)?;
        for (l, kv) in layers.iter().enumerate() {
            self.write(l, &kv.k, &kv.v)?;
        }
        self.len += t;
        Ok(())
    }

    /// Append positions `start..end` of `other` (a cache of the same model and the same
    /// tokens) after this cache's `start` positions.
    pub fn extend_from(&mut self, other: &KvCache, start: usize, end: usize) -> Result<()> {
        if self.len != start {
            return Err(ModelError::Cache(format!(
                "copying positions {start}..{end} onto a cache of {} positions",
                self.len
            )));
        }
        if end <= start {
            return Ok(());
        }
        let layers = (0..self.shape.n_layer)
            .map(|l| other.layer_range(l, start, end))
            .collect::<Result<Vec<_>>>()?;
        self.extend_with(&layers)?;
        for r in other.dropped.moved(start..end, start).runs() {
            self.dropped.insert(r.clone());
        }
        for r in other.foreign.moved(start..end, start).runs() {
            self.foreign.insert(r.clone());
        }
        if let (Some(mine), Some(theirs)) = (&mut self.residual, &other.residual) {
            mine.copy_from(theirs, start..end);
        }
        Ok(())
    }

    /// Forget every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.dropped.truncate(self.len);
        self.foreign.truncate(self.len);
        if let Some(kept) = &mut self.residual {
            kept.truncate(self.len);
        }
    }

    /// A deep copy: the two caches can then be extended independently.
    pub fn try_clone(&self) -> Result<Self> {
        self.try_clone_prefix(self.len)
    }

    /// A deep copy of positions `0..len` only (e.g. the model's own cache of an anchor),
    /// without copying the rest.
    pub fn try_clone_prefix(&self, len: usize) -> Result<Self> {
        let len = len.min(self.len);
        // Nothing allocated yet, or nothing wanted: there is nothing to export.
        let mut copy = if len == 0 {
            Self::new(self.shape, self.dtype, &self.device)
        } else {
            let mut copy = Self::import(
                self.shape,
                self.export_prefix(len)?,
                self.dtype,
                &self.device,
            )?;
            copy.dropped = self.dropped.clone();
            copy.dropped.truncate(len);
            copy.foreign = self.foreign.clone();
            copy.foreign.truncate(len);
            copy
        };
        copy.residual = self.residual.as_ref().map(|kept| kept.prefix(len));
        Ok(copy)
    }

    /// Layer `l`'s keys and values as the raw f32 CPU buffers they live in (each
    /// [kv_heads, capacity, head_dim], positions `0..len` meaningful), with the capacity,
    /// for kernels that read the cache in place. `None` for other dtypes or devices.
    pub fn with_layer_f32<R>(
        &self,
        l: usize,
        f: impl FnOnce(&[f32], &[f32], usize) -> R,
    ) -> Result<Option<R>> {
        if self.dtype != DType::F32 || !self.device.is_cpu() {
            return Ok(None);
        }
        let b = self.buffers.get(l).ok_or_else(|| {
            ModelError::Cache(format!("layer {l} of a {}-layer cache", self.shape.n_layer))
        })?;
        let n = self.shape.n_kv_head * self.capacity * self.shape.head_dim;
        let (ks, kl) = b.k.storage_and_layout();
        let (vs, vl) = b.v.storage_and_layout();
        let (candle_core::Storage::Cpu(kc), candle_core::Storage::Cpu(vc)) = (&*ks, &*vs) else {
            return Ok(None);
        };
        if !kl.is_contiguous() || !vl.is_contiguous() {
            return Ok(None);
        }
        let k = &kc.as_slice::<f32>()?[kl.start_offset()..kl.start_offset() + n];
        let v = &vc.as_slice::<f32>()?[vl.start_offset()..vl.start_offset() + n];
        Ok(Some(f(k, v, self.capacity)))
    }

    /// Make room for `extra` more positions.
    pub(crate) fn reserve(&mut self, extra: usize) -> Result<()> {
        let need = self.len + extra;
        if need <= self.capacity && !self.buffers.is_empty() {
            return Ok(());
        }
        let new_cap = Self::initial_capacity(need.max(self.capacity * 2));
        let s = self.shape;
        let mut buffers = Vec::with_capacity(s.n_layer);
        for l in 0..s.n_layer {
            let k = Tensor::zeros((s.n_kv_head, new_cap, s.head_dim), self.dtype, &self.device)?;
            let v = Tensor::zeros((s.n_kv_head, new_cap, s.head_dim), self.dtype, &self.device)?;
            if self.len > 0 {
                let old = self.layer(l)?;
                k.slice_set(&old.k.contiguous()?, 1, 0)?;
                v.slice_set(&old.v.contiguous()?, 1, 0)?;
            }
            buffers.push(LayerKv { k, v });
        }
        self.buffers = buffers;
        self.capacity = new_cap;
        Ok(())
    }

    /// Write `k`, `v` ([kv_heads, t, head_dim]) for layer `l` at positions `len..len+t`
    /// and return the layer's views over `0..len+t`. The caller commits with `advance`
    /// once every layer is written.
    pub(crate) fn write(&mut self, l: usize, k: &Tensor, v: &Tensor) -> Result<LayerKv> {
        self.write_at(l, self.len, k, v)
    }

    /// Write `k`, `v` ([kv_heads, t, head_dim]) for layer `l` at positions `at..at+t`,
    /// over what they held (a re-read) or past the end (a prefill, committed with
    /// `advance`), and return the layer's views over `0..at+t`. Positions past the end
    /// may not leave a gap.
    pub(crate) fn write_at(
        &mut self,
        l: usize,
        at: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<LayerKv> {
        let t = k.dim(1)?;
        if at > self.len || at + t > self.capacity {
            return Err(ModelError::Cache(format!(
                "writing positions {at}..{} of a cache of {} positions (room for {})",
                at + t,
                self.len,
                self.capacity
            )));
        }
        let b = self.buffers.get(l).ok_or_else(|| {
            ModelError::Cache(format!("layer {l} of a {}-layer cache", self.shape.n_layer))
        })?;
        b.k.slice_set(&k.contiguous()?.to_dtype(self.dtype)?, 1, at)?;
        b.v.slice_set(&v.contiguous()?.to_dtype(self.dtype)?, 1, at)?;
        Ok(LayerKv {
            k: b.k.narrow(1, 0, at + t)?,
            v: b.v.narrow(1, 0, at + t)?,
        })
    }

    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Keep, from now on, the residual stream entering `layer` (of width `width`) for
    /// every position the model computes ([`KeptResidual`]); a cache already keeping
    /// that layer keeps what it has, one keeping another layer starts again.
    pub fn keep_residual(&mut self, layer: usize, width: usize) {
        match &self.residual {
            Some(k) if k.layer() == layer && k.width() == width => {}
            _ => self.residual = Some(KeptResidual::new(layer, width)),
        }
    }

    /// Stop keeping a residual stream, and free what was kept.
    pub fn stop_keeping_residual(&mut self) {
        self.residual = None;
    }

    /// The residual stream kept, if any.
    pub fn kept_residual(&self) -> Option<&KeptResidual> {
        self.residual.as_ref()
    }

    /// The positions whose kept residual stream is the model's own computation: written
    /// as it read them, and not mapped in since (a position mapped over keeps its old
    /// row until a read writes it again, and is foreign meanwhile).
    pub fn residual_positions(&self) -> PositionSet {
        let Some(kept) = &self.residual else {
            return PositionSet::new();
        };
        let mut own = kept.written().clone();
        own.truncate(self.len());
        for r in self.foreign().runs() {
            own.remove(r.clone());
        }
        own
    }

    /// The pass through layer `l` over the positions of `runs` enters it with `h`: kept
    /// where this cache keeps that layer's stream.
    pub(crate) fn keep_rows(&mut self, l: usize, runs: &[Range<usize>], h: &Tensor) -> Result<()> {
        match &mut self.residual {
            Some(kept) if kept.layer() == l => kept.write(runs, h),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 4,
        }
    }

    fn chunk(t: usize, seed: f32) -> Result<Vec<LayerKv>> {
        (0..2)
            .map(|l| {
                let base =
                    Tensor::arange(0f32, (2 * t * 4) as f32, &Device::Cpu)?.reshape((2, t, 4))?;
                let k = (base.clone() + (seed + l as f32 * 100.0) as f64)?;
                let v = (base - (seed + l as f32 * 100.0) as f64)?;
                Ok(LayerKv { k, v })
            })
            .collect()
    }

    #[test]
    fn which_positions_are_foreign_travels_with_copies_splices_and_truncation() -> Result<()> {
        let mut c = KvCache::import(shape(), chunk(10, 1.0)?, DType::F32, &Device::Cpu)?;
        assert!(
            c.foreign().is_empty(),
            "entries given are nobody's map until marked"
        );
        c.mark_foreign(2..6)?;
        c.mark_foreign(8..10)?;
        assert!(c.mark_foreign(9..11).is_err(), "nothing past the end");
        let copy = c.try_clone_prefix(9)?;
        assert_eq!(copy.foreign().runs(), &[2..6, 8..9]);
        let mut spliced = c.try_clone_prefix(4)?;
        spliced.extend_from(&c, 4, 10)?;
        assert_eq!(spliced.foreign().runs(), c.foreign().runs());
        c.mark_own(3..5);
        assert_eq!(c.foreign().runs(), &[2..3, 5..6, 8..10]);
        c.truncate(6);
        assert_eq!(c.foreign().runs(), &[2..3, 5..6]);
        Ok(())
    }

    #[test]
    fn import_export_round_trip_and_growth_past_capacity() -> Result<()> {
        let first = chunk(300, 1.0)?;
        let mut c = KvCache::import(shape(), first.clone(), DType::F32, &Device::Cpu)?;
        c.extend_with(&chunk(5, 7.0)?)?; // forces no regrowth; then a big one does
        c.extend_with(&chunk(400, 9.0)?)?;
        assert_eq!(c.len(), 705);
        let out = c.export()?;
        let head = out[1].k.narrow(1, 0, 300)?;
        let diff = (head - &first[1].k)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        Ok(())
    }

    #[test]
    fn a_prefix_clone_holds_only_the_first_positions() -> Result<()> {
        let c = KvCache::import(shape(), chunk(10, 1.0)?, DType::F32, &Device::Cpu)?;
        let p = c.try_clone_prefix(4)?;
        assert_eq!(p.len(), 4);
        for l in 0..2 {
            let want = c.layer_range(l, 0, 4)?;
            let got = p.layer(l)?;
            let dk = (got.k - want.k)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let dv = (got.v - want.v)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!((dk, dv), (0.0, 0.0));
        }
        assert_eq!(c.try_clone_prefix(99)?.len(), 10);
        assert!(c.try_clone_prefix(0)?.is_empty());
        Ok(())
    }

    #[test]
    fn clone_is_independent_and_truncate_forgets() -> Result<()> {
        let mut a = KvCache::import(shape(), chunk(3, 1.0)?, DType::F32, &Device::Cpu)?;
        let mut b = a.try_clone()?;
        a.extend_with(&chunk(2, 5.0)?)?;
        b.extend_with(&chunk(2, 50.0)?)?;
        let ak = a.layer(0)?.k.narrow(1, 3, 2)?;
        let bk = b.layer(0)?.k.narrow(1, 3, 2)?;
        let d = (ak - bk)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!((d - 45.0).abs() < 1e-6, "clones must not share storage");
        a.truncate(1);
        assert_eq!(a.len(), 1);
        assert!(a.layer_range(0, 0, 2).is_err());
        Ok(())
    }

    #[test]
    fn an_empty_cache_clones_and_a_truncated_one_clones_its_prefix() -> Result<()> {
        let empty = KvCache::new(shape(), DType::F32, &Device::Cpu);
        let mut c = empty.try_clone()?;
        assert!(c.is_empty());
        c.extend_with(&chunk(2, 1.0)?)?;
        assert_eq!(c.len(), 2);
        c.truncate(0);
        assert!(c.try_clone()?.is_empty());
        Ok(())
    }

    #[test]
    fn wrong_geometry_is_refused() -> Result<()> {
        let bad = vec![
            LayerKv {
                k: Tensor::zeros((3, 1, 4), DType::F32, &Device::Cpu)?,
                v: Tensor::zeros((3, 1, 4), DType::F32, &Device::Cpu)?,
            };
            2
        ];
        let err = KvCache::import(shape(), bad, DType::F32, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("expected (2, 1, 4)"), "{err}");
        Ok(())
    }

    #[test]
    fn a_position_mapped_over_has_no_row_of_the_models_own_and_copies_carry_the_rest() -> Result<()>
    {
        let shape = KvShape {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 2,
        };
        let dev = Device::Cpu;
        let mut c = KvCache::new(shape, DType::F32, &dev);
        c.keep_residual(0, 2);
        c.reserve(3)?;
        c.advance(3);
        c.keep_rows(0, &[0..3], &Tensor::zeros((3, 2), DType::F32, &dev)?)?;
        assert_eq!(c.residual_positions(), PositionSet::of([0..3]));
        c.mark_foreign(1..2)?;
        assert_eq!(c.residual_positions(), PositionSet::of([0..1, 2..3]));
        let prefix = c.try_clone_prefix(2)?;
        assert_eq!(prefix.residual_positions(), PositionSet::of([0..1]));
        assert_eq!(prefix.kept_residual().map(|k| k.layer()), Some(0));
        let empty = c.try_clone_prefix(0)?;
        assert!(empty.residual_positions().is_empty() && empty.kept_residual().is_some());
        Ok(())
    }
}
