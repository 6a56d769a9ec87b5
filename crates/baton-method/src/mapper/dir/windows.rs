//! Which calibration windows a mapper has read in the background, whoever read them. A
//! window is claimed before it is read: a file of the mapper's windows folder, locked
//! while the window is read and marked once it was weighed (taken or not). Two
//! workbenches on one directory then never read one window twice for one mapper; a
//! reader that dies or gives way leaves its claim unlocked and unmarked, and the window
//! is read again later.

use super::{DirError, PairFiles};
use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

/// What a claim file holds once its window was weighed.
const READ: &[u8] = b"read\n";

/// The claim on one calibration window, held while this lives.
pub struct WindowClaim {
    path: PathBuf,
    file: File,
}

impl WindowClaim {
    /// Marks the window read for good: no reader of this mapper reads it again.
    pub fn read(mut self) -> Result<(), DirError> {
        let err = |e: std::io::Error| DirError::Write {
            path: self.path.clone(),
            reason: e.to_string(),
        };
        self.file.set_len(0).map_err(err)?;
        self.file.write_all(READ).map_err(err)?;
        self.file.sync_all().map_err(err)
    }
}

impl PairFiles {
    /// Claims window `number` for the mapper `mapper` (its identity): `None` when
    /// another reader holds it now or it was read already.
    pub fn claim_window(
        &self,
        mapper: &str,
        number: usize,
    ) -> Result<Option<WindowClaim>, DirError> {
        let folder = self.windows();
        let path = folder.join(format!("{}.{number}", super::sanitize(mapper)));
        let err = |e: std::io::Error| DirError::Write {
            path: path.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(&folder).map_err(err)?;
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(err)?;
        if file.try_lock().is_err() {
            return Ok(None);
        }
        let mut held = Vec::new();
        file.read_to_end(&mut held).map_err(err)?;
        if held == READ {
            return Ok(None);
        }
        Ok(Some(WindowClaim { path, file }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::MapperDir;
    use crate::mapper::artifact::ModelRef;

    fn pair(dir: &std::path::Path) -> super::PairFiles {
        let m = |n: &str| ModelRef {
            name: n.into(),
            sha256: n.repeat(12),
            architecture: "qwen2".into(),
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            tokenizer_fingerprint: "t".into(),
        };
        MapperDir::named(dir).pair(&m("a"), &m("b"))
    }

    #[test]
    fn a_window_is_read_once_per_mapper_whoever_reads_it() {
        let tmp = tempfile::tempdir().unwrap();
        let p = pair(tmp.path());
        let first = p.claim_window("m1", 7).unwrap().expect("free");
        assert!(
            p.claim_window("m1", 7).unwrap().is_none(),
            "held by a live reader"
        );
        assert!(
            p.claim_window("m2", 7).unwrap().is_some(),
            "another mapper's"
        );
        first.read().unwrap();
        assert!(p.claim_window("m1", 7).unwrap().is_none(), "read already");
        // A reader that gave way leaves the window to be read again.
        drop(p.claim_window("m1", 8).unwrap().expect("free"));
        assert!(p.claim_window("m1", 8).unwrap().is_some());
    }
}
