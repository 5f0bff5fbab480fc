//! The resource manager's state on disk: an [`OrmState`] in a [`CheckpointFile`] (crate
//! `weft-checkpoint`: the kubelet's checkpoint layout, `{"version": 1, "data": "<OrmState as
//! JSON>", "checksum": <crc32>}`, stored atomically and durably).
//!
//! [`Checkpoint::load`] gives `Ok(None)` when there is no file. A damaged file is moved aside to
//! `<path>.corrupt` and [`CheckpointError::Corrupt`] returned; a file of another version is
//! [`CheckpointError::UnsupportedVersion`] and left in place. Both say
//! [`CheckpointError::start_empty`]: the agent starts empty and rebuilds from the runtime.

use std::path::{Path, PathBuf};

use weft_checkpoint::CheckpointFile;
pub use weft_checkpoint::{CheckpointError, WriteStep};

use crate::orm::OrmState;

/// The checkpoint format version this build reads and writes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// The resource manager's checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    file: CheckpointFile,
}

impl Checkpoint {
    /// The checkpoint at `path` (its directory must exist when storing).
    pub fn new(path: impl Into<PathBuf>) -> Checkpoint {
        Checkpoint { file: CheckpointFile::new(path, CHECKPOINT_VERSION) }
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The temporary file a store writes first (`<path>.tmp`).
    pub fn tmp_path(&self) -> PathBuf {
        self.file.tmp_path()
    }

    /// Where a corrupt checkpoint is moved (`<path>.corrupt`).
    pub fn corrupt_path(&self) -> PathBuf {
        self.file.corrupt_path()
    }

    /// Replaces the stored state with `state` atomically and durably.
    pub fn store(&self, state: &OrmState) -> Result<(), CheckpointError> {
        self.file.store(state)
    }

    /// Crash simulation for tests: the steps of [`Checkpoint::store`] up to and including `after`.
    #[doc(hidden)]
    pub fn store_interrupted(&self, state: &OrmState, after: WriteStep) -> Result<(), CheckpointError> {
        self.file.store_interrupted(state, after)
    }

    /// The stored state: `Ok(None)` when there is none; corrupt files are moved aside.
    pub fn load(&self) -> Result<Option<OrmState>, CheckpointError> {
        self.file.load()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use crate::orm::{ContainerAllocation, PodAllocation};
    use crate::pod::{ContainerKind, ContainerSpec, QosClass};

    fn state(uid: &str, cpus: &str) -> OrmState {
        OrmState {
            pods: vec![PodAllocation {
                uid: uid.into(),
                namespace: "ns".into(),
                name: uid.into(),
                qos: QosClass::Guaranteed,
                exclusive: cpus.parse().unwrap(),
                containers: vec![ContainerAllocation {
                    spec: ContainerSpec {
                        name: "c".into(),
                        kind: ContainerKind::App,
                        cpu_request_milli: 2000,
                        cpu_limit_milli: Some(2000),
                        memory_request: 1 << 30,
                        memory_limit: Some(1 << 30),
                    },
                    cpus: cpus.parse().unwrap(),
                }],
                mems: Some("0".parse().unwrap()),
                affinity: Some("0".parse().unwrap()),
                devices: vec![],
                memory_numa: [(0, 1 << 30)].into(),
            }],
        }
    }

    // The file format's own behaviour (crashes, damage, versions) is tested in weft-checkpoint;
    // here, that the resource manager's state goes through it whole.
    #[test]
    fn store_then_load_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("orm_state"));
        assert!(cp.load().unwrap().is_none());
        let s = state("a", "2-3");
        cp.store(&s).unwrap();
        assert_eq!(cp.load().unwrap(), Some(s));
        assert!(!cp.tmp_path().exists());
        let s2 = state("b", "4-5");
        cp.store(&s2).unwrap();
        assert_eq!(cp.load().unwrap(), Some(s2));
        // The file is the documented envelope.
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(cp.path()).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        let data = v["data"].as_str().unwrap();
        assert_eq!(v["checksum"].as_u64().unwrap(), u64::from(crc32fast::hash(data.as_bytes())));
    }
}
