//! The re-read at the first message after a switch, through the engine on two tiny
//! models: the switch names it, the message triggers it, what it re-read is reported
//! (inside the mapped positions, within the budget), and re-reading everything makes the
//! shown answer the re-prefilled one.

mod common;

use baton::handoff::reread::RereadSetting;
use baton::protocol::{Command, Event};
use common::engine_rig::{rig_with, tiny, write_pair};

fn reread_events(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::SwitchReread { .. }))
        .collect()
}

#[test]
fn the_first_message_after_a_switch_rereads_within_its_budget_and_later_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("0.3:source-attention:word").unwrap();
    });
    let events = rig.talk_and_switch(1);
    let Some(Event::Switch(baton::protocol::SwitchEvent {
        reread,
        context_tokens,
        ..
    })) = events.iter().find(|e| matches!(e, Event::Switch(_)))
    else {
        panic!("no switch in {events:?}");
    };
    assert_eq!(reread.as_deref(), Some("30%:source-attention:word"));
    let n = *context_tokens;
    assert!(
        reread_events(&events).is_empty(),
        "nothing is re-read before a message"
    );

    let text = tiny().chat_text(12, 2);
    let events = rig.handle(Command::Submit { text });
    let rereads = reread_events(&events);
    assert_eq!(rereads.len(), 1, "{events:?}");
    let Event::SwitchReread {
        index,
        positions,
        context_tokens,
        spans,
        texts,
        ..
    } = rereads[0]
    else {
        unreachable!()
    };
    assert_eq!((*index, *context_tokens), (0, n));
    let budget = (0.3 * n as f64).round() as usize;
    assert!(
        *positions > 0 && *positions <= budget.max(1) + 8,
        "{positions} of {budget}"
    );
    assert_eq!(spans.iter().map(|s| s[1] - s[0]).sum::<usize>(), *positions);
    assert!(
        spans.iter().all(|s| s[0] >= 1 && s[1] <= n),
        "{spans:?}: the anchor stays"
    );
    assert_eq!(texts.len(), spans.len());
    // The re-read comes before the answer.
    let at = |f: &dyn Fn(&Event) -> bool| events.iter().position(f).unwrap();
    assert!(
        at(&|e| matches!(e, Event::SwitchReread { .. }))
            < at(&|e| matches!(e, Event::Token { .. }))
    );

    // A second message is answered from the cache as it stands.
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(8, 3),
    });
    assert!(reread_events(&events).is_empty());
}

#[test]
fn rereading_everything_gives_the_reprefilled_answer_and_off_rereads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("1.0:recency:token").unwrap();
    });
    let _ = rig.talk_and_switch(4);
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 5),
    });
    assert_eq!(reread_events(&events).len(), 1);
    let identical = events.iter().find_map(|e| match e {
        Event::TurnComparison { identical, .. } => Some(*identical),
        _ => None,
    });
    assert_eq!(identical, Some(true), "{events:?}");

    // Turned off by a command, the next switch names no re-read and makes none.
    let events = rig.handle(Command::SetReread { setting: None });
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Notice { message } if message.starts_with("re-read off"))));
    let events = rig.handle(Command::Switch);
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Switch(baton::protocol::SwitchEvent { reread: None, .. })
    )));
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 6),
    });
    assert!(reread_events(&events).is_empty());

    // A bad setting never reaches the engine: it does not read as a plan, and says why.
    let e = "2.0"
        .parse::<baton::handoff::reread::RereadSetting>()
        .unwrap_err();
    assert!(e.to_string().contains("re-read budget"), "{e}");
}

/// A re-read event's plan, as the event gives it.
struct Plan {
    positions: usize,
    context: usize,
    spans: Vec<[usize; 2]>,
    dropped: Vec<[usize; 2]>,
    reprefilled: bool,
    parts: usize,
}

fn plan_of(e: &Event) -> Plan {
    let Event::SwitchReread {
        positions,
        context_tokens,
        spans,
        dropped,
        reprefilled,
        parts,
        ..
    } = e
    else {
        panic!("not a re-read: {e:?}")
    };
    Plan {
        positions: *positions,
        context: *context_tokens,
        spans: spans.clone(),
        dropped: dropped.clone(),
        reprefilled: *reprefilled,
        parts: parts.len(),
    }
}

#[test]
fn a_drop_plan_rereads_its_budget_drops_the_rest_and_the_conversation_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("drop:0.3:recency:token").unwrap();
    });
    let _ = rig.talk_and_switch(7);
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(12, 8),
    });
    let rereads = reread_events(&events);
    assert_eq!(rereads.len(), 1, "{events:?}");
    let Plan {
        positions,
        context: n,
        spans,
        dropped,
        reprefilled,
        parts,
    } = plan_of(rereads[0]);
    assert!(!reprefilled);
    assert!(
        positions > 0 && !dropped.is_empty(),
        "{spans:?} {dropped:?}"
    );
    let count = |r: &[[usize; 2]]| r.iter().map(|s| s[1] - s[0]).sum::<usize>();
    // Re-read and dropped are disjoint, inside the mapped part (past the anchor), and
    // with the anchor they cover the history: nothing stays mapped.
    assert_eq!(
        count(&spans) + count(&dropped) + 1,
        n,
        "{spans:?} {dropped:?}"
    );
    for d in &dropped {
        assert!(spans.iter().all(|s| s[1] <= d[0] || s[0] >= d[1]));
    }
    // By recency, the newest positions are the ones re-read.
    assert_eq!(spans.last().unwrap()[1], n);
    assert!(parts >= 2, "the text comes marked part by part");
    assert!(events.iter().any(|e| matches!(e, Event::Token { .. })));
}

#[test]
fn what_a_drop_plan_dropped_is_read_back_before_the_next_message() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("drop:0.2:source-attention:token").unwrap();
    });
    let _ = rig.talk_and_switch(7);
    let first = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 20),
    });
    let rereads = reread_events(&first);
    assert_eq!(rereads.len(), 1, "{first:?}");
    assert!(!plan_of(rereads[0]).dropped.is_empty());
    // Repair is off, and the next message still finds the history whole: the dropped
    // rest is read back (in the background when idle, else before the answer), no
    // second plan runs, and the answer is the re-prefilled one.
    let second = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 21),
    });
    let events: Vec<&Event> = first.iter().chain(&second).collect();
    assert!(reread_events(&second).is_empty(), "{second:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CacheRepaired { complete: true, .. })),
        "{events:?}"
    );
    let compared: Vec<bool> = second
        .iter()
        .filter_map(|e| match e {
            Event::TurnComparison { identical, .. } => Some(*identical),
            _ => None,
        })
        .collect();
    assert_eq!(compared, [true], "{second:?}");
}

#[test]
fn a_plan_that_would_cost_the_reprefill_reprefills_instead() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    // Re-reading 90% costs more than reading it all once (a re-read position costs more
    // than a prefill's), so the target reads the mapped part itself.
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("drop:0.9:recency:token").unwrap();
    });
    let _ = rig.talk_and_switch(10);
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(12, 11),
    });
    let rereads = reread_events(&events);
    assert_eq!(rereads.len(), 1, "{events:?}");
    let Plan {
        positions,
        context: n,
        spans,
        dropped,
        reprefilled,
        ..
    } = plan_of(rereads[0]);
    assert!(reprefilled);
    assert!(dropped.is_empty());
    assert_eq!((positions, spans), (n - 1, vec![[1, n]]));
    let identical = events.iter().find_map(|e| match e {
        Event::TurnComparison { identical, .. } => Some(*identical),
        _ => None,
    });
    assert_eq!(identical, Some(true), "the re-prefilled answer: {events:?}");
}

#[test]
fn a_plan_waits_through_every_switch_before_the_message_and_reads_every_mapped_position() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    // Everything the target did not compute itself, re-read: the answer is the
    // re-prefilled one only if no mapped position was left out.
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("1.0:recency:token").unwrap();
    });
    // a -> b (b maps the history), b -> a (a holds it all), a -> b (b holds it all, as
    // it was mapped at the first switch): three switches and no message between them.
    let events = rig.talk_and_switch(12);
    let first_mapped = events
        .iter()
        .find_map(|e| match e {
            Event::Switch(s) => Some(s.context_tokens),
            _ => None,
        })
        .unwrap();
    for _ in 0..2 {
        let events = rig.handle(Command::Switch);
        rig.engine.measure_pending(&rig.rx);
        assert!(events.iter().any(|e| matches!(e, Event::Switch(_))));
        assert!(reread_events(&events).is_empty());
    }
    let _ = rig.drain();
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 13),
    });
    let rereads = reread_events(&events);
    assert_eq!(rereads.len(), 1, "the plan ran at the message: {events:?}");
    let Event::SwitchReread {
        index,
        context_tokens,
        spans,
        parts,
        ..
    } = rereads[0]
    else {
        unreachable!()
    };
    // The session says which plan ran: the one of the latest switch to this model.
    assert_eq!(*index, 2);
    assert_eq!(*context_tokens, first_mapped);
    // It read what the first switch mapped, up to the end of the history.
    assert_eq!(spans.last().map(|s| s[1]), Some(first_mapped), "{spans:?}");
    assert!(
        !parts
            .iter()
            .any(|p| p.part == baton::protocol::PlanPart::Mapped),
        "nothing is left mapped: {parts:?}"
    );
    let identical = events.iter().find_map(|e| match e {
        Event::TurnComparison { identical, .. } => Some(*identical),
        _ => None,
    });
    assert_eq!(identical, Some(true), "the re-prefilled answer: {events:?}");

    // Re-read, the positions are the target's own: a switch away and back leaves
    // nothing for the next message to re-read.
    let _ = rig.handle(Command::Switch);
    rig.engine.measure_pending(&rig.rx);
    let _ = rig.handle(Command::Submit {
        text: tiny().chat_text(6, 14),
    });
    let _ = rig.handle(Command::Switch);
    rig.engine.measure_pending(&rig.rx);
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(6, 15),
    });
    for e in reread_events(&events) {
        let Event::SwitchReread { spans, .. } = e else {
            unreachable!()
        };
        assert!(
            spans.iter().all(|s| s[0] >= first_mapped),
            "positions re-read before were read again: {spans:?}"
        );
    }
}

#[test]
fn the_opening_is_the_targets_own_and_no_plan_reads_or_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let system = tiny().chat_text(6, 16);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.system_prompt = Some(system.clone());
        c.settings.reread = RereadSetting::parse("drop:0.5:recency:token").unwrap();
    });
    let _ = rig.talk_and_switch(17);
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 18),
    });
    let rereads = reread_events(&events);
    assert_eq!(rereads.len(), 1, "{events:?}");
    let Event::SwitchReread {
        context_tokens: n,
        spans,
        dropped,
        parts,
        ..
    } = rereads[0]
    else {
        unreachable!()
    };
    // The opening (the system turn) is kept as the target computed it when it loaded:
    // more than the first position, and holding the system prompt.
    let first = &parts[0];
    assert_eq!(first.part, baton::protocol::PlanPart::Kept, "{parts:?}");
    assert!(first.text.contains(system.trim()), "{first:?}");
    let opening = dropped
        .iter()
        .chain(spans.iter())
        .map(|s| s[0])
        .min()
        .unwrap();
    assert!(opening > 1, "only the sink was held: {parts:?}");
    // Nothing of it is re-read or dropped, and the budget is half of what follows it.
    let count = |r: &[[usize; 2]]| r.iter().map(|s| s[1] - s[0]).sum::<usize>();
    assert_eq!(count(spans) + count(dropped), n - opening);
    let budget = ((n - opening) as f64 * 0.5).round() as usize;
    assert_eq!(count(spans), budget, "{spans:?}");
}

#[test]
fn the_answer_after_a_plan_records_the_wait_from_the_message_which_the_follow_up_gives() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_with(dir.path(), |c| {
        c.settings.reread = RereadSetting::parse("0.5:source-attention:word").unwrap();
    });
    rig.talk_and_switch(1);
    // A long message: its own reading is part of the answer's time, the plan's re-read
    // comes before the answer starts.
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(300, 4),
    });
    let Some(Event::SwitchReread {
        select_ms,
        reread_ms,
        positions,
        ..
    }) = events
        .iter()
        .find(|e| matches!(e, Event::SwitchReread { .. }))
    else {
        panic!("no re-read in {events:?}");
    };
    assert!(*positions > 0);
    let timings = events
        .iter()
        .find_map(|e| match e {
            Event::Generation {
                path: baton::protocol::PathKind::Mapped,
                timings,
                ..
            } => Some(*timings),
            _ => None,
        })
        .expect("the answer");
    let Some(Event::SwitchFollowUp { end_to_end_ms, .. }) = events
        .iter()
        .find(|e| matches!(e, Event::SwitchFollowUp { .. }))
    else {
        panic!("no follow-up in {events:?}");
    };
    let waited = timings.waited_ms.expect("the wait is recorded");
    // One figure in both places: the conversation's and the switch's.
    assert_eq!(waited, *end_to_end_ms);
    // It holds the plan and the answer's own time to its first token, which holds the
    // message's reading.
    assert!(
        waited >= select_ms + reread_ms + timings.first_token_ms,
        "waited {waited} ms; plan {select_ms} + {reread_ms} ms, first token {} ms",
        timings.first_token_ms
    );
    assert!(timings.first_token_ms >= timings.prefill_ms);
    // A later turn, with no plan, waits from its message too.
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(8, 5),
    });
    let later = events
        .iter()
        .find_map(|e| match e {
            Event::Generation { timings, .. } => Some(*timings),
            _ => None,
        })
        .expect("the answer");
    assert!(later.waited_ms.is_some_and(|w| w >= later.first_token_ms));
}
