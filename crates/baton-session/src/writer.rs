//! Appending events to a session file as they happen.

use super::clock::UtcTime;
use super::error::SessionError;
use super::header::{RecordedEvent, SessionHeader};
use baton_protocol::Event;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// An open session file. Every line reaches the disk before `append` returns, so a crash
/// or a power cut loses at most the line being written, and the reader recovers the rest.
#[derive(Debug)]
pub struct SessionWriter {
    file: File,
    path: PathBuf,
    seq: u64,
    started: Instant,
}

impl SessionWriter {
    /// Creates the file (and its folders) and writes the header. An existing file is
    /// refused, never truncated: it is a record of some earlier session.
    pub fn create(path: impl AsRef<Path>, header: &SessionHeader) -> Result<Self, SessionError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| SessionError::Create {
                path: path.clone(),
                source,
            })?;
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| match source.kind() {
                _ if path.is_dir() => SessionError::IsADirectory { path: path.clone() },
                ErrorKind::AlreadyExists => SessionError::Exists { path: path.clone() },
                _ => SessionError::Create {
                    path: path.clone(),
                    source,
                },
            })?;
        let mut writer = Self {
            file,
            path,
            seq: 0,
            started: Instant::now(),
        };
        writer.write_line(header)?;
        Ok(writer)
    }

    /// Records one event; returns whether it was written (streamed tokens and loading
    /// progress are not, see [`Event::is_recorded`]).
    pub fn append(&mut self, event: &Event) -> Result<bool, SessionError> {
        if !event.is_recorded() {
            return Ok(false);
        }
        let line = RecordedEvent {
            seq: self.seq,
            t_ms: self.started.elapsed().as_secs_f64() * 1e3,
            event: event.clone(),
        };
        self.write_line(&line)?;
        self.seq += 1;
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many events have been recorded so far.
    pub fn recorded(&self) -> u64 {
        self.seq
    }

    fn write_line<T: Serialize>(&mut self, value: &T) -> Result<(), SessionError> {
        let mut line = serde_json::to_vec(value)?;
        line.push(b'\n');
        // One write per line keeps a torn write to the last line, where the reader
        // expects it.
        let wrote = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .and_then(|()| self.file.sync_data());
        wrote.map_err(|source| SessionError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

/// Whether a session could be recorded to `path`, checked before anything is loaded: no
/// file where a directory of the path has to be, and no session there already.
pub fn check_record_path(path: &Path) -> Result<(), SessionError> {
    if path.is_dir() {
        return Err(SessionError::IsADirectory {
            path: path.to_path_buf(),
        });
    }
    if path.exists() {
        return Err(SessionError::Exists {
            path: path.to_path_buf(),
        });
    }
    if let Some(blocker) = path.ancestors().skip(1).find(|a| a.is_file()) {
        return Err(SessionError::NotADirectory {
            path: path.to_path_buf(),
            blocker: blocker.to_path_buf(),
        });
    }
    Ok(())
}

/// Where a new session goes by default: `dir/sessions/<UTC start time>-<process id>.jsonl`,
/// with a counter appended when that name is taken. Two recordings started in the same
/// second by different processes get different names without either seeing the other's
/// file (which exists only once its models have loaded).
pub fn default_session_path(dir: impl AsRef<Path>) -> PathBuf {
    session_path_in(&dir.as_ref().join("sessions"), std::process::id())
}

fn session_path_in(sessions: &Path, process: u32) -> PathBuf {
    let stamp = format!("{}-{process}", UtcTime::now().file_stamp());
    let mut path = sessions.join(format!("{stamp}.jsonl"));
    let mut n = 1;
    while path.exists() {
        n += 1;
        path = sessions.join(format!("{stamp}-{n}.jsonl"));
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_differ_between_processes_and_skip_taken_ones() {
        let dir = tempfile::tempdir().unwrap();
        let a = session_path_in(dir.path(), 100);
        let b = session_path_in(dir.path(), 101);
        assert_ne!(a, b, "two processes in the same second");
        std::fs::write(&a, "taken").unwrap();
        let again = session_path_in(dir.path(), 100);
        assert_ne!(again, a);
        assert!(
            again.to_string_lossy().ends_with("-100-2.jsonl"),
            "{}",
            again.display()
        );
        let name = default_session_path(dir.path());
        assert!(name.starts_with(dir.path().join("sessions")));
        let pid = format!("-{}.jsonl", std::process::id());
        assert!(name.to_string_lossy().ends_with(&pid), "{}", name.display());
    }

    #[test]
    fn a_record_path_under_a_file_or_onto_a_session_is_refused_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, "x").unwrap();
        let e = check_record_path(&file.join("s.jsonl")).unwrap_err();
        assert!(matches!(e, SessionError::NotADirectory { .. }), "{e}");
        assert!(e.to_string().contains("notes.txt is a file"), "{e}");
        assert!(matches!(
            check_record_path(&file),
            Err(SessionError::Exists { .. })
        ));
        assert!(check_record_path(&dir.path().join("new/s.jsonl")).is_ok());
        // A directory is no session to keep: the message says to name a file in it.
        let e = check_record_path(dir.path()).unwrap_err();
        assert!(matches!(e, SessionError::IsADirectory { .. }), "{e}");
        assert!(!e.to_string().contains("never overwritten"), "{e}");
    }
}
