//! The statistics on disk.
//!
//! [`PairStats::save`] writes a safetensors file (readable from Python with
//! `safetensors.numpy.load_file`). Header metadata: `format = "baton.pair_stats"`,
//! `version = "2"`, `l_s`, `d_s`, `l_t`, `d_t`, `count` (decimal strings). Tensors,
//! row-major:
//!
//! - `mean_x` `[D_x]`, `mean_y` `[D_y]`, `syy` `[D_y]` (centred sums of squares), F64;
//! - `cxx.{i}` `[D_s, D_x]` for each source layer `i`: rows `i·D_s .. (i+1)·D_s` of the full
//!   symmetric `C_xx`, F32;
//! - `cxy.{i}` `[D_s, D_y]` for each source layer `i`: the same rows of `C_xy`, F32.
//!
//! The big matrices are split by source layer so that writing never needs a second copy of
//! a whole matrix in memory, and so a reader can take only the layers it needs. They are
//! accumulated in f64 and stored in f32: half the disk (0.9 GB instead of 1.8 GB for the
//! default pair's two directions) for a relative rounding of 6e-8 per entry, far below
//! what the ridge term already moves a solution. Version 1 files (F64 throughout) still
//! load.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;

use super::PairStats;
use crate::mapper::error::{MapperError, Result};

const FORMAT: &str = "baton.pair_stats";
const VERSION: &str = "2";
/// Files whose matrices are F64.
const VERSION_F64: &str = "1";

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

        let mut tensors: Vec<(String, StatsView<'_>)> = vec![
            ("mean_x".into(), StatsView::vector(&self.mean_x)),
            ("mean_y".into(), StatsView::vector(&self.mean_y)),
            ("syy".into(), StatsView::vector(&self.syy)),
        ];
        for i in 0..self.l_s {
            tensors.push((format!("cxx.{i}"), StatsView::rows(self, Block::Xx, i)));
            tensors.push((format!("cxy.{i}"), StatsView::rows(self, Block::Xy, i)));
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
        let map = baton_runtime::os::map_file(&file).map_err(|source| MapperError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let st = SafeTensors::deserialize(&map).map_err(|e| bad_file(path, e.to_string()))?;
        let (mut out, matrices) = empty_from_header(&map, path)?;
        read_tensors(&st, &mut out, matrices, path)?;
        Ok(out)
    }
}

#[cfg(test)]
impl PairStats {
    /// These statistics as a file holds them: the matrices rounded to f32.
    pub(crate) fn as_stored(&self) -> Self {
        let mut s = self.clone();
        let round = |v: &mut f64| *v = f64::from(*v as f32);
        s.cxx.iter_mut().for_each(round);
        s.cxy.iter_mut().for_each(round);
        s
    }
}

fn bad_file(path: &Path, reason: String) -> MapperError {
    MapperError::BadFile {
        path: path.to_path_buf(),
        reason,
    }
}

/// Empty statistics of the geometry the header names, with its count, after checking the
/// format, the version and that the file is large enough to hold that geometry; and the
/// type the version stores its matrices in.
fn empty_from_header(map: &[u8], path: &Path) -> Result<(PairStats, Dtype)> {
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
    let matrices = match get("version")?.as_str() {
        VERSION => Dtype::F32,
        VERSION_F64 => Dtype::F64,
        other => {
            return Err(bad(format!(
                "version {other} is not supported (this build reads versions {VERSION_F64} and {VERSION})"
            )))
        }
    };
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
    let mut needed = PairStats::estimate_bytes(l_s, d_s, l_t, d_t)?;
    if matrices == Dtype::F32 {
        needed /= 2;
    }
    if needed > map.len() {
        return Err(bad(format!(
            "header claims {l_s}×{d_s} → {l_t}×{d_t} ({needed} bytes of statistics) but the file is {} bytes",
            map.len()
        )));
    }
    let mut out = PairStats::new(l_s, d_s, l_t, d_t)?;
    out.count = num("count")?;
    Ok((out, matrices))
}

/// The file's means, sums of squares and matrices into `out`, whose geometry the tensors
/// must have.
fn read_tensors(
    st: &SafeTensors<'_>,
    out: &mut PairStats,
    matrices: Dtype,
    path: &Path,
) -> Result<()> {
    let bad = |reason: String| bad_file(path, reason);
    let (dx, dy, d_s) = (out.dx(), out.dy(), out.d_s);
    let read = |name: &str,
                dtype: Dtype,
                shape: &[usize],
                sink: &mut dyn FnMut(usize, f64)|
     -> Result<()> {
        let t = st
            .tensor(name)
            .map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        if t.dtype() != dtype || t.shape() != shape {
            return Err(bad(format!(
                "tensor `{name}` is {:?} {:?}, expected {dtype:?} {shape:?}",
                t.dtype(),
                t.shape()
            )));
        }
        let width = if dtype == Dtype::F32 { 4 } else { 8 };
        for (k, b) in t.data().chunks_exact(width).enumerate() {
            let v = match *b {
                [a, b, c, d] => f64::from(f32::from_le_bytes([a, b, c, d])),
                [a, b, c, d, e, f, g, h] => f64::from_le_bytes([a, b, c, d, e, f, g, h]),
                _ => return Err(bad(format!("tensor `{name}` is cut short"))),
            };
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
    read("mean_x", Dtype::F64, &[dx], &mut |k, v| out.mean_x[k] = v)?;
    read("mean_y", Dtype::F64, &[dy], &mut |k, v| out.mean_y[k] = v)?;
    read("syy", Dtype::F64, &[dy], &mut |k, v| out.syy[k] = v)?;
    for i in 0..out.l_s {
        let cxx = &mut out.cxx;
        read(&format!("cxx.{i}"), matrices, &[d_s, dx], &mut |k, v| {
            let (r, c) = (i * d_s + k / dx, k % dx);
            // The file holds the full symmetric matrix; memory keeps its lower half.
            if r >= c {
                cxx[r + c * dx] = v;
            }
        })?;
        let cxy = &mut out.cxy;
        read(&format!("cxy.{i}"), matrices, &[d_s, dy], &mut |k, v| {
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
/// time, so saving never holds a second copy of a whole matrix: vectors in f64, matrix
/// rows in f32.
struct StatsView<'a> {
    source: ViewSource<'a>,
    shape: Vec<usize>,
}

enum ViewSource<'a> {
    Vector(&'a [f64]),
    Rows(&'a PairStats, Block, usize),
}

impl<'a> StatsView<'a> {
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

impl View for StatsView<'_> {
    fn dtype(&self) -> Dtype {
        match self.source {
            ViewSource::Vector(_) => Dtype::F64,
            ViewSource::Rows(..) => Dtype::F32,
        }
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
                        Block::Xx => {
                            (0..dx).for_each(|c| out.extend((s.cxx_at(r, c) as f32).to_le_bytes()))
                        }
                        Block::Xy => (0..s.dy())
                            .for_each(|c| out.extend((s.cxy[r + c * dx] as f32).to_le_bytes())),
                    }
                }
            }
        }
        Cow::Owned(out)
    }
    fn data_len(&self) -> usize {
        let width = match self.source {
            ViewSource::Vector(_) => 8,
            ViewSource::Rows(..) => 4,
        };
        width * self.shape.iter().product::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::data;
    use super::*;

    #[test]
    fn save_load_round_trip_keeps_means_exactly_and_rounds_matrices_to_f32() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 40);
        let (x, y) = data(rows, l_s * d_s, l_t * d_t, 3);
        let mut s = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        s.update(&x, &y, rows).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.stats.safetensors");
        s.save(&path).unwrap();
        let back = PairStats::load(&path).unwrap();
        // Means and counts exactly; the matrices as f32 rounds them.
        assert_eq!(back.count, s.count);
        assert_eq!(
            (&back.mean_x, &back.mean_y, &back.syy),
            (&s.mean_x, &s.mean_y, &s.syy)
        );
        let rounded = |v: f64| f64::from(v as f32);
        for (a, b) in back.cxy.iter().zip(&s.cxy) {
            assert_eq!(*a, rounded(*b));
        }
        for r in 0..s.dx() {
            for c in 0..=r {
                assert_eq!(back.cxx_at(r, c), rounded(s.cxx_at(r, c)));
            }
        }

        // The file is plain safetensors with the full symmetric Gram.
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("cxx.1").unwrap();
        assert_eq!(t.shape(), &[d_s, l_s * d_s]);
        let v = |k: usize| f32::from_le_bytes(t.data()[4 * k..4 * k + 4].try_into().unwrap());
        // row 4 (layer 1, first row), column 9 is upper-triangle in memory: mirrored from (9, 4).
        assert_eq!(v(9), s.cxx_at(9, 4) as f32);

        std::fs::write(&path, b"not safetensors").unwrap();
        assert!(matches!(
            PairStats::load(&path),
            Err(MapperError::BadFile { .. })
        ));
    }

    /// A version 1 file (F64 throughout), as earlier builds wrote it.
    fn write_version_1(s: &PairStats, path: &Path) {
        struct F64(Vec<f64>, Vec<usize>);
        impl View for &F64 {
            fn dtype(&self) -> Dtype {
                Dtype::F64
            }
            fn shape(&self) -> &[usize] {
                &self.1
            }
            fn data(&self) -> Cow<'_, [u8]> {
                Cow::Owned(self.0.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
            fn data_len(&self) -> usize {
                8 * self.0.len()
            }
        }
        let (dx, dy) = (s.dx(), s.dy());
        let mut ts = vec![
            ("mean_x".to_string(), F64(s.mean_x.clone(), vec![dx])),
            ("mean_y".to_string(), F64(s.mean_y.clone(), vec![dy])),
            ("syy".to_string(), F64(s.syy.clone(), vec![dy])),
        ];
        for i in 0..s.l_s {
            let rows = i * s.d_s..(i + 1) * s.d_s;
            let xx = rows
                .clone()
                .flat_map(|r| (0..dx).map(move |c| s.cxx_at(r, c)));
            let xy = rows.flat_map(|r| (0..dy).map(move |c| s.cxy[r + c * dx]));
            ts.push((format!("cxx.{i}"), F64(xx.collect(), vec![s.d_s, dx])));
            ts.push((format!("cxy.{i}"), F64(xy.collect(), vec![s.d_s, dy])));
        }
        let meta: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("version", VERSION_F64.to_string()),
            ("l_s", s.l_s.to_string()),
            ("d_s", s.d_s.to_string()),
            ("l_t", s.l_t.to_string()),
            ("d_t", s.d_t.to_string()),
            ("count", s.count.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let views: Vec<(String, &F64)> = ts.iter().map(|(n, t)| (n.clone(), t)).collect();
        safetensors::serialize_to_file(views, Some(meta), path).unwrap();
    }

    #[test]
    fn version_1_files_load_exactly_and_are_twice_the_size() {
        let (l_s, d_s, l_t, d_t, rows) = (3, 4, 2, 5, 40);
        let (x, y) = data(rows, l_s * d_s, l_t * d_t, 4);
        let mut s = PairStats::new(l_s, d_s, l_t, d_t).unwrap();
        s.update(&x, &y, rows).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2) = (dir.path().join("v1"), dir.path().join("v2"));
        write_version_1(&s, &v1);
        assert!(
            PairStats::load(&v1).unwrap() == s,
            "a version 1 file reads exactly"
        );
        s.save(&v2).unwrap();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len() as f64;
        let matrices = ((l_s * d_s) * (l_s * d_s + l_t * d_t)) as f64;
        // The matrices take 4 bytes an entry instead of 8; the header and vectors differ little.
        let saved = size(&v1) - size(&v2);
        assert!(
            (saved - 4.0 * matrices).abs() < 64.0,
            "{saved} vs {}",
            4.0 * matrices
        );
    }
}
