//! A text buffer with a cursor, for the message and the bookmark note. It keeps the line
//! breaks and tabs of a pasted block (a message is often code), and shows them in one
//! row: a line break as [`LINE_BREAK`], a tab as a space.

use unicode_width::UnicodeWidthChar;

/// How a line break shows in the one-row window.
pub const LINE_BREAK: char = '↵';

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineInput {
    text: String,
    /// In characters, not bytes, so editing never splits a character.
    cursor: usize,
}

impl LineInput {
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    #[cfg(test)]
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    fn byte_at(&self, chars: usize) -> usize {
        self.text
            .char_indices()
            .nth(chars)
            .map_or(self.text.len(), |(i, _)| i)
    }

    fn len(&self) -> usize {
        self.text.chars().count()
    }

    /// Line breaks and tabs are kept; any other control character (a stray escape in a
    /// paste) becomes a space, as it would show as nothing and shift the cursor.
    pub fn insert(&mut self, c: char) {
        let c = if c.is_control() && c != '\n' && c != '\t' {
            ' '
        } else {
            c
        };
        let at = self.byte_at(self.cursor);
        self.text.insert(at, c);
        self.cursor += 1;
    }

    /// Inserts pasted text. Terminals paste line breaks as `\r` (some as `\r\n`); each
    /// becomes one `\n`, so the message reads as it was written.
    pub fn insert_str(&mut self, s: &str) {
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\r' {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                self.insert('\n');
            } else {
                self.insert(c);
            }
        }
    }

    /// How many lines the text has (1 when it has no line break).
    pub fn lines(&self) -> usize {
        self.text.matches('\n').count() + 1
    }

    pub fn backspace(&mut self) {
        if self.cursor > 0 {
            self.cursor -= 1;
            let at = self.byte_at(self.cursor);
            self.text.remove(at);
        }
    }

    pub fn delete(&mut self) {
        if self.cursor < self.len() {
            let at = self.byte_at(self.cursor);
            self.text.remove(at);
        }
    }

    pub fn left(&mut self) {
        self.cursor = self.cursor.saturating_sub(1);
    }

    pub fn right(&mut self) {
        self.cursor = (self.cursor + 1).min(self.len());
    }

    pub fn home(&mut self) {
        self.cursor = 0;
    }

    pub fn end(&mut self) {
        self.cursor = self.len();
    }

    /// Empties the buffer, handing back what it held.
    pub fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }

    /// The part to show in `width` columns so that the cursor stays in view, and the
    /// cursor's column within it. Line breaks show as [`LINE_BREAK`] and tabs as spaces,
    /// one column each, so the whole text fits one row.
    pub fn window(&self, width: usize) -> (String, usize) {
        let width = width.max(1);
        let chars: Vec<char> = self.text.chars().map(shown_as).collect();
        let widths: Vec<usize> = chars.iter().map(|c| c.width().unwrap_or(0)).collect();
        let w = |from: usize, to: usize| widths[from..to].iter().sum::<usize>();
        let mut start = 0;
        // Leave a column for the cursor itself at the end of the text.
        while start < self.cursor && w(start, self.cursor) >= width {
            start += 1;
        }
        let mut shown = String::new();
        let mut used = 0;
        for (c, cw) in chars[start..].iter().zip(&widths[start..]) {
            if used + cw > width {
                break;
            }
            shown.push(*c);
            used += cw;
        }
        (shown, w(start, self.cursor))
    }
}

/// How `c` shows in the one-row window.
fn shown_as(c: char) -> char {
    match c {
        '\n' => LINE_BREAK,
        '\t' => ' ',
        c => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(s: &str) -> LineInput {
        let mut i = LineInput::default();
        i.insert_str(s);
        i
    }

    #[test]
    fn edits_happen_at_the_cursor() {
        let mut i = typed("héllo");
        i.home();
        i.right();
        i.insert('X');
        assert_eq!(i.text(), "hXéllo");
        i.right();
        i.backspace();
        assert_eq!(i.text(), "hXllo");
        i.delete();
        assert_eq!(i.text(), "hXlo");
        i.end();
        i.insert('!');
        assert_eq!(i.text(), "hXlo!");
        i.left();
        i.left();
        assert_eq!(i.cursor(), 3);
        assert_eq!(i.take(), "hXlo!");
        assert!(i.is_empty());
        i.backspace();
        i.delete();
        i.left();
        assert_eq!(i.cursor(), 0);
    }

    #[test]
    fn pasted_line_breaks_and_tabs_are_kept_and_other_controls_become_spaces() {
        let i = typed("a\r\nb\rc\nd\te\u{1b}f");
        assert_eq!(i.text(), "a\nb\nc\nd\te f");
        assert_eq!(i.lines(), 4);
        assert_eq!(typed("one line").lines(), 1);
    }

    #[test]
    fn a_line_break_shows_as_a_mark_in_one_row() {
        let i = typed("fn x() {\n\tok\n}");
        let (shown, at) = i.window(40);
        assert_eq!(shown, "fn x() {↵ ok↵}");
        assert_eq!(at, 14);
        let (shown, at) = i.window(6);
        assert_eq!((shown.as_str(), at), (" ok↵}", 5));
    }

    #[test]
    fn the_window_follows_the_cursor() {
        let i = typed("abcdefghij");
        let (shown, at) = i.window(4);
        assert_eq!((shown.as_str(), at), ("hij", 3));
        let mut i = i;
        i.home();
        let (shown, at) = i.window(4);
        assert_eq!((shown.as_str(), at), ("abcd", 0));
    }
}
