//! The conversation as the user sees it: the primary (mapped) path only, streaming, each
//! answer labelled with its model and where its cache came from.

use super::{cache_label, cache_style, fmt_factor, fmt_ms, panel, BOLD, DIM, MAP, WARN};
use crate::layout::inner;
use crate::records::{Entry, Reply};
use crate::wrap::wrap;
use baton_protocol::SwitchRow;
use baton_protocol::{CacheOrigin, PlanPart, StopKind};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

const USER: Style = Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD);

/// What the transcript shows: the entries, and the switches they point into.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conversation<'a> {
    pub entries: &'a [Entry],
    pub switches: &'a [SwitchRow],
    /// List under each switch the words its re-read read again.
    pub mark_reread: bool,
}

/// The conversation panel. It keeps where it is scrolled to; the text is handed to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Transcript {
    /// The first line shown; `None` follows the newest text.
    scroll_top: Option<usize>,
}

impl Transcript {
    #[cfg(test)]
    pub fn scroll_top(&self) -> Option<usize> {
        self.scroll_top
    }

    /// Go back to following the newest text.
    pub fn follow(&mut self) {
        self.scroll_top = None;
    }

    /// The lines a page moves in a panel of `area`: all it shows but one, kept as context.
    pub fn page(area: Rect) -> usize {
        (inner(area).height as usize).saturating_sub(1).max(1)
    }

    /// Move `delta` lines (negative: back) through `c` as shown in `area`. Reaching the
    /// end again resumes following the stream.
    pub fn scroll(&mut self, delta: i32, c: &Conversation, area: Rect) {
        let body = inner(area);
        let total = lines(c, body.width as usize).len();
        let bottom = total.saturating_sub(body.height as usize);
        let top = self.scroll_top.unwrap_or(bottom).min(bottom) as i64 + delta as i64;
        let top = top.clamp(0, bottom as i64) as usize;
        self.scroll_top = (top < bottom).then_some(top);
    }

    pub fn draw(&self, frame: &mut Frame, area: Rect, c: &Conversation) {
        let body = inner(area);
        let lines = lines(c, body.width as usize);
        let bottom = lines.len().saturating_sub(body.height as usize);
        let top = self.scroll_top.map_or(bottom, |t| t.min(bottom));
        let mut block = panel(Line::from(" conversation "));
        if top < bottom {
            block = block.title(
                Line::from(format!(" ↑ {} lines below · PgDn follows ", bottom - top))
                    .style(Style::new().fg(WARN))
                    .right_aligned(),
            );
        }
        let shown: Vec<Line> = lines
            .into_iter()
            .skip(top)
            .take(body.height as usize)
            .collect();
        frame.render_widget(Paragraph::new(shown).block(block), area);
    }
}

/// Every line of the transcript wrapped to `width`; its length is what scrolling needs.
fn lines(c: &Conversation, width: usize) -> Vec<Line<'static>> {
    if c.entries.is_empty() {
        return wrap(
            &[(
                "Type a message and press Enter. Tab hands the conversation to the other model; \
                 the panels then show what the handoff cost and how faithful it was.",
                DIM,
            )],
            width,
        );
    }
    let mut out = Vec::new();
    for entry in c.entries {
        match entry {
            Entry::User { turn, text } => {
                out.push(Line::from(vec![
                    Span::styled("you", USER),
                    Span::styled(format!(" · turn {turn}"), DIM),
                ]));
                out.extend(wrap(&[(text, Style::default())], width));
            }
            Entry::Reply(r) => reply(&mut out, r, width),
            Entry::Switch(i) => {
                if let Some(s) = c.switches.get(*i) {
                    out.extend(wrap(&[(&switch_line(s), BOLD.fg(WARN))], width));
                    if c.mark_reread {
                        out.extend(reread_lines(s, width));
                    }
                }
            }
            Entry::Bookmark { turn, note } => {
                let text = format!("※ bookmark on turn {turn}: {note}");
                out.extend(wrap(&[(&text, Style::new().fg(Color::Magenta))], width));
            }
        }
        out.push(Line::default());
    }
    out.pop();
    out
}

/// What the switch's plan made of the conversation: each run of its text marked kept,
/// re-read, mapped or dropped (or, from an older session, the re-read spans alone); or
/// why there is none.
fn reread_lines(s: &SwitchRow, width: usize) -> Vec<Line<'static>> {
    let Some(r) = &s.reread else {
        let why = match &s.plan {
            Some(setting) => format!("plan {setting}: at the next message"),
            None => "no plan at this switch: the map as handed over (Ctrl-E sets one)".into(),
        };
        return wrap(&[(&why, DIM)], width);
    };
    let head = if r.reprefilled {
        format!(
            "re-read all {} mapped tokens at the next message (the plan would have cost the \
             re-prefill):",
            r.positions
        )
    } else {
        format!(
            "re-read {} of {} tokens at the next message{}:",
            r.positions,
            r.context_tokens,
            if r.dropped > 0 {
                format!(", {} dropped", r.dropped)
            } else {
                String::new()
            }
        )
    };
    let mut chunks: Vec<(String, Style)> = vec![(head, DIM)];
    if r.parts.is_empty() {
        for t in &r.texts {
            chunks.push((" ".into(), Style::default()));
            chunks.push((t.replace('\n', "⏎"), REREAD));
        }
    } else {
        chunks.push((" ".into(), Style::default()));
        for (name, part) in [
            ("kept", PlanPart::Kept),
            ("re-read", PlanPart::Reread),
            ("mapped", PlanPart::Mapped),
            ("dropped", PlanPart::Dropped),
        ] {
            chunks.push((name.into(), part_style(part)));
            chunks.push((" ".into(), Style::default()));
        }
        chunks.push(("│ ".into(), DIM));
        for p in &r.parts {
            chunks.push((p.text.replace('\n', "⏎"), part_style(p.part)));
        }
    }
    let refs: Vec<(&str, Style)> = chunks.iter().map(|(t, s)| (t.as_str(), *s)).collect();
    wrap(&refs, width)
}

/// How a run of the conversation is shown by what the plan made of it.
fn part_style(part: PlanPart) -> Style {
    match part {
        PlanPart::Kept => Style::new(),
        PlanPart::Reread => REREAD,
        PlanPart::Mapped => Style::new().fg(MAP),
        PlanPart::Dropped => DIM.add_modifier(Modifier::CROSSED_OUT),
    }
}

/// The words a re-read read again.
const REREAD: Style = Style::new().fg(Color::Black).bg(Color::Yellow);

fn reply(out: &mut Vec<Line<'static>>, r: &Reply, width: usize) {
    let model_style = match r.cache {
        CacheOrigin::True => BOLD,
        _ => BOLD.fg(MAP),
    };
    out.push(Line::from(vec![
        Span::styled(r.model.clone(), model_style),
        Span::styled(" · ", DIM),
        Span::styled(cache_label(r.cache), cache_style(r.cache)),
    ]));
    let streaming = r.finished.is_none();
    let mut chunks = vec![(r.text.as_str(), Style::default())];
    if streaming {
        chunks.push(("▌", DIM));
    }
    out.extend(wrap(&chunks, width));
    let mut notes = Vec::new();
    if let Some(f) = r.finished {
        // What the person waited, as the latency panel's end-to-end counts it: from
        // Enter, a plan's re-read and the message's reading included. A session that
        // did not record it has only the answer's own time.
        let first = match f.timings.waited_ms {
            Some(waited) => format!("first token {} ms after Enter", fmt_ms(waited)),
            None => format!(
                "first token {} ms into the answer",
                fmt_ms(f.timings.first_token_ms)
            ),
        };
        notes.push(format!(
            "{} tokens · {:.1} tok/s · {first}",
            f.tokens, f.timings.decode_tokens_per_s,
        ));
        match f.stop {
            StopKind::Eos => {}
            StopKind::MaxTokens => notes.push("stopped at the token limit".into()),
            StopKind::Cancelled => notes.push("cancelled".into()),
        }
    }
    if !notes.is_empty() {
        out.extend(wrap(&[(&notes.join(" · "), DIM)], width));
    }
    if let Some(c) = r.comparison {
        let (text, style) = if c.identical {
            (
                "= same tokens as the re-prefilled answer".to_string(),
                DIM.fg(MAP),
            )
        } else {
            let at = c
                .first_difference
                .map_or_else(String::new, |i| format!(" from token {i}"));
            (
                format!(
                    "≠ differs from the re-prefilled answer{at} · {} of tokens agree",
                    super::fmt_percent(c.agreement)
                ),
                Style::new().fg(WARN),
            )
        };
        out.extend(wrap(&[(&text, style)], width));
    }
}

fn switch_line(s: &SwitchRow) -> String {
    let t = &s.timings;
    let mut text = format!(
        "⇄ switch #{}: {} → {} · {} tokens handed over ({} new)",
        s.index + 1,
        s.from,
        s.to,
        s.context_tokens,
        s.suffix_tokens,
    );
    match t.map_full_ms {
        Some(m) => text.push_str(&format!(" · map {} ms", fmt_ms(m))),
        None => text.push_str(&format!(" · handoff {} ms", fmt_ms(t.end_to_end_ms))),
    }
    if s.measuring() {
        text.push_str(" · measuring…");
    }
    if let Some(r) = t.reprefill_full_ms {
        text.push_str(&format!(" vs re-prefill {} ms", fmt_ms(r)));
    }
    if let Some(x) = t.speedup_full() {
        text.push_str(&format!(" · {} faster", fmt_factor(x)));
    }
    let predicted = s.estimate.and_then(|e| e.predicted_cosine);
    match (s.metrics.as_ref().and_then(|m| m.cosine_mean()), predicted) {
        (Some(m), Some(p)) => text.push_str(&format!(" · cosine {m:.3} (predicted {p:.3})")),
        (Some(m), None) => text.push_str(&format!(" · cosine {m:.3}")),
        (None, Some(p)) => text.push_str(&format!(" · predicted cosine {p:.3}")),
        (None, None) => {}
    }
    if let Some(layer) = s.metrics.as_ref().and_then(|m| m.first_uncomputed_layer()) {
        text.push_str(&format!(" · cosine not computed (layer {layer})"));
    }
    if let Some(g) = s.gate {
        if g.used == CacheOrigin::Reprefilled {
            text.push_str(&format!(
                " · the gate re-prefilled instead (estimate {:.3} < {:.3})",
                g.estimate, g.threshold
            ));
        }
    }
    text
}
