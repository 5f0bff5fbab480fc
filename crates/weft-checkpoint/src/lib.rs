//! weft-checkpoint: node-local state files (the NRI agent's resource-manager state, the NIC DRA
//! driver's prepared claims), read and written one way.
//!
//! Format: one JSON object `{"version": <n>, "data": "<state as JSON>", "checksum": <crc32>}`,
//! where `data` is the state serialised to a JSON string and `checksum` is the CRC-32 (IEEE,
//! `crc32fast`) of that string's UTF-8 bytes: the layout of the kubelet's and Katalyst's
//! checkpoints, data plus a checksum over it. Each user picks its own format version.
//!
//! [`CheckpointFile::store`]: write `<path>.tmp`, fsync it, rename it over `<path>`, fsync the
//! directory. A crash at any point leaves `<path>` holding either the old state or the new one,
//! never a mix: until the rename, `<path>` is untouched; the rename is atomic. The directory
//! must exist.
//!
//! [`CheckpointFile::load`]: `Ok(None)` when there is no file; the state when the envelope
//! parses, the version is the expected one and the checksum matches; otherwise the file is moved
//! aside to `<path>.corrupt` and [`CheckpointError::Corrupt`] is returned, which the caller
//! treats as "start empty and rebuild" (the next load then finds no file). A checkpoint of
//! another version is [`CheckpointError::UnsupportedVersion`] and is left in place (a newer
//! build's file after a downgrade; the next store replaces it). A leftover `<path>.tmp` from an
//! interrupted store is ignored (the next store truncates it).
//!
//! Crash simulation: [`CheckpointFile::store_interrupted`] performs the store's steps only up to
//! a [`WriteStep`]. It is public but `#[doc(hidden)]` (not behind a feature) so tests of every
//! crate that keeps a checkpoint can use it without extra build flags; it only ever does a
//! prefix of what `store` does, so it cannot corrupt anything `store` could not.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The on-disk envelope.
#[derive(Serialize, serde::Deserialize)]
struct Envelope {
    version: u32,
    data: String,
    checksum: u32,
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("checkpoint {path}: {op}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`create`, `write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged (bad JSON, checksum mismatch, undecodable state). It was moved to
    /// `moved_to` (when that worked); start empty and rebuild.
    #[error("checkpoint {path} is corrupt ({why}){}", match moved_to { Some(p) => format!("; moved to {}", p.display()), None => String::new() })]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        why: String,
        /// Where it was moved.
        moved_to: Option<PathBuf>,
    },
    /// The file is of a format version this build does not read (left in place).
    #[error("checkpoint {path} has format version {found}; this build reads version {expected}")]
    UnsupportedVersion {
        /// The checkpoint file.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// The state could not be serialised.
    #[error("checkpoint {path}: encoding the state: {source}")]
    Encode {
        /// The checkpoint file.
        path: PathBuf,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

impl CheckpointError {
    /// Whether the caller should start from an empty state and rebuild it (a corrupt or
    /// unreadable-version file), as opposed to an I/O failure worth retrying or reporting.
    pub fn start_empty(&self) -> bool {
        matches!(self, CheckpointError::Corrupt { .. } | CheckpointError::UnsupportedVersion { .. })
    }
}

/// How far [`CheckpointFile::store_interrupted`] goes before "crashing".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteStep {
    /// `<path>.tmp` written, not synced.
    TmpWritten,
    /// `<path>.tmp` written and fsynced.
    TmpSynced,
    /// Renamed over `<path>`; the directory is not yet fsynced.
    Renamed,
}

/// The checkpoint file at one path, of one format version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFile {
    path: PathBuf,
    version: u32,
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

impl CheckpointFile {
    /// The checkpoint at `path` in format `version` (its directory must exist when storing).
    pub fn new(path: impl Into<PathBuf>, version: u32) -> CheckpointFile {
        CheckpointFile { path: path.into(), version }
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version read and written.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The temporary file a store writes first (`<path>.tmp`).
    pub fn tmp_path(&self) -> PathBuf {
        with_suffix(&self.path, ".tmp")
    }

    /// Where a corrupt checkpoint is moved (`<path>.corrupt`).
    pub fn corrupt_path(&self) -> PathBuf {
        with_suffix(&self.path, ".corrupt")
    }

    fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointError {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, op, source }
    }

    /// The encoded envelope for `state`.
    pub fn encode<T: Serialize>(&self, state: &T) -> Result<Vec<u8>, CheckpointError> {
        let encode = |source| CheckpointError::Encode { path: self.path.clone(), source };
        let data = serde_json::to_string(state).map_err(encode)?;
        let envelope = Envelope { version: self.version, checksum: crc32fast::hash(data.as_bytes()), data };
        serde_json::to_vec(&envelope).map_err(encode)
    }

    /// Replaces the stored state with `state` atomically and durably (see the crate docs).
    pub fn store<T: Serialize>(&self, state: &T) -> Result<(), CheckpointError> {
        self.store_steps(state, None)
    }

    /// Crash simulation for tests: the steps of [`CheckpointFile::store`] up to and including
    /// `after`, then stop as if the process died. See the crate docs.
    #[doc(hidden)]
    pub fn store_interrupted<T: Serialize>(&self, state: &T, after: WriteStep) -> Result<(), CheckpointError> {
        self.store_steps(state, Some(after))
    }

    fn store_steps<T: Serialize>(&self, state: &T, stop: Option<WriteStep>) -> Result<(), CheckpointError> {
        let bytes = self.encode(state)?;
        let tmp = self.tmp_path();
        let mut file =
            OpenOptions::new().write(true).create(true).truncate(true).open(&tmp).map_err(Self::io(&tmp, "create"))?;
        file.write_all(&bytes).map_err(Self::io(&tmp, "write"))?;
        if stop == Some(WriteStep::TmpWritten) {
            return Ok(());
        }
        file.sync_all().map_err(Self::io(&tmp, "fsync"))?;
        drop(file);
        if stop == Some(WriteStep::TmpSynced) {
            return Ok(());
        }
        std::fs::rename(&tmp, &self.path).map_err(Self::io(&self.path, "rename"))?;
        if stop == Some(WriteStep::Renamed) {
            return Ok(());
        }
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(&dir).and_then(|d| d.sync_all()).map_err(Self::io(&dir, "fsync directory"))?;
        Ok(())
    }

    /// The stored state: `Ok(None)` when there is none; corrupt files are moved aside (see the
    /// crate docs).
    pub fn load<T: DeserializeOwned>(&self) -> Result<Option<T>, CheckpointError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Self::io(&self.path, "read")(e)),
        };
        let envelope: Envelope = match serde_json::from_slice(&bytes) {
            Ok(e) => e,
            Err(e) => return Err(self.corrupt(format!("not a checkpoint envelope: {e}"))),
        };
        if envelope.version != self.version {
            return Err(CheckpointError::UnsupportedVersion {
                path: self.path.clone(),
                found: envelope.version,
                expected: self.version,
            });
        }
        let sum = crc32fast::hash(envelope.data.as_bytes());
        if sum != envelope.checksum {
            return Err(
                self.corrupt(format!("checksum {sum:#010x} does not match the recorded {:#010x}", envelope.checksum))
            );
        }
        match serde_json::from_str::<T>(&envelope.data) {
            Ok(state) => Ok(Some(state)),
            Err(e) => Err(self.corrupt(format!("state does not decode: {e}"))),
        }
    }

    /// Moves the file aside and describes it.
    fn corrupt(&self, why: String) -> CheckpointError {
        let to = self.corrupt_path();
        let moved_to = match std::fs::rename(&self.path, &to) {
            Ok(()) => Some(to),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "could not move the corrupt checkpoint aside");
                None
            }
        };
        CheckpointError::Corrupt { path: self.path.clone(), why, moved_to }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    type State = BTreeMap<String, String>;

    fn state(key: &str, cpus: &str) -> State {
        [(key.to_string(), cpus.to_string())].into()
    }

    fn file(dir: &tempfile::TempDir) -> CheckpointFile {
        CheckpointFile::new(dir.path().join("state"), 1)
    }

    #[test]
    fn store_then_load_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let cp = file(&dir);
        assert!(cp.load::<State>().unwrap().is_none());
        let s = state("a", "2-3");
        cp.store(&s).unwrap();
        assert_eq!(cp.load().unwrap(), Some(s));
        assert!(!cp.tmp_path().exists());
        let s2 = state("b", "4-5");
        cp.store(&s2).unwrap();
        assert_eq!(cp.load().unwrap(), Some(s2.clone()));
        // The file is the documented envelope.
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(cp.path()).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        let data = v["data"].as_str().unwrap();
        assert_eq!(serde_json::from_str::<State>(data).unwrap(), s2, "data is the state as a JSON string");
        assert_eq!(v["checksum"].as_u64().unwrap(), u64::from(crc32fast::hash(data.as_bytes())));
    }

    #[test]
    fn an_interrupted_store_leaves_the_old_or_the_new_state() {
        let old = state("old", "2-3");
        let new = state("new", "6-7");
        for step in [WriteStep::TmpWritten, WriteStep::TmpSynced, WriteStep::Renamed] {
            let dir = tempfile::tempdir().unwrap();
            let cp = file(&dir);
            cp.store(&old).unwrap();
            cp.store_interrupted(&new, step).unwrap();
            let got: Option<State> = cp.load().unwrap();
            let want = if step == WriteStep::Renamed { &new } else { &old };
            assert_eq!(got.as_ref(), Some(want), "{step:?}");
            // A later full store wins over whatever the crash left.
            cp.store(&new).unwrap();
            assert_eq!(cp.load().unwrap(), Some(new.clone()), "{step:?}");
        }
        // An interrupted first store leaves no state at all.
        let dir = tempfile::tempdir().unwrap();
        let cp = file(&dir);
        cp.store_interrupted(&new, WriteStep::TmpSynced).unwrap();
        assert!(cp.load::<State>().unwrap().is_none());
    }

    #[test]
    fn a_torn_tmp_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cp = file(&dir);
        let old = state("old", "2-3");
        cp.store(&old).unwrap();
        std::fs::write(cp.tmp_path(), b"{\"version\":1,\"da").unwrap();
        assert_eq!(cp.load().unwrap(), Some(old));
    }

    #[test]
    fn corrupt_files_are_moved_aside() {
        type Damage = Box<dyn Fn(&str) -> String>;
        let cases: Vec<(&str, Damage)> = vec![
            ("garbage", Box::new(|_| "not json at all".to_string())),
            ("truncated", Box::new(|s| s[..s.len() / 2].to_string())),
            (
                "checksum",
                Box::new(|s| {
                    let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
                    v["data"] = serde_json::Value::String(v["data"].as_str().unwrap().replace("2-3", "2-4"));
                    v.to_string()
                }),
            ),
            (
                "undecodable",
                Box::new(|_| {
                    let data = "{\"a\":7}";
                    format!("{{\"version\":1,\"data\":{:?},\"checksum\":{}}}", data, crc32fast::hash(data.as_bytes()))
                }),
            ),
        ];
        for (name, damage) in cases {
            let dir = tempfile::tempdir().unwrap();
            let cp = file(&dir);
            cp.store(&state("a", "2-3")).unwrap();
            let text = std::fs::read_to_string(cp.path()).unwrap();
            std::fs::write(cp.path(), damage(&text)).unwrap();
            let err = cp.load::<State>().unwrap_err();
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{name}: {err}");
            assert!(err.start_empty(), "{name}");
            assert!(err.to_string().contains("corrupt"), "{name}: {err}");
            assert!(cp.corrupt_path().exists(), "{name}");
            assert!(!cp.path().exists(), "{name}");
            // Start empty: the next load finds nothing, a store works again.
            assert!(cp.load::<State>().unwrap().is_none(), "{name}");
            cp.store(&state("b", "4")).unwrap();
            assert_eq!(cp.load().unwrap(), Some(state("b", "4")), "{name}");
        }
    }

    #[test]
    fn another_version_is_reported_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let cp = file(&dir);
        let data = "{}";
        std::fs::write(
            cp.path(),
            format!("{{\"version\":2,\"data\":{:?},\"checksum\":{}}}", data, crc32fast::hash(data.as_bytes())),
        )
        .unwrap();
        let err = cp.load::<State>().unwrap_err();
        assert!(matches!(err, CheckpointError::UnsupportedVersion { found: 2, expected: 1, .. }), "{err}");
        assert!(err.to_string().contains("version 2") && err.to_string().contains("reads version 1"), "{err}");
        assert!(err.start_empty());
        assert!(cp.path().exists());
    }

    #[test]
    fn store_into_a_missing_directory_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let cp = CheckpointFile::new(dir.path().join("no/such/dir/state"), 1);
        let err = cp.store(&State::new()).unwrap_err();
        assert!(matches!(err, CheckpointError::Io { op: "create", .. }), "{err}");
        assert!(!err.start_empty());
    }
}
