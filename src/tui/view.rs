//! The whole screen: where each panel goes, and what covers them (help, banners).

use super::app::{App, Overlay};
use super::panels;
use ratatui::layout::{Constraint, Layout, Margin, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

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

/// The panels' places on a screen of `area`, or `None` when it is too small for them.
pub(crate) fn layout(area: Rect) -> Option<Areas> {
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        return None;
    }
    let [main, message, input, status, hints] = Layout::vertical([
        Constraint::Min(0),
        Constraint::Length(1),
        Constraint::Length(3),
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

pub fn render(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let Some(a) = layout(area) else {
        let msg = format!(
            "terminal too small: {MIN_WIDTH}x{MIN_HEIGHT} needed, have {}x{}",
            area.width, area.height
        );
        frame.render_widget(
            Paragraph::new(Line::from(msg)).wrap(Wrap { trim: true }),
            area,
        );
        return;
    };
    if !app.phase.loaded() {
        panels::loading::render(frame, area, app);
    } else {
        panels::transcript::render(frame, a.transcript, app);
        panels::latency::render(frame, a.latency, app);
        panels::side_by_side::render(frame, a.side_by_side, app);
        panels::layers::render(frame, a.layers, app);
        panels::status::render_message(frame, a.message, app);
        panels::input_box::render(frame, a.input, app);
        panels::status::render_status(frame, a.status, app);
        panels::status::render_hints(frame, a.hints, app);
        // Over the input, which the demo does not use, so the numbers stay in view.
        let below = Rect {
            height: a.message.height + a.input.height,
            ..a.message
        };
        panels::banners::render_demo_pause(frame, below, app);
        panels::banners::render_fatal(frame, a.main, app);
    }
    match app.overlay {
        Overlay::Help => panels::help::render(frame, area, app),
        Overlay::ConfirmQuit => panels::banners::render_confirm_quit(frame, area, app),
        Overlay::None => {}
    }
}
