//! Everything the workbench waits for, on one channel: terminal input (a thread reading
//! crossterm's events), engine events (a thread forwarding the engine's channel), frames
//! (a timer thread that runs only while a redraw is pending or something animates) and
//! an interrupt from outside. The runner blocks on it and wakes only when one arrives.

use crate::protocol::Event;
use crate::tui::Msg;
use crossterm::event::{self as cevent, Event as CEvent, KeyEventKind, MouseEventKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the terminal reader waits for input before it looks at its stop flag: the
/// longest a quit waits for it.
const READ_POLL: Duration = Duration::from_millis(100);

// Boxing the engine's event would cost an allocation per streamed token.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Input {
    /// A key, a scroll, a resize or a paste from the terminal.
    Terminal(Msg),
    /// Reading the terminal failed; the reader has stopped.
    TerminalFailed(std::io::Error),
    Engine(Event),
    /// The engine's event channel closed: its thread is gone.
    EngineGone,
    /// Time to draw a pending change or turn the busy indicator.
    Frame,
    /// A request to leave from outside (SIGINT), like Ctrl-C on the keyboard.
    Interrupt,
}

/// The most events read as one burst, so that a terminal that never stops sending still
/// gets its events to the app.
const MOST_IN_A_BURST: usize = 1 << 16;
/// How long the reader looks for the next event of a burst. Not zero: crossterm's
/// /dev/tty source answers a zero timeout without looking, even at events it has
/// already read.
const NEXT_IN_BURST: Duration = Duration::from_millis(1);
/// How long a burst of typed keys that ends on a line break waits for more: a paste
/// reaches the application in pieces, a piece may end right after a line break, and on a
/// busy machine the next one can take tens of milliseconds. Typing by hand never waits
/// (its keys come one at a time); a script's text and Enter are sent this much later.
const PASTE_GAP: Duration = Duration::from_millis(100);

/// A terminal event as the app understands it, or `None` for one it has no use for (mouse
/// moves, key releases, focus changes), which then does not wake the runner.
pub(crate) fn to_msg(e: CEvent) -> Option<Msg> {
    match e {
        CEvent::Key(k) if k.kind != KeyEventKind::Release => Some(Msg::Key(k.into())),
        CEvent::Mouse(m) => match m.kind {
            MouseEventKind::ScrollUp => Some(Msg::Scroll(-3)),
            MouseEventKind::ScrollDown => Some(Msg::Scroll(3)),
            _ => None,
        },
        CEvent::Resize(w, h) => Some(Msg::Resize(w, h)),
        CEvent::Paste(text) => Some(Msg::Paste(text)),
        _ => None,
    }
}

/// What a key types into a pasted text, for a key press without Ctrl or Alt.
fn typed(e: &CEvent) -> Option<char> {
    use crossterm::event::{KeyCode as C, KeyModifiers as M};
    let CEvent::Key(k) = e else { return None };
    if k.kind == KeyEventKind::Release || k.modifiers.intersects(M::CONTROL | M::ALT) {
        return None;
    }
    match k.code {
        C::Char(c) => Some(c),
        C::Enter => Some('\n'),
        C::Tab => Some('\t'),
        _ => None,
    }
}

/// Terminal events that arrived together (see [`read_burst`]), as the app's messages.
///
/// A terminal without bracketed paste, or one whose paste reaches the application some
/// other way, types a paste as keys, all at once: its line breaks arrive as Enter and its
/// tabs as Tab, which would send the first line as a message and switch models. Keys
/// that arrive together with other typed characters were pasted, so each run of them
/// becomes one [`Msg::Paste`], line breaks and tabs included. An Enter that ends such a
/// run stays a key: it may be the user's, read together with the paste (a script's text
/// and Enter, or a paste read late), and losing it is what a paste must never do; a
/// paste that ends on a line break is then sent whole, never in part.
pub(crate) fn coalesce(events: Vec<CEvent>) -> Vec<Msg> {
    let mut msgs = Vec::new();
    let mut run: Vec<(CEvent, char)> = Vec::new();
    let flush = |run: &mut Vec<(CEvent, char)>, msgs: &mut Vec<Msg>| {
        let chars = run.iter().filter(|(_, c)| !c.is_control()).count();
        if chars < 2 {
            msgs.extend(run.drain(..).filter_map(|(e, _)| to_msg(e)));
            return;
        }
        let mut text: String = run.iter().map(|(_, c)| *c).collect();
        let mut enter = None;
        if text.ends_with('\n') {
            text.pop();
            enter = run.pop().and_then(|(e, _)| to_msg(e));
        }
        run.clear();
        msgs.push(Msg::Paste(text));
        msgs.extend(enter);
    };
    for e in events {
        match typed(&e) {
            Some(c) => run.push((e, c)),
            None => {
                flush(&mut run, &mut msgs);
                msgs.extend(to_msg(e));
            }
        }
    }
    flush(&mut run, &mut msgs);
    msgs
}

/// The merged channel and the threads that feed it. Dropping it stops the terminal reader
/// and the frame timer and waits for them (at most [`READ_POLL`]); the engine forwarder
/// ends with the engine's channel, or with the process.
pub(crate) struct Inputs {
    tx: Sender<Input>,
    rx: Receiver<Input>,
    /// Tells the terminal reader and the frame timer to end.
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    /// Frames are wanted (a redraw is pending or something animates).
    frames_wanted: Arc<AtomicBool>,
    /// A frame is in the channel and not yet received, so a slow draw cannot pile them up.
    frame_queued: Arc<AtomicBool>,
    timer: Option<JoinHandle<()>>,
    engine_gone: bool,
}

impl Inputs {
    /// The channel, with a frame timer that ticks every `frame` while frames are wanted.
    pub fn new(frame: Duration) -> Self {
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let frames_wanted = Arc::new(AtomicBool::new(false));
        let frame_queued = Arc::new(AtomicBool::new(false));
        let timer = {
            let (tx, stop) = (tx.clone(), stop.clone());
            let (wanted, queued) = (frames_wanted.clone(), frame_queued.clone());
            std::thread::Builder::new()
                .name("baton-frames".into())
                .spawn(move || frame_timer(tx, frame, stop, wanted, queued))
                .ok()
        };
        Self {
            tx,
            rx,
            stop,
            reader: None,
            frames_wanted,
            frame_queued,
            timer,
            engine_gone: false,
        }
    }

    /// A sender for inputs from elsewhere (the signal handler, tests).
    pub fn sender(&self) -> Sender<Input> {
        self.tx.clone()
    }

    /// Start reading the terminal's events into the channel.
    pub fn read_terminal(&mut self) -> std::io::Result<()> {
        let (tx, stop) = (self.tx.clone(), self.stop.clone());
        let reader = std::thread::Builder::new()
            .name("baton-terminal".into())
            .spawn(move || read_terminal(tx, stop))?;
        self.reader = Some(reader);
        Ok(())
    }

    /// Forward the engine's events into the channel, then [`Input::EngineGone`] once the
    /// engine's thread has dropped its sender. The thread is not joined: it may wait on
    /// an engine still loading a model when the workbench leaves.
    pub fn forward_engine(&self, events: Receiver<Event>) -> std::io::Result<()> {
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("baton-engine-events".into())
            .spawn(move || {
                for e in events.iter() {
                    if tx.send(Input::Engine(e)).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Input::EngineGone);
            })?;
        Ok(())
    }

    /// Turn the frame timer on or off.
    pub fn want_frames(&self, on: bool) {
        let was = self.frames_wanted.swap(on, Ordering::SeqCst);
        if on && !was {
            if let Some(t) = &self.timer {
                t.thread().unpark();
            }
        }
    }

    /// The next input, waiting as long as it takes.
    pub fn recv(&mut self) -> Input {
        // The channel holds a sender of its own, so it never closes.
        let input = self.rx.recv().unwrap_or(Input::EngineGone);
        self.seen(input)
    }

    /// The next input within `limit`, if one comes.
    pub fn recv_timeout(&mut self, limit: Duration) -> Option<Input> {
        match self.rx.recv_timeout(limit) {
            Ok(input) => Some(self.seen(input)),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(self.seen(Input::EngineGone)),
        }
    }

    fn seen(&mut self, input: Input) -> Input {
        match input {
            Input::Frame => self.frame_queued.store(false, Ordering::SeqCst),
            Input::EngineGone => self.engine_gone = true,
            _ => {}
        }
        input
    }

    /// Read inputs until the engine says it shut down, its thread is gone, or `limit`
    /// passes; true when it shut down. Everything else is dropped.
    pub fn wait_for_shutdown(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.engine_gone {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv_timeout(left) {
                Some(Input::Engine(Event::ShutDown)) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
        true
    }

    /// Tell the terminal reader and the frame timer to end, without waiting for them.
    pub fn close(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = &self.timer {
            t.thread().unpark();
        }
    }
}

impl Drop for Inputs {
    fn drop(&mut self) {
        self.close();
        for t in [self.reader.take(), self.timer.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

/// Reads crossterm's events until told to stop. It polls with a timeout rather than
/// blocking in `read`, so that it sees the stop flag and never keeps the process alive.
fn read_terminal(tx: Sender<Input>, stop: Arc<AtomicBool>) {
    // A panic here must not leave the runner waiting for input that never comes.
    struct Farewell(Sender<Input>);
    impl Drop for Farewell {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let e = std::io::Error::other("the terminal reader panicked");
                let _ = self.0.send(Input::TerminalFailed(e));
            }
        }
    }
    let _farewell = Farewell(tx.clone());
    let result = (|| -> std::io::Result<()> {
        while !stop.load(Ordering::SeqCst) {
            if !cevent::poll(READ_POLL)? {
                continue;
            }
            for msg in coalesce(read_burst()?) {
                if tx.send(Input::Terminal(msg)).is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = tx.send(Input::TerminalFailed(e));
    }
}

/// The event that is ready and every one ready right after it: what the terminal sent
/// in one go. A burst of typed keys that ends on a line break waits [`PASTE_GAP`] for
/// the rest of a paste that arrives in pieces.
fn read_burst() -> std::io::Result<Vec<CEvent>> {
    let mut burst = vec![cevent::read()?];
    while burst.len() < MOST_IN_A_BURST {
        if cevent::poll(NEXT_IN_BURST)? {
            burst.push(cevent::read()?);
            continue;
        }
        let typing = burst.iter().filter(|e| typed(e).is_some()).count() > 1;
        let at_line_break = burst.last().and_then(typed) == Some('\n');
        if typing && at_line_break && cevent::poll(PASTE_GAP)? {
            continue;
        }
        break;
    }
    Ok(burst)
}

/// Sends a frame every `period` while `wanted`, and sleeps (parked) otherwise.
fn frame_timer(
    tx: Sender<Input>,
    period: Duration,
    stop: Arc<AtomicBool>,
    wanted: Arc<AtomicBool>,
    queued: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        if !wanted.load(Ordering::SeqCst) {
            // An unpark that came before this park makes it return at once.
            std::thread::park();
            continue;
        }
        std::thread::sleep(period);
        if wanted.load(Ordering::SeqCst)
            && !queued.swap(true, Ordering::SeqCst)
            && tx.send(Input::Frame).is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::{Key, KeyCode};
    use crossterm::event::{KeyEvent, KeyModifiers, MouseEvent};

    const FRAME: Duration = Duration::from_millis(5);

    #[test]
    fn terminal_events_become_messages_and_the_rest_is_dropped() {
        let key = KeyEvent::new(cevent::KeyCode::Enter, KeyModifiers::NONE);
        assert_eq!(
            to_msg(CEvent::Key(key)),
            Some(Msg::Key(Key::plain(KeyCode::Enter)))
        );
        let mouse = |kind| {
            CEvent::Mouse(MouseEvent {
                kind,
                column: 0,
                row: 0,
                modifiers: KeyModifiers::NONE,
            })
        };
        assert_eq!(
            to_msg(mouse(MouseEventKind::ScrollUp)),
            Some(Msg::Scroll(-3))
        );
        assert_eq!(
            to_msg(mouse(MouseEventKind::ScrollDown)),
            Some(Msg::Scroll(3))
        );
        assert_eq!(to_msg(mouse(MouseEventKind::Moved)), None);
        assert_eq!(to_msg(CEvent::FocusGained), None);
        assert_eq!(to_msg(CEvent::Resize(90, 30)), Some(Msg::Resize(90, 30)));
    }

    fn keys(text: &str) -> Vec<CEvent> {
        text.chars()
            .map(|c| {
                let code = match c {
                    '\r' => cevent::KeyCode::Enter,
                    '\t' => cevent::KeyCode::Tab,
                    c => cevent::KeyCode::Char(c),
                };
                CEvent::Key(KeyEvent::new(code, KeyModifiers::NONE))
            })
            .collect()
    }

    fn enter() -> Msg {
        Msg::Key(Key::plain(KeyCode::Enter))
    }

    #[test]
    fn a_paste_typed_as_keys_is_one_paste_with_its_line_breaks_and_tabs() {
        let burst = keys("fn main() {\r\tprintln!(\"hi\");\r}");
        assert_eq!(
            coalesce(burst),
            vec![Msg::Paste("fn main() {\n\tprintln!(\"hi\");\n}".into())]
        );
        // Nothing in it is a key: no Enter sends half of it, no Tab switches, no q asks.
        let burst = keys("q?\tx\ry");
        assert_eq!(coalesce(burst), vec![Msg::Paste("q?\tx\ny".into())]);
    }

    #[test]
    fn text_then_enter_in_one_burst_still_sends() {
        let mut burst = keys("Write hello world.\r");
        assert_eq!(
            coalesce(burst.clone()),
            vec![Msg::Paste("Write hello world.".into()), enter()]
        );
        burst = keys("two\rlines\r");
        assert_eq!(
            coalesce(burst.clone()),
            vec![Msg::Paste("two\nlines".into()), enter()]
        );
        // Separate keys stay keys, and so does a key between other events.
        burst = keys("a");
        burst.push(CEvent::Resize(80, 24));
        burst.extend(keys("\r"));
        assert_eq!(
            coalesce(burst),
            vec![Msg::Key(Key::char('a')), Msg::Resize(80, 24), enter()]
        );
    }

    #[test]
    fn keys_with_ctrl_break_a_paste_and_stay_keys() {
        let mut burst = keys("ab");
        burst.push(CEvent::Key(KeyEvent::new(
            cevent::KeyCode::Char('c'),
            KeyModifiers::CONTROL,
        )));
        burst.extend(keys("cd"));
        assert_eq!(
            coalesce(burst),
            vec![
                Msg::Paste("ab".into()),
                Msg::Key(Key::ctrl('c')),
                Msg::Paste("cd".into())
            ]
        );
    }

    #[test]
    fn a_multi_line_paste_typed_as_keys_is_sent_whole_by_the_enter_after_it() {
        use crate::protocol::Command;
        use crate::tui::{App, AppInfo, Effect};
        let mut app = App::new(AppInfo::default());
        app.update(Msg::Engine(Event::Ready {
            models: vec![],
            active: 0,
            mappers: vec![],
            device: "cpu".into(),
        }));
        let lines: Vec<String> = (0..80).map(|i| format!("line {i:02} of a paste")).collect();
        let block = lines.join("\r");
        assert!((1500..3000).contains(&block.len()));
        let mut sent = Vec::new();
        for msg in coalesce(keys(&block))
            .into_iter()
            .chain(coalesce(keys("\r")))
        {
            sent.extend(app.update(msg));
        }
        // Its line breaks reach the engine as line breaks.
        assert_eq!(
            sent,
            vec![Effect::Send(Command::Submit {
                text: lines.join("\n")
            })]
        );
    }

    #[test]
    fn frames_come_only_while_wanted_and_never_pile_up() {
        let period = Duration::from_millis(40);
        let mut inputs = Inputs::new(period);
        assert!(inputs.recv_timeout(period * 4).is_none());
        inputs.want_frames(true);
        // Not received for ten periods: one frame waits, not ten.
        std::thread::sleep(period * 10);
        assert!(matches!(
            inputs.recv_timeout(Duration::ZERO),
            Some(Input::Frame)
        ));
        assert!(inputs.recv_timeout(Duration::ZERO).is_none());
        assert!(matches!(
            inputs.recv_timeout(period * 4),
            Some(Input::Frame)
        ));
        inputs.want_frames(false);
        // At most the frame already on its way arrives.
        let _ = inputs.recv_timeout(period * 2);
        assert!(inputs.recv_timeout(period * 4).is_none());
    }

    #[test]
    fn engine_events_are_forwarded_and_the_end_of_the_engine_is_seen() {
        let mut inputs = Inputs::new(FRAME);
        let (etx, erx) = channel();
        inputs.forward_engine(erx).unwrap();
        etx.send(Event::Done { turn: 1 }).unwrap();
        drop(etx);
        let limit = Duration::from_secs(5);
        assert!(matches!(
            inputs.recv_timeout(limit),
            Some(Input::Engine(Event::Done { turn: 1 }))
        ));
        assert!(matches!(
            inputs.recv_timeout(limit),
            Some(Input::EngineGone)
        ));
        // Nothing is left to wait for.
        let t0 = Instant::now();
        assert!(inputs.wait_for_shutdown(limit));
        assert!(t0.elapsed() < limit);
    }

    #[test]
    fn waiting_for_the_shutdown_skips_other_inputs_and_gives_up_in_time() {
        let mut inputs = Inputs::new(FRAME);
        let tx = inputs.sender();
        tx.send(Input::Interrupt).unwrap();
        tx.send(Input::Engine(Event::ShutDown)).unwrap();
        assert!(inputs.wait_for_shutdown(Duration::from_secs(5)));
        assert!(!inputs.wait_for_shutdown(FRAME));
    }
}
