//! What the last switch cost: mapping the cache against re-prefilling it, the speed-up
//! in big digits, the handoff and the end-to-end time (the message sent to the first
//! mapped token), and the speed-up of every switch so far. The handoff shows at once;
//! the map and re-prefill times once the switch's measurement reports them.

use super::columns::{self, Column};
use super::{big_text, fmt_factor, fmt_ms, panel, Names, BAD, BOLD, DIM, MAP, REPREFILL};
use crate::layout::inner;
use crate::wrap::wrap;
use baton_protocol::{Measure, SwitchRow};
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;

const LABEL: usize = 14;
const VALUE: usize = 9;

/// The newest of `switches` in detail, and the speed-up of each below it.
pub(crate) fn render(frame: &mut Frame, area: Rect, switches: &[SwitchRow], names: Names) {
    let Some(s) = switches.last() else {
        let body = inner(area);
        let text = wrap(
            &[(
                "No switch yet. Tab hands the conversation over; its cost is timed here \
                 against the target re-prefilling the whole conversation.",
                DIM,
            )],
            body.width as usize,
        );
        frame.render_widget(
            Paragraph::new(text).block(panel(Line::from(" handoff latency "))),
            area,
        );
        return;
    };
    let title = format!(" handoff latency · switch #{} ", s.index + 1);
    frame.render_widget(panel(Line::from(title)), area);
    let body = inner(area);
    if body.is_empty() {
        return;
    }
    let w = body.width as usize;
    let mut lines = vec![Line::from(vec![
        Span::styled(
            format!(
                "{} → {}",
                names.short(s.from.as_str()),
                names.short(s.to.as_str())
            ),
            BOLD,
        ),
        Span::styled(
            format!(" · {} tokens, {} new", s.context_tokens, s.suffix_tokens),
            DIM,
        ),
    ])];
    lines.extend(bars(s, w));
    let rest = body.height as usize;
    let headline = headline(s, w);
    let detail = detail(s, w);
    // The big digits need three rows; below that the headline shrinks to one line.
    if lines.len() + headline.len() + detail.len() <= rest {
        lines.extend(headline);
    } else {
        lines.push(small_headline(s));
    }
    lines.extend(detail);
    let used = lines.len().min(rest) as u16;
    frame.render_widget(Paragraph::new(lines), body);
    let history = Rect {
        y: body.y + used,
        height: body.height - used,
        ..body
    };
    render_history(frame, history, switches);
}

fn bars(s: &SwitchRow, width: usize) -> Vec<Line<'static>> {
    let t = &s.timings;
    let mut rows = vec![
        ("map all", t.map_full_ms, MAP),
        ("re-prefill all", t.reprefill_full_ms, REPREFILL),
    ];
    // The first switch to a model has no earlier cache to extend: no suffix to time.
    if t.map_suffix_ms.is_some() || t.reprefill_suffix_ms.is_some() {
        rows.push(("map new", t.map_suffix_ms, MAP));
        rows.push(("re-prefill new", t.reprefill_suffix_ms, REPREFILL));
    }
    let max = rows
        .iter()
        .filter_map(|r| r.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let missing = if s.measuring() {
        "measuring…"
    } else {
        "not measured"
    };
    let texts: Vec<Option<String>> = rows
        .iter()
        .map(|r| {
            r.1.filter(|v| v.is_finite())
                .map(|v| format!("{} ms", fmt_ms(v)))
        })
        .collect();
    let value_width = texts
        .iter()
        .map(|t| t.as_deref().unwrap_or(missing).width())
        .fold(VALUE, usize::max);
    let bar_width = width.saturating_sub(LABEL + value_width + 2);
    rows.into_iter()
        .zip(texts)
        .map(|((label, value, color), text)| {
            let (bar, text) = match (value, text) {
                (Some(v), Some(text)) => (bar(v, max, bar_width), text),
                _ => (String::new(), missing.to_string()),
            };
            let pad = bar_width.saturating_sub(bar.width());
            Line::from(vec![
                Span::styled(format!("{label:<LABEL$} "), DIM),
                Span::styled(bar, Style::new().fg(color)),
                Span::raw(" ".repeat(pad)),
                Span::styled(format!(" {text:>value_width$}"), BOLD),
            ])
        })
        .collect()
}

/// A horizontal bar of `value` against `max` in `width` cells, in eighths of a cell.
fn bar(value: f64, max: f64, width: usize) -> String {
    const PARTIAL: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    if max <= 0.0 || width == 0 {
        return String::new();
    }
    let eighths = ((value / max).clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    let eighths = eighths.max(1);
    "█".repeat(eighths / 8) + PARTIAL[eighths % 8]
}

/// The speed-up and whether mapping was faster or slower than re-prefilling.
fn factor(s: &SwitchRow) -> Option<(String, &'static str, Color)> {
    let x = s.timings.speedup_full()?;
    if !x.is_finite() || x <= 0.0 {
        return None;
    }
    Some(if x >= 1.0 {
        (fmt_factor(x), "faster", MAP)
    } else {
        (fmt_factor(1.0 / x), "slower", BAD)
    })
}

fn headline(s: &SwitchRow, width: usize) -> Vec<Line<'static>> {
    let Some((x, word, color)) = factor(s) else {
        return vec![small_headline(s)];
    };
    let Some(rows) = big_text::render(&x) else {
        return vec![small_headline(s)];
    };
    let big = big_text::width(&x);
    if big + 2 > width {
        return vec![small_headline(s)];
    }
    let side = [
        String::new(),
        format!("  {word}"),
        "  than re-prefill".to_string(),
    ];
    rows.into_iter()
        .zip(side)
        .map(|(row, side)| {
            let side = if big + side.width() <= width {
                side
            } else {
                String::new()
            };
            Line::from(vec![
                Span::styled(row, BOLD.fg(color)),
                Span::styled(side, BOLD.fg(color)),
            ])
        })
        .collect()
}

fn small_headline(s: &SwitchRow) -> Line<'static> {
    match factor(s) {
        Some((x, word, color)) => Line::from(vec![
            Span::styled(format!("{x} {word}"), BOLD.fg(color)),
            Span::styled(" than re-prefill", BOLD),
        ]),
        None => Line::from(Span::styled(
            match &s.measure {
                Measure::Pending => "speed-up: measuring the map and the re-prefill…".to_string(),
                Measure::Stopped(why) => format!("not measured: the measurement {why}"),
                Measure::Done => "re-prefill not timed: the reference path was off".to_string(),
            },
            DIM,
        )),
    }
}

fn detail(s: &SwitchRow, width: usize) -> Vec<Line<'static>> {
    let mut parts = Vec::new();
    if let Some(x) = s.timings.speedup_suffix() {
        parts.push(format!("new tokens {}", fmt_factor(x)));
    }
    parts.push(format!("handoff {} ms", fmt_ms(s.timings.end_to_end_ms)));
    match (&s.reread, &s.plan) {
        (Some(r), _) => {
            parts.push(format!("re-read {} ms", fmt_ms(r.ms)));
            if r.select_ms > 0.0 {
                parts.push(format!("of which choosing {} ms", fmt_ms(r.select_ms)));
            }
            if let Some((positions, ms)) = r.layers {
                parts.push(format!("layers {} ms over {positions} tokens", fmt_ms(ms)));
            }
            parts.push(format!(
                "{} of {} tokens re-read ({:.0}%)",
                r.positions,
                r.context_tokens,
                100.0 * r.positions as f64 / r.context_tokens.max(1) as f64
            ));
            if r.dropped > 0 {
                parts.push(format!("{} dropped", r.dropped));
            }
            if r.reprefilled {
                parts.push("re-prefilled: the plan would have cost as much".into());
            }
            // The whole plan against the map alone and the re-prefill it replaces.
            if let (Some(map), Some(full)) = (
                s.timings.map_suffix_ms.or(s.timings.map_full_ms),
                s.timings
                    .reprefill_suffix_ms
                    .or(s.timings.reprefill_full_ms),
            ) {
                parts.push(format!(
                    "plan {} ms vs map alone {} ms vs re-prefill {} ms",
                    fmt_ms(map + r.ms),
                    fmt_ms(map),
                    fmt_ms(full)
                ));
            }
        }
        (None, Some(setting)) if s.follow_up.is_none() => {
            parts.push(format!("re-read {setting} at the next message"));
        }
        _ => {}
    }
    let reread_ms = s.reread.as_ref().map_or(0.0, |r| r.ms);
    match s.follow_up {
        Some(f) => {
            if reread_ms > 0.0 {
                // The message waited for the re-read: what is left is the message itself.
                parts.push(format!(
                    "message {} ms",
                    fmt_ms((f.end_to_end_ms - reread_ms).max(0.0))
                ));
            }
            parts.push(format!("end-to-end {} ms", fmt_ms(f.end_to_end_ms)));
        }
        None => parts.push("end-to-end after the next turn".into()),
    }
    pack(&parts, width)
        .into_iter()
        .map(|l| Line::from(Span::styled(l, BOLD)))
        .collect()
}

/// `parts` joined by dots, starting a new line rather than splitting one.
fn pack(parts: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for p in parts {
        match lines.last_mut() {
            Some(l) if l.width() + 3 + p.width() <= width => {
                l.push_str(" · ");
                l.push_str(p);
            }
            _ => lines.push(p.clone()),
        }
    }
    lines
}

/// The full speed-up of every switch, newest on the right.
fn render_history(frame: &mut Frame, area: Rect, switches: &[SwitchRow]) {
    let speedups: Vec<Option<f64>> = switches
        .iter()
        .map(|s| s.timings.speedup_full().filter(|x| x.is_finite()))
        .collect();
    if area.height == 0 || area.width < 8 || speedups.len() < 2 {
        return;
    }
    // A title, the bars and the values under them need four rows; with fewer, the
    // newest speed-ups are listed on one line.
    if area.height < 4 {
        let all: Vec<String> = speedups
            .iter()
            .enumerate()
            .map(|(i, x)| format!("#{} {}", i + 1, x.map_or("–".into(), fmt_factor)))
            .collect();
        let mut shown: Vec<&str> = Vec::new();
        let mut used = "per switch: ".len();
        for one in all.iter().rev() {
            if used + one.width() + 3 > area.width as usize {
                break;
            }
            used += one.width() + 3;
            shown.insert(0, one);
        }
        let line = Line::from(vec![
            Span::styled("per switch: ", DIM),
            Span::styled(shown.join(" · "), BOLD),
        ]);
        frame.render_widget(Paragraph::new(line), area);
        return;
    }
    let (bar, gap, fits) = columns::fit(speedups.len(), area.width, 6);
    let skip = speedups.len() - fits;
    let shown = &speedups[skip..];
    let max = shown.iter().flatten().fold(1.0, |m: f64, x| m.max(*x));
    let title = Line::from(vec![
        Span::styled("speed-up per switch", BOLD),
        Span::styled(format!(" · {} so far", switches.len()), DIM),
    ]);
    let buf = frame.buffer_mut();
    buf.set_line(area.x, area.y, &title, area.width);
    let chart = Rect {
        y: area.y + 1,
        height: area.height - 3,
        ..area
    };
    let cols: Vec<Column> = shown
        .iter()
        .map(|x| Column {
            fill: x.map_or(f64::NAN, |x| x / max),
            style: Style::new().fg(MAP),
        })
        .collect();
    columns::draw(buf, chart, &cols, bar, gap);
    let values_y = area.bottom() - 2;
    let labels_y = area.bottom() - 1;
    for (i, x) in shown.iter().enumerate() {
        let at = area.x + columns::offset(i, bar, gap) as u16;
        let cell = bar as usize;
        let value = x.map_or("–".to_string(), fmt_factor);
        let label = format!("#{}", skip + i + 1);
        // Values wider than their bar would run into the next one.
        if value.width() <= cell {
            buf.set_stringn(at, values_y, &value, cell, BOLD);
        }
        if label.width() <= cell {
            buf.set_stringn(at, labels_y, &label, cell, DIM);
        }
    }
}
