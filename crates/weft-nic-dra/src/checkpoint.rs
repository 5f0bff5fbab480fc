//! The driver's prepared claims on disk, written atomically, and the [`PodNics`] view the NRI half
//! reads.
//!
//! Format: a [`CheckpointFile`] (crate `weft-checkpoint`, shared with the agent's resource
//! manager: the kubelet's layout, `{"version": 1, "data": "<State as JSON>", "checksum":
//! <crc32>}`). A store writes `<path>.tmp`, fsyncs it, renames it over `<path>` and fsyncs the
//! directory, off the async workers: a crash leaves the old state or the new one. Opening creates
//! the directory when it is missing.
//!
//! The file is written before the in-memory state changes, so what [`Checkpoint::get`] and
//! [`PodNics::nics_for_pod`] answer is always on disk. A corrupt file is moved aside to
//! `<path>.corrupt` and the driver starts empty: the addresses are recorded in the API server
//! (`NetworkAddress`), so a re-prepare finds them again; only the VLANs to restore are lost (and
//! logged).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};

use serde::{Deserialize, Serialize};
pub use weft_checkpoint::CheckpointError;
use weft_checkpoint::CheckpointFile;
use weft_cni::pf::PfVfState;

use crate::prepared::{ClaimRef, PodNics, PreparedNic};

/// The checkpoint format version this build reads and writes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// One prepared NIC and what to restore when it is unprepared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicEntry {
    /// What was prepared.
    pub nic: PreparedNic,
    /// The VF's PF-side settings before the prepare (restored by unprepare).
    pub original: PfVfState,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    /// The claim.
    pub claim: ClaimRef,
    /// Its NICs on this node, in the order of the allocation's results.
    pub nics: Vec<NicEntry>,
}

/// Everything prepared on this node, by claim UID.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// By claim UID.
    pub claims: BTreeMap<String, ClaimEntry>,
}

/// The driver's checkpoint: the file and the state it holds.
#[derive(Debug)]
pub struct Checkpoint {
    file: CheckpointFile,
    state: RwLock<State>,
    /// Held from reading the state to storing the next one, so concurrent changes never lose one.
    writer: tokio::sync::Mutex<()>,
    fail_next: AtomicUsize,
}

impl Checkpoint {
    /// Opens the checkpoint at `path` (creating its directory when missing): its state, or an
    /// empty one when there is no file. A damaged file is moved to `<path>.corrupt` and the state
    /// starts empty (logged); a file of another format version is an error.
    pub fn open(path: impl Into<PathBuf>) -> Result<Checkpoint, CheckpointError> {
        let file = CheckpointFile::new(path, CHECKPOINT_VERSION);
        if let Some(dir) = file.path().parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Io {
                path: dir.to_path_buf(),
                op: "create directory",
                source,
            })?;
        }
        let state = match file.load::<State>() {
            Ok(state) => state.unwrap_or_default(),
            Err(e @ CheckpointError::Corrupt { .. }) => {
                tracing::warn!(error = %e, "the NIC driver's checkpoint is damaged; starting empty: addresses are found again in the API server, VLANs of claims prepared before are not restored");
                State::default()
            }
            Err(e) => return Err(e),
        };
        Ok(Checkpoint {
            file,
            state: RwLock::new(state),
            writer: tokio::sync::Mutex::new(()),
            fail_next: AtomicUsize::new(0),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// A copy of the whole state.
    pub fn state(&self) -> State {
        self.state.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The claim with UID `uid`, when prepared.
    pub fn get(&self, uid: &str) -> Option<ClaimEntry> {
        self.state.read().unwrap_or_else(PoisonError::into_inner).claims.get(uid).cloned()
    }

    /// Records `entry` (replacing the claim's entry): on disk first, then in memory.
    pub async fn insert(&self, entry: ClaimEntry) -> Result<(), CheckpointError> {
        let _writing = self.writer.lock().await;
        let mut next = self.state();
        next.claims.insert(entry.claim.uid.clone(), entry);
        self.store(next).await
    }

    /// Drops the claim `uid`: on disk first, then in memory. An unknown claim writes nothing.
    pub async fn remove(&self, uid: &str) -> Result<(), CheckpointError> {
        let _writing = self.writer.lock().await;
        let mut next = self.state();
        if next.claims.remove(uid).is_none() {
            return Ok(());
        }
        self.store(next).await
    }

    /// Fault injection for tests: the next `n` stores fail (before anything is written) as if the
    /// disk refused them.
    #[doc(hidden)]
    pub fn fail_next_stores(&self, n: usize) {
        self.fail_next.store(n, Ordering::SeqCst);
    }

    async fn store(&self, next: State) -> Result<(), CheckpointError> {
        let write_error =
            |e: std::io::Error| CheckpointError::Io { path: self.file.path().to_path_buf(), op: "write", source: e };
        if self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(write_error(std::io::Error::other("injected fault")));
        }
        let (file, state) = (self.file.clone(), next.clone());
        match tokio::task::spawn_blocking(move || file.store(&state)).await {
            Ok(r) => r?,
            Err(e) => return Err(write_error(std::io::Error::other(e.to_string()))),
        }
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = next;
        Ok(())
    }
}

impl PodNics for Checkpoint {
    fn nics_for_pod(&self, pod_uid: &str) -> Vec<PreparedNic> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        // Claims by UID, NICs in allocation order; sorted by (claim, request) as the trait says.
        let mut nics: Vec<PreparedNic> = state
            .claims
            .values()
            .flat_map(|c| c.nics.iter())
            .filter(|n| n.nic.pod_uids.iter().any(|u| u == pod_uid))
            .map(|n| n.nic.clone())
            .collect();
        nics.sort_by(|a, b| {
            (&a.claim.namespace, &a.claim.name, &a.request).cmp(&(&b.claim.namespace, &b.claim.name, &b.request))
        });
        nics
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn entry(uid: &str, name: &str, pod: &str) -> ClaimEntry {
        let claim = ClaimRef { namespace: "ns".into(), name: name.into(), uid: uid.into() };
        ClaimEntry {
            claim: claim.clone(),
            nics: vec![NicEntry {
                nic: PreparedNic {
                    claim,
                    request: "nic".into(),
                    pool: "n1".into(),
                    device: "vf-0000-3b-00-2".into(),
                    pod_uids: vec![pod.into()],
                    vf_pci: "0000:3b:00.2".into(),
                    pf: "ens1f0".into(),
                    vf_index: 0,
                    network: "net-a".into(),
                    address: "10.0.0.1/24".parse().unwrap(),
                    vlan: Some(10),
                    interface_name: None,
                    mtu: None,
                    aligned: None,
                },
                original: PfVfState::default(),
            }],
        }
    }

    #[tokio::test]
    async fn stores_reload_and_serve_the_pods() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let cp = Checkpoint::open(&path).unwrap();
        cp.insert(entry("u2", "b", "pod-1")).await.unwrap();
        cp.insert(entry("u1", "a", "pod-1")).await.unwrap();
        cp.insert(entry("u3", "c", "pod-2")).await.unwrap();
        let again = Checkpoint::open(&path).unwrap();
        assert_eq!(again.state(), cp.state());
        let names: Vec<String> = again.nics_for_pod("pod-1").into_iter().map(|n| n.claim.name).collect();
        assert_eq!(names, ["a", "b"]);
        again.remove("u1").await.unwrap();
        again.remove("unknown").await.unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().nics_for_pod("pod-1").len(), 1);
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["checksum"].as_u64().unwrap(), u64::from(crc32fast::hash(v["data"].as_str().unwrap().as_bytes())));
    }

    #[tokio::test]
    async fn a_failed_store_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let cp = Checkpoint::open(&path).unwrap();
        cp.fail_next_stores(1);
        let e = cp.insert(entry("u1", "a", "p")).await.unwrap_err().to_string();
        assert!(e.contains("cp.json") && e.contains("injected fault"), "{e}");
        assert!(cp.get("u1").is_none() && !path.exists());
        cp.insert(entry("u1", "a", "p")).await.unwrap();
        assert!(cp.get("u1").is_some());
    }

    #[tokio::test]
    async fn a_missing_directory_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("var/lib/weft/nic-dra/checkpoint.json");
        let cp = Checkpoint::open(&path).unwrap();
        cp.insert(entry("u1", "a", "p")).await.unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().state(), cp.state());
    }

    #[tokio::test]
    async fn a_damaged_file_is_moved_aside_and_another_version_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        std::fs::write(&path, "{\"version\":1,\"data\":\"{}\",\"checksum\":7}").unwrap();
        let cp = Checkpoint::open(&path).unwrap();
        assert_eq!(cp.state(), State::default());
        assert!(dir.path().join("cp.json.corrupt").exists() && !path.exists());
        std::fs::write(&path, "{\"version\":9,\"data\":\"{}\",\"checksum\":0}").unwrap();
        let e = Checkpoint::open(&path).unwrap_err().to_string();
        assert!(e.contains("format version 9"), "{e}");
    }
}
