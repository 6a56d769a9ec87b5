//! How engine events land: the context length, the streamed answers and their
//! comparison, a switch's follow-up and what a mapper learned.

use super::*;
use crate::records::PathText;

#[test]
fn context_length_sums_the_mapped_path_and_a_switch_resets_it() {
    let mut app = running_app();
    event(
        &mut app,
        generation(1, PathKind::Mapped, "ab", vec![1, 2, 3], 20),
    );
    assert_eq!(app.context_tokens(), 23);
    event(
        &mut app,
        generation(1, PathKind::Reference, "ab", vec![1; 9], 50),
    );
    assert_eq!(app.context_tokens(), 23);
    event(&mut app, Event::Done { turn: 1 });
    event(&mut app, switch_event(25));
    assert_eq!(app.context_tokens(), 25);
    event(&mut app, generation(2, PathKind::Mapped, "c", vec![4], 6));
    assert_eq!(app.context_tokens(), 32);
}

#[test]
fn tokens_stream_into_the_transcript_and_the_reference_only_beside_it() {
    let mut app = running_app();
    event(
        &mut app,
        Event::UserMessage {
            turn: 2,
            text: "hi".into(),
        },
    );
    event(&mut app, started(2, PathKind::Mapped, CacheOrigin::Mapped));
    event(&mut app, token(2, PathKind::Mapped, "Hel", 5));
    event(&mut app, token(2, PathKind::Mapped, "lo", 6));
    let reply = app.transcript.iter().rev().find_map(|e| match e {
        Entry::Reply(r) => Some(r.clone()),
        _ => None,
    });
    let reply = reply.expect("a reply entry");
    assert_eq!(reply.text, "Hello");
    assert_eq!(reply.cache, CacheOrigin::Mapped);
    assert_eq!(reply.model, "large");
    event(
        &mut app,
        started(2, PathKind::Reference, CacheOrigin::Reprefilled),
    );
    event(&mut app, token(2, PathKind::Reference, "Hey", 7));
    let pair = app.pair.clone().expect("a turn pair");
    let texts = |p: &PathText| -> Vec<String> { p.pieces.iter().map(|x| x.text.clone()).collect() };
    assert_eq!(texts(&pair.mapped), ["Hel", "lo"]);
    assert_eq!(
        pair.reference.as_ref().map(texts),
        Some(vec!["Hey".to_string()])
    );
    assert_eq!(app.transcript.len(), 2);
    match app.transcript.last() {
        Some(Entry::Reply(r)) => assert_eq!(r.text, "Hello"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_first_difference_is_found_among_the_streamed_pieces() {
    let mut app = running_app();
    event(&mut app, started(1, PathKind::Mapped, CacheOrigin::Mapped));
    // Token 11 completes no text of its own: its bytes arrive with token 12.
    for (t, id) in [("The", 10), (" café", 12), (" is", 13), (" open", 14)] {
        event(&mut app, token(1, PathKind::Mapped, t, id));
    }
    event(
        &mut app,
        generation(
            1,
            PathKind::Mapped,
            "The café is open.",
            vec![10, 11, 12, 13, 14, 15],
            5,
        ),
    );
    event(
        &mut app,
        Event::TurnComparison {
            turn: 1,
            identical: false,
            first_difference: Some(3),
            agreement: 0.5,
        },
    );
    let pair = app.pair.clone().expect("a turn pair");
    assert_eq!(pair.comparison.and_then(|c| c.first_difference), Some(3));
    let mapped = &pair.mapped;
    assert_eq!(mapped.piece_of_token(0), Some(0));
    assert_eq!(mapped.piece_of_token(1), Some(1));
    assert_eq!(mapped.piece_of_token(2), Some(1));
    assert_eq!(mapped.piece_of_token(3), Some(2));
    // The flushed "." has no token of its own and covers what is left.
    assert_eq!(mapped.pieces.last().map(|p| p.text.as_str()), Some("."));
    assert_eq!(mapped.piece_of_token(5), Some(4));
    assert_eq!(mapped.piece_of_token(6), None);
}

#[test]
fn a_follow_up_completes_its_switch() {
    let mut app = ready_app();
    event(&mut app, switch_event(8));
    event(
        &mut app,
        Event::SwitchFollowUp {
            index: 0,
            turn: 2,
            top1_agreement: Some(0.9),
            kl: Some(0.1),
            positions: 7,
            first_token_ms: 30.0,
            end_to_end_ms: 35.0,
        },
    );
    let f = app.switches[0].follow_up.expect("follow-up recorded");
    assert_eq!(f.end_to_end_ms, 35.0);
    assert_eq!(f.top1_agreement, Some(0.9));
    assert!(matches!(app.transcript.last(), Some(Entry::Switch(0))));
}

#[test]
fn what_a_mapper_learned_is_said_on_the_status_line() {
    let mut app = ready_app();
    event(&mut app, switch_event(8));
    event(
        &mut app,
        Event::MapperLearned {
            index: 0,
            turn: 2,
            from: "small".into(),
            to: "large".into(),
            tokens: 1840,
            held_out: 600,
            before: 0.71,
            after: 0.78,
            conversation_before: 0.6,
            conversation_after: 0.7,
            calibration_before: Some(0.82),
            calibration_after: Some(0.86),
            accepted: true,
            learned_tokens: 1840,
            seconds: 12.0,
            kept: true,
        },
    );
    let status = app.status_text().unwrap_or_default();
    assert!(
        status.contains("adapted on 1,840 of this conversation's tokens")
            && status.contains("0.71 → 0.78"),
        "{status}"
    );
}
