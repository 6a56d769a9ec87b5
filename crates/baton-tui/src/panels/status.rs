//! The lines at the bottom but the session's (see `session_line`): what just happened,
//! and the keys.

use super::{BAD, BOLD, DIM, WARN};
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
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
    /// A switch runs; `queued` when a message waits for it.
    HandingOver { queued: bool },
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
        Activity::HandingOver { queued: false } => "handing over…".into(),
        Activity::HandingOver { queued: true } => "handing over… · then your message".into(),
        Activity::Measuring(index) => format!("measuring switch #{} · Esc cancels", index + 1),
    }
}

/// The keys worth knowing, shortened when the line is narrow, and then without the keys
/// the help lists that matter least here.
pub(crate) fn render_hints(frame: &mut Frame, area: Rect) {
    const FULL: [(&str, &str); 8] = [
        ("Enter", "send"),
        ("Alt-Enter", "new line"),
        ("Tab", "switch"),
        ("Esc", "cancel"),
        ("Ctrl-R", "reference"),
        ("Ctrl-B", "bookmark"),
        ("?", "help"),
        ("q", "quit"),
    ];
    /// Left out in this order while the line is still too long.
    const LEAST: [&str; 2] = ["Ctrl-R", "Ctrl-B"];
    let full = hint_line(&FULL, " · ");
    let line = if full.width() <= area.width as usize {
        full
    } else {
        let mut keys: Vec<(String, &str)> = FULL
            .iter()
            .map(|(k, d)| (k.replace("Ctrl-", "^"), *d))
            .collect();
        let compact = |keys: &[(String, &str)]| {
            let keys: Vec<(&str, &str)> = keys.iter().map(|(k, d)| (k.as_str(), *d)).collect();
            hint_line(&keys, "  ")
        };
        for least in LEAST {
            if compact(&keys).width() <= area.width as usize {
                break;
            }
            let least = least.replace("Ctrl-", "^");
            keys.retain(|(k, _)| *k != least);
        }
        compact(&keys)
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
