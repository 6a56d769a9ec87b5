//! The lines at the bottom: what just happened, the session's state, and the keys.

use super::{short_mapper_id, BAD, BOLD, DIM, MAP, WARN};
use crate::tui::app::{App, Level};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

const SPINNER: [&str; 8] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧"];

/// What the engine is doing, then the latest notice, warning or error.
pub fn render_message(frame: &mut Frame, area: Rect, app: &App) {
    let mut spans = Vec::new();
    if let Some(doing) = activity(app) {
        spans.push(Span::styled(
            format!("{} {doing}", SPINNER[app.spinner % SPINNER.len()]),
            Style::new().fg(Color::Cyan),
        ));
    }
    if let Some(s) = &app.status {
        if !spans.is_empty() {
            spans.push(Span::styled(" │ ", DIM));
        }
        let style = match s.level {
            Level::Info => Style::default(),
            Level::Warn => Style::new().fg(WARN),
            Level::Error => BOLD.fg(BAD),
        };
        spans.push(Span::styled(s.text.clone(), style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn activity(app: &App) -> Option<String> {
    if app.phase.stopped() {
        return None;
    }
    if app.phase.answering() {
        let reference = app
            .pair
            .as_ref()
            .filter(|p| app.turn_announced && p.turn == app.latest_turn)
            .is_some_and(|p| p.mapped.stop.is_some() && p.reference.is_some());
        let model = app.active_model().map_or("the model", |m| m.name.as_str());
        return Some(if app.phase.cancelling() {
            "cancelling…".into()
        } else if reference {
            format!("{model} re-prefills for the reference answer · Esc cancels")
        } else {
            format!("{model} is answering · Esc cancels")
        });
    }
    if app.phase.switches_pending() > 0 {
        return Some("handing over…".into());
    }
    app.measuring()
        .map(|s| format!("measuring switch #{} · Esc cancels", s.index + 1))
}

/// How much the status bar leaves out to fit its line, least important first.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Fit {
    Everything,
    ShortNames,
    RecordingFileName,
    NoMappers,
    NoDevice,
}

/// Both models (the active one marked), device, context, mappers, recording, reference.
pub fn render_status(frame: &mut Frame, area: Rect, app: &App) {
    let fits = [
        Fit::Everything,
        Fit::ShortNames,
        Fit::RecordingFileName,
        Fit::NoMappers,
        Fit::NoDevice,
    ];
    let line = fits
        .iter()
        .map(|f| status_line(app, *f))
        .find(|l| l.width() <= area.width as usize)
        .unwrap_or_else(|| status_line(app, Fit::NoDevice));
    frame.render_widget(Paragraph::new(line), area);
}

fn status_line(app: &App, fit: Fit) -> Line<'static> {
    let sep = || Span::styled(" │ ", DIM);
    let mut spans = Vec::new();
    for (i, m) in app.models.iter().enumerate() {
        let name = if fit >= Fit::ShortNames {
            app.short_name(&m.name)
        } else {
            m.name.clone()
        };
        if i == app.active {
            spans.push(Span::styled(
                format!(" ▶ {name} "),
                Style::new()
                    .fg(Color::Black)
                    .bg(MAP)
                    .add_modifier(Modifier::BOLD),
            ));
        } else {
            spans.push(Span::styled(format!(" {name} "), DIM));
        }
    }
    if let Some(d) = &app.demo {
        spans.push(sep());
        spans.push(Span::styled(
            format!("demo step {}/{}", d.step(), d.total),
            BOLD.fg(Color::Cyan),
        ));
    } else if app.info.demo && app.phase.loaded() {
        spans.push(sep());
        spans.push(Span::styled("demo over", Style::new().fg(Color::Cyan)));
    }
    if fit < Fit::NoDevice {
        spans.push(sep());
        spans.push(Span::raw(app.device.clone()));
    }
    spans.push(sep());
    spans.push(Span::styled(format!("{} tokens", app.context_tokens), BOLD));
    spans.push(sep());
    let (reference, style) = if app.reference {
        ("reference on", Style::new().fg(MAP))
    } else {
        ("reference off", Style::new().fg(WARN))
    };
    spans.push(Span::styled(reference, style));
    match (app.repair, app.repaired) {
        (true, Some((done, total))) if done < total => {
            spans.push(sep());
            spans.push(Span::styled(
                format!("repaired {done} / {total}"),
                Style::new().fg(WARN),
            ));
        }
        (true, Some((_, total))) => {
            spans.push(sep());
            spans.push(Span::styled(
                format!("repaired {total} / {total}"),
                Style::new().fg(MAP),
            ));
        }
        (true, None) => {
            spans.push(sep());
            spans.push(Span::styled("repair on", DIM));
        }
        (false, _) => {}
    }
    if app.info.tail > 0 {
        // The handoff time includes the target reading these itself.
        spans.push(sep());
        spans.push(Span::raw(format!("tail {}", app.info.tail)));
    }
    spans.push(sep());
    spans.push(match (&app.info.record_path, app.recording_stopped) {
        (_, true) => Span::styled("recording stopped", BOLD.fg(BAD)),
        (Some(p), false) => {
            let shown = if fit >= Fit::RecordingFileName {
                p.rsplit(['/', '\\']).next().unwrap_or(p)
            } else {
                p
            };
            Span::styled(format!("● rec {shown}"), Style::new().fg(Color::Red))
        }
        (None, false) => Span::styled("not recording", DIM),
    });
    if !app.mappers.is_empty() && fit < Fit::NoMappers {
        spans.push(sep());
        let ids: Vec<String> = app.mappers.iter().map(|m| short_mapper_id(&m.id)).collect();
        spans.push(Span::styled(format!("mappers {}", ids.join(" ")), DIM));
    }
    Line::from(spans)
}

pub fn render_hints(frame: &mut Frame, area: Rect, _app: &App) {
    const FULL: [(&str, &str); 7] = [
        ("Enter", "send"),
        ("Tab", "switch"),
        ("Esc", "cancel"),
        ("Ctrl-R", "reference"),
        ("Ctrl-B", "bookmark"),
        ("?", "help"),
        ("q", "quit"),
    ];
    let full = hint_line(&FULL, " · ");
    let line = if full.width() <= area.width as usize {
        full
    } else {
        let compact: Vec<(String, &str)> = FULL
            .iter()
            .map(|(k, d)| (k.replace("Ctrl-", "^"), *d))
            .collect();
        let compact: Vec<(&str, &str)> = compact.iter().map(|(k, d)| (k.as_str(), *d)).collect();
        hint_line(&compact, "  ")
    };
    frame.render_widget(Paragraph::new(line), area);
}

fn hint_line(keys: &[(&str, &str)], sep: &'static str) -> Line<'static> {
    let mut spans = Vec::new();
    for (i, (k, d)) in keys.iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(sep, DIM));
        }
        spans.push(Span::styled(k.to_string(), BOLD));
        spans.push(Span::styled(format!(" {d}"), DIM));
    }
    Line::from(spans)
}
