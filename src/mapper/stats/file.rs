//! The statistics on disk.
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
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;

use super::PairStats;
use crate::mapper::error::{MapperError, Result};

const FORMAT: &str = "baton.pair_stats";
const VERSION: &str = "1";

impl PairStats {
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
        let st = SafeTensors::deserialize(&map).map_err(|e| bad_file(path, e.to_string()))?;
        let mut out = empty_from_header(&map, path)?;
        read_tensors(&st, &mut out, path)?;
        Ok(out)
    }
}

fn bad_file(path: &Path, reason: String) -> MapperError {
    MapperError::BadFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// Empty statistics of the geometry the header names, with its count, after checking the
/// format, the version and that the file is large enough to hold that geometry.
fn empty_from_header(map: &[u8], path: &Path) -> Result<PairStats> {
    let bad = |reason: String| bad_file(path, reason);
    let (_, header) = SafeTensors::read_metadata(map).map_err(|e| bad(e.to_string()))?;
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
    let needed = PairStats::estimate_bytes(l_s, d_s, l_t, d_t)?;
    if needed > map.len() {
        return Err(bad(format!(
            "header claims {l_s}×{d_s} → {l_t}×{d_t} ({needed} bytes of statistics) but the file is {} bytes",
            map.len()
        )));
    }
    let mut out = PairStats::new(l_s, d_s, l_t, d_t)?;
    out.count = num("count")?;
    Ok(out)
}

/// The file's means, sums of squares and matrices into `out`, whose geometry the tensors
/// must have.
fn read_tensors(st: &SafeTensors<'_>, out: &mut PairStats, path: &Path) -> Result<()> {
    let bad = |reason: String| bad_file(path, reason);
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
            let v = f64::from_le_bytes(a);
            // Maps solved from these would be NaN everywhere.
            if !v.is_finite() {
                return Err(bad(format!(
                    "tensor `{name}` holds {v} at index {k}, not a finite number: the \
                     statistics are damaged; delete the file (`baton calibrate` saves them \
                     again; what was learned starts again)"
                )));
            }
            sink(k, v);
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
    Ok(())
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
mod tests {
    use super::super::tests::data;
    use super::*;

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
}
