//! The screen before both models are ready: what is loading, how far along, how long.

use super::{panel, BAD, BOLD, DIM, WARN};
use crate::layout::{centered, inner};
use crate::records::LoadingProgress;
use crate::wrap::wrap;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Gauge, Paragraph};
use ratatui::Frame;

/// What the loading box shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loading<'a> {
    /// Said above the rest, e.g. that a quick mapper is being calibrated.
    pub note: Option<&'a str>,
    /// The latest progress the engine reported.
    pub progress: Option<&'a LoadingProgress>,
    /// The engine stopped before it was ready.
    pub stopped: bool,
    /// The error it stopped on.
    pub fatal: Option<&'a str>,
}

pub(crate) fn render(frame: &mut Frame, area: Rect, view: &Loading) {
    let width = 76.min(area.width);
    let text_width = width.saturating_sub(2) as usize;
    let mut lines = Vec::new();
    if let Some(note) = view.note {
        lines.extend(wrap(&[(note, Style::new().fg(WARN))], text_width));
        lines.push(Line::default());
    }
    if let Some(err) = view.fatal {
        lines.extend(wrap(&[(err, BOLD.fg(BAD))], text_width));
        lines.push(Line::default());
        lines.push(Line::from(Span::styled(
            "the engine has stopped: press q to quit",
            BOLD,
        )));
    }
    lines.push(Line::from(Span::styled("q quits · ? shows the keys", DIM)));
    let height = 2 + 4 + lines.len() as u16;
    let box_area = centered(area, width, height);
    frame.render_widget(panel(Line::from(" baton · loading ")), box_area);
    let body = inner(box_area);
    let [stage, gauge, rest] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(2),
        Constraint::Min(0),
    ])
    .areas(body);
    let (title, ratio, label) = match view.progress {
        // Nothing is working any more: the gauge must not look as if it were.
        _ if view.stopped => ("could not start".to_string(), 0.0, "stopped".to_string()),
        Some(p) => {
            let ratio = if p.total > 0 {
                (p.done as f64 / p.total as f64).clamp(0.0, 1.0)
            } else {
                0.0
            };
            let mut label = if p.total > 0 {
                format!("{} / {}", p.done, p.total)
            } else {
                "working".to_string()
            };
            if let Some(eta) = p.eta_seconds.filter(|e| e.is_finite()) {
                label.push_str(&format!(" · about {} left", fmt_eta(eta)));
            }
            (p.stage.clone(), ratio, label)
        }
        None => (
            "starting the engine".to_string(),
            0.0,
            "waiting".to_string(),
        ),
    };
    frame.render_widget(Paragraph::new(Line::from(Span::styled(title, BOLD))), stage);
    frame.render_widget(
        Gauge::default()
            .ratio(ratio)
            .label(Span::styled(label, BOLD))
            .gauge_style(Style::new().fg(Color::Cyan).bg(Color::DarkGray)),
        Rect {
            height: gauge.height.min(1),
            ..gauge
        },
    );
    frame.render_widget(Paragraph::new(lines), rest);
}

fn fmt_eta(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_reads_in_minutes_and_seconds() {
        assert_eq!(fmt_eta(4.4), "4 s");
        assert_eq!(fmt_eta(125.0), "2 min 05 s");
    }
}
