//! The status line: both models (the active one marked), then the session's state, item
//! by item. When the line is too narrow it first shortens (model names against each
//! other, the recording's path to its file name), then leaves out whole items, least
//! important first, so that no item is ever cut in the middle.

use super::{short_mapper_id, Names, BAD, BOLD, DIM, MAP, WARN};
use baton_protocol::plan::{PlanKind, RereadBudget, RereadSetting};
use baton_protocol::{MapperInfo, ModelInfo};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// The demo's place on the status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DemoBadge {
    /// The demo runs step `.0` of `.1`.
    Step(usize, usize),
    Over,
}

/// What the status line shows about the session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session<'a> {
    pub models: &'a [ModelInfo],
    pub active: usize,
    pub demo: Option<DemoBadge>,
    pub device: &'a str,
    pub context_tokens: usize,
    pub reference: bool,
    pub repair: bool,
    /// The active model's cache repaired so far, of its length, since the last switch.
    pub repaired: Option<(usize, usize)>,
    /// Calibration windows read in the background so far, of the full calibration's
    /// (the direction furthest from done), while it goes on.
    pub calibration: Option<(usize, usize)>,
    /// Newest tokens the target reads itself at a switch (0: all mapped).
    pub tail: usize,
    /// The re-read setting (`20%:source-attention:word`), if any.
    pub reread: Option<&'a RereadSetting>,
    pub record_path: Option<&'a str>,
    pub recording_stopped: bool,
    pub mappers: &'a [MapperInfo],
}

/// How far the items are shortened before any is left out.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Shorten {
    Nothing,
    Names,
    NamesAndFile,
}

/// How much an item matters, least first: a narrow line is filled from the other end.
/// The active model and a stopped recording (a failure the user must see) always show.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Priority {
    Mappers,
    Calibration,
    Device,
    Tail,
    Reread,
    Repair,
    Reference,
    Recording,
    Demo,
    Tokens,
    OtherModel,
    Never,
}

struct Item {
    spans: Vec<Span<'static>>,
    /// A shorter form, shown when the full one does not fit.
    compact: Option<Vec<Span<'static>>>,
    priority: Priority,
    /// Models sit side by side; every other item is set off by a separator.
    model: bool,
}

impl Item {
    fn new(priority: Priority, spans: Vec<Span<'static>>) -> Self {
        Self {
            spans,
            compact: None,
            priority,
            model: false,
        }
    }

    fn spans(&self, form: Form) -> &[Span<'static>] {
        match (form, &self.compact) {
            (Form::Compact, Some(compact)) => compact,
            _ => &self.spans,
        }
    }
}

/// How an item shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Full,
    Compact,
}

const SEPARATOR: &str = " │ ";

/// Both models (the active one marked), device, context, mappers, recording, reference.
pub(crate) fn render_status(frame: &mut Frame, area: Rect, session: &Session) {
    let line = status_line(session, area.width as usize);
    frame.render_widget(Paragraph::new(line), area);
}

/// The status line for `width` columns.
fn status_line(s: &Session, width: usize) -> Line<'static> {
    for shorten in [Shorten::Nothing, Shorten::Names] {
        let items = items(s, shorten);
        let full = vec![Some(Form::Full); items.len()];
        if line_width(&items, &full) <= width {
            return join(items, &full);
        }
    }
    // Most important first, each item in its full form if the line still fits, else in
    // its compact form, else left out; a less important item may still fit after one
    // that did not.
    let items = items(s, Shorten::NamesAndFile);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(items[i].priority));
    let mut forms: Vec<Option<Form>> = vec![None; items.len()];
    for i in order {
        let mut tried = vec![Form::Full];
        if items[i].compact.is_some() {
            tried.push(Form::Compact);
        }
        for form in tried {
            forms[i] = Some(form);
            if items[i].priority == Priority::Never || line_width(&items, &forms) <= width {
                break;
            }
            forms[i] = None;
        }
    }
    ellipsize(join(items, &forms), width)
}

/// The width of the line that shows `items` in `forms` (`None`: left out).
fn line_width(items: &[Item], forms: &[Option<Form>]) -> usize {
    let mut width = 0;
    let mut first = true;
    for (item, form) in items.iter().zip(forms) {
        let Some(form) = form else { continue };
        if !first && !item.model {
            width += SEPARATOR.width();
        }
        first = false;
        width += item.spans(*form).iter().map(|s| s.width()).sum::<usize>();
    }
    width
}

fn join(items: Vec<Item>, forms: &[Option<Form>]) -> Line<'static> {
    let mut spans = Vec::new();
    for (item, form) in items.into_iter().zip(forms) {
        let Some(form) = form else { continue };
        if !spans.is_empty() && !item.model {
            spans.push(Span::styled(SEPARATOR, DIM));
        }
        spans.extend(item.spans(*form).iter().cloned());
    }
    Line::from(spans)
}

/// What is left when only what never goes is too wide (a panel drawn on its own, far
/// below the workbench's minimum width): cut, with a mark that says so.
fn ellipsize(line: Line<'static>, width: usize) -> Line<'static> {
    if line.width() <= width {
        return line;
    }
    let mut spans = Vec::new();
    let mut left = width.saturating_sub(1);
    for span in line.spans {
        let mut kept = String::new();
        for c in span.content.chars() {
            let w = c.width().unwrap_or(0);
            if w > left {
                break;
            }
            kept.push(c);
            left -= w;
        }
        let cut = kept.len() < span.content.len();
        spans.push(Span::styled(kept, span.style));
        if cut {
            break;
        }
    }
    if width > 0 {
        spans.push(Span::styled("…", DIM));
    }
    Line::from(spans)
}

fn items(s: &Session, shorten: Shorten) -> Vec<Item> {
    let sep_item = Item::new;
    let mut items = Vec::new();
    for (i, m) in s.models.iter().enumerate() {
        let name = if shorten >= Shorten::Names {
            Names(s.models).short(m.name.as_str())
        } else {
            m.name.to_string()
        };
        let (span, priority) = if i == s.active {
            let style = Style::new()
                .fg(Color::Black)
                .bg(MAP)
                .add_modifier(Modifier::BOLD);
            (Span::styled(format!(" ▶ {name} "), style), Priority::Never)
        } else {
            (Span::styled(format!(" {name} "), DIM), Priority::OtherModel)
        };
        items.push(Item {
            model: true,
            ..Item::new(priority, vec![span])
        });
    }
    match s.demo {
        Some(DemoBadge::Step(step, total)) => items.push(sep_item(
            Priority::Demo,
            vec![Span::styled(
                format!("demo step {step}/{total}"),
                BOLD.fg(Color::Cyan),
            )],
        )),
        Some(DemoBadge::Over) => items.push(sep_item(
            Priority::Demo,
            vec![Span::styled("demo over", Style::new().fg(Color::Cyan))],
        )),
        None => {}
    }
    items.push(sep_item(
        Priority::Device,
        vec![Span::raw(s.device.to_string())],
    ));
    items.push(sep_item(
        Priority::Tokens,
        vec![Span::styled(format!("{} tokens", s.context_tokens), BOLD)],
    ));
    let (reference, style) = if s.reference {
        ("reference on", Style::new().fg(MAP))
    } else {
        ("reference off", Style::new().fg(WARN))
    };
    items.push(sep_item(
        Priority::Reference,
        vec![Span::styled(reference, style)],
    ));
    let repair = match (s.repair, s.repaired) {
        (true, Some((done, total))) if done < total => Some(Span::styled(
            format!("repaired {done} / {total}"),
            Style::new().fg(WARN),
        )),
        (true, Some((_, total))) => Some(Span::styled(
            format!("repaired {total} / {total}"),
            Style::new().fg(MAP),
        )),
        (true, None) => Some(Span::styled("repair on", DIM)),
        (false, _) => None,
    };
    if let Some(span) = repair {
        items.push(sep_item(Priority::Repair, vec![span]));
    }
    if let Some((read, full)) = s.calibration {
        items.push(Item {
            compact: Some(vec![Span::styled(format!("cal {read}/{full}"), DIM)]),
            ..sep_item(
                Priority::Calibration,
                vec![Span::styled(format!("calibrating {read}/{full}"), DIM)],
            )
        });
    }
    if s.tail > 0 {
        // The handoff time includes the target reading these itself.
        items.push(sep_item(
            Priority::Tail,
            vec![Span::raw(format!("tail {}", s.tail))],
        ));
    }
    if let Some(r) = s.reread {
        items.push(sep_item(Priority::Reread, vec![Span::raw(plan_item(r))]));
    }
    items.push(match (s.record_path, s.recording_stopped) {
        (_, true) => sep_item(
            Priority::Never,
            vec![Span::styled("recording stopped", BOLD.fg(BAD))],
        ),
        (Some(p), false) => {
            let shown = if shorten >= Shorten::NamesAndFile {
                p.rsplit(['/', '\\']).next().unwrap_or(p)
            } else {
                p
            };
            let style = Style::new().fg(Color::Red);
            Item {
                compact: Some(vec![Span::styled("● rec", style)]),
                ..sep_item(
                    Priority::Recording,
                    vec![Span::styled(format!("● rec {shown}"), style)],
                )
            }
        }
        (None, false) => sep_item(
            Priority::Recording,
            vec![Span::styled("not recording", DIM)],
        ),
    });
    if !s.mappers.is_empty() {
        let ids: Vec<String> = s.mappers.iter().map(|m| short_mapper_id(&m.id)).collect();
        items.push(sep_item(
            Priority::Mappers,
            vec![Span::styled(format!("mappers {}", ids.join(" ")), DIM)],
        ));
    }
    items
}

/// A plan that re-reads nothing over the map: what it does is its layers.
pub(crate) fn layers_alone(plan: &RereadSetting) -> bool {
    plan.kind == PlanKind::Map && plan.budget == RereadBudget::Share(0.0)
}

/// A plan as the status line names it: the kind (the re-read over the map is "re-read")
/// and the budget, "up" for a plan that runs on switches up only, and its layers; the
/// selector and spans are in the help and the session.
pub(crate) fn plan_item(plan: &RereadSetting) -> String {
    let up = if plan.up_only { " up" } else { "" };
    let layers = plan.layers.map(|l| l.to_string().replace('=', " "));
    if layers_alone(plan) {
        return format!("{}{up}", layers.unwrap_or_default());
    }
    let kind = match plan.kind {
        PlanKind::Map => "re-read",
        k => k.name(),
    };
    let budget = plan.budget;
    let layers = layers.map(|l| format!(" · {l}")).unwrap_or_default();
    format!("{kind} {budget}{up}{layers}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_named_by_its_kind_budget_and_direction() {
        assert_eq!(plan_item(&plan("20%:source-attention:word")), "re-read 20%");
        assert_eq!(plan_item(&plan("up:40%:facts:word")), "re-read 40% up");
        assert_eq!(plan_item(&plan("drop:10%:recency:token")), "drop 10%");
        assert_eq!(plan_item(&plan("up:focus:30%")), "focus 30% up");
        assert_eq!(plan_item(&plan("150ms")), "re-read 150ms");
        assert_eq!(
            plan_item(&plan("up:40%:facts:word:upper=14")),
            "re-read 40% up · upper 14"
        );
        assert_eq!(plan_item(&plan("lower=7")), "lower 7");
    }

    fn plan(s: &str) -> RereadSetting {
        s.parse().unwrap()
    }

    const PLAN: RereadSetting = RereadSetting {
        budget: RereadBudget::Share(0.2),
        selector: baton_protocol::plan::Selector::SourceAttention,
        spans: baton_protocol::plan::SpanGrowth::Word,
        kind: PlanKind::Map,
        up_only: false,
        layers: None,
    };

    fn model(name: &str) -> ModelInfo {
        ModelInfo {
            name: name.into(),
            path: format!("models/{name}"),
            sha256: "ab".repeat(32),
            arch: "qwen2".into(),
            n_layer: 4,
            n_kv_head: 2,
            head_dim: 64,
        }
    }

    fn session<'a>(models: &'a [ModelInfo], mappers: &'a [MapperInfo]) -> Session<'a> {
        Session {
            models,
            active: 1,
            demo: Some(DemoBadge::Step(3, 9)),
            device: "cpu · 2 threads · avx512",
            context_tokens: 18_342,
            reference: false,
            repair: true,
            repaired: Some((512, 900)),
            calibration: None,
            tail: 32,
            reread: Some(&PLAN),
            record_path: Some("sessions/a-rather-long-session-name-2025-06-01.jsonl"),
            recording_stopped: false,
            mappers,
        }
    }

    /// The items a line shows, as text, with the models as one item.
    fn shown(line: &Line) -> Vec<String> {
        line.to_string()
            .split(SEPARATOR)
            .map(|s| s.trim().to_string())
            .collect()
    }

    #[test]
    fn background_calibration_shows_how_far_it_got_and_yields_first_when_narrow() {
        let models = [model("qwen2.5-coder-0.5b"), model("qwen2.5-coder-1.5b")];
        let s = Session {
            calibration: Some((30, 128)),
            ..session(&models, &[])
        };
        let wide = shown(&status_line(&s, 300));
        assert!(wide.contains(&"calibrating 30/128".to_string()), "{wide:?}");
        let narrow = shown(&status_line(&s, 80));
        assert!(
            !narrow.iter().any(|i| i.contains("30/128")),
            "least important after the mappers: {narrow:?}"
        );
    }

    #[test]
    fn a_narrow_line_shortens_or_leaves_out_whole_items_least_important_first() {
        let models = [model("qwen2.5-coder-0.5b"), model("qwen2.5-coder-1.5b")];
        let mappers = [MapperInfo {
            id: "a__to__b.0123456789ab-ba9876543210.safetensors".into(),
            source: "a".into(),
            target: "b".into(),
            sha256: "cd".repeat(32),
            k: 4,
        }];
        let s = session(&models, &mappers);
        let wide = shown(&status_line(&s, 300));
        assert_eq!(
            wide,
            [
                "qwen2.5-coder-0.5b  ▶ qwen2.5-coder-1.5b",
                "demo step 3/9",
                "cpu · 2 threads · avx512",
                "18342 tokens",
                "reference off",
                "repaired 512 / 900",
                "tail 32",
                "re-read 20%",
                "● rec sessions/a-rather-long-session-name-2025-06-01.jsonl",
                "mappers 012345-ba9876",
            ]
        );
        let at_80 = status_line(&s, 80);
        assert!(at_80.width() <= 80, "{at_80}");
        assert_eq!(
            shown(&at_80),
            [
                "0.5b  ▶ 1.5b",
                "demo step 3/9",
                "18342 tokens",
                "reference off",
                "tail 32",
                "● rec",
            ]
        );
        // Narrower still: the active model and the context length are the last to go.
        assert_eq!(
            shown(&status_line(&s, 30)),
            ["0.5b  ▶ 1.5b", "18342 tokens"]
        );
        assert_eq!(shown(&status_line(&s, 10)), ["▶ 1.5b"]);
    }

    #[test]
    fn a_stopped_recording_is_never_left_out_and_nothing_is_wider_than_the_line() {
        let models = [model("small"), model("large")];
        let s = Session {
            recording_stopped: true,
            ..session(&models, &[])
        };
        let line = status_line(&s, 40);
        assert!(line.width() <= 40, "{line}");
        assert!(line.to_string().contains("recording stopped"), "{line}");
        for width in 0..12 {
            let line = status_line(&s, width);
            assert!(line.width() <= width, "{width}: {line}");
        }
    }
}
