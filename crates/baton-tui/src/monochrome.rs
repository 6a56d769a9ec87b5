//! A screen without colour, for terminals that ask for none: `NO_COLOR` set (see
//! no-color.org) or `TERM=dumb`. Bold and the other modifiers stay, so what they mark
//! (the active model, the first differing token) still stands out.

use ratatui::buffer::Buffer;
use ratatui::style::Color;
use std::ffi::OsStr;

/// Whether the screen may use colour, given the values of `NO_COLOR` and `TERM`: not
/// when `NO_COLOR` is set to anything but the empty string, nor on a terminal that
/// calls itself `dumb`. The values are passed in, so that the choice is testable
/// without touching the process's environment.
pub fn colour_allowed(no_color: Option<&OsStr>, term: Option<&OsStr>) -> bool {
    let no_color = no_color.is_some_and(|v| !v.is_empty());
    let dumb = term.is_some_and(|t| t == "dumb");
    !no_color && !dumb
}

/// Takes every colour out of a drawn screen. The terminal backend sends a colour only
/// where a cell's differs from the one before it, so a screen left with the default
/// colours everywhere sends none.
pub fn strip_colours(buf: &mut Buffer) {
    for cell in buf.content.iter_mut() {
        cell.set_fg(Color::Reset);
        cell.set_bg(Color::Reset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::{Modifier, Style};

    fn allowed(no_color: Option<&str>, term: Option<&str>) -> bool {
        colour_allowed(no_color.map(OsStr::new), term.map(OsStr::new))
    }

    #[test]
    fn a_dumb_terminal_or_no_color_gets_no_colour() {
        assert!(!allowed(None, Some("dumb")));
        assert!(!allowed(Some("1"), Some("xterm-256color")));
        assert!(!allowed(Some("1"), Some("dumb")));
        assert!(allowed(None, Some("xterm-256color")));
        assert!(allowed(None, None));
        // An empty NO_COLOR is unset, as no-color.org has it; only `dumb` itself is dumb.
        assert!(allowed(Some(""), Some("screen")));
        assert!(allowed(None, Some("dumb-ish")));
    }

    #[test]
    fn stripping_keeps_the_text_and_the_modifiers() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 4, 1));
        let marked = Style::new()
            .fg(Color::Black)
            .bg(Color::LightRed)
            .add_modifier(Modifier::BOLD);
        buf.set_string(0, 0, "ab", marked);
        strip_colours(&mut buf);
        let cell = &buf[(0, 0)];
        assert_eq!(
            (cell.symbol(), cell.fg, cell.bg),
            ("a", Color::Reset, Color::Reset)
        );
        assert!(cell.modifier.contains(Modifier::BOLD));
    }
}
