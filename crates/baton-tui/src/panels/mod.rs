//! One module per part of the screen. Panels are components: each draws from the data it
//! is handed (a few borrowed records, or a small view struct) into the area it is given,
//! copes with any size down to nothing at all, and never sees the app. A panel with view
//! state of its own (the transcript's scroll, the layer panel's measure, the message and
//! note being typed, the notice and spinner of the message line) owns it in a struct.

pub(crate) mod banners;
pub(crate) mod big_text;
pub(crate) mod columns;
pub(crate) mod help;
pub(crate) mod input_box;
pub(crate) mod latency;
pub(crate) mod layers;
pub(crate) mod loading;
pub(crate) mod session_line;
pub(crate) mod side_by_side;
pub(crate) mod status;
pub(crate) mod transcript;

use baton_protocol::{CacheOrigin, ModelInfo};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, BorderType};

pub(crate) const DIM: Style = Style::new().fg(Color::DarkGray);
pub(crate) const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
pub(crate) const MAP: Color = Color::Green;
pub(crate) const REPREFILL: Color = Color::Yellow;
pub(crate) const WARN: Color = Color::Yellow;
pub(crate) const BAD: Color = Color::LightRed;
/// How the first differing token is marked, in both columns and nowhere else.
pub(crate) const DIFFERENCE: Style = Style::new()
    .fg(Color::Black)
    .bg(Color::LightRed)
    .add_modifier(Modifier::BOLD);

pub(crate) fn panel(title: Line<'static>) -> Block<'static> {
    Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(DIM)
        .title(title.style(BOLD))
}

/// Milliseconds with the precision that still means something at that size.
pub(crate) fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        "–".into()
    } else if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 1000.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

pub(crate) fn fmt_factor(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x < 100.0 {
        format!("{x:.1}x")
    } else {
        format!("{x:.0}x")
    }
}

pub(crate) fn fmt_percent(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", x * 100.0)
    } else {
        "–".into()
    }
}

pub(crate) fn cache_label(c: CacheOrigin) -> &'static str {
    match c {
        CacheOrigin::True => "own cache",
        CacheOrigin::Mapped => "mapped cache",
        CacheOrigin::Reprefilled => "re-prefilled cache",
    }
}

pub(crate) fn cache_style(c: CacheOrigin) -> Style {
    match c {
        CacheOrigin::True => DIM,
        CacheOrigin::Mapped => Style::new().fg(MAP).add_modifier(Modifier::BOLD),
        CacheOrigin::Reprefilled => Style::new().fg(REPREFILL).add_modifier(Modifier::BOLD),
    }
}

/// The two models, for shortening a name against the other's in narrow places.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names<'a>(pub &'a [ModelInfo]);

impl Names<'_> {
    /// `name` shortened against the other model's name; as it is if it is neither.
    pub fn short(&self, name: &str) -> String {
        let [a, b] = self.0 else {
            return name.to_string();
        };
        let (sa, sb) = short_names(a.name.as_str(), b.name.as_str());
        if name == a.name {
            sa
        } else if name == b.name {
            sb
        } else {
            name.to_string()
        }
    }
}

/// Two model names without the part they share ("Qwen2.5-1.5B-Instruct" and
/// "Qwen2.5-7B-Instruct" become "1.5B" and "7B"), for places too narrow for the full
/// names. Cuts fall only at `-`, `_`, `/` or a space, so a version number stays whole.
pub(crate) fn short_names(a: &str, b: &str) -> (String, String) {
    let cut = |c: char| matches!(c, '-' | '_' | '/' | ' ');
    let (ca, cb): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    let prefix = ca[..common]
        .iter()
        .rposition(|c| cut(*c))
        .map_or(0, |i| i + 1);
    let tail = ca
        .iter()
        .rev()
        .zip(cb.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let suffix = ca[ca.len() - tail..]
        .iter()
        .position(|c| cut(*c))
        .map_or(0, |i| tail - i);
    let trim = |cs: &[char]| -> String {
        let end = cs.len().saturating_sub(suffix).max(prefix);
        cs[prefix..end].iter().collect()
    };
    let (sa, sb) = (trim(&ca), trim(&cb));
    if sa.is_empty() || sb.is_empty() || sa == sb {
        return (a.to_string(), b.to_string());
    }
    (sa, sb)
}

/// A mapper artifact's name is `<source>__to__<target>.<sha>-<sha>.safetensors`; the two
/// checksum prefixes tell mappers apart, the model names are shown elsewhere.
pub(crate) fn short_mapper_id(id: &str) -> String {
    let stem = id.strip_suffix(".safetensors").unwrap_or(id);
    let tail = match stem.rsplit_once('.') {
        Some((_, sums)) if sums.contains('-') => sums,
        _ => stem,
    };
    let short: String = match tail.split_once('-') {
        Some((a, b)) => format!(
            "{}-{}",
            a.chars().take(6).collect::<String>(),
            b.chars().take(6).collect::<String>()
        ),
        None => tail.chars().take(16).collect(),
    };
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_at_a_glance() {
        assert_eq!(fmt_ms(3.456), "3.46");
        assert_eq!(fmt_ms(151.24), "151.2");
        assert_eq!(fmt_ms(2048.4), "2048");
        assert_eq!(fmt_ms(f64::NAN), "–");
        assert_eq!(fmt_factor(12.63), "12.6x");
        assert_eq!(fmt_factor(250.0), "250x");
        assert_eq!(fmt_percent(0.973), "97.3%");
    }

    #[test]
    fn model_names_shorten_to_what_tells_them_apart() {
        let short = |a, b| short_names(a, b);
        assert_eq!(
            short("Qwen2.5-1.5B-Instruct", "Qwen2.5-7B-Instruct"),
            ("1.5B".into(), "7B".into())
        );
        assert_eq!(
            short("Qwen2.5-1.5B", "Qwen2.5-1.8B"),
            ("1.5B".into(), "1.8B".into())
        );
        assert_eq!(short("a", "b"), ("a".into(), "b".into()));
        assert_eq!(short("x-1", "x-1"), ("x-1".into(), "x-1".into()));
        assert_eq!(short("m-a-chat", "m-b-chat"), ("a".into(), "b".into()));
    }

    #[test]
    fn mapper_ids_shorten_to_their_checksums() {
        assert_eq!(
            short_mapper_id("qwen-a__to__qwen-b.0123456789ab-ba9876543210.safetensors"),
            "012345-ba9876"
        );
        assert_eq!(short_mapper_id("custom.safetensors"), "custom");
    }
}
