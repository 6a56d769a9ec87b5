//! The message being typed, or the bookmark note while one is being written. The box owns
//! both buffers; the message is kept while a note is written.

use super::{panel, DIM};
use crate::input::LineInput;
use crate::keys::{Key, KeyCode};
use crate::layout::inner;
use ratatui::layout::{Position, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

/// The most rows the message box grows to; a longer message scrolls within them.
pub(crate) const MAX_ROWS: usize = 5;

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
    /// A message waits for a switch to finish; the box says so while it is empty.
    pub queued: bool,
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

    /// A line break in the message (Alt-Enter, Shift-Enter): text like any other, which
    /// the message sends as it is.
    pub fn line_break(&mut self) {
        if self.note.is_none() {
            self.message.insert('\n');
        }
    }

    /// How many rows of text the box wants: one per line of the message, up to
    /// [`MAX_ROWS`]; a note is one line.
    pub fn rows(&self) -> usize {
        match self.note {
            Some(_) => 1,
            None => self.message.lines().min(MAX_ROWS),
        }
    }

    /// Types `c` into the message even while a note is open.
    pub fn type_into_message(&mut self, c: char) {
        self.message.insert(c);
    }

    /// Puts `text` back in front of whatever the message holds now, a line break
    /// between them, so that neither is lost.
    pub fn restore_message(&mut self, text: &str) {
        let typed = self.message.take();
        self.message.insert_str(text);
        if !typed.is_empty() {
            self.message.insert('\n');
            self.message.insert_str(&typed);
        }
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

    /// Pasted text goes where the cursor is: into the note if one is open. A note is one
    /// line in the transcript and the status line, so its line breaks and tabs become
    /// spaces; the message keeps them.
    pub fn paste(&mut self, text: &str) {
        match self.note.as_mut() {
            Some(note) => {
                let flat = text.replace("\r\n", " ").replace(['\r', '\n', '\t'], " ");
                note.insert_str(&flat);
            }
            None => self.message.insert_str(text),
        }
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
                // The count says a block longer than the box is all there.
                let lines = match self.message.lines() {
                    1 => String::new(),
                    n => format!(" · {n} lines"),
                };
                (
                    Line::from(format!(" message{to}{lines} ")),
                    &self.message,
                    Style::default(),
                )
            }
        };
        let block = panel(title).border_style(style.fg(style.fg.unwrap_or(Color::Gray)));
        let body = inner(area);
        let rows = (body.height as usize).max(1);
        let (shown, (row, column)) = input.window(body.width as usize, rows);
        let empty_message = input.is_empty() && self.note.is_none();
        let content: Vec<Line> = if empty_message && ctx.queued {
            vec![Line::from(Span::styled(
                "message queued: sent when the handoff is done · Esc takes it back",
                DIM,
            ))]
        } else if empty_message && !ctx.busy {
            vec![Line::from(Span::styled(
                "type here · Enter sends · Alt-Enter (or Shift-Enter) starts a new line",
                DIM,
            ))]
        } else {
            shown
                .into_iter()
                .map(|l| Line::from(Span::styled(l, style)))
                .collect()
        };
        frame.render_widget(Paragraph::new(content).block(block), area);
        if ctx.cursor && !body.is_empty() {
            let x = body.x + (column as u16).min(body.width.saturating_sub(1));
            let y = body.y + (row as u16).min(body.height.saturating_sub(1));
            frame.set_cursor_position(Position::new(x, y));
        }
    }
}
