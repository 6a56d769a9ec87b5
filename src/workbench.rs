//! The workbench runner: the terminal, the engine thread and the UI state machine
//! joined. Input and engine events are drained as they come; the screen is redrawn at
//! most ~30 times a second, never once per token. The terminal is restored on every
//! way out: normal exit, Ctrl-C (as a key or as a signal) and panic.

use crate::engine::{self, EngineConfig};
use crate::protocol::{Command, Event};
use crate::tui::{self, App, AppInfo, Effect, Msg};
use crossterm::event::{self as cevent, Event as CEvent, KeyEventKind, MouseEventKind};
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::TryRecvError;
use std::sync::Arc;
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

/// Put the terminal back as it was; safe to call more than once.
fn restore_terminal() {
    let _ = disable_raw_mode();
    let mut out = std::io::stdout();
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

const FRAME: Duration = Duration::from_millis(33);
/// How long leaving waits for the engine to record the end of the session: a turn stops
/// at its next token or half layer, so this is only reached while a model still loads
/// (nothing is recorded then).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(250);
/// Engine events handled per loop pass at most, so input stays responsive under a burst.
const EVENTS_PER_PASS: usize = 4096;

pub fn run(opts: WorkbenchOptions) -> Result<(), WorkbenchError> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(WorkbenchError::NotATerminal);
    }
    let record_path = opts.engine.record.as_ref().map(|p| p.display().to_string());
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // A second handler (e.g. in tests) is refused; the key binding still works.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
    }));

    enable_raw_mode()?;
    let _guard = TerminalGuard;
    let mut stdout = std::io::stdout();
    execute!(
        stdout,
        EnterAlternateScreen,
        cevent::EnableMouseCapture,
        cevent::EnableBracketedPaste
    )?;
    let mut terminal = Terminal::new(CrosstermBackend::new(stdout))?;
    terminal.clear()?;

    let reference = opts.engine.settings.reference;
    let tail = opts.engine.settings.tail;
    let repair = opts.engine.settings.repair;
    let handle = engine::spawn(opts.engine);
    let mut app = App::new(AppInfo {
        record_path,
        demo: opts.demo.is_some(),
        quick_mapper_note: opts.loading_note,
        reference,
        tail,
        repair,
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
    let mut last_draw = Instant::now() - FRAME;
    let mut last_tick = Instant::now();
    let mut quit = false;
    while !quit {
        let mut effects = Vec::new();
        if cevent::poll(Duration::from_millis(15))? {
            match cevent::read()? {
                CEvent::Key(k) if k.kind != KeyEventKind::Release => {
                    effects.extend(app.update(Msg::Key(k.into())))
                }
                CEvent::Mouse(m) => match m.kind {
                    MouseEventKind::ScrollUp => effects.extend(app.update(Msg::Scroll(-3))),
                    MouseEventKind::ScrollDown => effects.extend(app.update(Msg::Scroll(3))),
                    _ => {}
                },
                CEvent::Resize(w, h) => effects.extend(app.update(Msg::Resize(w, h))),
                CEvent::Paste(text) => effects.extend(app.update(Msg::Paste(text))),
                _ => {}
            }
        }
        for _ in 0..EVENTS_PER_PASS {
            match handle.events.try_recv() {
                Ok(e) => effects.extend(app.update(Msg::Engine(e))),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        if last_tick.elapsed() >= TICK {
            effects.extend(app.update(Msg::Tick));
            last_tick = Instant::now();
        }
        if interrupted.swap(false, Ordering::SeqCst) {
            // A signal from outside is a request to leave, like Ctrl-C on the keyboard.
            effects.extend(app.update(Msg::Key(tui::Key::ctrl('c'))));
        }
        for e in effects {
            match e {
                Effect::Send(c) => handle.send(c),
                Effect::Quit => quit = true,
            }
        }
        if app.needs_redraw() && last_draw.elapsed() >= FRAME {
            terminal.draw(|f| tui::render(f, &app))?;
            app.mark_drawn();
            last_draw = Instant::now();
        }
    }
    // The engine stops at its next token or command, records what was on screen (a
    // turn cut short is recorded as cancelled) and the end of the session; leaving
    // before that would lose both. A model still loading is left behind after
    // SHUTDOWN_WAIT (artifacts are written atomically, session lines are synced).
    handle.send(Command::Shutdown);
    wait_for_shutdown(&handle.events, SHUTDOWN_WAIT);
    drop(terminal);
    match app.fatal_error() {
        Some(message) => Err(WorkbenchError::EngineStopped(message.to_string())),
        None => Ok(()),
    }
}

/// Read `events` until the engine says it shut down, its thread is gone, or `limit`
/// passes; true when it shut down.
pub fn wait_for_shutdown(events: &std::sync::mpsc::Receiver<Event>, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::ShutDown) => return true,
            Ok(_) => continue,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return true,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return false,
        }
    }
}
