//! The residual stream a cache keeps at one layer while its model reads.
//!
//! A handoff with layers ([`baton_method::handoff::layers`]) maps the source's residual stream
//! to the target's, and the target computes its upper layers over it. The source must
//! then have that stream for every position it computed, and a second read of the
//! history to get it would cost what the handoff saves. So a cache that is asked to
//! keeps it as its model reads: every pass through the layer (prefill, decode, re-read)
//! writes the rows of the positions it computes, at the cost of one row of the model's
//! hidden width a position (3.6 MB per 1,000 positions for a hidden width of 896, in
//! f32), beside the cache's keys and values of every layer.
//!
//! A row is only what the model computed at a position where the model computed it: a
//! position mapped in from another model has none, whatever passes ran over it since
//! (upper layers over a mapped stream are not the model's own either).

use super::error::{ModelError, Result};
use super::position_set::PositionSet;
use candle_core::{DType, Device, Tensor};
use std::ops::Range;

/// Rows of the residual stream entering one layer, by position, in f32 on the host.
#[derive(Debug, Clone)]
pub struct KeptResidual {
    layer: usize,
    width: usize,
    rows: Vec<f32>,
    written: PositionSet,
}

impl KeptResidual {
    pub fn new(layer: usize, width: usize) -> Self {
        Self {
            layer,
            width,
            rows: Vec::new(),
            written: PositionSet::new(),
        }
    }

    /// The layer whose incoming stream is kept.
    pub fn layer(&self) -> usize {
        self.layer
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Positions a row was written for (the owner subtracts what it did not compute).
    pub fn written(&self) -> &PositionSet {
        &self.written
    }

    /// Bytes the rows take.
    pub fn bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<f32>()
    }

    /// Keep `h` ([rows, width], the stream entering the layer for the positions of
    /// `runs`, in order).
    pub fn write(&mut self, runs: &[Range<usize>], h: &Tensor) -> Result<()> {
        let (n, width) = h.dims2()?;
        let total: usize = runs.iter().map(|r| r.len()).sum();
        if width != self.width || n != total {
            return Err(ModelError::Cache(format!(
                "keeping a residual stream of {n} rows of {width} for {total} positions of \
                 width {}",
                self.width
            )));
        }
        let end = runs.iter().map(|r| r.end).max().unwrap_or(0);
        if self.rows.len() < end * width {
            self.rows.resize(end * width, 0.0);
        }
        let host = h.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let mut row = 0;
        for r in runs {
            let from = row * width;
            self.rows[r.start * width..r.end * width]
                .copy_from_slice(&host[from..from + r.len() * width]);
            row += r.len();
            self.written.insert(r.clone());
        }
        Ok(())
    }

    /// The rows of the positions of `runs` (each written), as [positions, width] f32.
    pub fn rows(&self, runs: &[Range<usize>], device: &Device) -> Result<Tensor> {
        let mut out = Vec::with_capacity(runs.iter().map(|r| r.len()).sum::<usize>() * self.width);
        for r in runs {
            if self.written.moved(r.clone(), r.start).count() != r.len() {
                return Err(ModelError::Cache(format!(
                    "no residual stream kept for some of positions {}..{}",
                    r.start, r.end
                )));
            }
            out.extend_from_slice(&self.rows[r.start * self.width..r.end * self.width]);
        }
        let n = out.len() / self.width.max(1);
        Ok(Tensor::from_vec(out, (n, self.width), device)?)
    }

    /// The rows `other` wrote for positions of `range`, at the same positions, where
    /// both keep the same layer (otherwise nothing is copied: those positions have no row).
    pub fn copy_from(&mut self, other: &KeptResidual, range: Range<usize>) {
        if other.layer != self.layer || other.width != self.width {
            return;
        }
        let w = self.width;
        for r in other.written.moved(range.clone(), range.start).runs() {
            if self.rows.len() < r.end * w {
                self.rows.resize(r.end * w, 0.0);
            }
            self.rows[r.start * w..r.end * w].copy_from_slice(&other.rows[r.start * w..r.end * w]);
            self.written.insert(r.clone());
        }
    }

    /// Forget every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.written.truncate(len);
        self.rows.truncate(len * self.width);
    }

    /// Positions `0..len` alone, copying no row past them.
    pub fn prefix(&self, len: usize) -> Self {
        let mut written = self.written.clone();
        written.truncate(len);
        Self {
            layer: self.layer,
            width: self.width,
            rows: self.rows[..(len * self.width).min(self.rows.len())].to_vec(),
            written,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_by_position_and_unwritten_ones_are_refused() -> Result<()> {
        let dev = Device::Cpu;
        let mut k = KeptResidual::new(3, 2);
        let h = Tensor::new(&[[1f32, 2.], [3., 4.], [5., 6.]], &dev)?;
        k.write(&[0..2, 5..6], &h)?;
        assert_eq!(k.written(), &PositionSet::of([0..2, 5..6]));
        let got = k.rows(&[5..6, 1..2], &dev)?.to_vec2::<f32>()?;
        assert_eq!(got, vec![vec![5., 6.], vec![3., 4.]]);
        assert!(
            k.rows(&[2..3], &dev).is_err(),
            "position 2 was never written"
        );
        // A prefix copies only the rows before its end.
        let p = k.prefix(1);
        assert_eq!(p.written(), &PositionSet::of([0..1]));
        assert_eq!(p.bytes(), 2 * 4);
        k.truncate(3);
        assert_eq!(k.written(), &PositionSet::of([0..2]));
        assert_eq!(k.bytes(), 3 * 2 * 4);
        // A copy takes the rows of the range it is given, where the layers agree.
        let mut other = KeptResidual::new(3, 2);
        other.write(&[0..1, 4..6], &h)?;
        k.copy_from(&other, 4..7);
        assert_eq!(k.written(), &PositionSet::of([0..2, 4..6]));
        assert_eq!(
            k.rows(&[4..6], &dev)?.to_vec2::<f32>()?,
            vec![vec![3., 4.], vec![5., 6.]]
        );
        let mut elsewhere = KeptResidual::new(2, 2);
        elsewhere.copy_from(&other, 0..6);
        assert!(
            elsewhere.written().is_empty(),
            "another layer's rows are not this one's"
        );
        // Rows that do not fit the positions named are refused.
        let e = k.write(&[0..1], &h).unwrap_err().to_string();
        assert!(e.contains("3 rows"), "{e}");
        Ok(())
    }
}
