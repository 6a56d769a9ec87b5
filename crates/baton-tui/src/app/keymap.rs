//! What each key does, given what is on screen: an open question or help, a paused
//! demo, a bookmark note being written, or the message.

use super::{App, Effect, Overlay};
use crate::keys::{Key, KeyCode};

impl App {
    pub(super) fn on_key(&mut self, key: Key) -> Vec<Effect> {
        if self.overlay == Overlay::ConfirmQuit {
            self.overlay = Overlay::None;
            let from_q = std::mem::take(&mut self.quit_from_q);
            return match key.code {
                KeyCode::Char('y' | 'Y') => self.quit_now(),
                KeyCode::Char('c') if key.ctrl => self.quit_now(),
                KeyCode::Char('n' | 'N') | KeyCode::Esc => vec![],
                _ if from_q => {
                    self.input.type_into_message('q');
                    self.on_main_key(key)
                }
                _ => vec![],
            };
        }
        if key.is_ctrl('c') {
            return self.request_quit();
        }
        if key.code == KeyCode::Other {
            return vec![];
        }
        if self.overlay == Overlay::Help {
            self.overlay = Overlay::None;
            return vec![];
        }
        if self.demo_paused() {
            if key.code == KeyCode::Char('q') && !key.ctrl && self.input.message_is_empty() {
                return self.request_quit();
            }
            return self.demo_continue();
        }
        if self.input.note_open() {
            return match key.code {
                KeyCode::Enter => self.finish_bookmark(),
                KeyCode::Esc => {
                    self.input.drop_note();
                    vec![]
                }
                _ => {
                    self.input.edit(key);
                    vec![]
                }
            };
        }
        self.on_main_key(key)
    }

    fn on_main_key(&mut self, key: Key) -> Vec<Effect> {
        if key.ctrl {
            return match key.code {
                KeyCode::Char('r') => self.toggle_reference(),
                KeyCode::Char('p') => self.toggle_repair(),
                KeyCode::Char('b') => self.start_bookmark(),
                KeyCode::Char('e') => self.cycle_reread(),
                KeyCode::Char('t') => self.cycle_plan_kind(),
                KeyCode::Char('y') => self.cycle_layers(),
                KeyCode::Char('k') => {
                    self.mark_reread = !self.mark_reread;
                    self.dirty = true;
                    vec![]
                }
                KeyCode::Char('l') => {
                    self.layers.next_measure();
                    vec![]
                }
                _ => vec![],
            };
        }
        if key.is_line_break() {
            self.input.line_break();
            return vec![];
        }
        match key.code {
            KeyCode::Enter => self.submit_input(),
            KeyCode::Tab => self.request_switch(),
            KeyCode::Esc => self.cancel(),
            KeyCode::F(1) => {
                self.overlay = Overlay::Help;
                vec![]
            }
            KeyCode::PageUp => self.scroll_pages(-1),
            KeyCode::PageDown => self.scroll_pages(1),
            KeyCode::Up => self.scroll_lines(-1),
            KeyCode::Down => self.scroll_lines(1),
            // With an empty input `?` cannot be part of a message yet, so it opens help.
            KeyCode::Char('?') if self.input.message_is_empty() => {
                self.overlay = Overlay::Help;
                vec![]
            }
            // Always asked: the q may be the first letter of a message, and any key but
            // y/n/Esc goes on typing it.
            KeyCode::Char('q') if self.input.message_is_empty() => {
                self.overlay = Overlay::ConfirmQuit;
                self.quit_from_q = true;
                vec![]
            }
            _ => {
                self.input.edit(key);
                vec![]
            }
        }
    }
}
