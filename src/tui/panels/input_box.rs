//! The message being typed, or the bookmark note while one is being written.

use super::{panel, DIM};
use crate::tui::app::{App, Overlay};
use crate::tui::view::inner;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let (title, input, style) = match &app.bookmark {
        Some(note) => (
            Line::from(" bookmark note · Enter saves · Esc drops · your message is kept "),
            note,
            Style::new().fg(Color::Magenta),
        ),
        None => {
            let to = app
                .active_model()
                .map_or_else(String::new, |m| format!(" to {}", m.name));
            (
                Line::from(format!(" message{to} ")),
                &app.input,
                Style::default(),
            )
        }
    };
    let block = panel(title).border_style(style.fg(style.fg.unwrap_or(Color::Gray)));
    let body = inner(area);
    let (shown, cursor) = input.window(body.width as usize);
    let content = if shown.is_empty() && app.bookmark.is_none() && !app.busy() {
        Line::from(Span::styled("type here, Enter sends", DIM))
    } else {
        Line::from(Span::styled(shown, style))
    };
    frame.render_widget(Paragraph::new(content).block(block), area);
    if app.overlay == Overlay::None && !body.is_empty() {
        let x = body.x + (cursor as u16).min(body.width.saturating_sub(1));
        frame.set_cursor_position(Position::new(x, body.y));
    }
}
