//! The report as plain-text tables, for a terminal or a log.

use super::session_report::{LearningRow, PathRow, RepairRow, Report, TurnRow};
use baton_protocol::SwitchRow;
use baton_protocol::{CacheOrigin, GateDecision, StopKind};
use std::fmt::{self, Display, Formatter};

impl Display for Report {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let s = &self.session;
        writeln!(
            f,
            "session {}  baton {}  device {}  {} events",
            s.created, s.baton_version, s.device, s.events
        )?;
        writeln!(f, "models  {}", list(&s.models))?;
        writeln!(f, "mappers {}", list(&s.mappers))?;
        for w in &s.warnings {
            writeln!(f, "warning {w}")?;
        }
        writeln!(f)?;
        writeln!(f, "switches")?;
        if self.switches.is_empty() {
            writeln!(f, "  (none)")?;
        } else {
            table(f, &SWITCH_COLUMNS, self.switches.iter().map(switch_cells))?;
        }
        writeln!(f)?;
        writeln!(f, "turns")?;
        if self.turns.is_empty() {
            writeln!(f, "  (none)")?;
        } else {
            table(f, &TURN_COLUMNS, self.turns.iter().flat_map(turn_lines))?;
        }
        if !self.learning.is_empty() {
            writeln!(f)?;
            writeln!(f, "learning")?;
            table(
                f,
                &LEARNING_COLUMNS,
                self.learning.iter().map(learning_cells),
            )?;
        }
        if !self.repairs.is_empty() {
            writeln!(f)?;
            writeln!(f, "repair")?;
            table(f, &REPAIR_COLUMNS, self.repairs.iter().map(repair_cells))?;
        }
        if !self.bookmarks.is_empty() {
            writeln!(f)?;
            writeln!(f, "bookmarks")?;
            for b in &self.bookmarks {
                writeln!(f, "  turn {}: {}", b.turn, b.note)?;
            }
        }
        if !self.errors.is_empty() {
            writeln!(f)?;
            writeln!(f, "errors")?;
            for e in &self.errors {
                let kind = if e.fatal { "fatal" } else { "error" };
                writeln!(f, "  {kind}: {}", e.message)?;
            }
        }
        let m = &self.summary;
        writeln!(f)?;
        writeln!(
            f,
            "summary: {} turns, {} switches; speed-up {} full, {} suffix; attention cosine mean {}, min {}",
            m.turns,
            m.switches,
            times(m.mean_speedup_full),
            times(m.mean_speedup_suffix),
            num(m.cosine_mean, 3),
            num(m.cosine_min, 3)
        )?;
        writeln!(
            f,
            "         {} of {} compared turns identical, mean token agreement {}; gate mapped {}, re-prefilled {}",
            m.identical_turns,
            m.compared_turns,
            num(m.mean_agreement, 3),
            m.gate_mapped,
            m.gate_reprefilled
        )
    }
}

const SWITCH_COLUMNS: [&str; 20] = [
    "#",
    "turn",
    "from -> to",
    "context",
    "suffix",
    "map ms",
    "map suffix ms",
    "re-prefill ms",
    "re-prefill suffix ms",
    "speed-up",
    "suffix speed-up",
    "end to end ms",
    "re-read",
    "dropped",
    "re-read ms",
    "cos mean",
    "cos min",
    "cos predicted",
    "top-1",
    "KL",
];

fn switch_cells(s: &SwitchRow) -> Vec<String> {
    let t = &s.timings;
    let r = s.reread.as_ref();
    let mut cells = vec![
        s.index.to_string(),
        s.turn.to_string(),
        format!("{} -> {}", s.from, s.to),
        s.context_tokens.to_string(),
        s.suffix_tokens.to_string(),
        num(t.map_full_ms, 1),
        num(t.map_suffix_ms, 1),
        num(t.reprefill_full_ms, 1),
        num(t.reprefill_suffix_ms, 1),
        times(t.speedup_full()),
        times(t.speedup_suffix()),
        num(Some(s.end_to_end_ms()), 0),
        match r {
            Some(r) if r.reprefilled => format!("{} (all)", r.positions),
            Some(r) => r.positions.to_string(),
            None => "-".to_string(),
        },
        r.map_or("-".to_string(), |r| r.dropped.to_string()),
        num(r.map(|r| r.ms), 1),
        num(s.cosine_mean(), 3),
        num(s.cosine_min(), 3),
        num(s.estimate.and_then(|e| e.predicted_cosine), 3),
        num(s.top1_agreement(), 3),
        num(s.kl(), 3),
    ];
    if let Some(g) = &s.gate {
        cells.push(gate(g));
    }
    cells
}

fn gate(g: &GateDecision) -> String {
    let (used, cmp) = match g.used {
        CacheOrigin::Mapped => ("mapped", ">="),
        CacheOrigin::Reprefilled => ("re-prefilled", "<"),
        CacheOrigin::True => ("own cache", "vs"),
    };
    let basis = match g.basis {
        Some(baton_protocol::EstimateBasis::Measured) => ", measured",
        Some(baton_protocol::EstimateBasis::Predicted) => ", predicted",
        Some(baton_protocol::EstimateBasis::Calibration) => ", calibration",
        None => "",
    };
    format!(
        "gate: {used} ({:.3} {cmp} {:.3}{basis})",
        g.estimate, g.threshold
    )
}

const LEARNING_COLUMNS: [&str; 10] = [
    "switch",
    "turn",
    "from -> to",
    "tokens",
    "held out",
    "cos before",
    "cos after",
    "taken",
    "learned in all",
    "seconds",
];

fn learning_cells(l: &LearningRow) -> Vec<String> {
    vec![
        l.index.to_string(),
        l.turn.to_string(),
        format!("{} -> {}", l.from, l.to),
        l.tokens.to_string(),
        l.held_out.to_string(),
        num(l.before, 3),
        num(l.after, 3),
        match (l.accepted, l.kept) {
            (true, true) => "yes, kept".into(),
            (true, false) => "yes".into(),
            (false, _) => "no".into(),
        },
        l.learned_tokens.to_string(),
        num(Some(l.seconds), 1),
    ]
}

const REPAIR_COLUMNS: [&str; 7] = [
    "switch",
    "turn",
    "model",
    "repaired",
    "complete",
    "s after switch",
    "s of prefill",
];

fn repair_cells(r: &RepairRow) -> Vec<String> {
    vec![
        r.index.to_string(),
        r.turn.to_string(),
        r.model.clone(),
        format!("{} / {}", r.repaired, r.total),
        if r.complete { "yes" } else { "no" }.into(),
        num(Some(r.after_switch_ms / 1e3), 1),
        num(Some(r.compute_ms / 1e3), 1),
    ]
}

const TURN_COLUMNS: [&str; 10] = [
    "turn",
    "path",
    "model",
    "cache",
    "tokens",
    "first token ms",
    "decode tok/s",
    "stop",
    "identical",
    "agreement",
];

/// One line per path the turn ran on; the comparison goes on the first.
fn turn_lines(t: &TurnRow) -> Vec<Vec<String>> {
    let paths = [("mapped", &t.mapped), ("reference", &t.reference)];
    let mut lines: Vec<Vec<String>> = paths
        .iter()
        .filter_map(|(name, row)| row.as_ref().map(|r| path_cells(t.turn, name, r)))
        .collect();
    if lines.is_empty() {
        lines.push(vec![t.turn.to_string(), "-".into()]);
    }
    if let Some(identical) = t.identical {
        let verdict = match (identical, t.first_difference) {
            (true, _) => "yes".to_string(),
            (false, Some(i)) => format!("no, at token {i}"),
            (false, None) => "no".to_string(),
        };
        lines[0].resize(TURN_COLUMNS.len() - 2, "-".into());
        lines[0].push(verdict);
        lines[0].push(num(t.agreement, 3));
    }
    lines
}

fn path_cells(turn: u32, path: &str, r: &PathRow) -> Vec<String> {
    let cache = match r.cache {
        Some(CacheOrigin::True) => "own",
        Some(CacheOrigin::Mapped) => "mapped",
        Some(CacheOrigin::Reprefilled) => "re-prefilled",
        None => "-",
    };
    let stop = match r.stop {
        StopKind::Eos => "eos",
        StopKind::MaxTokens => "max tokens",
        StopKind::Cancelled => "cancelled",
    };
    vec![
        turn.to_string(),
        path.into(),
        r.model.clone(),
        cache.into(),
        r.tokens.to_string(),
        num(Some(r.first_token_ms), 1),
        num(Some(r.decode_tokens_per_s), 1),
        stop.into(),
    ]
}

/// Left-aligned columns as wide as their widest cell; a row may run past the header
/// with trailing free text (the gate) or stop short of it.
fn table(
    f: &mut Formatter<'_>,
    header: &[&str],
    rows: impl Iterator<Item = Vec<String>>,
) -> fmt::Result {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |f: &mut Formatter<'_>, cells: &[String]| {
        let mut out = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            out.push(' ');
            let width = widths.get(i).copied().unwrap_or(0);
            out.push_str(&format!("{cell:<width$}"));
            if i + 1 < cells.len() {
                out.push(' ');
            }
        }
        writeln!(f, "{}", out.trim_end())
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    line(f, &header)?;
    for row in &rows {
        line(f, row)?;
    }
    Ok(())
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "-".into(),
    }
}

fn times(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.1}x"),
        _ => "-".into(),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use crate::{fixtures, Report};

    #[test]
    fn the_table_shows_switches_turns_and_summary() {
        let text = Report::from_session(&fixtures::session()).to_string();
        assert!(text.contains("a -> b"), "{text}");
        assert!(text.contains("20.0x"), "{text}");
        assert!(
            text.contains("gate: re-prefilled (0.400 < 0.500)"),
            "{text}"
        );
        assert!(text.contains("no, at token 1"), "{text}");
        assert!(text.contains("turn 3: drift"), "{text}");
        assert!(text.contains("1 of 2 compared turns identical"), "{text}");
        let header = text.lines().find(|l| l.contains("first token ms")).unwrap();
        let row = text.lines().find(|l| l.contains("no, at token 1")).unwrap();
        assert_eq!(
            header.find("identical"),
            row.find("no, at token 1"),
            "columns line up:\n{text}"
        );
    }
}
