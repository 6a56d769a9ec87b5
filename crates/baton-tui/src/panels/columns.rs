//! Vertical bars in eighths of a cell, one per value, each with its own style; the
//! library's bar chart cannot colour a single bar by its value, which is how the worst
//! layer stands out.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

pub(crate) struct Column {
    /// Height as a fraction of the area, 0 to 1; NaN draws nothing.
    pub fill: f64,
    pub style: Style,
}

/// How wide the bars and gaps can be for `n` bars in `width` columns, and how many fit.
pub(crate) fn fit(n: usize, width: u16, max_bar: u16) -> (u16, u16, usize) {
    let (n16, w) = (n.min(u16::MAX as usize) as u16, width);
    if n16 == 0 || w == 0 {
        return (1, 0, 0);
    }
    let with_gap = (w + 1) / n16;
    if with_gap >= 2 {
        return ((with_gap - 1).min(max_bar.max(1)), 1, n);
    }
    (1, 0, n.min(w as usize))
}

/// The x offset of bar `i` from the area's left edge.
pub(crate) fn offset(i: usize, bar: u16, gap: u16) -> usize {
    i * (bar + gap) as usize
}

pub(crate) fn draw(buf: &mut Buffer, area: Rect, columns: &[Column], bar: u16, gap: u16) {
    const EIGHTHS: [&str; 9] = [" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
    let area = area.intersection(*buf.area());
    if area.is_empty() {
        return;
    }
    let h = area.height as usize;
    for (i, col) in columns.iter().enumerate() {
        if !col.fill.is_finite() {
            continue;
        }
        let x0 = area.x as usize + offset(i, bar, gap);
        // Even the lowest value gets a sliver, so no layer looks missing.
        let eighths = ((col.fill.clamp(0.0, 1.0) * (h * 8) as f64).round() as usize).max(1);
        for dx in 0..bar as usize {
            let x = x0 + dx;
            if x >= area.right() as usize {
                return;
            }
            for row in 0..h {
                let lit = eighths.saturating_sub(row * 8).min(8);
                if lit == 0 {
                    break;
                }
                let y = area.bottom() as usize - 1 - row;
                if let Some(cell) = buf.cell_mut((x as u16, y as u16)) {
                    cell.set_symbol(EIGHTHS[lit]).set_style(col.style);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fit_their_width() {
        assert_eq!(fit(28, 40, 5), (1, 0, 28));
        assert_eq!(fit(28, 60, 5), (1, 1, 28));
        assert_eq!(fit(4, 40, 5), (5, 1, 4));
        assert_eq!(fit(100, 30, 5), (1, 0, 30));
        assert_eq!(fit(0, 30, 5).2, 0);
    }

    #[test]
    fn heights_are_drawn_in_eighths() {
        let area = Rect::new(0, 0, 3, 2);
        let mut buf = Buffer::empty(area);
        let cols = [0.5, 1.0, 0.0625].map(|fill| Column {
            fill,
            style: Style::default(),
        });
        draw(&mut buf, area, &cols, 1, 0);
        assert_eq!(buf, Buffer::with_lines([" █ ", "██▁"]));
    }
}
