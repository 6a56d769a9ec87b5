//! Every key, over the rest of the screen.

use super::{panel, BOLD, DIM};
use crate::layout::centered;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};
use ratatui::Frame;

const KEYS: [(&str, &str); 17] = [
    (
        "Enter",
        "send the message (queued during a switch; not while a turn runs)",
    ),
    (
        "Alt-Enter",
        "a new line in the message (also Shift-Enter where the terminal tells it)",
    ),
    (
        "Tab",
        "hand the conversation to the other model (queued during a turn)",
    ),
    (
        "Esc",
        "cancel the answer or a switch's measurement · take back a queued message",
    ),
    (
        "Ctrl-R",
        "reference path on/off: the re-prefilled answer to compare with",
    ),
    (
        "Ctrl-P",
        "cache repair on/off: re-prefill the mapped cache while idle",
    ),
    (
        "Ctrl-E",
        "plan budget, same kind: re-read off → 10% → 20% → 30% → 40%, others from 0%",
    ),
    ("Ctrl-T", "plan: re-read over map → drop rest → focus"),
    (
        "Ctrl-Y",
        "plan layers: upper ¾ → ½ → ¼ over the mapped residual → lower ½ → none",
    ),
    (
        "Ctrl-K",
        "mark each token of the conversation kept, re-read, mapped or dropped",
    ),
    ("Ctrl-B", "bookmark the current turn with a note"),
    (
        "Ctrl-L",
        "layer panel: attention cosine → K/V R² → key-error concentration",
    ),
    (
        "PgUp PgDn",
        "scroll the conversation (also the mouse wheel, ↑ ↓)",
    ),
    (
        "← → Home End",
        "move in the message (Home End: in its line) · Backspace Delete edit it",
    ),
    ("?, F1", "this help"),
    (
        "q, Ctrl-C",
        "quit (asks first while a turn runs; Ctrl-C twice quits at once)",
    ),
    ("demo", "after each switch the demo waits: any key goes on"),
];

pub(crate) fn render(frame: &mut Frame, area: Rect) {
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, d)| {
            Line::from(vec![
                Span::styled(format!("{k:>12}  "), BOLD),
                Span::raw(*d),
            ])
        })
        .collect();
    lines.push(Line::default());
    lines.push(Line::from(Span::styled(
        "l, ? and q act as keys only while the message is empty. Any key closes this help.",
        DIM,
    )));
    let box_area = centered(area, 92, lines.len() as u16 + 2);
    frame.render_widget(Clear, box_area);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(panel(Line::from(" keys "))),
        box_area,
    );
}
