//! Drift across a session as a chart: how faithful the mapped cache stayed turn after
//! turn, and what each switch cost against a re-prefill.

use super::{drawing_error, register_font, write_svg_or_png, PlotError, FAMILY, SIZE};
use baton_session::Report;
use plotters::coord::types::RangedCoordi64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;
use std::path::Path;

const COSINE_MEAN: RGBColor = RGBColor(31, 119, 180);
const COSINE_MIN: RGBColor = RGBColor(214, 39, 40);
const AGREEMENT: RGBColor = RGBColor(44, 160, 44);
const LEARNED: RGBColor = RGBColor(148, 103, 189);
const MAP: RGBColor = RGBColor(31, 119, 180);
const REPREFILL: RGBColor = RGBColor(255, 127, 14);

/// Writes the chart to `path`, as SVG or PNG by its extension.
pub fn write_plot(report: &Report, path: &Path) -> Result<(), PlotError> {
    write_svg_or_png(
        path,
        || render_svg(report),
        |path| {
            let series = Series::of(report)?;
            register_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, &series)
                .and_then(|()| root.present())
                .map_err(|e| drawing_error(path, e))
        },
    )
}

/// The chart as an SVG document.
pub fn render_svg(report: &Report) -> Result<String, PlotError> {
    let series = Series::of(report)?;
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(&root, &series)
            .and_then(|()| root.present())
            .map_err(|e| drawing_error(Path::new("<svg>"), e))?;
    }
    Ok(svg)
}

/// The points to draw, x being the turn: a switch sits at the first turn the new model
/// answers, so fidelity at a switch and agreement in the turns after it line up.
struct Series {
    turns: Range<i64>,
    cosine_mean: Vec<(i64, f64)>,
    cosine_min: Vec<(i64, f64)>,
    agreement: Vec<(i64, f64)>,
    /// The held-out cosine after each update the mappers took: the learning curve.
    learned: Vec<(i64, f64)>,
    map_ms: Vec<(i64, f64)>,
    reprefill_ms: Vec<(i64, f64)>,
}

impl Series {
    fn of(report: &Report) -> Result<Self, PlotError> {
        let finite = |(x, y): (i64, Option<f64>)| y.filter(|y| y.is_finite()).map(|y| (x, y));
        let per_switch =
            |f: &dyn Fn(&baton_protocol::SwitchRow) -> Option<f64>| -> Vec<(i64, f64)> {
                report
                    .switches
                    .iter()
                    .filter_map(|s| finite((i64::from(s.turn), f(s))))
                    .collect()
            };
        let series = Self {
            turns: 0..0,
            cosine_mean: per_switch(&|s| s.cosine_mean()),
            cosine_min: per_switch(&|s| s.cosine_min()),
            agreement: report
                .turns
                .iter()
                .filter_map(|t| finite((i64::from(t.turn), t.agreement)))
                .collect(),
            learned: report
                .learning
                .iter()
                .filter(|l| l.accepted)
                .filter_map(|l| finite((i64::from(l.turn), l.after)))
                .collect(),
            // The latency axis is logarithmic: a zero time has no place on it.
            map_ms: per_switch(&|s| s.timings.map_full_ms.filter(|ms| *ms > 0.0)),
            reprefill_ms: per_switch(&|s| s.timings.reprefill_full_ms.filter(|ms| *ms > 0.0)),
        };
        let xs = series
            .fidelity()
            .chain(series.latency())
            .flat_map(|s| s.iter().map(|p| p.0));
        let (lo, hi) = xs
            .fold(None, |r: Option<(i64, i64)>, x| {
                Some(r.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
            })
            .ok_or(PlotError::NothingToPlot)?;
        Ok(Self {
            turns: lo - 1..hi + 1,
            ..series
        })
    }

    fn fidelity(&self) -> impl Iterator<Item = &Vec<(i64, f64)>> {
        [
            &self.cosine_mean,
            &self.cosine_min,
            &self.agreement,
            &self.learned,
        ]
        .into_iter()
    }

    fn latency(&self) -> impl Iterator<Item = &Vec<(i64, f64)>> {
        [&self.map_ms, &self.reprefill_ms].into_iter()
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &Series,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let has_latency = s.latency().any(|v| !v.is_empty());
    let (top, bottom) = if has_latency {
        root.split_vertically(SIZE.1 * 3 / 5)
    } else {
        root.split_vertically(SIZE.1)
    };
    let x_labels = (s.turns.end - s.turns.start + 1).clamp(2, 16) as usize;

    // Cosines of a usable mapper sit in a narrow band under 1, so the axis fits the data
    // instead of starting at 0; the room left below it holds the legend.
    let lowest = s
        .fidelity()
        .flat_map(|v| v.iter().map(|p| p.1))
        .fold(1.0f64, f64::min);
    let span = (1.0 - lowest).max(0.02);
    let mut chart = ChartBuilder::on(&top)
        .caption("Drift across turns", (FAMILY, 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(s.turns.clone(), lowest - 0.45 * span..1.0 + 0.05 * span)?;
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_desc("turn")
        .y_desc("cosine / agreement")
        .label_style((FAMILY, 14))
        .draw()?;
    let fidelity = [
        ("attention cosine mean", &s.cosine_mean, COSINE_MEAN),
        ("attention cosine min", &s.cosine_min, COSINE_MIN),
        ("token agreement", &s.agreement, AGREEMENT),
        ("held-out cosine after learning", &s.learned, LEARNED),
    ];
    for (label, points, color) in fidelity {
        line(&mut chart, label, points, color)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;

    if has_latency {
        // Mapping is one to two orders of magnitude faster than a re-prefill: on a
        // linear axis it would be a flat line at zero.
        let ms = || {
            s.latency()
                .flat_map(|v| v.iter().map(|p| p.1))
                .filter(|v| *v > 0.0)
        };
        let low = ms().fold(f64::INFINITY, f64::min).min(1.0);
        let high = ms().fold(low, f64::max);
        let mut chart = ChartBuilder::on(&bottom)
            .caption("Switch cost: map vs re-prefill", (FAMILY, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(s.turns.clone(), (low / 2.0..high * 8.0).log_scale())?;
        chart
            .configure_mesh()
            .x_labels(x_labels)
            .x_desc("turn")
            .y_desc("ms (log)")
            .label_style((FAMILY, 14))
            .draw()?;
        line(&mut chart, "map ms", &s.map_ms, MAP)?;
        line(&mut chart, "re-prefill ms", &s.reprefill_ms, REPREFILL)?;
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    Ok(())
}

type Chart<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<RangedCoordi64, Y>>;

fn line<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, DB, Y>,
    label: &str,
    points: &[(i64, f64)],
    color: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if points.is_empty() {
        return Ok(());
    }
    chart
        .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)).point_size(4))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'a, DB, Y>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_session::fixtures;

    #[test]
    fn the_svg_holds_every_series_and_both_panels() {
        let svg = render_svg(&Report::from_session(&fixtures::session())).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        for label in [
            "Drift across turns",
            "attention cosine mean",
            "attention cosine min",
            "token agreement",
            "map ms",
            "re-prefill ms",
        ] {
            assert!(svg.contains(label), "no `{label}` in the SVG");
        }
        assert!(svg.matches("<polyline").count() >= 5, "{svg}");
    }

    #[test]
    fn a_session_without_switches_or_comparisons_has_nothing_to_plot() {
        let err = render_svg(&Report::from_session(&fixtures::session_of(vec![]))).unwrap_err();
        assert!(matches!(err, PlotError::NothingToPlot));
    }

    #[test]
    fn a_png_is_drawn_with_the_built_in_font() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drift.png");
        write_plot(&Report::from_session(&fixtures::session()), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    }

    #[test]
    fn other_extensions_are_refused() {
        let err = write_plot(
            &Report::from_session(&fixtures::session()),
            Path::new("drift.pdf"),
        )
        .unwrap_err();
        assert!(err.to_string().contains(".svg and .png"), "{err}");
    }
}
