//! A one-line text buffer with a cursor, for the message and the bookmark note.

use unicode_width::UnicodeWidthStr;

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

    pub fn insert(&mut self, c: char) {
        // A pasted line break would otherwise leave the one-line field in pieces.
        let c = if c.is_control() { ' ' } else { c };
        let at = self.byte_at(self.cursor);
        self.text.insert(at, c);
        self.cursor += 1;
    }

    pub fn insert_str(&mut self, s: &str) {
        for c in s.chars() {
            self.insert(c);
        }
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
    /// cursor's column within it.
    pub fn window(&self, width: usize) -> (String, usize) {
        let width = width.max(1);
        let chars: Vec<char> = self.text.chars().collect();
        let w = |cs: &[char]| cs.iter().collect::<String>().width();
        let mut start = 0;
        // Leave a column for the cursor itself at the end of the text.
        while start < self.cursor && w(&chars[start..self.cursor]) >= width {
            start += 1;
        }
        let mut shown = String::new();
        let mut used = 0;
        for c in &chars[start..] {
            let cw = c.to_string().width();
            if used + cw > width {
                break;
            }
            shown.push(*c);
            used += cw;
        }
        (shown, w(&chars[start..self.cursor]))
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
    fn line_breaks_become_spaces() {
        assert_eq!(typed("a\nb\tc").text(), "a b c");
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
