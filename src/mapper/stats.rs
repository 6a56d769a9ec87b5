//! Streaming, mergeable sufficient statistics of paired source/target features.
//!
//! # What is kept
//!
//! For `n` paired observations `x` (all source layers concatenated, layer-major, width
//! `D_x = L_s·D_s`) and `y` (all target layers, width `D_y = L_t·D_t`):
//!
//! - the count `n`,
//! - the means `μ_x` (`D_x`) and `μ_y` (`D_y`),
//! - the centred Gram `C_xx = Σ (x−μ_x)(x−μ_x)ᵀ` (`D_x × D_x`, f64),
//! - the centred cross moments `C_xy = Σ (x−μ_x)(y−μ_y)ᵀ` (`D_x × D_y`, f64),
//! - the centred sum of squares of every target column `s_yy = Σ (y−μ_y)²` (`D_y`).
//!
//! These carry exactly the information of the raw sums (Σx, Σy, XᵀX, XᵀY, Σy² per
//! column: `XᵀX = C_xx + n μ_x μ_xᵀ` and so on, see [`PairStats::sum_x`] and friends), but
//! centred moments are what the ridge fit needs, and keeping them centred avoids the
//! cancellation `XᵀX − n μμᵀ` suffers when a feature's mean is large against its spread
//! (RoPE-stripped keys have channels like that). Batches and whole statistics objects are
//! combined with the pairwise update of Chan, Golub and LeVeque, which is exact in exact
//! arithmetic, so streaming in any batching, or merging any split, gives the same
//! statistics up to rounding.
//!
//! # Memory
//!
//! `≈ 8·D_x² + 8·D_x·D_y` bytes (plus a few vectors), independent of `n`:
//!
//! | pair (features K or V)                 | `D_x` | `D_y` | `C_xx`  | `C_xy`  |
//! |----------------------------------------|-------|-------|---------|---------|
//! | Qwen2.5 0.5B → 1.5B (24×128 → 28×256)  | 3072  | 7168  | ~75 MB  | ~176 MB |
//! | Qwen2.5 1.5B → 0.5B (28×256 → 24×128)  | 7168  | 3072  | ~411 MB | ~176 MB |
//!
//! and one object each for K and for V. `C_xx` is stored as a full square of which only the
//! lower triangle is maintained: that saves no memory, but halves the update's arithmetic
//! for `C_xx` (and keeps the matrix a plain column-major buffer for faer).
//!
//! A larger model pair does not fit this way (Qwen3 14B → 32B: `D_x = 40·1024`, so `C_xx`
//! alone is ~13 GB). The scalable calibration is two passes over the corpus: first
//! per-source-layer diagonal blocks `C_{x_i x_i}` with per-layer cross moments (enough for
//! the single-layer R² ranking in [`crate::mapper::select`], memory `L_s·8·D_s² +
//! 8·D_x·D_y`), then, once the top-k source layers of every target layer are known, only
//! the Gram blocks among the union of selected layers. This type covers the models this
//! workbench runs on a CPU, where one pass with everything is simpler and lets k be swept
//! freely afterwards.
//!
//! # File format
//!
//! [`PairStats::save`] writes a safetensors file (readable from Python with
//! `safetensors.numpy.load_file`). Header metadata: `format = "baton.pair_stats"`,
//! `version = "1"`, `l_s`, `d_s`, `l_t`, `d_t`, `count` (decimal strings). Tensors, all F64,
//! row-major:
//!
//! - `mean_x` `[D_x]`, `mean_y` `[D_y]`, `syy` `[D_y]` (centred sums of squares);
//! - `cxx.{i}` `[D_s, D_x]` for each source layer `i`: rows `i·D_s .. (i+1)·D_s` of the full
//!   symmetric `C_xx`;
//! - `cxy.{i}` `[D_s, D_y]` for each source layer `i`: the same rows of `C_xy`.
//!
//! The big matrices are split by source layer so that writing never needs a second copy of
//! a whole matrix in memory, and so a reader can take only the layers it needs.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;
use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;

use super::error::{MapperError, Result};

const FORMAT: &str = "baton.pair_stats";
const VERSION: &str = "1";

/// Sufficient statistics of paired observations for the ridge mapper: see the module
/// documentation for what is kept, how memory scales and the file format.
#[derive(Clone, PartialEq)]
pub struct PairStats {
    l_s: usize,
    d_s: usize,
    l_t: usize,
    d_t: usize,
    count: u64,
    mean_x: Vec<f64>,
    mean_y: Vec<f64>,
    /// `D_x × D_x`, column-major; lower triangle (with diagonal) maintained, strict upper
    /// triangle always zero.
    cxx: Vec<f64>,
    /// `D_x × D_y`, column-major.
    cxy: Vec<f64>,
    syy: Vec<f64>,
}

impl fmt::Debug for PairStats {
    // The matrices run to hundreds of megabytes: print the geometry, never the data.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairStats")
            .field("l_s", &self.l_s)
            .field("d_s", &self.d_s)
            .field("l_t", &self.l_t)
            .field("d_t", &self.d_t)
            .field("count", &self.count)
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

impl PairStats {
    /// Empty statistics for `l_s` source layers of width `d_s` and `l_t` target layers of
    /// width `d_t`. Allocates the full matrices up front (see [`PairStats::estimate_bytes`]).
    pub fn new(l_s: usize, d_s: usize, l_t: usize, d_t: usize) -> Result<Self> {
        Self::estimate_bytes(l_s, d_s, l_t, d_t)?;
        let dx = l_s * d_s;
        let dy = l_t * d_t;
        Ok(Self {
            l_s,
            d_s,
            l_t,
            d_t,
            count: 0,
            mean_x: vec![0.0; dx],
            mean_y: vec![0.0; dy],
            cxx: vec![0.0; dx * dx],
            cxy: vec![0.0; dx * dy],
            syy: vec![0.0; dy],
        })
    }

    /// Bytes that statistics of this geometry hold, without allocating them; errors on a
    /// zero dimension or on a size that overflows.
    pub fn estimate_bytes(l_s: usize, d_s: usize, l_t: usize, d_t: usize) -> Result<usize> {
        if l_s == 0 || d_s == 0 || l_t == 0 || d_t == 0 {
            return Err(MapperError::Geometry(format!(
                "every dimension must be positive (l_s {l_s}, d_s {d_s}, l_t {l_t}, d_t {d_t})"
            )));
        }
        let overflow = || {
            MapperError::Geometry(format!(
                "statistics for {l_s}×{d_s} → {l_t}×{d_t} do not fit in memory"
            ))
        };
        let dx = l_s.checked_mul(d_s).ok_or_else(overflow)?;
        let dy = l_t.checked_mul(d_t).ok_or_else(overflow)?;
        let elems = dx
            .checked_mul(dx)
            .and_then(|a| dx.checked_mul(dy).and_then(|b| a.checked_add(b)))
            .and_then(|a| a.checked_add(dx + 2 * dy))
            .ok_or_else(overflow)?;
        elems.checked_mul(8).ok_or_else(overflow)
    }

    pub fn l_s(&self) -> usize {
        self.l_s
    }
    pub fn d_s(&self) -> usize {
        self.d_s
    }
    pub fn l_t(&self) -> usize {
        self.l_t
    }
    pub fn d_t(&self) -> usize {
        self.d_t
    }
    /// Total source feature width `L_s·D_s`.
    pub fn dx(&self) -> usize {
        self.l_s * self.d_s
    }
    /// Total target feature width `L_t·D_t`.
    pub fn dy(&self) -> usize {
        self.l_t * self.d_t
    }
    /// Number of observations accumulated.
    pub fn count(&self) -> u64 {
        self.count
    }
    /// Bytes held by the statistics (the heap data; the struct itself is negligible).
    pub fn memory_bytes(&self) -> usize {
        8 * (self.mean_x.len()
            + self.mean_y.len()
            + self.cxx.len()
            + self.cxy.len()
            + self.syy.len())
    }

    pub fn mean_x(&self) -> &[f64] {
        &self.mean_x
    }
    pub fn mean_y(&self) -> &[f64] {
        &self.mean_y
    }
    /// Centred sum of squares of every target column, `Σ (y − μ_y)²`.
    pub fn syy(&self) -> &[f64] {
        &self.syy
    }
    /// Σx over all observations.
    pub fn sum_x(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.mean_x.iter().map(|m| m * n).collect()
    }
    /// Σy over all observations.
    pub fn sum_y(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.mean_y.iter().map(|m| m * n).collect()
    }
    /// Σy² of every target column (uncentred).
    pub fn sum_y2(&self) -> Vec<f64> {
        let n = self.count as f64;
        self.syy
            .iter()
            .zip(&self.mean_y)
            .map(|(s, m)| s + n * m * m)
            .collect()
    }

    /// The centred Gram `C_xx`; only its lower triangle (with the diagonal) is meaningful,
    /// the strict upper triangle reads as zero.
    pub fn cxx_lower(&self) -> MatRef<'_, f64> {
        let dx = self.dx();
        MatRef::from_column_major_slice(&self.cxx, dx, dx)
    }
    /// The centred cross moments `C_xy` (`D_x × D_y`).
    pub fn cxy(&self) -> MatRef<'_, f64> {
        MatRef::from_column_major_slice(&self.cxy, self.dx(), self.dy())
    }

    /// Column `c` of `C_xy` (`D_x` values: the cross moments of target feature `c` with
    /// every source feature).
    pub fn cxy_column(&self, c: usize) -> &[f64] {
        let dx = self.dx();
        &self.cxy[c * dx..(c + 1) * dx]
    }

    /// Entry `(i, j)` of the full symmetric `C_xx`.
    #[inline]
    pub fn cxx_at(&self, i: usize, j: usize) -> f64 {
        let dx = self.dx();
        if i >= j {
            self.cxx[i + j * dx]
        } else {
            self.cxx[j + i * dx]
        }
    }

    /// Adds a batch of `rows` paired observations: `x` is `rows × L_s·D_s` row-major, `y` is
    /// `rows × L_t·D_t` row-major (the layouts the caller captures in). A batch with a NaN or
    /// infinite value is rejected whole, before anything is added: one would poison the
    /// statistics for good, and they are kept and merged for a long time.
    pub fn update(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<()> {
        self.update_weighted(x, y, rows, None)
    }

    /// [`Self::update`] with a weight per observation: the moments become weighted sums
    /// (`C_xx = Σ wᵢ (xᵢ−μ)(xᵢ−μ)ᵀ` about the weighted mean), so the ridge fit from them is
    /// the weighted least-squares fit. The weights are rescaled to sum to `rows`, so the
    /// batch still counts as `rows` observations and merges with unweighted batches as
    /// one of that size would; only their proportions matter.
    pub fn update_weighted(
        &mut self,
        x: &[f32],
        y: &[f32],
        rows: usize,
        weights: Option<&[f32]>,
    ) -> Result<()> {
        let dx = self.dx();
        let dy = self.dy();
        check_batch("x", x, rows, dx)?;
        check_batch("y", y, rows, dy)?;
        if rows == 0 {
            return Ok(());
        }
        let weights = match weights {
            None => None,
            Some(w) => Some(normalised_weights(w, rows)?),
        };
        let weights = weights.as_deref();
        let na = self.count as f64;
        let nb = rows as f64;
        let n = na + nb;
        let batch_mean_x = column_means(x, rows, dx, weights);
        let batch_mean_y = column_means(y, rows, dy, weights);

        // The Chan merge term (na·nb/n)·δδᵀ is folded into the product as one extra row
        // sqrt(na·nb/n)·δ, so the big matrices are swept once per batch, not twice.
        let extra = usize::from(self.count > 0);
        let w = if self.count > 0 {
            (na * nb / n).sqrt()
        } else {
            0.0
        };
        let xc = centred_columns(x, rows, dx, &batch_mean_x, &self.mean_x, w, extra, weights);
        let yc = centred_columns(y, rows, dy, &batch_mean_y, &self.mean_y, w, extra, weights);
        let k = rows + extra;
        let xc_ref = MatRef::from_column_major_slice(&xc, k, dx);
        let yc_ref = MatRef::from_column_major_slice(&yc, k, dy);

        let par = Par::rayon(0);
        triangular::matmul(
            MatMut::from_column_major_slice_mut(&mut self.cxx, dx, dx),
            BlockStructure::TriangularLower,
            Accum::Add,
            xc_ref.transpose(),
            BlockStructure::Rectangular,
            xc_ref,
            BlockStructure::Rectangular,
            1.0,
            par,
        );
        matmul(
            MatMut::from_column_major_slice_mut(&mut self.cxy, dx, dy),
            Accum::Add,
            xc_ref.transpose(),
            yc_ref,
            1.0,
            par,
        );
        for (s, col) in self.syy.iter_mut().zip(yc.chunks_exact(k)) {
            *s += col.iter().map(|v| v * v).sum::<f64>();
        }
        let f = nb / n;
        for (m, b) in self.mean_x.iter_mut().zip(&batch_mean_x) {
            *m += (b - *m) * f;
        }
        for (m, b) in self.mean_y.iter_mut().zip(&batch_mean_y) {
            *m += (b - *m) * f;
        }
        self.count += rows as u64;
        Ok(())
    }

    /// Adds everything `other` holds, as if its observations had been streamed into `self`.
    pub fn merge(&mut self, other: &PairStats) -> Result<()> {
        if (self.l_s, self.d_s, self.l_t, self.d_t) != (other.l_s, other.d_s, other.l_t, other.d_t)
        {
            return Err(MapperError::MergeMismatch(format!(
                "{}×{} → {}×{} vs {}×{} → {}×{}",
                self.l_s, self.d_s, self.l_t, self.d_t, other.l_s, other.d_s, other.l_t, other.d_t
            )));
        }
        if other.count == 0 {
            return Ok(());
        }
        if self.count == 0 {
            self.clone_from(other);
            return Ok(());
        }
        let dx = self.dx();
        let na = self.count as f64;
        let nb = other.count as f64;
        let n = na + nb;
        let c = na * nb / n;
        let dmx: Vec<f64> = other
            .mean_x
            .iter()
            .zip(&self.mean_x)
            .map(|(b, a)| b - a)
            .collect();
        let dmy: Vec<f64> = other
            .mean_y
            .iter()
            .zip(&self.mean_y)
            .map(|(b, a)| b - a)
            .collect();
        // Column by column in parallel: the matrices are hundreds of megabytes and this is a
        // plain memory sweep.
        self.cxx
            .par_chunks_mut(dx)
            .zip(other.cxx.par_chunks(dx))
            .zip(dmx.par_iter())
            .enumerate()
            .for_each(|(j, ((col, ocol), &dj))| {
                let cj = c * dj;
                for ((a, o), d) in col[j..].iter_mut().zip(&ocol[j..]).zip(&dmx[j..]) {
                    *a += o + cj * d;
                }
            });
        self.cxy
            .par_chunks_mut(dx)
            .zip(other.cxy.par_chunks(dx))
            .zip(dmy.par_iter())
            .for_each(|((col, ocol), &dj)| {
                let cj = c * dj;
                for ((a, o), d) in col.iter_mut().zip(ocol).zip(&dmx) {
                    *a += o + cj * d;
                }
            });
        for ((s, o), d) in self.syy.iter_mut().zip(&other.syy).zip(&dmy) {
            *s += o + c * d * d;
        }
        let f = nb / n;
        for (m, d) in self.mean_x.iter_mut().zip(&dmx) {
            *m += d * f;
        }
        for (m, d) in self.mean_y.iter_mut().zip(&dmy) {
            *m += d * f;
        }
        self.count += other.count;
        Ok(())
    }

    /// Writes the statistics as a safetensors file (format in the module documentation).
    /// The file is written beside `path` and renamed into place, so a crash never leaves a
    /// truncated file where good statistics were.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut meta = HashMap::new();
        meta.insert("format".to_string(), FORMAT.to_string());
        meta.insert("version".to_string(), VERSION.to_string());
        meta.insert("l_s".to_string(), self.l_s.to_string());
        meta.insert("d_s".to_string(), self.d_s.to_string());
        meta.insert("l_t".to_string(), self.l_t.to_string());
        meta.insert("d_t".to_string(), self.d_t.to_string());
        meta.insert("count".to_string(), self.count.to_string());

        let mut tensors: Vec<(String, F64View<'_>)> = vec![
            ("mean_x".into(), F64View::vector(&self.mean_x)),
            ("mean_y".into(), F64View::vector(&self.mean_y)),
            ("syy".into(), F64View::vector(&self.syy)),
        ];
        for i in 0..self.l_s {
            tensors.push((format!("cxx.{i}"), F64View::rows(self, Block::Xx, i)));
            tensors.push((format!("cxy.{i}"), F64View::rows(self, Block::Xy, i)));
        }
        safetensors::serialize_to_file(tensors, Some(meta), path).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(source) => MapperError::Io {
                path: path.to_path_buf(),
                source,
            },
            other => MapperError::BadFile {
                path: path.to_path_buf(),
                reason: other.to_string(),
            },
        })
    }

    /// Reads statistics written by [`PairStats::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |reason: String| MapperError::BadFile {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|source| MapperError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the map is only read while this function runs, and statistics files are
        // baton's own; if another process truncates the file meanwhile, reading can fault,
        // the same trade every mmap-based safetensors reader makes to avoid holding a
        // second copy of a file that can be over half a gigabyte.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| MapperError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let st = SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
        let meta = header
            .metadata()
            .clone()
            .ok_or_else(|| bad("no header metadata".into()))?;
        let get = |key: &str| -> Result<&String> {
            meta.get(key)
                .ok_or_else(|| bad(format!("header metadata lacks `{key}`")))
        };
        if get("format")? != FORMAT {
            return Err(bad(format!(
                "format is `{}`, not `{FORMAT}`",
                get("format")?
            )));
        }
        if get("version")? != VERSION {
            return Err(bad(format!(
                "version {} is not supported (this build reads version {VERSION})",
                get("version")?
            )));
        }
        let num = |key: &str| -> Result<u64> {
            get(key)?
                .parse::<u64>()
                .map_err(|e| bad(format!("`{key}` is not a count: {e}")))
        };
        let dim = |key: &str| -> Result<usize> {
            usize::try_from(num(key)?).map_err(|e| bad(format!("`{key}` too large: {e}")))
        };
        let (l_s, d_s, l_t, d_t) = (dim("l_s")?, dim("d_s")?, dim("l_t")?, dim("d_t")?);
        // The tensors must hold every value, so a header claiming a huge geometry cannot
        // make us allocate more than the file's own size.
        let needed = Self::estimate_bytes(l_s, d_s, l_t, d_t)?;
        if needed > map.len() {
            return Err(bad(format!(
                "header claims {l_s}×{d_s} → {l_t}×{d_t} ({needed} bytes of statistics) but the file is {} bytes",
                map.len()
            )));
        }
        let mut out = Self::new(l_s, d_s, l_t, d_t)?;
        out.count = num("count")?;
        let (dx, dy, d_s) = (out.dx(), out.dy(), out.d_s);

        let read = |name: &str, shape: &[usize], sink: &mut dyn FnMut(usize, f64)| -> Result<()> {
            let t = st
                .tensor(name)
                .map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
            if t.dtype() != Dtype::F64 || t.shape() != shape {
                return Err(bad(format!(
                    "tensor `{name}` is {:?} {:?}, expected F64 {shape:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            for (k, b) in t.data().chunks_exact(8).enumerate() {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                sink(k, f64::from_le_bytes(a));
            }
            Ok(())
        };
        read("mean_x", &[dx], &mut |k, v| out.mean_x[k] = v)?;
        read("mean_y", &[dy], &mut |k, v| out.mean_y[k] = v)?;
        read("syy", &[dy], &mut |k, v| out.syy[k] = v)?;
        for i in 0..out.l_s {
            let cxx = &mut out.cxx;
            read(&format!("cxx.{i}"), &[d_s, dx], &mut |k, v| {
                let (r, c) = (i * d_s + k / dx, k % dx);
                // The file holds the full symmetric matrix; memory keeps its lower half.
                if r >= c {
                    cxx[r + c * dx] = v;
                }
            })?;
            let cxy = &mut out.cxy;
            read(&format!("cxy.{i}"), &[d_s, dy], &mut |k, v| {
                let (r, c) = (i * d_s + k / dy, k % dy);
                cxy[r + c * dx] = v;
            })?;
        }
        Ok(out)
    }
}

fn check_batch(what: &'static str, data: &[f32], rows: usize, width: usize) -> Result<()> {
    let expected = rows.saturating_mul(width);
    if data.len() != expected {
        return Err(MapperError::BatchShape {
            what,
            got: data.len(),
            expected,
            rows,
            width,
        });
    }
    if let Some(k) = data.iter().position(|v| !v.is_finite()) {
        return Err(MapperError::NonFinite {
            what,
            row: k / width,
            col: k % width,
        });
    }
    Ok(())
}

/// `w` (one per row, non-negative, finite, not all zero) scaled to sum to `rows`.
fn normalised_weights(w: &[f32], rows: usize) -> Result<Vec<f64>> {
    if w.len() != rows {
        return Err(MapperError::BatchShape {
            what: "weights",
            got: w.len(),
            expected: rows,
            rows,
            width: 1,
        });
    }
    if let Some(r) = w.iter().position(|v| !v.is_finite() || *v < 0.0) {
        return Err(MapperError::NonFinite {
            what: "weights",
            row: r,
            col: 0,
        });
    }
    let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
    if total <= 0.0 {
        return Err(MapperError::NonFinite {
            what: "weights (all zero)",
            row: 0,
            col: 0,
        });
    }
    let f = rows as f64 / total;
    Ok(w.iter().map(|&v| f64::from(v) * f).collect())
}

/// Column means of the batch, weighted by `weights` (which sum to `rows`) when given.
fn column_means(data: &[f32], rows: usize, width: usize, weights: Option<&[f64]>) -> Vec<f64> {
    let mut m = vec![0.0f64; width];
    for (r, row) in data.chunks_exact(width).enumerate() {
        let w = weights.map_or(1.0, |w| w[r]);
        for (a, v) in m.iter_mut().zip(row) {
            *a += w * f64::from(*v);
        }
    }
    let inv = 1.0 / rows as f64;
    m.iter_mut().for_each(|a| *a *= inv);
    m
}

/// The batch centred on its own mean as a column-major f64 matrix (`rows + extra` ×
/// `width`), plus (when `extra` is 1) the last row `w·(batch mean − running mean)` that
/// carries the Chan merge term. Column-major because faer's product runs about twice as
/// fast with both operands laid out that way than with the row-major input as is.
#[allow(clippy::too_many_arguments)] // one batch's layout, means, merge row and weights
fn centred_columns(
    data: &[f32],
    rows: usize,
    width: usize,
    batch_mean: &[f64],
    running_mean: &[f64],
    w: f64,
    extra: usize,
    weights: Option<&[f64]>,
) -> Vec<f64> {
    let k = rows + extra;
    let mut out = vec![0.0f64; k * width];
    for (r, row) in data.chunks_exact(width).enumerate() {
        // A row of weight w enters the products as √w·(x − μ): Σ √w·√w = Σ w.
        let s = weights.map_or(1.0, |w| w[r].sqrt());
        for (c, (v, m)) in row.iter().zip(batch_mean).enumerate() {
            out[c * k + r] = s * (f64::from(*v) - m);
        }
    }
    if extra == 1 {
        for (c, (b, a)) in batch_mean.iter().zip(running_mean).enumerate() {
            out[c * k + rows] = w * (b - a);
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Block {
    Xx,
    Xy,
}

/// A safetensors view that renders its bytes only when the writer asks, one tensor at a
/// time, so saving never holds a second copy of a whole matrix.
struct F64View<'a> {
    source: ViewSource<'a>,
    shape: Vec<usize>,
}

enum ViewSource<'a> {
    Vector(&'a [f64]),
    Rows(&'a PairStats, Block, usize),
}

impl<'a> F64View<'a> {
    fn vector(v: &'a [f64]) -> Self {
        Self {
            source: ViewSource::Vector(v),
            shape: vec![v.len()],
        }
    }
    fn rows(stats: &'a PairStats, block: Block, layer: usize) -> Self {
        let width = match block {
            Block::Xx => stats.dx(),
            Block::Xy => stats.dy(),
        };
        Self {
            source: ViewSource::Rows(stats, block, layer),
            shape: vec![stats.d_s, width],
        }
    }
}

impl View for F64View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F64
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data_len());
        match self.source {
            ViewSource::Vector(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            ViewSource::Rows(s, block, layer) => {
                let dx = s.dx();
                for r in layer * s.d_s..(layer + 1) * s.d_s {
                    match block {
                        Block::Xx => (0..dx).for_each(|c| out.extend(s.cxx_at(r, c).to_le_bytes())),
                        Block::Xy => {
                            (0..s.dy()).for_each(|c| out.extend(s.cxy[r + c * dx].to_le_bytes()))
                        }
                    }
                }
            }
        }
        Cow::Owned(out)
    }
    fn data_len(&self) -> usize {
        8 * self.shape.iter().product::<usize>()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random numbers for synthetic data (splitmix64 → uniform →
    /// Box-Muller), so tests need no RNG crate state and always see the same data.
    pub(crate) struct Rng(u64);
    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed)
        }
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub(crate) fn uniform(&mut self) -> f64 {
            ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        pub(crate) fn normal(&mut self) -> f64 {
            let (u, v) = (self.uniform(), self.uniform());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
        pub(crate) fn normals(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f32> {
            (0..n)
                .map(|_| (offset + scale * self.normal()) as f32)
                .collect()
        }
    }

    pub(crate) fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
        let scale = a
            .iter()
            .chain(b)
            .fold(0.0f64, |m, v| m.max(v.abs()))
            .max(1e-300);
        a.iter()
            .zip(b)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
            / scale
    }

    fn assert_close(a: &PairStats, b: &PairStats, tol: f64) {
        assert_eq!(a.count, b.count);
        assert!(max_rel_diff(&a.mean_x, &b.mean_x) <= tol, "mean_x");
        assert!(max_rel_diff(&a.mean_y, &b.mean_y) <= tol, "mean_y");
        assert!(max_rel_diff(&a.cxx, &b.cxx) <= tol, "cxx");
        assert!(max_rel_diff(&a.cxy, &b.cxy) <= tol, "cxy");
        assert!(max_rel_diff(&a.syy, &b.syy) <= tol, "syy");
    }

    #[test]
    fn a_weighted_batch_is_the_batch_with_rows_repeated_as_often_as_their_weight() {
        // Multiplicities summing to the row count, so both count four observations.
        let (dx, dy) = (3, 2);
        let (x, y) = data(4, dx, dy, 7);
        let repeat = [2usize, 1, 1, 0];
        let (mut rx, mut ry) = (Vec::new(), Vec::new());
        for (r, &m) in repeat.iter().enumerate() {
            for _ in 0..m {
                rx.extend_from_slice(&x[r * dx..(r + 1) * dx]);
                ry.extend_from_slice(&y[r * dy..(r + 1) * dy]);
            }
        }
        let (x2, y2) = data(5, dx, dy, 8);
        let mut repeated = PairStats::new(1, dx, 1, dy).unwrap();
        repeated.update(&x2, &y2, 5).unwrap();
        repeated.update(&rx, &ry, 4).unwrap();
        let mut weighted = PairStats::new(1, dx, 1, dy).unwrap();
        weighted.update(&x2, &y2, 5).unwrap();
        // Scaled by 3: only the proportions of the weights count.
        let w: Vec<f32> = repeat.iter().map(|&m| 3.0 * m as f32).collect();
        weighted.update_weighted(&x, &y, 4, Some(&w)).unwrap();
        assert_close(&weighted, &repeated, 1e-9);
        let mut plain = PairStats::new(1, dx, 1, dy).unwrap();
        plain.update(&x2, &y2, 5).unwrap();
        plain.update(&x, &y, 4).unwrap();
        assert!(max_rel_diff(&plain.cxx, &weighted.cxx) > 1e-3);
    }

    #[test]
    fn weights_that_are_negative_missing_or_all_zero_are_refused() {
        let (x, y) = data(2, 1, 1, 3);
        let mut s = PairStats::new(1, 1, 1, 1).unwrap();
        for w in [&[1.0f32, -1.0][..], &[1.0], &[0.0, 0.0], &[f32::NAN, 1.0]] {
            assert!(s.update_weighted(&x, &y, 2, Some(w)).is_err(), "{w:?}");
        }
        assert_eq!(s.count(), 0);
    }

    /// Straightforward f64 reference: raw sums, then centre.
    fn naive(
        x: &[f32],
        y: &[f32],
        rows: usize,
        dx: usize,
        dy: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mx = column_means(x, rows, dx, None);
        let my = column_means(y, rows, dy, None);
        let mut cxx = vec![0.0; dx * dx];
        let mut cxy = vec![0.0; dx * dy];
        let mut syy = vec![0.0; dy];
        for r in 0..rows {
            let xr: Vec<f64> = (0..dx).map(|i| f64::from(x[r * dx + i]) - mx[i]).collect();
            let yr: Vec<f64> = (0..dy).map(|j| f64::from(y[r * dy + j]) - my[j]).collect();
            for j in 0..dx {
                for i in j..dx {
                    cxx[i + j * dx] += xr[i] * xr[j];
                }
            }
            for j in 0..dy {
                for i in 0..dx {
                    cxy[i + j * dx] += xr[i] * yr[j];
                }
                syy[j] += yr[j] * yr[j];
            }
        }
        (cxx, cxy, syy)
    }

    fn data(rows: usize, dx: usize, dy: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = Rng::new(seed);
        // Large offsets on purpose: centring must not lose the spread to cancellation.
        (
            rng.normals(rows * dx, 1.0, 30.0),
            rng.normals(rows * dy, 2.0, -7.0),
        )
    }

    #[test]
    fn one_batch_matches_naive() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 57);
        let (x, y) = data(rows, l_s * d_s, l_t * d_t, 1);
        let mut s = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        s.update(&x, &y, rows).unwrap();
        let (cxx, cxy, syy) = naive(&x, &y, rows, l_s * d_s, l_t * d_t);
        assert!(max_rel_diff(&s.cxx, &cxx) < 1e-12);
        assert!(max_rel_diff(&s.cxy, &cxy) < 1e-12);
        assert!(max_rel_diff(&s.syy, &syy) < 1e-12);
        let sum_y2: Vec<f64> = (0..l_t * d_t)
            .map(|j| {
                (0..rows)
                    .map(|r| f64::from(y[r * l_t * d_t + j]).powi(2))
                    .sum()
            })
            .collect();
        assert!(max_rel_diff(&s.sum_y2(), &sum_y2) < 1e-12);
    }

    #[test]
    fn streaming_and_merge_match_one_batch() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 300);
        let (dx, dy) = (l_s * d_s, l_t * d_t);
        let (mut x, mut y) = data(rows, dx, dy, 2);
        // Drift, so batches have different means and the merge terms carry real weight.
        for (k, v) in x.iter_mut().enumerate() {
            *v += 0.3 * (k / dx) as f32;
        }
        for (k, v) in y.iter_mut().enumerate() {
            *v -= 0.2 * (k / dy) as f32;
        }
        let mut whole = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        whole.update(&x, &y, rows).unwrap();

        let mut streamed = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        let mut start = 0;
        for len in [1, 7, 100, 0, 64, 128] {
            streamed
                .update(
                    &x[start * dx..(start + len) * dx],
                    &y[start * dy..(start + len) * dy],
                    len,
                )
                .unwrap();
            start += len;
        }
        assert_eq!(start, rows);
        assert_close(&streamed, &whole, 1e-9);

        let split = 123;
        let mut a = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        let mut b = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        a.update(&x[..split * dx], &y[..split * dy], split).unwrap();
        b.update(&x[split * dx..], &y[split * dy..], rows - split)
            .unwrap();
        a.merge(&b).unwrap();
        assert_close(&a, &whole, 1e-9);

        let mut empty = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        empty.merge(&whole).unwrap();
        assert_close(&empty, &whole, 0.0);
        let other_shape = PairStats::new(l_s, d_s, l_t, d_t + 1).unwrap();
        assert!(matches!(
            whole.merge(&other_shape),
            Err(MapperError::MergeMismatch(_))
        ));
    }

    #[test]
    fn bad_batches_are_rejected_untouched() {
        let mut s = PairStats::new(2, 3, 1, 2).unwrap();
        let x = vec![1.0f32; 2 * 6];
        let mut y = vec![1.0f32; 2 * 2];
        assert!(matches!(
            s.update(&x, &y, 3),
            Err(MapperError::BatchShape { .. })
        ));
        y[3] = f32::NAN;
        let err = s.update(&x, &y, 2).unwrap_err();
        assert!(
            matches!(
                err,
                MapperError::NonFinite {
                    what: "y",
                    row: 1,
                    col: 1
                }
            ),
            "{err}"
        );
        assert_eq!(s.count(), 0);
        assert!(PairStats::new(0, 3, 1, 2).is_err());
    }

    #[test]
    fn save_load_round_trip_is_exact() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 40);
        let (x, y) = data(rows, l_s * d_s, l_t * d_t, 3);
        let mut s = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        s.update(&x, &y, rows).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.stats.safetensors");
        s.save(&path).unwrap();
        let back = PairStats::load(&path).unwrap();
        assert!(back == s, "round trip changed the statistics");

        // The file is plain safetensors with the full symmetric Gram.
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("cxx.1").unwrap();
        assert_eq!(t.shape(), &[d_s, l_s * d_s]);
        let v = |k: usize| f64::from_le_bytes(t.data()[8 * k..8 * k + 8].try_into().unwrap());
        // row 4 (layer 1, first row), column 9 is upper-triangle in memory: mirrored from (9, 4).
        assert_eq!(v(9), s.cxx_at(9, 4));

        std::fs::write(&path, b"not safetensors").unwrap();
        assert!(matches!(
            PairStats::load(&path),
            Err(MapperError::BadFile { .. })
        ));
    }

    #[test]
    fn memory_estimates_match_the_documented_figures() {
        let fwd = PairStats::estimate_bytes(24, 128, 28, 256).unwrap();
        let rev = PairStats::estimate_bytes(28, 256, 24, 128).unwrap();
        let mb = |b: usize| b as f64 / 1e6;
        assert!((mb(fwd) - (75.5 + 176.2)).abs() < 1.0, "{}", mb(fwd));
        assert!((mb(rev) - (411.0 + 176.2)).abs() < 1.0, "{}", mb(rev));
    }
}
