//! Numbers three rows tall, drawn with half blocks, so the speed-up reads from the back
//! of a room.

/// 3×5 pixel glyphs, top row first; `1` is a lit pixel.
fn glyph(c: char) -> Option<&'static [&'static str; 5]> {
    Some(match c {
        '0' => &["111", "101", "101", "101", "111"],
        '1' => &["010", "110", "010", "010", "111"],
        '2' => &["111", "001", "111", "100", "111"],
        '3' => &["111", "001", "111", "001", "111"],
        '4' => &["101", "101", "111", "001", "001"],
        '5' => &["111", "100", "111", "001", "111"],
        '6' => &["111", "100", "111", "101", "111"],
        '7' => &["111", "001", "001", "001", "001"],
        '8' => &["111", "101", "111", "101", "111"],
        '9' => &["111", "101", "111", "001", "111"],
        '.' => &["0", "0", "0", "0", "1"],
        'x' => &["000", "000", "101", "010", "101"],
        _ => return None,
    })
}

/// `text` as three rows of half blocks, or `None` if it holds a character without a
/// glyph.
pub(crate) fn render(text: &str) -> Option<[String; 3]> {
    let glyphs: Vec<_> = text.chars().map(glyph).collect::<Option<_>>()?;
    let mut rows: [String; 3] = Default::default();
    for (i, g) in glyphs.iter().enumerate() {
        if i > 0 {
            for row in rows.iter_mut() {
                row.push(' ');
            }
        }
        let lit = |y: usize, x: usize| g.get(y).is_some_and(|r| r.as_bytes()[x] == b'1');
        for (r, row) in rows.iter_mut().enumerate() {
            for x in 0..g[0].len() {
                row.push(match (lit(2 * r, x), lit(2 * r + 1, x)) {
                    (true, true) => '█',
                    (true, false) => '▀',
                    (false, true) => '▄',
                    (false, false) => ' ',
                });
            }
        }
    }
    Some(rows)
}

pub(crate) fn width(text: &str) -> usize {
    render(text).map_or(0, |r| r[0].chars().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_three_rows_tall() {
        let rows = render("1.5x").unwrap();
        assert_eq!(rows[0], "▄█    █▀▀    ");
        assert_eq!(rows[1], " █    ▀▀█ ▀▄▀");
        assert_eq!(rows[2], "▀▀▀ ▀ ▀▀▀ ▀ ▀");
        assert_eq!(width("1.5x"), 13);
        assert!(render("n/a").is_none());
    }
}
