//! A text buffer with a cursor, for the message and the bookmark note. It keeps the line
//! breaks and tabs of a pasted or typed block (a message is often code), and shows each
//! line on a row of its own, a tab as a space.

use unicode_width::UnicodeWidthChar;

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

    /// To the start of the cursor's line.
    pub fn home(&mut self) {
        let chars: Vec<char> = self.text.chars().collect();
        while self.cursor > 0 && chars[self.cursor - 1] != '\n' {
            self.cursor -= 1;
        }
    }

    /// To the end of the cursor's line.
    pub fn end(&mut self) {
        let chars: Vec<char> = self.text.chars().collect();
        while self.cursor < chars.len() && chars[self.cursor] != '\n' {
            self.cursor += 1;
        }
    }

    /// Empties the buffer, handing back what it held.
    pub fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }

    /// What to show in a box of `width` columns and at most `rows` rows: a row per line,
    /// the rows around the cursor's line when there are more lines than rows, each row
    /// scrolled so that the cursor stays in view; and the cursor's row and column in it.
    pub fn window(&self, width: usize, rows: usize) -> (Vec<String>, (usize, usize)) {
        let (width, rows) = (width.max(1), rows.max(1));
        let lines: Vec<&str> = self.text.split('\n').collect();
        let before = self.text.chars().take(self.cursor).collect::<String>();
        let row = before.matches('\n').count();
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        // The newest lines stay in view while the cursor is on the last one.
        let first = (row + 1).saturating_sub(rows);
        let mut shown = Vec::new();
        let mut at = (row - first, 0);
        for (i, line) in lines.iter().enumerate().skip(first).take(rows) {
            let cursor = if i == row { column } else { 0 };
            let (text, x) = window_line(line, cursor, width);
            if i == row {
                at.1 = x;
            }
            shown.push(text);
        }
        (shown, at)
    }
}

/// The part of `line` to show in `width` columns so that the character at `cursor` is in
/// view, and the cursor's column within it. A tab shows as a space.
fn window_line(line: &str, cursor: usize, width: usize) -> (String, usize) {
    let chars: Vec<char> = line.chars().map(shown_as).collect();
    let widths: Vec<usize> = chars.iter().map(|c| c.width().unwrap_or(0)).collect();
    let w = |from: usize, to: usize| widths[from..to].iter().sum::<usize>();
    let mut start = 0;
    // Leave a column for the cursor itself at the end of the text.
    while start < cursor && w(start, cursor) >= width {
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
    (shown, w(start, cursor))
}

/// Whether `text` shows nothing: every character is white space or one that draws no
/// mark of its own (a zero-width space or joiner, a byte-order mark, a direction or
/// variation mark: Unicode's default-ignorable code points). Such a message would reach
/// the model as a turn the person cannot see; one with any visible character is text.
pub fn shows_nothing(text: &str) -> bool {
    text.chars().all(|c| c.is_whitespace() || invisible(c))
}

/// Unicode's default-ignorable code points (DerivedCoreProperties.txt), the unassigned
/// ones included, as a terminal draws none of them.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// How `c` shows in the box.
fn shown_as(c: char) -> char {
    match c {
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
    fn each_line_shows_on_a_row_of_its_own() {
        let i = typed("fn x() {\n\tok\n}");
        let (shown, at) = i.window(40, 5);
        assert_eq!(shown, ["fn x() {", " ok", "}"]);
        assert_eq!(at, (2, 1));
        // More lines than rows: the rows end at the cursor's line.
        let (shown, at) = i.window(40, 2);
        assert_eq!((shown, at), (vec![" ok".to_string(), "}".into()], (1, 1)));
        let mut i = i;
        i.home();
        assert_eq!(i.cursor(), 13);
        i.left();
        i.left();
        let (shown, at) = i.window(40, 1);
        assert_eq!((shown, at), (vec![" ok".to_string()], (0, 2)));
        i.home();
        i.insert('x');
        i.end();
        assert_eq!(i.text(), "fn x() {\nx\tok\n}");
        assert_eq!(i.cursor(), 13);
        // A line break typed at the end starts an empty row with the cursor on it.
        let mut i = typed("one");
        i.insert('\n');
        assert_eq!(
            i.window(10, 5),
            (vec!["one".to_string(), String::new()], (1, 0))
        );
    }

    #[test]
    fn blank_and_invisible_text_shows_nothing_and_any_visible_character_is_text() {
        for nothing in [
            "",
            "   ",
            "\n\t \n",
            "\u{200B}\u{200C}\u{200D}\u{FEFF}\u{2060}",
            " \u{200B}\n\u{00A0}\u{3000}",
            "\u{FE0F}\u{E0041}",
        ] {
            assert!(shows_nothing(nothing), "{nothing:?}");
        }
        for text in ["a", "\u{200B}hi\u{200D}", " . ", "👍\u{FE0F}", "\u{200D}é"] {
            assert!(!shows_nothing(text), "{text:?}");
        }
    }

    #[test]
    fn the_window_follows_the_cursor() {
        let i = typed("abcdefghij");
        let (shown, at) = i.window(4, 1);
        assert_eq!((shown, at), (vec!["hij".to_string()], (0, 3)));
        let mut i = i;
        i.home();
        let (shown, at) = i.window(4, 1);
        assert_eq!((shown, at), (vec!["abcd".to_string()], (0, 0)));
    }
}
