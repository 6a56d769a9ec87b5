//! `baton bench --plot`: map and re-prefill time against context length, both axes
//! logarithmic, one pair of lines per direction, so the gap and how each grows are seen
//! at a glance.

use super::{drawing_error, register_font, write_svg_or_png, PlotError, FAMILY, SIZE};
use crate::bench::BenchPoint;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One direction's measured points.
pub struct BenchSeries<'a> {
    pub direction: &'a str,
    pub points: &'a [BenchPoint],
}

const COLORS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];

/// Writes the chart to `path`, as SVG or PNG by its extension.
pub fn write_bench_plot(series: &[BenchSeries<'_>], path: &Path) -> Result<(), PlotError> {
    write_svg_or_png(
        path,
        || render_bench_svg(series),
        |path| {
            register_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, series)
                .and_then(|()| root.present())
                .map_err(|e| drawing_error(path, e))
        },
    )
}

/// The chart as an SVG document.
pub fn render_bench_svg(series: &[BenchSeries<'_>]) -> Result<String, PlotError> {
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(&root, series)
            .and_then(|()| root.present())
            .map_err(|e| drawing_error(Path::new("<svg>"), e))?;
    }
    Ok(svg)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    series: &[BenchSeries<'_>],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter())
        .flat_map(|p| {
            [p.map_full.median_ms, p.reprefill_full.median_ms]
                .into_iter()
                .map(move |ms| (p.tokens as f64, ms))
        })
        .filter(|&(t, ms)| positive(t) && positive(ms))
        .collect();
    let (x0, x1) = all.iter().fold((f64::INFINITY, 0.0f64), |(a, b), &(t, _)| {
        (a.min(t), b.max(t))
    });
    let (y0, y1) = all
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &(_, ms)| {
            (a.min(ms), b.max(ms))
        });
    let (x0, x1) = if all.is_empty() {
        (1.0, 10.0)
    } else {
        (x0 / 1.25, x1 * 1.25)
    };
    let (y0, y1) = if all.is_empty() {
        (1.0, 10.0)
    } else {
        (y0 / 1.5, y1 * 1.5)
    };
    let mut chart = ChartBuilder::on(root)
        .caption("Map vs re-prefill by context length", (FAMILY, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("context tokens")
        .y_desc("milliseconds (median)")
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = |f: &dyn Fn(&BenchPoint) -> f64| -> Vec<(f64, f64)> {
            s.points
                .iter()
                .map(|p| (p.tokens as f64, f(p)))
                .filter(|&(t, ms)| positive(t) && positive(ms))
                .collect()
        };
        let reprefill = pts(&|p| p.reprefill_full.median_ms);
        let map = pts(&|p| p.map_full.median_ms);
        chart
            .draw_series(LineSeries::new(reprefill, color.stroke_width(2)).point_size(4))?
            .label(format!("{}: re-prefill", s.direction))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        let light = color.mix(0.55);
        chart
            .draw_series(
                map.iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, light.filled()))
                    .collect::<Vec<_>>(),
            )?
            .label(format!("{}: map", s.direction))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, light.filled()));
        chart.draw_series(LineSeries::new(map, light.stroke_width(2)))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Spread;

    fn point(tokens: usize, map: f64, reprefill: f64) -> BenchPoint {
        let s = |ms: f64| Spread {
            median_ms: ms,
            min_ms: ms,
            max_ms: ms,
        };
        BenchPoint {
            tokens,
            suffix: 64,
            source_prefill: s(reprefill / 3.0),
            reprefill_full: s(reprefill),
            map_full: s(map),
            map_suffix: s(map / 10.0),
            reprefill_suffix: s(reprefill / 10.0),
            switch_end_to_end: s(map),
            speedup_full: reprefill / map,
            speedup_suffix: reprefill / map,
            handoff_with_reread: None,
            reread_share_of_reprefill: None,
        }
    }

    #[test]
    fn the_svg_names_both_series_of_every_direction() {
        let a = [point(128, 2.0, 900.0), point(1024, 16.0, 8000.0)];
        let b = [point(128, 1.5, 300.0), point(1024, 12.0, 3000.0)];
        let svg = render_bench_svg(&[
            BenchSeries {
                direction: "a -> b",
                points: &a,
            },
            BenchSeries {
                direction: "b -> a",
                points: &b,
            },
        ])
        .unwrap();
        for label in [
            "Map vs re-prefill by context length",
            "a -&gt; b: re-prefill",
            "a -&gt; b: map",
            "b -&gt; a: re-prefill",
            "b -&gt; a: map",
        ] {
            assert!(svg.contains(label), "no `{label}` in the SVG");
        }
    }

    #[test]
    fn an_unknown_extension_is_refused() {
        let e = write_bench_plot(&[], Path::new("out.gif")).unwrap_err();
        assert!(matches!(e, PlotError::UnsupportedFormat { .. }), "{e}");
    }
}
