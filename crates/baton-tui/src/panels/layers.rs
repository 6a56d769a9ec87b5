//! How faithful the last switch's mapped cache was, layer by layer: attention-output
//! cosine, K/V R², or key-error concentration (the `l` key cycles them).

use super::columns::{self, Column};
use super::{fmt_percent, panel, BAD, BOLD, DIM};
use crate::layout::inner;
use crate::wrap::wrap;
use baton_protocol::{finite_mean, SwitchMetrics};
use baton_protocol::{Measure, SwitchRow};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;

/// Which per-layer measure the layer panel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerView {
    #[default]
    Cosine,
    R2,
    Concentration,
}

impl LayerView {
    pub fn next(self) -> Self {
        match self {
            Self::Cosine => Self::R2,
            Self::R2 => Self::Concentration,
            Self::Concentration => Self::Cosine,
        }
    }
}

/// The layer panel. It keeps which measure it shows (Ctrl-L cycles them); the switch to
/// show is handed to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Layers {
    measure: LayerView,
}

impl Layers {
    pub fn measure(&self) -> LayerView {
        self.measure
    }

    pub fn next_measure(&mut self) {
        self.measure = self.measure.next();
    }

    /// Draw the per-layer fidelity of `last`, the newest switch.
    pub fn draw(&self, frame: &mut Frame, area: Rect, last: Option<&SwitchRow>) {
        let Some(s) = last else {
            empty(
                frame,
                area,
                "No switch yet: the per-layer fidelity of the mapped cache shows here after one.",
            );
            return;
        };
        match &s.metrics {
            Some(m) => chart(frame, area, self.measure, s, m),
            None => empty(frame, area, &unmeasured(s)),
        }
    }
}

/// Why the newest switch has no per-layer metrics.
fn unmeasured(s: &SwitchRow) -> String {
    match &s.measure {
        Measure::Pending => format!(
            "Measuring the per-layer fidelity of switch #{}… (your next message goes first)",
            s.index + 1
        ),
        Measure::Stopped(why) => {
            format!("No per-layer metrics for this switch: its measurement {why}.")
        }
        Measure::Done => {
            "No per-layer metrics for this switch: they need the reference path (Ctrl-R)."
                .to_string()
        }
    }
}

/// Which way is better for a measure, so the worst layer can be marked.
#[derive(Clone, Copy)]
enum Better {
    Higher,
    Lower,
}

struct Series<'a> {
    name: &'static str,
    short: &'static str,
    values: &'a [f64],
    color: Color,
    better: Better,
}

fn chart(frame: &mut Frame, area: Rect, view: LayerView, s: &SwitchRow, m: &SwitchMetrics) {
    let series = series(view, m);
    let (lo, hi) = scale(view, &series);
    frame.render_widget(panel(title(view, &series, area.width)), area);
    let body = inner(area);
    if body.height < 3 || body.width < 4 {
        return;
    }
    let mut info = Vec::new();
    if let Some(f) = fidelity(s) {
        info.push((f, BOLD));
    }
    info.push((format!("axis {lo:.2}–{hi:.2}"), DIM));
    info.push(("Ctrl-L: next measure".to_string(), DIM));
    let mut spans = Vec::new();
    let mut used = 0;
    for (text, style) in info {
        let sep = if spans.is_empty() { 0 } else { 3 };
        if used + sep + text.width() > body.width as usize {
            break;
        }
        if sep > 0 {
            spans.push(Span::styled(" · ", DIM));
        }
        used += sep + text.width();
        spans.push(Span::styled(text, style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), body);
    let chart = Rect {
        y: body.y + 1,
        height: body.height - 1,
        ..body
    };
    let n = series.iter().map(|s| s.values.len()).max().unwrap_or(0);
    let (bar, gap, fits) = columns::fit(n, chart.width, 3);
    let buf = frame.buffer_mut();
    let [bars, axis] = Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(chart);
    let parts = Layout::vertical(vec![Constraint::Fill(1); series.len()]).split(bars);
    for (one, part) in series.iter().zip(parts.iter()) {
        let labelled = series.len() > 1 && part.height >= 2;
        let plot = if labelled {
            let label = Line::from(vec![
                Span::styled(one.name, BOLD.fg(one.color)),
                Span::styled(format!(" · {}", summary(one, false)), DIM),
            ]);
            buf.set_line(part.x, part.y, &label, part.width);
            Rect {
                y: part.y + 1,
                height: part.height - 1,
                ..*part
            }
        } else {
            *part
        };
        let cols = columns_of(one, lo, hi, fits);
        columns::draw(buf, plot, &cols, bar, gap);
    }
    draw_axis(buf, axis, fits, n, bar, gap);
}

fn empty(frame: &mut Frame, area: Rect, text: &str) {
    let body = inner(area);
    frame.render_widget(
        Paragraph::new(wrap(&[(text, DIM)], body.width as usize))
            .block(panel(Line::from(" per-layer fidelity "))),
        area,
    );
}

fn series(view: LayerView, m: &SwitchMetrics) -> Vec<Series<'_>> {
    match view {
        LayerView::Cosine => vec![Series {
            name: "attention cosine",
            short: "cosine",
            values: &m.attention_cosine,
            color: Color::Cyan,
            better: Better::Higher,
        }],
        LayerView::R2 => vec![
            Series {
                name: "K R²",
                short: "K R²",
                values: &m.r2_k,
                color: Color::Blue,
                better: Better::Higher,
            },
            Series {
                name: "V R²",
                short: "V R²",
                values: &m.r2_v,
                color: Color::Magenta,
                better: Better::Higher,
            },
        ],
        LayerView::Concentration => vec![Series {
            name: "key-error concentration",
            short: "concentration",
            values: &m.key_error_concentration,
            color: Color::Cyan,
            better: Better::Lower,
        }],
    }
}

fn finite(values: &[f64]) -> impl Iterator<Item = (usize, f64)> + '_ {
    values
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
}

/// The worst layer and its value.
fn worst(s: &Series) -> Option<(usize, f64)> {
    finite(s.values).reduce(|a, b| {
        let b_worse = match s.better {
            Better::Higher => b.1 < a.1,
            Better::Lower => b.1 > a.1,
        };
        if b_worse {
            b
        } else {
            a
        }
    })
}

fn summary(s: &Series, compact: bool) -> String {
    let word = match s.better {
        Better::Higher => "min",
        Better::Lower => "max",
    };
    if let Some(layer) = s.values.iter().position(|v| !v.is_finite()) {
        // A mean without that layer would look better than the cache is.
        return if compact {
            format!("layer {layer} not computed")
        } else {
            format!("mean n/a · layer {layer} could not be computed")
        };
    }
    match (finite_mean(s.values.iter().copied()), worst(s)) {
        (Some(mean), Some((_, w))) if compact => format!("mean {mean:.3} · {word} {w:.3}"),
        (Some(mean), Some((layer, w))) => {
            format!("mean {mean:.3} · {word} {w:.3} (layer {layer})")
        }
        _ => "no finite values".into(),
    }
}

/// The longest title that fits `width`: the measure, its mean and its worst layer.
fn title(view: LayerView, series: &[Series], width: u16) -> Line<'static> {
    let candidates = match (view, series) {
        (LayerView::R2, _) => vec![" per-layer K/V R² ".to_string(), " K/V R² ".to_string()],
        (_, [one]) => vec![
            format!(" per-layer {} · {} ", one.name, summary(one, false)),
            format!(" {} · {} ", one.name, summary(one, false)),
            format!(" {} · {} ", one.short, summary(one, false)),
            format!(" {} · {} ", one.short, summary(one, true)),
        ],
        _ => vec![" per-layer fidelity ".to_string()],
    };
    let room = width.saturating_sub(2) as usize;
    let fits = candidates.iter().find(|t| t.width() <= room);
    Line::from(fits.or(candidates.last()).cloned().unwrap_or_default())
}

/// The value range the bars span. Good caches sit just below 1, where a zero-based axis
/// would make every layer look the same, so cosine and R² start just under the worst.
fn scale(view: LayerView, series: &[Series]) -> (f64, f64) {
    let values = || series.iter().flat_map(|s| finite(s.values).map(|(_, v)| v));
    match view {
        LayerView::Cosine | LayerView::R2 => {
            let min = values().fold(f64::INFINITY, f64::min);
            if !min.is_finite() {
                return (0.0, 1.0);
            }
            let lo = (((min - 0.02) * 10.0).floor() / 10.0).clamp(-1.0, 0.9);
            (lo, 1.0)
        }
        LayerView::Concentration => {
            let max = values().fold(1.0, f64::max);
            (0.0, (max * 2.0).ceil() / 2.0)
        }
    }
}

fn columns_of(s: &Series, lo: f64, hi: f64, fits: usize) -> Vec<Column> {
    let worst = worst(s).map(|(i, _)| i);
    let span = (hi - lo).max(f64::EPSILON);
    s.values
        .iter()
        .take(fits)
        .enumerate()
        .map(|(i, v)| {
            let color = if Some(i) == worst {
                BAD
            } else if matches!(s.better, Better::Lower) && *v > 1.0 {
                super::WARN
            } else {
                s.color
            };
            Column {
                fill: (v - lo) / span,
                style: Style::new().fg(color),
            }
        })
        .collect()
}

/// Layer numbers under the bars, as many as fit without touching.
fn draw_axis(buf: &mut Buffer, axis: Rect, fits: usize, n: usize, bar: u16, gap: u16) {
    let pitch = (bar + gap).max(1) as usize;
    let step = [1, 2, 4, 5, 10, 20, 50, 100]
        .into_iter()
        .find(|s| s * pitch >= 3)
        .unwrap_or(100);
    let mut free = axis.x as usize;
    for i in (0..fits).step_by(step) {
        let x = axis.x as usize + columns::offset(i, bar, gap);
        let label = i.to_string();
        if x < free || x + label.len() > axis.right() as usize {
            continue;
        }
        buf.set_string(x as u16, axis.y, &label, DIM);
        free = x + label.len() + 1;
    }
    if fits < n {
        let more = format!("+{}", n - fits);
        let x = axis.right().saturating_sub(more.len() as u16);
        buf.set_string(x, axis.y, more, Style::new().fg(super::WARN));
    }
}

/// Next-token agreement and KL of the mapped cache against the re-prefilled one,
/// measured on the turn after the switch.
fn fidelity(s: &SwitchRow) -> Option<String> {
    let (top1, kl) = match (s.follow_up, &s.metrics) {
        (Some(f), _) => (f.top1_agreement, f.kl),
        (None, Some(m)) => (m.top1_agreement, m.kl),
        (None, None) => (None, None),
    };
    let mut parts = Vec::new();
    if let Some(a) = top1 {
        parts.push(format!("top-1 {}", fmt_percent(a)));
    }
    if let Some(kl) = kl {
        parts.push(format!("KL {kl:.3}"));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}
