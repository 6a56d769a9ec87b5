//! The gate study as a scatter: each estimate against the measured attention cosine,
//! one point per switch, with each estimate's fitted line (the gate's drawn thicker).

use super::{drawing_error, register_font, write_svg_or_png, PlotError, FAMILY, SIZE};
use crate::eval::gate_study::GateStudy;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const POINT: RGBColor = RGBColor(31, 119, 180);
const LINE: RGBColor = RGBColor(214, 39, 40);

/// Writes the scatter to `path`, as SVG or PNG by its extension.
pub fn write_gate_plot(study: &GateStudy, path: &Path) -> Result<(), PlotError> {
    if study.switches.is_empty() {
        return Err(PlotError::NothingToPlot);
    }
    write_svg_or_png(
        path,
        || {
            register_font()?;
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
                draw(&root, study)
                    .and_then(|()| root.present())
                    .map_err(|e| drawing_error(path, e))?;
            }
            Ok(svg)
        },
        |path| {
            register_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, study)
                .and_then(|()| root.present())
                .map_err(|e| drawing_error(path, e))
        },
    )
}

fn range(v: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = v
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.05).max(1e-3);
    lo - pad..hi + pad
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    study: &GateStudy,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let cosine = range(study.switches.iter().map(|s| s.cosine));
    let panels = [
        (
            &left,
            "feature distance",
            study
                .switches
                .iter()
                .filter_map(|s| s.feature_distance.map(|d| (d, s.cosine)))
                .collect::<Vec<_>>(),
            baton_method::gate::fit::FEATURE_DISTANCE,
        ),
        (
            &right,
            "round-trip cosine",
            study
                .switches
                .iter()
                .filter_map(|s| s.round_trip.map(|r| (r, s.cosine)))
                .collect::<Vec<_>>(),
            baton_method::gate::fit::ROUND_TRIP,
        ),
    ];
    for (area, name, points, estimator) in panels {
        let xs = range(points.iter().map(|p| p.0));
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{name} vs attention cosine ({})", points.len()),
                (FAMILY, 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(xs.clone(), cosine.clone())?;
        chart
            .configure_mesh()
            .x_desc(name)
            .y_desc("measured attention cosine")
            .label_style((FAMILY, 13))
            .draw()?;
        chart.draw_series(
            points
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 3, POINT.filled())),
        )?;
        // The line fitted to this estimate, solid when it is the gate's.
        if let Some(f) = study.lines.iter().find(|l| l.estimator == estimator) {
            let kept = study.fit.as_ref().is_some_and(|k| k.estimator == estimator);
            let width = if kept { 3 } else { 1 };
            chart.draw_series(LineSeries::new(
                [xs.start, xs.end].map(|x| (x, f.predict(x))),
                LINE.stroke_width(width),
            ))?;
        }
    }
    Ok(())
}
