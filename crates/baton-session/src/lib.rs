//! Session files: an append-only JSON Lines record of one conversation's protocol events,
//! written as they happen so a crash loses at most the line being written, and read back
//! for reports, replays and the drift charts.
//!
//! Line 1 is a [`SessionHeader`]; every further line is a [`RecordedEvent`]: one
//! [`Event`](baton_protocol::Event) with its sequence number and its time since the
//! session started.

mod clock;
pub mod diff;
mod error;
mod header;
mod reader;
mod repair_states;
mod report_table;
pub mod session_report;
mod settings_diff;
mod switch_json;
mod writer;

/// A hand-built session for the tests of the crates that read sessions.
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

pub use diff::{diff_sessions, DiffOptions, SessionDiff};
pub use error::SessionError;
pub use header::{RecordedEvent, SessionHeader, FORMAT, MINOR, VERSION};
pub use reader::{parse_session, read_session, Session};
pub use session_report::Report;
pub use writer::{check_record_path, default_session_path, SessionWriter};
