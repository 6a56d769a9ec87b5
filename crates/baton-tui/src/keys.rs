//! Keys as the workbench understands them. The state machine takes this small type
//! rather than crossterm's, so it can be driven from tests without a terminal.

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
    /// Alt (Option, Meta) held; Alt-Enter types a line break.
    pub alt: bool,
    /// Shift held, as far as the terminal says: most report it with Enter only under
    /// the keyboard enhancement the workbench asks for where it is supported.
    pub shift: bool,
}

impl Key {
    pub fn plain(code: KeyCode) -> Self {
        Self {
            code,
            ctrl: false,
            alt: false,
            shift: false,
        }
    }

    pub fn alt(code: KeyCode) -> Self {
        Self {
            alt: true,
            ..Self::plain(code)
        }
    }

    pub fn shift(code: KeyCode) -> Self {
        Self {
            shift: true,
            ..Self::plain(code)
        }
    }

    pub fn char(c: char) -> Self {
        Self::plain(KeyCode::Char(c))
    }

    pub fn ctrl(c: char) -> Self {
        Self {
            ctrl: true,
            ..Self::char(c)
        }
    }

    /// Enter with Alt or Shift: a line break in the message rather than sending it.
    pub fn is_line_break(&self) -> bool {
        self.code == KeyCode::Enter && !self.ctrl && (self.alt || self.shift)
    }

    pub fn is_ctrl(&self, c: char) -> bool {
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
        let altgr = e.modifiers.contains(M::CONTROL | M::ALT);
        Self {
            code,
            ctrl: e.modifiers.contains(M::CONTROL) && !altgr,
            alt: e.modifiers.contains(M::ALT) && !altgr,
            shift: e.modifiers.contains(M::SHIFT),
        }
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
        let k: Key = event(C::Enter, KeyModifiers::ALT, KeyEventKind::Press).into();
        assert_eq!(k, Key::alt(KeyCode::Enter));
        assert!(k.is_line_break());
        let k: Key = event(C::Enter, KeyModifiers::SHIFT, KeyEventKind::Press).into();
        assert!(k.is_line_break());
        let k: Key = event(C::Enter, KeyModifiers::NONE, KeyEventKind::Press).into();
        assert!(!k.is_line_break());
    }
}
