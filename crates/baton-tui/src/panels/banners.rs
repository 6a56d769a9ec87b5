//! Boxes that cover part of the screen until a key is pressed: the quit question, the
//! demo's pause after a switch, and a fatal engine error.

use super::{fmt_factor, Names, BAD, BOLD};
use crate::layout::centered;
use baton_protocol::SwitchRow;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph, Wrap};
use ratatui::Frame;

fn banner(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>, color: Color, title: &str) {
    frame.render_widget(Clear, area);
    let block = Block::bordered()
        .border_type(BorderType::Double)
        .border_style(Style::new().fg(color))
        .title(Line::from(format!(" {title} ")).style(BOLD.fg(color)));
    frame.render_widget(
        Paragraph::new(lines)
            .alignment(Alignment::Center)
            .wrap(Wrap { trim: true })
            .block(block),
        area,
    );
}

/// The quit question; `busy` while the engine is answering or switching.
pub(crate) fn render_confirm_quit(frame: &mut Frame, area: Rect, busy: bool) {
    let lines = if busy {
        vec![
            Line::from(Span::styled("A turn is still running. Quit anyway?", BOLD)),
            Line::from("y quits (the turn is cancelled) · any other key stays"),
        ]
    } else {
        vec![
            Line::from(Span::styled("Quit baton?", BOLD)),
            Line::from("y quits · n or Esc stays · any other key types on after the q"),
        ]
    };
    banner(
        frame,
        centered(area, 60, 4),
        lines,
        Color::Yellow,
        "quit? y/n",
    );
}

/// Fills `area` (the rows of the input) while the demo waits for the presenter after
/// switch `paused_after`.
pub(crate) fn render_demo_pause(
    frame: &mut Frame,
    area: Rect,
    paused_after: Option<&SwitchRow>,
    names: Names,
) {
    let Some(s) = paused_after else {
        return;
    };
    let speedup = match s.timings.speedup_full() {
        Some(x) => format!(" · {} faster than re-prefill", fmt_factor(x)),
        None if s.measuring() => " · measuring…".to_string(),
        None => String::new(),
    };
    let lines = vec![
        Line::from(Span::styled(
            format!(
                "switch #{}: {} → {}{speedup}",
                s.index + 1,
                names.short(s.from.as_str()),
                names.short(s.to.as_str())
            ),
            BOLD,
        )),
        Line::from(Span::styled(
            "press any key to continue · q quits",
            BOLD.fg(Color::Cyan),
        )),
    ];
    banner(frame, area, lines, Color::Cyan, "demo paused");
}

/// The error that stopped the engine, if one did.
pub(crate) fn render_fatal(frame: &mut Frame, area: Rect, fatal: Option<&str>) {
    let Some(message) = fatal else {
        return;
    };
    let lines = vec![
        Line::from(Span::styled(message.to_string(), BOLD)),
        Line::default(),
        Line::from("The engine has stopped. Press q to quit."),
    ];
    banner(frame, centered(area, 70, 7), lines, BAD, "engine stopped");
}
