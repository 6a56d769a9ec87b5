//! The latest turn answered twice: from the mapped cache (what the user was shown) and
//! from a re-prefill (the reference), with the first token where they part marked.

use super::{cache_label, fmt_percent, panel, Names, BOLD, DIFFERENCE, DIM, MAP, REPREFILL, WARN};
use crate::layout::inner;
use crate::records::{PathText, TurnPair};
use crate::wrap::wrap;
use baton_protocol::CacheOrigin;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;

/// The latest turn's two answers; `reference_on` says whether the reference path is on,
/// which explains a missing reference answer.
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    pair: Option<&TurnPair>,
    reference_on: bool,
    names: Names,
) {
    let Some(pair) = pair else {
        let body = inner(area);
        frame.render_widget(
            Paragraph::new(wrap(
                &[(
                    "No turn yet. After a switch, each answer from the mapped cache is set \
                     here beside the target's answer from a full re-prefill.",
                    DIM,
                )],
                body.width as usize,
            ))
            .block(panel(Line::from(" mapped vs re-prefilled "))),
            area,
        );
        return;
    };
    frame.render_widget(panel(title(names, pair, area.width)), area);
    let body = inner(area);
    let [left, sep, right] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Fill(1),
    ])
    .areas(body);
    for y in sep.top()..sep.bottom() {
        frame.buffer_mut().set_string(sep.x, y, "│", DIM);
    }
    let difference = pair.comparison.and_then(|c| c.first_difference);
    column(
        frame,
        left,
        Line::from(vec![
            Span::styled(cache_label(pair.cache), BOLD.fg(MAP)),
            Span::styled(" · shown", DIM),
        ]),
        Some(&pair.mapped),
        difference,
        "",
    );
    column(
        frame,
        right,
        Line::from(vec![
            Span::styled("re-prefilled", BOLD.fg(REPREFILL)),
            Span::styled(" · reference", DIM),
        ]),
        pair.reference.as_ref(),
        difference,
        &no_reference(reference_on, pair),
    );
}

/// The turn, its model and the verdict, shortened until it fits.
fn title(names: Names, pair: &TurnPair, width: u16) -> Line<'static> {
    let verdicts = match pair.comparison {
        Some(c) if c.identical => vec!["identical".to_string()],
        Some(c) => {
            let agree = format!("{} agree", fmt_percent(c.agreement));
            match c.first_difference {
                Some(i) => vec![
                    format!("first difference at token {i} · {agree}"),
                    format!("differs at token {i}"),
                ],
                None => vec![agree],
            }
        }
        None => vec!["mapped vs re-prefilled".to_string()],
    };
    let style = match pair.comparison {
        Some(c) if c.identical => BOLD.fg(MAP),
        Some(_) => BOLD.fg(WARN),
        None => DIM,
    };
    let leads = [
        format!(" turn {} · {} · ", pair.turn, names.short(&pair.model)),
        format!(" turn {} · ", pair.turn),
    ];
    let room = width.saturating_sub(2) as usize;
    let candidates = verdicts
        .iter()
        .flat_map(|v| leads.iter().map(move |l| (l, v)));
    let (lead, verdict) = candidates
        .clone()
        .find(|(l, v)| l.width() + v.width() < room)
        .or_else(|| candidates.last())
        .map(|(l, v)| (l.clone(), v.clone()))
        .unwrap_or_default();
    Line::from(vec![
        Span::raw(lead),
        Span::styled(verdict, style),
        Span::raw(" "),
    ])
}

fn no_reference(reference_on: bool, pair: &TurnPair) -> String {
    if pair.cache == CacheOrigin::True {
        "This turn ran on the model's own cache: there is nothing to compare until a switch.".into()
    } else if !reference_on {
        "The reference path is off: Ctrl-R turns it on.".into()
    } else {
        "The reference answer starts when the shown one is done…".into()
    }
}

fn column(
    frame: &mut Frame,
    area: Rect,
    header: Line<'static>,
    path: Option<&PathText>,
    difference: Option<usize>,
    absent: &str,
) {
    if area.is_empty() {
        return;
    }
    let width = area.width as usize;
    let mut lines = vec![header];
    let body_rows = (area.height as usize).saturating_sub(1);
    let text = match path {
        Some(p) => styled_text(p, difference, width),
        None => wrap(&[(absent, DIM)], width),
    };
    // Keep the first difference in view; without one, follow the newest text.
    let marked = text
        .iter()
        .position(|l| l.spans.iter().any(|s| s.style == DIFFERENCE));
    let start = match marked {
        Some(i) => i.saturating_sub(1),
        None => text.len().saturating_sub(body_rows),
    }
    .min(text.len().saturating_sub(body_rows));
    lines.extend(text.into_iter().skip(start).take(body_rows));
    frame.render_widget(Paragraph::new(lines), area);
}

fn styled_text(path: &PathText, difference: Option<usize>, width: usize) -> Vec<Line<'static>> {
    let marked = difference.and_then(|d| path.piece_of_token(d));
    let after = Style::new().fg(WARN);
    let mut chunks: Vec<(&str, Style)> = path
        .pieces
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let style = match marked {
                Some(m) if j == m => DIFFERENCE,
                Some(m) if j > m => after,
                _ => Style::default(),
            };
            (p.text.as_str(), style)
        })
        .collect();
    if path.stop.is_none() {
        chunks.push(("▌", DIM));
    } else if difference.is_some() && marked.is_none() {
        // The difference lies past this answer's end: it stopped where the other went on.
        chunks.push(("⏹ end", DIFFERENCE));
    }
    wrap(&chunks, width)
}
