//! The message being typed, or the bookmark note while one is being written. The box owns
//! both buffers; the message is kept while a note is written.

use super::{panel, DIM};
use crate::tui::input::LineInput;
use crate::tui::keys::{Key, KeyCode};
use crate::tui::layout::inner;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InputBox {
    message: LineInput,
    /// The bookmark note being typed; the message keeps its own buffer meanwhile.
    note: Option<LineInput>,
}

/// What the input box needs to know about the rest of the screen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputContext<'a> {
    /// The model the message goes to.
    pub to: Option<&'a str>,
    /// The engine is answering or switching: no invitation to type.
    pub busy: bool,
    /// Nothing covers the box, so the terminal's cursor goes in it.
    pub cursor: bool,
}

impl InputBox {
    pub fn message(&self) -> &str {
        self.message.text()
    }

    pub fn message_is_empty(&self) -> bool {
        self.message.is_empty()
    }

    /// Empties the message, handing back what it held.
    pub fn take_message(&mut self) -> String {
        self.message.take()
    }

    /// Types `c` into the message even while a note is open.
    pub fn type_into_message(&mut self, c: char) {
        self.message.insert(c);
    }

    pub fn note_open(&self) -> bool {
        self.note.is_some()
    }

    pub fn open_note(&mut self) {
        self.note = Some(LineInput::default());
    }

    pub fn drop_note(&mut self) {
        self.note = None;
    }

    /// Closes the note, handing back what it held (empty if none was open).
    pub fn take_note(&mut self) -> String {
        self.note.take().map(|mut n| n.take()).unwrap_or_default()
    }

    fn focused(&mut self) -> &mut LineInput {
        self.note.as_mut().unwrap_or(&mut self.message)
    }

    /// Pasted text goes where the cursor is: into the note if one is open.
    pub fn paste(&mut self, text: &str) {
        self.focused().insert_str(text);
    }

    /// The editing keys, shared by the message and the note.
    pub fn edit(&mut self, key: Key) {
        let input = self.focused();
        match key.code {
            KeyCode::Char(c) if !key.ctrl => input.insert(c),
            KeyCode::Backspace => input.backspace(),
            KeyCode::Delete => input.delete(),
            KeyCode::Left => input.left(),
            KeyCode::Right => input.right(),
            KeyCode::Home => input.home(),
            KeyCode::End => input.end(),
            _ => {}
        }
    }

    pub fn draw(&self, frame: &mut Frame, area: Rect, ctx: InputContext) {
        let (title, input, style) = match &self.note {
            Some(note) => (
                Line::from(" bookmark note · Enter saves · Esc drops · your message is kept "),
                note,
                Style::new().fg(Color::Magenta),
            ),
            None => {
                let to = ctx
                    .to
                    .map_or_else(String::new, |name| format!(" to {name}"));
                (
                    Line::from(format!(" message{to} ")),
                    &self.message,
                    Style::default(),
                )
            }
        };
        let block = panel(title).border_style(style.fg(style.fg.unwrap_or(Color::Gray)));
        let body = inner(area);
        let (shown, cursor) = input.window(body.width as usize);
        let content = if shown.is_empty() && self.note.is_none() && !ctx.busy {
            Line::from(Span::styled("type here, Enter sends", DIM))
        } else {
            Line::from(Span::styled(shown, style))
        };
        frame.render_widget(Paragraph::new(content).block(block), area);
        if ctx.cursor && !body.is_empty() {
            let x = body.x + (cursor as u16).min(body.width.saturating_sub(1));
            frame.set_cursor_position(Position::new(x, body.y));
        }
    }
}
