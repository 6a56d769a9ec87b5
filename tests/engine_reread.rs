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

    // A bad setting is an error that names the problem, and changes nothing.
    rig.engine.handle(
        Command::SetReread {
            setting: Some("2.0".into()),
        }
        .into(),
        &rig.rx,
    );
    let events: Vec<Event> = rig.events.try_iter().collect();
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Error { message, fatal: false } if message.contains("re-read budget"))));
}
