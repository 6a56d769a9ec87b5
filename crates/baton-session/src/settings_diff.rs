//! What two sessions ran under, compared before their numbers are: the models, the
//! mappers, the device and the settings of their headers, the settings changed during
//! the conversation, and the plan each switch made. A replay's answers that part from
//! the recording's are explained here first, where a setting explains them.

use super::reader::Session;
use baton_protocol::{Event, SwitchRows};
use std::collections::BTreeMap;

/// The minor version from which a switch names its plan.
const PLAN_SINCE_MINOR: u32 = 4;
/// The minor version from which a setting changed mid-session is an event of its own.
const CHANGES_SINCE_MINOR: u32 = 8;

/// One sentence per setting that differs between `a` (recorded) and `b` (replayed),
/// comparing only what both files can say.
pub(super) fn compare(a: &Session, b: &Session) -> Vec<String> {
    let mut out = Vec::new();
    models(a, b, &mut out);
    mappers(a, b, &mut out);
    if a.header.device != b.header.device {
        out.push(format!(
            "device: recorded {}, replayed {}",
            a.header.device, b.header.device
        ));
    }
    header_settings(&a.header.settings, &b.header.settings, &mut out);
    let minor = a.header.minor.min(b.header.minor);
    if minor >= CHANGES_SINCE_MINOR {
        changes(a, b, &mut out);
    }
    if minor >= PLAN_SINCE_MINOR {
        plans(a, b, &mut out);
    }
    out
}

fn models(a: &Session, b: &Session, out: &mut Vec<String>) {
    let (ma, mb) = (&a.header.models, &b.header.models);
    if ma.len() != mb.len() {
        out.push(format!(
            "models: {} recorded, {} replayed",
            ma.len(),
            mb.len()
        ));
    }
    for (i, (x, y)) in ma.iter().zip(mb).enumerate() {
        if x.sha256 != y.sha256 {
            out.push(format!(
                "model {i}: recorded {} ({}), replayed {} ({})",
                x.name,
                short(&x.sha256),
                y.name,
                short(&y.sha256)
            ));
        }
    }
}

fn mappers(a: &Session, b: &Session, out: &mut Vec<String>) {
    let by_direction = |s: &Session| -> BTreeMap<(String, String), (String, usize)> {
        s.header
            .mappers
            .iter()
            .map(|m| {
                (
                    (m.source.to_string(), m.target.to_string()),
                    (m.sha256.clone(), m.k),
                )
            })
            .collect()
    };
    let (x, y) = (by_direction(a), by_direction(b));
    let described = |m: Option<&(String, usize)>| match m {
        Some((sha, k)) => format!("{} (k {k})", short(sha)),
        None => "none".into(),
    };
    let directions: std::collections::BTreeSet<_> = x.keys().chain(y.keys()).collect();
    for d in directions {
        let (p, q) = (x.get(d), y.get(d));
        if p != q {
            out.push(format!(
                "mapper {} -> {}: recorded {}, replayed {}",
                d.0,
                d.1,
                described(p),
                described(q)
            ));
        }
    }
}

/// The settings both headers hold, key by key; a key one of them lacks was added after
/// that file was written, and is not said to differ.
fn header_settings(a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    let (Some(x), Some(y)) = (a.as_object(), b.as_object()) else {
        if a != b && !a.is_null() && !b.is_null() {
            out.push(format!("settings: recorded {a}, replayed {b}"));
        }
        return;
    };
    let mut keys: Vec<&String> = x.keys().filter(|k| y.contains_key(*k)).collect();
    keys.sort();
    for k in keys {
        if x[k] != y[k] {
            out.push(format!(
                "setting {k}: recorded {}, replayed {}",
                value(&x[k]),
                value(&y[k])
            ));
        }
    }
}

fn value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "none".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The settings changed during the conversation, in order, with the turn after which.
fn changes(a: &Session, b: &Session, out: &mut Vec<String>) {
    let of = |s: &Session| -> Vec<(u32, String, String)> {
        s.events()
            .filter_map(|e| match e {
                Event::SettingChanged {
                    turn,
                    setting,
                    value,
                } => Some((*turn, setting.clone(), value.clone())),
                _ => None,
            })
            .collect()
    };
    let (x, y) = (of(a), of(b));
    for (side, mine, theirs, other) in [
        ("recording", &x, &y, "replay"),
        ("replay", &y, &x, "recording"),
    ] {
        for (turn, setting, value) in mine.iter().filter(|c| !theirs.contains(c)) {
            out.push(format!(
                "after turn {turn} the {side} set {setting} to {value}; the {other} did not"
            ));
        }
    }
}

/// The plan each switch set for the next message (`none`: the map as handed over).
fn plans(a: &Session, b: &Session, out: &mut Vec<String>) {
    let of = |s: &Session| -> BTreeMap<u32, (u32, Option<String>)> {
        SwitchRows::of(s.events())
            .into_rows()
            .into_iter()
            .map(|r| (r.index, (r.turn, r.plan)))
            .collect()
    };
    let (x, y) = (of(a), of(b));
    for (index, (turn, p)) in &x {
        let Some((_, q)) = y.get(index) else { continue };
        if p != q {
            let name = |p: &Option<String>| p.clone().unwrap_or_else(|| "none".into());
            out.push(format!(
                "switch {index} (turn {turn}): plan recorded {}, replayed {}",
                name(p),
                name(q)
            ));
        }
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use baton_protocol::SwitchEvent;

    fn with_plan(plan: Option<&str>) -> Session {
        let mut events = fixtures::events();
        for e in events.iter_mut() {
            if let Event::Switch(SwitchEvent { reread, .. }) = e {
                *reread = plan.map(String::from);
            }
        }
        fixtures::session_of(events)
    }

    #[test]
    fn a_session_runs_under_the_same_settings_as_itself() {
        let s = fixtures::session();
        assert!(compare(&s, &s).is_empty());
    }

    #[test]
    fn every_setting_that_differs_is_named_with_both_values() {
        let a = with_plan(Some("up:40%:facts:word"));
        let mut b = with_plan(None);
        b.header.settings = serde_json::json!({"temperature": 0.7, "added_later": 1});
        b.header.device = "cuda".into();
        b.header.mappers[0].sha256 = "dd".repeat(32);
        b.header.models[1].sha256 = "ee".repeat(32);
        let said = compare(&a, &b);
        let has = |needle: &str| said.iter().any(|s| s.contains(needle));
        assert!(
            has("setting temperature: recorded 0.0, replayed 0.7"),
            "{said:?}"
        );
        assert!(
            !has("added_later"),
            "a key one file lacks is not compared: {said:?}"
        );
        assert!(has("device: recorded cpu, replayed cuda"), "{said:?}");
        assert!(
            has("mapper a -> b: recorded cccccccccccc (k 2), replayed dddddddddddd (k 2)"),
            "{said:?}"
        );
        assert!(has("model 1: recorded b"), "{said:?}");
        assert!(
            has("plan recorded up:40%:facts:word, replayed none"),
            "{said:?}"
        );
        // The reverse: a plan in the replay only.
        let said = compare(&with_plan(None), &with_plan(Some("20%:facts:word")));
        assert_eq!(said.len(), 2, "one line per switch: {said:?}");
        assert!(said[0].contains("plan recorded none, replayed 20%:facts:word"));
    }

    #[test]
    fn a_change_made_on_one_side_only_is_named_with_its_turn() {
        let change = Event::SettingChanged {
            turn: 2,
            setting: "reread".into(),
            value: "40%:facts:word".into(),
        };
        let mut events = fixtures::events();
        events.insert(4, change);
        let a = fixtures::session_of(events);
        let b = fixtures::session();
        assert_eq!(
            compare(&a, &b),
            ["after turn 2 the recording set reread to 40%:facts:word; the replay did not"]
        );
        // A recording from before the event says nothing of the changes it made.
        let mut old = b.clone();
        old.header.minor = CHANGES_SINCE_MINOR - 1;
        assert!(compare(&old, &a).is_empty());
    }
}
