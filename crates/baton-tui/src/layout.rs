//! Where each panel goes on the screen, and the boxes inside and over them. Geometry
//! only: what is drawn there is up to the panels.

use ratatui::layout::{Constraint, Layout, Margin, Rect};

/// Below this the panels cannot show their numbers legibly.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Areas {
    pub main: Rect,
    pub transcript: Rect,
    pub latency: Rect,
    pub side_by_side: Rect,
    pub layers: Rect,
    pub message: Rect,
    pub input: Rect,
    pub status: Rect,
    pub hints: Rect,
}

/// The panels' places on a screen of `area`, with `input_rows` rows of text in the input
/// box (it grows with the lines of a message), or `None` when the screen is too small.
pub(crate) fn layout(area: Rect, input_rows: u16) -> Option<Areas> {
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        return None;
    }
    let [main, message, input, status, hints] = Layout::vertical([
        Constraint::Min(0),
        Constraint::Length(1),
        Constraint::Length(input_rows.max(1) + 2),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let [upper, lower] =
        Layout::vertical([Constraint::Percentage(58), Constraint::Percentage(42)]).areas(main);
    let columns = [Constraint::Percentage(58), Constraint::Percentage(42)];
    let [transcript, latency] = Layout::horizontal(columns).areas(upper);
    let [side_by_side, layers] = Layout::horizontal(columns).areas(lower);
    Some(Areas {
        main,
        transcript,
        latency,
        side_by_side,
        layers,
        message,
        input,
        status,
        hints,
    })
}

/// The part of a bordered panel inside its border.
pub(crate) fn inner(area: Rect) -> Rect {
    area.inner(Margin::new(1, 1))
}

/// A `width`×`height` box in the middle of `area`, shrunk to fit.
pub(crate) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}
