//! A study's drift curves: per variant and direction, the mapped answers' F1 against the
//! expected answers by turn (token agreement with the re-prefilled answer where the
//! scripts expect none), with each turn's 95% interval as a bar.

use super::{drawing_error, register_font, write_svg_or_png, PlotError, FAMILY, SIZE};
use crate::study::report::{StudyReport, TurnStats};
use baton_method::metrics::interval::Estimate;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes the curves to `path`, as SVG or PNG by its extension.
pub fn write_study_plot(report: &StudyReport, path: &Path) -> Result<(), PlotError> {
    write_svg_or_png(
        path,
        || render_study_svg(report),
        |path| {
            let curves = Curves::of(report)?;
            register_font()?;
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, &curves)
                .and_then(|()| root.present())
                .map_err(|e| drawing_error(path, e))
        },
    )
}

pub fn render_study_svg(report: &StudyReport) -> Result<String, PlotError> {
    let curves = Curves::of(report)?;
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(&root, &curves)
            .and_then(|()| root.present())
            .map_err(|e| drawing_error(Path::new("<svg>"), e))?;
    }
    Ok(svg)
}

struct Curves {
    measure: &'static str,
    /// Name, and per turn the estimate.
    lines: Vec<(String, Vec<(i64, Estimate)>)>,
    last_turn: i64,
}

impl Curves {
    fn of(report: &StudyReport) -> Result<Self, PlotError> {
        let by_f1 = report
            .groups
            .iter()
            .any(|g| g.turns.iter().any(|t| t.f1.is_some()));
        let pick = |t: &TurnStats| if by_f1 { t.f1 } else { t.agreement };
        let lines: Vec<(String, Vec<(i64, Estimate)>)> = report
            .groups
            .iter()
            .map(|g| {
                let name = format!("{} · {}", g.variant, g.direction);
                let points = g
                    .turns
                    .iter()
                    .filter_map(|t| {
                        pick(t)
                            .filter(|e| e.value.is_finite())
                            .map(|e| (i64::from(t.turn), e))
                    })
                    .collect();
                (name, points)
            })
            .filter(|(_, p): &(String, Vec<_>)| !p.is_empty())
            .collect();
        let last_turn = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(t, _)| *t))
            .max()
            .ok_or(PlotError::NothingToPlot)?;
        Ok(Self {
            measure: if by_f1 {
                "F1 against the expected answers"
            } else {
                "token agreement with the re-prefilled answer"
            },
            lines,
            last_turn,
        })
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &Curves,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(format!("Drift by turn: {}", c.measure), (FAMILY, 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0i64..c.last_turn + 1, -0.02f64..1.02)?;
    chart
        .configure_mesh()
        .x_labels((c.last_turn + 1).clamp(2, 16) as usize)
        .x_desc("turn")
        .y_desc(c.measure)
        .label_style((FAMILY, 14))
        .draw()?;
    for (k, (name, points)) in c.lines.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|(t, e)| (*t, e.value)),
                colour.stroke_width(2),
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        chart.draw_series(
            points
                .iter()
                .filter(|(_, e)| e.ci95.iter().all(|v| v.is_finite()))
                .map(|(t, e)| PathElement::new([(*t, e.ci95[0]), (*t, e.ci95[1])], colour)),
        )?;
        chart.draw_series(
            points
                .iter()
                .map(|(t, e)| Circle::new((*t, e.value), 3, colour.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .draw()?;
    Ok(())
}
