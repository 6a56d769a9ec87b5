//! The lines at the bottom: what just happened, the session's state, and the keys.

use super::{short_mapper_id, Names, BAD, BOLD, DIM, MAP, WARN};
use crate::protocol::{MapperInfo, ModelInfo};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

const SPINNER: [&str; 8] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Notice {
    text: String,
    level: Level,
}

/// What the engine is busy with, as the message line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity<'a> {
    /// A turn runs on `model`; `reference` once it re-prefills for the reference answer.
    Answering {
        model: Option<&'a str>,
        reference: bool,
        cancelling: bool,
    },
    HandingOver,
    /// The measurement of the switch with this index runs.
    Measuring(u32),
}

/// The line above the input: a spinner with what the engine is doing, then the latest
/// notice, warning or error. It keeps the notice and the spinner's frame.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MessageLine {
    notice: Option<Notice>,
    spinner: usize,
}

impl MessageLine {
    pub fn say(&mut self, level: Level, text: impl Into<String>) {
        self.notice = Some(Notice {
            text: text.into(),
            level,
        });
    }

    pub fn clear(&mut self) {
        self.notice = None;
    }

    pub fn text(&self) -> Option<&str> {
        self.notice.as_ref().map(|n| n.text.as_str())
    }

    /// Turn the spinner one step.
    pub fn tick(&mut self) {
        self.spinner = self.spinner.wrapping_add(1);
    }

    pub fn draw(&self, frame: &mut Frame, area: Rect, activity: Option<Activity>) {
        let mut spans = Vec::new();
        if let Some(doing) = activity.map(describe) {
            spans.push(Span::styled(
                format!("{} {doing}", SPINNER[self.spinner % SPINNER.len()]),
                Style::new().fg(Color::Cyan),
            ));
        }
        if let Some(s) = &self.notice {
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
}

fn describe(activity: Activity) -> String {
    match activity {
        Activity::Answering {
            cancelling: true, ..
        } => "cancelling…".into(),
        Activity::Answering {
            model, reference, ..
        } => {
            let model = model.unwrap_or("the model");
            if reference {
                format!("{model} re-prefills for the reference answer · Esc cancels")
            } else {
                format!("{model} is answering · Esc cancels")
            }
        }
        Activity::HandingOver => "handing over…".into(),
        Activity::Measuring(index) => format!("measuring switch #{} · Esc cancels", index + 1),
    }
}

/// The demo's place on the status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DemoBadge {
    /// The demo runs step `.0` of `.1`.
    Step(usize, usize),
    Over,
}

/// What the status line shows about the session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session<'a> {
    pub models: &'a [ModelInfo],
    pub active: usize,
    pub demo: Option<DemoBadge>,
    pub device: &'a str,
    pub context_tokens: usize,
    pub reference: bool,
    pub repair: bool,
    /// The active model's cache repaired so far, of its length, since the last switch.
    pub repaired: Option<(usize, usize)>,
    /// Newest tokens the target reads itself at a switch (0: all mapped).
    pub tail: usize,
    /// The re-read setting (`20%:source-attention:word`), if any.
    pub reread: Option<&'a str>,
    pub record_path: Option<&'a str>,
    pub recording_stopped: bool,
    pub mappers: &'a [MapperInfo],
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
pub(crate) fn render_status(frame: &mut Frame, area: Rect, session: &Session) {
    let fits = [
        Fit::Everything,
        Fit::ShortNames,
        Fit::RecordingFileName,
        Fit::NoMappers,
        Fit::NoDevice,
    ];
    let line = fits
        .iter()
        .map(|f| status_line(session, *f))
        .find(|l| l.width() <= area.width as usize)
        .unwrap_or_else(|| status_line(session, Fit::NoDevice));
    frame.render_widget(Paragraph::new(line), area);
}

fn status_line(s: &Session, fit: Fit) -> Line<'static> {
    let sep = || Span::styled(" │ ", DIM);
    let mut spans = Vec::new();
    for (i, m) in s.models.iter().enumerate() {
        let name = if fit >= Fit::ShortNames {
            Names(s.models).short(m.name.as_str())
        } else {
            m.name.to_string()
        };
        if i == s.active {
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
    match s.demo {
        Some(DemoBadge::Step(step, total)) => {
            spans.push(sep());
            spans.push(Span::styled(
                format!("demo step {step}/{total}"),
                BOLD.fg(Color::Cyan),
            ));
        }
        Some(DemoBadge::Over) => {
            spans.push(sep());
            spans.push(Span::styled("demo over", Style::new().fg(Color::Cyan)));
        }
        None => {}
    }
    if fit < Fit::NoDevice {
        spans.push(sep());
        spans.push(Span::raw(s.device.to_string()));
    }
    spans.push(sep());
    spans.push(Span::styled(format!("{} tokens", s.context_tokens), BOLD));
    spans.push(sep());
    let (reference, style) = if s.reference {
        ("reference on", Style::new().fg(MAP))
    } else {
        ("reference off", Style::new().fg(WARN))
    };
    spans.push(Span::styled(reference, style));
    match (s.repair, s.repaired) {
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
    if s.tail > 0 {
        // The handoff time includes the target reading these itself.
        spans.push(sep());
        spans.push(Span::raw(format!("tail {}", s.tail)));
    }
    if let Some(r) = s.reread {
        // Only the budget: the selector and spans are in the help and the session.
        spans.push(sep());
        let budget = r.split(':').next().unwrap_or(r);
        spans.push(Span::raw(format!("re-read {budget}")));
    }
    spans.push(sep());
    spans.push(match (s.record_path, s.recording_stopped) {
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
    if !s.mappers.is_empty() && fit < Fit::NoMappers {
        spans.push(sep());
        let ids: Vec<String> = s.mappers.iter().map(|m| short_mapper_id(&m.id)).collect();
        spans.push(Span::styled(format!("mappers {}", ids.join(" ")), DIM));
    }
    Line::from(spans)
}

/// The keys worth knowing, shortened when the line is narrow.
pub(crate) fn render_hints(frame: &mut Frame, area: Rect) {
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
