//! Keys as the workbench understands them, and what each one does. The state machine
//! takes this small type rather than crossterm's, so it can be driven from tests without
//! a terminal.

use super::app::{App, Effect, Overlay};
use super::input::LineInput;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCode {
    Char(char),
    Enter,
    Tab,
    Esc,
    Backspace,
    Delete,
    Left,
    Right,
    Up,
    Down,
    Home,
    End,
    PageUp,
    PageDown,
    F(u8),
    /// Anything the workbench has no use for (and key releases).
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub code: KeyCode,
    pub ctrl: bool,
}

impl Key {
    pub fn plain(code: KeyCode) -> Self {
        Self { code, ctrl: false }
    }

    pub fn char(c: char) -> Self {
        Self::plain(KeyCode::Char(c))
    }

    pub fn ctrl(c: char) -> Self {
        Self {
            code: KeyCode::Char(c),
            ctrl: true,
        }
    }

    fn is_ctrl(&self, c: char) -> bool {
        self.ctrl && self.code == KeyCode::Char(c)
    }
}

impl From<crossterm::event::KeyEvent> for Key {
    fn from(e: crossterm::event::KeyEvent) -> Self {
        use crossterm::event::{KeyCode as C, KeyEventKind, KeyModifiers as M};
        // Terminals that report releases would otherwise type every character twice.
        if e.kind == KeyEventKind::Release {
            return Self::plain(KeyCode::Other);
        }
        let code = match e.code {
            C::Char(c) => KeyCode::Char(c),
            C::Enter => KeyCode::Enter,
            C::Tab => KeyCode::Tab,
            C::Esc => KeyCode::Esc,
            C::Backspace => KeyCode::Backspace,
            C::Delete => KeyCode::Delete,
            C::Left => KeyCode::Left,
            C::Right => KeyCode::Right,
            C::Up => KeyCode::Up,
            C::Down => KeyCode::Down,
            C::Home => KeyCode::Home,
            C::End => KeyCode::End,
            C::PageUp => KeyCode::PageUp,
            C::PageDown => KeyCode::PageDown,
            C::F(n) => KeyCode::F(n),
            _ => KeyCode::Other,
        };
        // AltGr arrives as Ctrl+Alt on some systems and must stay a typed character.
        let ctrl = e.modifiers.contains(M::CONTROL) && !e.modifiers.contains(M::ALT);
        Self { code, ctrl }
    }
}

impl App {
    pub(crate) fn on_key(&mut self, key: Key) -> Vec<Effect> {
        if self.overlay == Overlay::ConfirmQuit {
            self.overlay = Overlay::None;
            let from_q = std::mem::take(&mut self.quit_from_q);
            return match key.code {
                KeyCode::Char('y' | 'Y') => self.quit_now(),
                KeyCode::Char('c') if key.ctrl => self.quit_now(),
                KeyCode::Char('n' | 'N') | KeyCode::Esc => vec![],
                _ if from_q => {
                    self.input.insert('q');
                    self.on_main_key(key)
                }
                _ => vec![],
            };
        }
        if key.is_ctrl('c') {
            return self.request_quit();
        }
        if key.code == KeyCode::Other {
            return vec![];
        }
        if self.overlay == Overlay::Help {
            self.overlay = Overlay::None;
            return vec![];
        }
        if self.demo_paused() {
            if key.code == KeyCode::Char('q') && !key.ctrl && self.input.is_empty() {
                return self.request_quit();
            }
            return self.demo_continue();
        }
        if let Some(note) = self.bookmark.as_mut() {
            return match key.code {
                KeyCode::Enter => self.finish_bookmark(),
                KeyCode::Esc => {
                    self.bookmark = None;
                    vec![]
                }
                _ => {
                    edit(note, key);
                    vec![]
                }
            };
        }
        self.on_main_key(key)
    }

    fn on_main_key(&mut self, key: Key) -> Vec<Effect> {
        if key.ctrl {
            return match key.code {
                KeyCode::Char('r') => self.toggle_reference(),
                KeyCode::Char('p') => self.toggle_repair(),
                KeyCode::Char('b') => self.start_bookmark(),
                KeyCode::Char('l') => {
                    self.layer_view = self.layer_view.next();
                    vec![]
                }
                _ => vec![],
            };
        }
        match key.code {
            KeyCode::Enter => self.submit_input(),
            KeyCode::Tab => self.request_switch(),
            KeyCode::Esc => self.cancel(),
            KeyCode::F(1) => {
                self.overlay = Overlay::Help;
                vec![]
            }
            KeyCode::PageUp => self.scroll_pages(-1),
            KeyCode::PageDown => self.scroll_pages(1),
            KeyCode::Up => self.scroll_lines(-1),
            KeyCode::Down => self.scroll_lines(1),
            // With an empty input `?` cannot be part of a message yet, so it opens help.
            KeyCode::Char('?') if self.input.is_empty() => {
                self.overlay = Overlay::Help;
                vec![]
            }
            // Always asked: the q may be the first letter of a message, and any key but
            // y/n/Esc goes on typing it.
            KeyCode::Char('q') if self.input.is_empty() => {
                self.overlay = Overlay::ConfirmQuit;
                self.quit_from_q = true;
                vec![]
            }
            _ => {
                edit(&mut self.input, key);
                vec![]
            }
        }
    }
}

/// The editing keys shared by the message and the bookmark note.
fn edit(input: &mut LineInput, key: Key) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::{KeyCode as C, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};

    fn event(code: C, modifiers: KeyModifiers, kind: KeyEventKind) -> KeyEvent {
        KeyEvent {
            code,
            modifiers,
            kind,
            state: KeyEventState::NONE,
        }
    }

    #[test]
    fn crossterm_keys_convert() {
        let k: Key = event(C::Char('r'), KeyModifiers::CONTROL, KeyEventKind::Press).into();
        assert_eq!(k, Key::ctrl('r'));
        let k: Key = event(C::F(1), KeyModifiers::NONE, KeyEventKind::Press).into();
        assert_eq!(k, Key::plain(KeyCode::F(1)));
        let k: Key = event(C::Char('a'), KeyModifiers::NONE, KeyEventKind::Release).into();
        assert_eq!(k.code, KeyCode::Other);
        let altgr = KeyModifiers::CONTROL | KeyModifiers::ALT;
        let k: Key = event(C::Char('@'), altgr, KeyEventKind::Press).into();
        assert_eq!(k, Key::char('@'));
    }
}
