//! Word wrapping of styled text into lines of a given width. The transcript needs the
//! wrapped line count to scroll, so it wraps itself instead of leaving it to the widget.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

/// Wrap `chunks` at spaces where possible and mid-word where a word is wider than the
/// line; `\n` starts a new line. Always gives at least one line.
pub(crate) fn wrap(chunks: &[(&str, Style)], width: usize) -> Vec<Line<'static>> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut line: Vec<(char, Style)> = Vec::new();
    let mut used = 0;
    // Where the current line may be broken: just after its last space.
    let mut last_space: Option<usize> = None;
    for (text, style) in chunks {
        for c in text.chars() {
            if c == '\n' {
                out.push(to_line(&line));
                line.clear();
                used = 0;
                last_space = None;
                continue;
            }
            let c = if c == '\t' { ' ' } else { c };
            let Some(cw) = c.width() else {
                continue;
            };
            if used + cw > width && !line.is_empty() {
                if c == ' ' {
                    // The space that overflows ends the line and is not carried over.
                    out.push(to_line(&line));
                    line.clear();
                    used = 0;
                    last_space = None;
                    continue;
                }
                let rest = match last_space {
                    Some(i) => line.split_off(i + 1),
                    None => Vec::new(),
                };
                while line.last().is_some_and(|(c, _)| *c == ' ') {
                    line.pop();
                }
                out.push(to_line(&line));
                line = rest;
                used = line.iter().filter_map(|(c, _)| c.width()).sum();
                last_space = None;
            }
            if c == ' ' {
                last_space = Some(line.len());
            }
            line.push((c, *style));
            used += cw;
        }
    }
    out.push(to_line(&line));
    out
}

fn to_line(chars: &[(char, Style)]) -> Line<'static> {
    let mut spans: Vec<Span<'static>> = Vec::new();
    let mut text = String::new();
    let mut current: Option<Style> = None;
    for (c, s) in chars {
        if current.is_some_and(|cur| cur != *s) {
            spans.push(Span::styled(
                std::mem::take(&mut text),
                current.unwrap_or_default(),
            ));
        }
        current = Some(*s);
        text.push(*c);
    }
    if let Some(s) = current {
        spans.push(Span::styled(text, s));
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Line]) -> Vec<String> {
        lines.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn wraps_at_spaces_and_breaks_long_words() {
        let s = Style::default();
        let lines = wrap(&[("the quick brown fox", s)], 10);
        assert_eq!(plain(&lines), ["the quick", "brown fox"]);
        let lines = wrap(&[("abcdefghijkl xy", s)], 5);
        assert_eq!(plain(&lines), ["abcde", "fghij", "kl xy"]);
        let lines = wrap(&[("a\n\nb", s)], 5);
        assert_eq!(plain(&lines), ["a", "", "b"]);
        assert_eq!(plain(&wrap(&[], 5)), [""]);
    }

    #[test]
    fn styles_survive_a_break() {
        let red = Style::default().red();
        let lines = wrap(&[("aaa ", Style::default()), ("bbb", red)], 5);
        assert_eq!(plain(&lines), ["aaa", "bbb"]);
        assert_eq!(lines[1].spans[0].style, red);
    }
}
