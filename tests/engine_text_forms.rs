//! Messages in any Unicode form, through the engine on two tiny chat models generated
//! here: a decomposed accent, composed accents, emoji, a ZWJ sequence and right-to-left
//! text are each answered, and so is every turn after them, with and without a switch.

mod common;

use baton::protocol::{Command, Event};
use common::engine_rig::{rig_with, tiny, write_pair_of};
use common::synthetic::Tiny;

/// Each message's words, in the tokenizer's normal form (NFC): a vocabulary entry each.
const WORDS: &[&str] = &[
    "café",
    "ñ",
    "🦀",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧",
    "שלום",
    "مرحبا",
    "é\u{301}",
];

/// What the user types: decomposed accents among them.
const MESSAGES: [&str; 6] = [
    "w3 cafe\u{301} w4 n\u{303}",
    "w5 café ñ",
    "🦀 w1 👍🏽",
    "w2 👨\u{200d}👩\u{200d}👧",
    "שלום w7 مرحبا",
    "e\u{301}\u{301} w9",
];

/// The engine's tiny chat models, with the words above in their vocabulary.
fn unicode_tiny() -> Tiny {
    let t = tiny();
    Tiny {
        vocab: t.vocab + WORDS.len(),
        chat_words: WORDS,
        ..t
    }
}

fn answered(events: &[Event]) -> bool {
    events.iter().any(|e| matches!(e, Event::Done { .. }))
}

#[test]
fn every_turn_after_a_decomposed_accent_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    write_pair_of(&unicode_tiny(), dir.path(), false);
    let mut r = rig_with(dir.path(), |c| c.settings.max_tokens = 4);
    for (i, text) in MESSAGES.iter().enumerate() {
        // `drain` fails the test on any engine error, the template's included.
        let events = r.handle(Command::Submit {
            text: text.to_string(),
        });
        assert!(answered(&events), "turn {i} ({text:?}): {events:?}");
        if i == 2 {
            let events = r.handle(Command::Switch);
            assert!(
                events.iter().any(|e| matches!(e, Event::Switch(_))),
                "{events:?}"
            );
        }
    }
    let events = r.handle(Command::Submit {
        text: "and one more".into(),
    });
    assert!(answered(&events), "{events:?}");
}
