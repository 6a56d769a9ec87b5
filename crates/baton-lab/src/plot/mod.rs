//! Charts written as SVG or PNG: the drift of a recorded session ([`session`]) and the
//! map-against-re-prefill latency sweep ([`bench`]).
//!
//! The labels use a font compiled into the binary, so neither SVG nor PNG needs a system
//! font library.

pub mod bench;
pub mod gate;
pub mod session;
pub mod study;

pub use bench::{render_bench_svg, write_bench_plot, BenchSeries};
pub use session::{render_svg, write_plot};

use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub(crate) const SIZE: (u32, u32) = (960, 720);
const FONT: &[u8] = include_bytes!("../../../../assets/fonts/DejaVuSans-subset.ttf");
pub(crate) const FAMILY: &str = "sans-serif";

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the session has no switch and no compared turn: nothing to plot")]
    NothingToPlot,
    #[error("cannot plot to {}: only .svg and .png files are written", path.display())]
    UnsupportedFormat { path: PathBuf },
    #[error("cannot write the plot {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the font compiled into baton for plot labels did not load")]
    Font,
    #[error("cannot draw the plot {}: {detail}", path.display())]
    Draw { path: PathBuf, detail: String },
}

/// Writes `svg()` to a .svg `path`, or has `png` draw a .png one; refuses other names.
pub(crate) fn write_svg_or_png(
    path: &Path,
    svg: impl FnOnce() -> Result<String, PlotError>,
    png: impl FnOnce(&Path) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => std::fs::write(path, svg()?).map_err(|source| PlotError::Write {
            path: path.to_path_buf(),
            source,
        }),
        Some("png") => png(path),
        _ => Err(PlotError::UnsupportedFormat {
            path: path.to_path_buf(),
        }),
    }
}

pub(crate) fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    ok.then_some(()).ok_or(PlotError::Font)
}

pub(crate) fn drawing_error<E: std::error::Error + Send + Sync>(
    path: &Path,
    e: DrawingAreaErrorKind<E>,
) -> PlotError {
    PlotError::Draw {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}
