//! The whole screen: where each panel goes, what each is handed, and what covers them
//! (help, banners). The panels see only what is passed here, never the app.

use super::{App, Overlay};
use crate::layout::{self, Areas, MIN_HEIGHT, MIN_WIDTH};
use crate::panels::input_box::InputContext;
use crate::panels::loading::{self, Loading};
use crate::panels::session_line::{self, DemoBadge, Session};
use crate::panels::status::{self, Activity};
use crate::panels::{banners, help, latency, side_by_side, Names};
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

/// One part of the screen, to draw on its own (as the snapshot tests do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Panel {
    Transcript,
    Latency,
    SideBySide,
    Layers,
    /// The message or bookmark note being typed.
    Input,
    /// What the engine is doing, and the latest notice.
    Message,
    /// Models, device, context, settings, recording.
    Status,
    /// The keys worth knowing.
    Hints,
    Help,
}

pub fn render(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let Some(a) = layout::layout(area, app.input_rows()) else {
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
    if app.phase.loaded() {
        app.draw_main(frame, &a);
    } else {
        loading::render(frame, area, &app.loading_view());
    }
    match app.overlay {
        Overlay::Help => help::render(frame, area),
        Overlay::ConfirmQuit => banners::render_confirm_quit(frame, area, app.busy()),
        Overlay::None => {}
    }
}

/// Draw one panel of `app` into `area`.
pub fn render_panel(frame: &mut Frame, area: Rect, app: &App, panel: Panel) {
    let names = app.names();
    match panel {
        Panel::Transcript => app.transcript_panel.draw(frame, area, &app.conversation()),
        Panel::Latency => latency::render(frame, area, &app.switches, names),
        Panel::SideBySide => {
            side_by_side::render(frame, area, app.pair.as_ref(), app.reference, names)
        }
        Panel::Layers => app.layers.draw(frame, area, app.switches.last()),
        Panel::Input => app.input.draw(frame, area, app.input_context()),
        Panel::Message => app.message_line.draw(frame, area, app.activity()),
        Panel::Status => session_line::render_status(frame, area, &app.session()),
        Panel::Hints => status::render_hints(frame, area),
        Panel::Help => help::render(frame, area),
    }
}

impl App {
    fn draw_main(&self, frame: &mut Frame, a: &Areas) {
        for (panel, area) in [
            (Panel::Transcript, a.transcript),
            (Panel::Latency, a.latency),
            (Panel::SideBySide, a.side_by_side),
            (Panel::Layers, a.layers),
            (Panel::Message, a.message),
            (Panel::Input, a.input),
            (Panel::Status, a.status),
            (Panel::Hints, a.hints),
        ] {
            render_panel(frame, area, self, panel);
        }
        // Over the input, which the demo does not use, so the numbers stay in view.
        let below = Rect {
            height: a.message.height + a.input.height,
            ..a.message
        };
        let paused = self.demo.as_ref().and_then(|d| d.paused_after);
        let paused = paused.and_then(|i| self.switches.get(i));
        banners::render_demo_pause(frame, below, paused, self.names());
        banners::render_fatal(frame, a.main, self.phase.fatal());
    }

    fn names(&self) -> Names<'_> {
        Names(&self.models)
    }

    fn loading_view(&self) -> Loading<'_> {
        Loading {
            note: self.info.quick_mapper_note.as_deref(),
            progress: self.phase.loading_progress(),
            stopped: self.phase.stopped(),
            fatal: self.phase.fatal(),
        }
    }

    fn input_context(&self) -> InputContext<'_> {
        InputContext {
            to: self.active_model().map(|m| m.name.as_str()),
            busy: self.busy(),
            cursor: self.overlay == Overlay::None,
            queued: self.queued.is_some(),
        }
    }

    /// What the engine is busy with, if anything.
    pub(super) fn activity(&self) -> Option<Activity<'_>> {
        if self.phase.stopped() {
            return None;
        }
        if self.phase.answering() {
            // The mapped answer is complete and the reference one is being computed.
            let reference = self
                .pair
                .as_ref()
                .filter(|p| self.turn_announced && p.turn == self.latest_turn)
                .is_some_and(|p| p.mapped.stop.is_some() && p.reference.is_some());
            return Some(Activity::Answering {
                model: self.active_model().map(|m| m.name.as_str()),
                reference,
                cancelling: self.phase.cancelling(),
            });
        }
        if self.phase.switches_pending() > 0 {
            return Some(Activity::HandingOver {
                queued: self.queued.is_some(),
            });
        }
        self.measuring().map(|s| Activity::Measuring(s.index))
    }

    fn session(&self) -> Session<'_> {
        let demo = match &self.demo {
            Some(d) => Some(DemoBadge::Step(d.step(), d.total)),
            None if self.info.demo && self.phase.loaded() => Some(DemoBadge::Over),
            None => None,
        };
        Session {
            models: &self.models,
            active: self.active,
            demo,
            device: &self.device,
            context_tokens: self.context_tokens,
            reference: self.reference,
            repair: self.repair,
            repaired: self.repaired,
            calibration: self
                .calibration
                .values()
                .filter(|(read, full)| read < full)
                .min()
                .copied(),
            tail: self.info.tail,
            reread: self.reread.as_ref(),
            record_path: self.info.record_path.as_deref(),
            recording_stopped: self.recording_stopped,
            mappers: &self.mappers,
        }
    }
}
