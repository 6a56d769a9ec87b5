//! Reading a session file back, recovering what a crash left behind.

use super::error::SessionError;
use super::header::{RecordedEvent, SessionHeader, FORMAT, VERSION};
use baton_protocol::Event;
use std::path::Path;

/// A session file's contents.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub header: SessionHeader,
    pub events: Vec<RecordedEvent>,
    /// What was skipped or recovered while reading, one sentence each.
    pub warnings: Vec<String>,
}

impl Session {
    /// The protocol events in file order, without their envelopes.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().map(|r| &r.event)
    }
}

pub fn read_session(path: impl AsRef<Path>) -> Result<Session, SessionError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| SessionError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_session(&bytes, path)
}

/// Parses a session file's bytes; `path` only names the file in errors and warnings.
///
/// A last line that is not complete JSON and has no newline is what a crash mid-write
/// leaves: the events before it load, with a warning. A bad line anywhere else means the
/// file was damaged or edited, and is an error, since the events after it could not be
/// trusted to follow on.
pub fn parse_session(bytes: &[u8], path: &Path) -> Result<Session, SessionError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(SessionError::Empty {
            path: path.to_path_buf(),
        });
    }
    let pieces: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // `split` yields one piece after the last newline: empty when the file ends cleanly.
    let last = pieces.len() - 1;
    let header = parse_header(pieces[0], 0 == last, path)?;
    let mut events = Vec::new();
    let mut warnings = Vec::new();
    for (i, piece) in pieces.iter().enumerate().skip(1) {
        let line = i + 1;
        if piece.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<RecordedEvent>(piece) {
            Ok(e) => events.push((line, e)),
            Err(_) if i == last => {
                warnings.push(format!(
                    "{}: line {line} is cut off (the session ended mid-write, e.g. in a crash); loaded the {} events before it",
                    path.display(),
                    events.len()
                ));
            }
            Err(e) => match unknown_event_type(piece) {
                Some(kind) => warnings.push(format!(
                    "{}: line {line}: skipped an event of type `{kind}`, unknown to this baton (written by a newer one?)",
                    path.display()
                )),
                None => {
                    return Err(SessionError::BadLine {
                        path: path.to_path_buf(),
                        line,
                        detail: format!("not a session event: {e}"),
                    })
                }
            },
        }
    }
    let events = in_seq_order(events, path, &mut warnings);
    Ok(Session {
        header,
        events,
        warnings,
    })
}

/// The events in the order they were recorded (`seq`), whatever order the lines are in.
/// A writer numbers its events one after another, so a line out of order, a number used
/// twice or a line repeated means the file was edited or pieced together: each fault
/// gets a warning, a repeated line is read once, and the rest go in `seq` order (stably,
/// so two different events that share a number keep their file order).
fn in_seq_order(
    mut events: Vec<(usize, RecordedEvent)>,
    path: &Path,
    warnings: &mut Vec<String>,
) -> Vec<RecordedEvent> {
    let p = path.display();
    for pair in events.windows(2) {
        let ((_, a), (line, b)) = (&pair[0], &pair[1]);
        if b.seq < a.seq {
            warnings.push(format!(
                "{p}: line {line} has seq {} after seq {}: the lines are out of order; read in seq order",
                b.seq, a.seq
            ));
        }
    }
    events.sort_by_key(|(_, e)| e.seq);
    let mut kept: Vec<(usize, RecordedEvent)> = Vec::with_capacity(events.len());
    for (line, e) in events {
        match kept.last() {
            Some((first, k)) if k.seq == e.seq && *k == e => warnings.push(format!(
                "{p}: line {line} repeats line {first} (seq {}): read once",
                e.seq
            )),
            Some((first, k)) if k.seq == e.seq => {
                warnings.push(format!(
                    "{p}: lines {first} and {line} share seq {} with different events: both read, in file order",
                    e.seq
                ));
                kept.push((line, e));
            }
            _ => kept.push((line, e)),
        }
    }
    kept.into_iter().map(|(_, e)| e).collect()
}

fn parse_header(line: &[u8], cut_off: bool, path: &Path) -> Result<SessionHeader, SessionError> {
    let not_a_session = |detail: String| SessionError::NotASession {
        path: path.to_path_buf(),
        detail,
    };
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        not_a_session(if cut_off {
            "it was cut off before the header was complete".into()
        } else {
            format!("not JSON: {e}")
        })
    })?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(not_a_session(format!(
                "format is `{other}`, not `{FORMAT}`"
            )))
        }
        None => return Err(not_a_session(format!("no \"format\": \"{FORMAT}\" field"))),
    }
    // The version is checked before the fields: a newer layout may have any fields, and
    // "upgrade baton" is the useful answer, not a missing-field error.
    let version = value.get("version").and_then(|v| v.as_u64());
    match version {
        Some(v) if v == u64::from(VERSION) => {}
        Some(found) => {
            return Err(SessionError::UnsupportedVersion {
                path: path.to_path_buf(),
                found,
                supported: VERSION,
                ours: env!("CARGO_PKG_VERSION"),
            })
        }
        None => return Err(not_a_session("no numeric \"version\" field".into())),
    }
    serde_json::from_value(value).map_err(|e| not_a_session(e.to_string()))
}

/// The type of an event this baton does not know, if the line is otherwise a well-formed
/// envelope: a newer baton may add event types without changing the layout.
fn unknown_event_type(line: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(line).ok()?;
    value.get("seq")?.as_u64()?;
    value.get("t_ms")?.as_f64()?;
    let kind = value.get("event")?.get("type")?.as_str()?;
    (!Event::TYPES.contains(&kind)).then(|| kind.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn file(lines: &[String], trailing_newline: bool) -> Vec<u8> {
        let mut s = lines.join("\n");
        if trailing_newline {
            s.push('\n');
        }
        s.into_bytes()
    }

    fn lines_of(session: &Session) -> Vec<String> {
        std::iter::once(serde_json::to_string(&session.header).unwrap())
            .chain(
                session
                    .events
                    .iter()
                    .map(|e| serde_json::to_string(e).unwrap()),
            )
            .collect()
    }

    #[test]
    fn a_clean_file_reads_back_whole() {
        let s = fixtures::session();
        let back = parse_session(&file(&lines_of(&s), true), Path::new("s.jsonl")).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error_naming_it() {
        let s = fixtures::session();
        let mut lines = lines_of(&s);
        lines[3] = "{\"seq\": 2, oops".into();
        let err = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap_err();
        assert!(
            matches!(err, SessionError::BadLine { line: 4, .. }),
            "{err}"
        );
        assert!(err.to_string().starts_with("s.jsonl: line 4:"), "{err}");
    }

    #[test]
    fn an_unknown_event_type_is_skipped_with_a_warning() {
        let s = fixtures::session();
        let mut lines = lines_of(&s);
        lines.insert(
            2,
            r#"{"seq":99,"t_ms":1.0,"event":{"type":"telepathy","x":1}}"#.into(),
        );
        let back = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap();
        assert_eq!(back.events, s.events);
        assert_eq!(back.warnings.len(), 1);
        assert!(back.warnings[0].contains("telepathy"));
    }

    #[test]
    fn lines_out_of_order_or_repeated_are_read_in_seq_order_once_with_warnings() {
        let s = fixtures::session();
        assert!(s.events.len() >= 4);
        let mut lines = lines_of(&s);
        lines.swap(2, 3);
        let dup = lines[4].clone();
        lines.insert(5, dup);
        let back = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap();
        assert_eq!(back.events, s.events, "seq order, the repeat read once");
        assert_eq!(back.warnings.len(), 2, "{:?}", back.warnings);
        assert!(
            back.warnings[0].contains("out of order"),
            "{:?}",
            back.warnings
        );
        assert!(
            back.warnings[1].contains("repeats line 5"),
            "{:?}",
            back.warnings
        );

        // Two different events under one number: both kept, in file order, with a word.
        let mut lines = lines_of(&s);
        let mut other: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
        other["seq"] = serde_json::from_str::<serde_json::Value>(&lines[2]).unwrap()["seq"].clone();
        lines[3] = other.to_string();
        let back = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap();
        assert_eq!(back.events.len(), s.events.len());
        assert!(
            back.warnings.iter().any(|w| w.contains("share seq")),
            "{:?}",
            back.warnings
        );
    }

    #[test]
    fn a_known_event_with_bad_fields_is_an_error() {
        let s = fixtures::session();
        let mut lines = lines_of(&s);
        lines.insert(2, r#"{"seq":99,"t_ms":1.0,"event":{"type":"done"}}"#.into());
        let err = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap_err();
        assert!(
            matches!(err, SessionError::BadLine { line: 3, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_header_without_a_minor_version_is_format_1_0() {
        let s = fixtures::session();
        assert_eq!(s.header.minor, crate::MINOR);
        let mut lines = lines_of(&s);
        let mut header: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        header.as_object_mut().unwrap().remove("minor");
        lines[0] = header.to_string();
        let back = parse_session(&file(&lines, true), Path::new("s.jsonl")).unwrap();
        assert_eq!(back.header.minor, 0);
        assert_eq!(back.events, s.events);
    }

    #[test]
    fn a_header_cut_off_is_not_a_session() {
        let err = parse_session(br#"{"format":"baton-sess"#, Path::new("s.jsonl")).unwrap_err();
        assert!(err.to_string().contains("cut off"), "{err}");
    }

    #[test]
    fn another_format_is_refused() {
        let err = parse_session(
            b"{\"format\":\"other\",\"version\":1}\n",
            Path::new("s.jsonl"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("format is `other`"), "{err}");
    }

    #[test]
    fn whitespace_only_is_empty() {
        let err = parse_session(b" \n\n", Path::new("s.jsonl")).unwrap_err();
        assert!(matches!(err, SessionError::Empty { .. }));
    }
}
