//! What a learning step did, in words: the same line on screen, in a headless run's log
//! and in the report.

use super::events::Event;

/// `1840` as `1,840`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The line for a `MapperLearned` event; `None` for any other.
pub fn line(e: &Event) -> Option<String> {
    let Event::MapperLearned {
        from,
        to,
        tokens,
        before,
        after,
        accepted,
        learned_tokens,
        kept,
        ..
    } = e
    else {
        return None;
    };
    let tokens = grouped(*tokens as u64);
    Some(if *accepted {
        format!(
            "{from} -> {to} adapted on {tokens} of this conversation's tokens: held-out cosine {before:.2} → {after:.2} ({} learned in all{})",
            grouped(*learned_tokens),
            if *kept { ", kept" } else { "" }
        )
    } else {
        format!(
            "{from} -> {to} did not take what it learned from {tokens} tokens: held-out cosine would go {before:.2} → {after:.2}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(accepted: bool, kept: bool) -> Event {
        Event::MapperLearned {
            index: 0,
            turn: 2,
            from: "a".into(),
            to: "b".into(),
            tokens: 1840,
            held_out: 600,
            before: 0.712,
            after: if accepted { 0.781 } else { 0.70 },
            conversation_before: 0.6,
            conversation_after: 0.7,
            calibration_before: Some(0.8),
            calibration_after: Some(0.8),
            accepted,
            learned_tokens: 12_345,
            seconds: 3.0,
            kept,
        }
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1840), "1,840");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }

    #[test]
    fn the_line_says_whether_the_update_was_taken_and_kept() {
        assert_eq!(
            line(&learned(true, true)).unwrap(),
            "a -> b adapted on 1,840 of this conversation's tokens: held-out cosine 0.71 → 0.78 (12,345 learned in all, kept)"
        );
        assert!(!line(&learned(true, false)).unwrap().contains("kept"));
        let refused = line(&learned(false, false)).unwrap();
        assert!(refused.contains("did not take"), "{refused}");
        assert!(refused.contains("0.71 → 0.70"), "{refused}");
        assert!(line(&Event::ShutDown).is_none());
    }
}
