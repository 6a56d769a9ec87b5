//! The workbench runner: the terminal, the engine thread and the UI state machine
//! joined. The runner blocks on one channel that merges terminal input, engine events,
//! frames and interrupts (see `inputs`), hands each to the app, and redraws at most ~30
//! times a second, never once per token; while nothing changes and nothing animates it
//! sleeps. The terminal is restored on every way out, the keyboard enhancement that
//! reports Shift-Enter included: normal exit, Ctrl-C (as a key or as a signal) and panic.

mod inputs;

use crate::engine::{self, EngineConfig};
use crate::protocol::Command;
use crate::tui::{self, App, AppInfo, Effect, Msg};
use crossterm::event as cevent;
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use inputs::{Input, Inputs};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum WorkbenchError {
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("the workbench needs an interactive terminal (stdin and stdout are not both one); for a run without a screen use `baton run --script FILE`")]
    NotATerminal,
    /// The engine stopped on an error (shown on screen until the user quit).
    #[error("{0}")]
    EngineStopped(String),
}

pub struct WorkbenchOptions {
    pub engine: EngineConfig,
    /// Shown on the loading screen (e.g. that a first run calibrates a quick mapper).
    pub loading_note: Option<String>,
    /// Play these commands as a demo, pausing after each switch.
    pub demo: Option<Vec<Command>>,
}

/// Whether the terminal took the keyboard enhancement (see [`enhance_keyboard`]), so that
/// leaving takes it back exactly once, whichever way out runs first.
static KEYBOARD_ENHANCED: AtomicBool = AtomicBool::new(false);

/// Ask a terminal that supports the kitty keyboard protocol to tell modified keys apart,
/// so that Shift-Enter reaches the workbench as such (a line break in the message)
/// rather than as Enter; elsewhere Alt-Enter does it. Unmodified Enter, Tab and
/// Backspace keep their usual bytes under this flag. Asked before the terminal reader
/// starts, as the question's answer arrives as input.
fn enhance_keyboard(out: &mut impl Write) {
    use cevent::{KeyboardEnhancementFlags as F, PushKeyboardEnhancementFlags};
    if !matches!(
        crossterm::terminal::supports_keyboard_enhancement(),
        Ok(true)
    ) {
        return;
    }
    if execute!(
        out,
        PushKeyboardEnhancementFlags(F::DISAMBIGUATE_ESCAPE_CODES)
    )
    .is_ok()
    {
        KEYBOARD_ENHANCED.store(true, Ordering::SeqCst);
    }
}

/// Put the terminal back as it was; safe to call more than once.
fn restore_terminal() {
    let _ = disable_raw_mode();
    let mut out = std::io::stdout();
    if KEYBOARD_ENHANCED.swap(false, Ordering::SeqCst) {
        let _ = execute!(out, cevent::PopKeyboardEnhancementFlags);
    }
    let _ = execute!(
        out,
        LeaveAlternateScreen,
        cevent::DisableMouseCapture,
        cevent::DisableBracketedPaste,
        crossterm::cursor::Show
    );
    let _ = out.flush();
}

/// Restores the terminal when dropped, so every return path (and unwinding) does it.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// The shortest time between two frames: at most ~30 redraws a second.
const FRAME: Duration = Duration::from_millis(33);
/// How long leaving waits for the engine to record the end of the session: a turn stops
/// at its next token or half layer, so this is only reached while a model still loads
/// (nothing is recorded then).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// How often the busy indicator turns.
const TICK: Duration = Duration::from_millis(250);

pub fn run(opts: WorkbenchOptions) -> Result<(), WorkbenchError> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(WorkbenchError::NotATerminal);
    }
    let record_path = opts.engine.record.as_ref().map(|p| p.display().to_string());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
    }));

    // NO_COLOR is honoured by crossterm itself; a dumb terminal takes the same path, and
    // the screen is drawn without colours so that bold and the like survive.
    let colour = tui::colour_allowed(
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("TERM").as_deref(),
    );
    if !colour {
        crossterm::style::force_color_output(false);
    }
    enable_raw_mode()?;
    let _guard = TerminalGuard;
    let mut stdout = std::io::stdout();
    execute!(
        stdout,
        EnterAlternateScreen,
        cevent::EnableMouseCapture,
        cevent::EnableBracketedPaste
    )?;
    enhance_keyboard(&mut stdout);
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout))?;
    terminal.clear()?;
    // Made after the guard, so that it is dropped (its reader stopped) before the
    // terminal is restored.
    let mut inputs = Inputs::new(FRAME);
    {
        let tx = inputs.sender();
        // A second handler (e.g. in tests) is refused; the key binding still works.
        let _ = ctrlc::set_handler(move || {
            let _ = tx.send(Input::Interrupt);
        });
    }

    let reference = opts.engine.settings.reference;
    let tail = opts.engine.settings.tail;
    let repair = opts.engine.settings.repair;
    let reread = opts.engine.settings.reread;
    let mut handle = engine::spawn(opts.engine);
    let mut app = App::new(AppInfo {
        record_path,
        demo: opts.demo.is_some(),
        quick_mapper_note: opts.loading_note,
        reference,
        tail,
        repair,
        reread,
    });
    let (w, h) = crossterm::terminal::size()?;
    let _ = app.update(Msg::Resize(w, h));
    if let Some(steps) = opts.demo {
        for e in app.load_demo(steps) {
            if let Effect::Send(c) = e {
                handle.send(c);
            }
        }
    }
    // The forwarder owns the engine's receiver; the handle keeps a closed one.
    let events = std::mem::replace(&mut handle.events, std::sync::mpsc::channel().1);
    inputs.forward_engine(events)?;
    inputs.read_terminal()?;
    serve(
        &mut app,
        &mut inputs,
        |c| handle.send(c),
        |app| {
            terminal
                .draw(|f| {
                    tui::render(f, app);
                    if !colour {
                        tui::strip_colours(f.buffer_mut());
                    }
                })
                .map(|_| ())
        },
    )?;
    // The engine stops at its next token or command, records what was on screen (a
    // turn cut short is recorded as cancelled) and the end of the session; leaving
    // before that would lose both. A model still loading is left behind after
    // SHUTDOWN_WAIT (artifacts are written atomically, session lines are synced).
    inputs.close();
    handle.send(Command::Shutdown);
    inputs.wait_for_shutdown(SHUTDOWN_WAIT);
    drop(inputs);
    drop(terminal);
    match app.fatal_error() {
        Some(message) => Err(WorkbenchError::EngineStopped(message.to_string())),
        None => Ok(()),
    }
}

/// Serve `app` until it quits: wait for the next input, hand it to the app, carry out
/// the commands that come back with `send`, and `draw` the app when it changed, at most
/// once per [`FRAME`]. Frames are asked for only while a change waits to be drawn or
/// something animates; otherwise this sleeps until an input arrives.
fn serve(
    app: &mut App,
    inputs: &mut Inputs,
    mut send: impl FnMut(Command),
    mut draw: impl FnMut(&App) -> std::io::Result<()>,
) -> Result<(), WorkbenchError> {
    let mut last_draw: Option<Instant> = None;
    let mut last_tick = Instant::now();
    loop {
        if app.needs_redraw() && last_draw.is_none_or(|t| t.elapsed() >= FRAME) {
            draw(app)?;
            app.mark_drawn();
            last_draw = Some(Instant::now());
        }
        inputs.want_frames(app.needs_redraw() || app.animating());
        let msg = match inputs.recv() {
            Input::Terminal(msg) => Some(msg),
            Input::TerminalFailed(e) => return Err(e.into()),
            Input::Engine(e) => Some(Msg::Engine(e)),
            // The app learns of a stopped engine from its events; a vanished one only
            // ends the wait for its shutdown.
            Input::EngineGone => None,
            Input::Frame if last_tick.elapsed() >= TICK => {
                last_tick = Instant::now();
                Some(Msg::Tick)
            }
            Input::Frame => None,
            // A signal from outside is a request to leave, like Ctrl-C on the keyboard.
            Input::Interrupt => Some(Msg::Key(tui::Key::ctrl('c'))),
        };
        let mut quit = false;
        for e in msg.map(|m| app.update(m)).unwrap_or_default() {
            match e {
                Effect::Send(c) => send(c),
                Effect::Quit => quit = true,
            }
        }
        if quit {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Event, PathKind};
    use crate::tui::{Key, KeyCode};
    use std::sync::mpsc::Sender;

    fn ready() -> Input {
        Input::Engine(Event::Ready {
            models: vec![],
            active: 0,
            mappers: vec![],
            device: "cpu".into(),
        })
    }

    fn key(k: Key) -> Input {
        Input::Terminal(Msg::Key(k))
    }

    /// Send `inputs` after `delay`, from another thread.
    fn later(tx: Sender<Input>, delay: Duration, inputs: Vec<Input>) {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            for i in inputs {
                let _ = tx.send(i);
            }
        });
    }

    /// Serve a fresh app until it quits; the commands sent and the number of draws.
    fn serve_counting(inputs: &mut Inputs) -> (Result<(), WorkbenchError>, Vec<Command>, usize) {
        let mut app = App::new(AppInfo::default());
        let (mut sent, mut draws) = (Vec::new(), 0);
        let result = serve(
            &mut app,
            inputs,
            |c| sent.push(c),
            |_| {
                draws += 1;
                Ok(())
            },
        );
        (result, sent, draws)
    }

    #[test]
    fn a_burst_of_tokens_costs_a_few_frames_and_a_quit_shuts_the_engine_down() {
        let mut inputs = Inputs::new(FRAME);
        let tx = inputs.sender();
        tx.send(ready()).unwrap();
        for id in 0..2000 {
            let text = "x".to_string();
            let path = PathKind::Mapped;
            tx.send(Input::Engine(Event::Token {
                turn: 1,
                path,
                text,
                id,
            }))
            .unwrap();
        }
        tx.send(key(Key::ctrl('c'))).unwrap();
        let t0 = Instant::now();
        let (result, sent, draws) = serve_counting(&mut inputs);
        result.unwrap();
        let most = (t0.elapsed().as_millis() / FRAME.as_millis()) as usize + 2;
        assert!((1..=most).contains(&draws), "{draws} draws, at most {most}");
        assert_eq!(sent, vec![Command::Shutdown]);
    }

    #[test]
    fn a_change_is_drawn_when_its_frame_comes_and_an_idle_screen_is_left_alone() {
        let mut inputs = Inputs::new(FRAME);
        let tx = inputs.sender();
        tx.send(ready()).unwrap();
        later(tx, FRAME * 8, vec![key(Key::ctrl('c'))]);
        let (result, _, draws) = serve_counting(&mut inputs);
        result.unwrap();
        // The first screen, then the ready one once a frame came; nothing while idle.
        assert_eq!(draws, 2);
    }

    #[test]
    fn a_running_turn_keeps_the_indicator_turning() {
        let mut inputs = Inputs::new(FRAME);
        let tx = inputs.sender();
        tx.send(ready()).unwrap();
        tx.send(key(Key::char('h'))).unwrap();
        tx.send(key(Key::plain(KeyCode::Enter))).unwrap();
        later(tx, TICK * 3, vec![key(Key::ctrl('c')), key(Key::char('y'))]);
        let (result, sent, draws) = serve_counting(&mut inputs);
        result.unwrap();
        assert_eq!(
            sent,
            vec![
                Command::Submit { text: "h".into() },
                Command::Cancel,
                Command::Shutdown
            ]
        );
        // At least two turns of the indicator besides the typing.
        assert!(draws >= 4, "{draws} draws");
    }

    #[test]
    fn an_interrupt_quits_like_ctrl_c_and_a_terminal_failure_ends_the_loop() {
        let mut inputs = Inputs::new(FRAME);
        inputs.sender().send(Input::Interrupt).unwrap();
        let (result, sent, _) = serve_counting(&mut inputs);
        result.unwrap();
        assert_eq!(sent, vec![Command::Shutdown]);
        let e = std::io::Error::other("gone");
        inputs.sender().send(Input::TerminalFailed(e)).unwrap();
        let (result, sent, _) = serve_counting(&mut inputs);
        assert!(matches!(result, Err(WorkbenchError::Terminal(_))));
        assert!(sent.is_empty());
    }
}
