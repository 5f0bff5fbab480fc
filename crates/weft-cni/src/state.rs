//! What weft-cni keeps between calls, under `cacheDir` (default `/var/lib/cni/weft`):
//!
//! - `<containerID>-<ifname>.json`: one attachment ([`Attachment`]): the pod, the netns, and per
//!   VF its original state (host name, MAC, MTU, up, and the PF-side VLAN/MAC when ADD changed
//!   them), what ADD applied, and the VIF as `weft_net::vif::Vif`, the facts of the pod's
//!   `weft.io/vifs` record (the node agent publishes it on the pod: docs/cni.md);
//! - `pci/<pci>`: the VF's allocation record; its content is the netns path holding the VF;
//! - `pci/<pci>.lock`: the VF's lock file (an exclusive `flock` while an ADD or DEL works on it).
//!
//! Files are written to a temporary name and renamed, so a reader sees a whole file or none.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weft_net::vif::{Vif, VifRecord};

use crate::conf::VlanSetting;
use crate::error::{CniError, code};
use crate::pf::{Mac, PfVfState};

/// The `format` of an attachment file.
pub const ATTACHMENT_FORMAT: &str = "weft.io/cni-attachment/v1";

/// The pod an attachment belongs to (from CNI_ARGS).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A VF's state before ADD touched it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginalState {
    /// Its netdev name in the host.
    pub host_ifname: String,
    /// Its MAC (the effective one, on the netdev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// Its MTU.
    pub mtu: u32,
    /// Whether it was administratively up.
    pub up: bool,
    /// What the PF reported for it, read only when ADD changes PF-side settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf: Option<PfVfState>,
}

/// What ADD changed (DEL restores exactly these).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// The VLAN set through the PF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanSetting>,
    /// The MAC set (administratively through the PF, and on the netdev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// The MTU set on the netdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// One VF of an attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedVf {
    /// The VF's PCI address.
    pub pci_address: String,
    /// Its index on the PF.
    pub vf_index: u32,
    /// The PF's netdev, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_netdev: Option<String>,
    /// Its interface name in the pod (also the `CNI_IFNAME` its IPAM calls carry).
    pub ifname: String,
    /// Before ADD.
    pub original: OriginalState,
    /// What ADD did.
    pub applied: Applied,
    /// The VIF.
    pub vif: Vif,
}

/// One attachment (`CNI_CONTAINERID`, `CNI_IFNAME`): one VF with a deviceID, one or more in
/// chained mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// [`ATTACHMENT_FORMAT`].
    pub format: String,
    /// `CNI_CONTAINERID`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The network's name.
    pub network: String,
    /// The pod.
    #[serde(default)]
    pub pod: PodRef,
    /// The VFs, in the order they were attached.
    pub vfs: Vec<AttachedVf>,
}

impl Attachment {
    /// The attachment's VIFs by interface name, for `weft.io/vifs`.
    pub fn vif_record(&self) -> VifRecord {
        VifRecord { vifs: self.vfs.iter().map(|v| (v.ifname.clone(), v.vif.clone())).collect::<BTreeMap<_, _>>() }
    }
}

/// The state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

/// A VF's lock, released on drop.
#[derive(Debug)]
pub struct PciLock {
    _file: File,
}

/// Write `data` to `path` whole or not at all: to a temporary name beside it, synced, renamed.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl StateDir {
    /// The directory at `root` (created on first write).
    pub fn new(root: &Path) -> StateDir {
        StateDir { root: root.to_path_buf() }
    }

    /// Its path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of attachment (`container_id`, `ifname`).
    pub fn attachment_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.root.join(format!("{container_id}-{ifname}.json"))
    }

    fn pci_dir(&self) -> PathBuf {
        self.root.join("pci")
    }

    /// The allocation record of VF `pci`.
    pub fn pci_record_path(&self, pci: &str) -> PathBuf {
        self.pci_dir().join(pci)
    }

    /// The attachment, if one is cached.
    pub fn load(&self, container_id: &str, ifname: &str) -> Result<Option<Attachment>, CniError> {
        let path = self.attachment_path(container_id, ifname);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| CniError::new(code::DECODE, format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CniError::io(path.display(), &e)),
        }
    }

    /// Write the attachment.
    pub fn save(&self, a: &Attachment) -> Result<(), CniError> {
        let path = self.attachment_path(&a.container_id, &a.ifname);
        std::fs::create_dir_all(&self.root).map_err(|e| CniError::io(self.root.display(), &e))?;
        let data = serde_json::to_vec_pretty(a).map_err(|e| CniError::new(code::IO, e.to_string()))?;
        write_atomic(&path, &data).map_err(|e| CniError::io(path.display(), &e))
    }

    /// Remove the attachment's file.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<(), CniError> {
        let path = self.attachment_path(container_id, ifname);
        remove_if_there(&path).map_err(|e| CniError::io(path.display(), &e))
    }

    /// Every cached attachment (unreadable files are skipped and named in the second list).
    pub fn list(&self) -> (Vec<Attachment>, Vec<String>) {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else { return (out, bad) };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for p in paths {
            match std::fs::read(&p).ok().and_then(|b| serde_json::from_slice::<Attachment>(&b).ok()) {
                Some(a) => out.push(a),
                None => bad.push(p.display().to_string()),
            }
        }
        (out, bad)
    }

    /// The netns path recorded for VF `pci`, if it is recorded as allocated.
    pub fn pci_record(&self, pci: &str) -> Result<Option<PathBuf>, CniError> {
        let path = self.pci_record_path(pci);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(PathBuf::from(text.trim()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CniError::io(path.display(), &e)),
        }
    }

    /// Record VF `pci` as allocated to `netns`.
    pub fn write_pci_record(&self, pci: &str, netns: &Path) -> Result<(), CniError> {
        let dir = self.pci_dir();
        std::fs::create_dir_all(&dir).map_err(|e| CniError::io(dir.display(), &e))?;
        let path = self.pci_record_path(pci);
        write_atomic(&path, netns.as_os_str().as_encoded_bytes()).map_err(|e| CniError::io(path.display(), &e))
    }

    /// Remove VF `pci`'s allocation record.
    pub fn remove_pci_record(&self, pci: &str) -> Result<(), CniError> {
        let path = self.pci_record_path(pci);
        remove_if_there(&path).map_err(|e| CniError::io(path.display(), &e))
    }

    /// Take VF `pci`'s exclusive lock, waiting at most `timeout`; a timeout is "try again later"
    /// (code 11).
    pub fn lock_pci(&self, pci: &str, timeout: Duration) -> Result<PciLock, CniError> {
        let dir = self.pci_dir();
        std::fs::create_dir_all(&dir).map_err(|e| CniError::io(dir.display(), &e))?;
        let path = dir.join(format!("{pci}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| CniError::io(path.display(), &e))?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(PciLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(CniError::io(path.display(), &e)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CniError::new(
                    code::TRY_AGAIN,
                    format!(
                        "VF {pci} is locked by another ADD or DEL (waited {} ms on {})",
                        timeout.as_millis(),
                        path.display()
                    ),
                ));
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_held_lock_times_out_with_code_11() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(&dir.path().join("state"));
        assert_eq!(s.pci_record("0000:3b:00.2").unwrap(), None);
        s.write_pci_record("0000:3b:00.2", Path::new("/run/netns/a")).unwrap();
        assert_eq!(s.pci_record("0000:3b:00.2").unwrap(), Some(PathBuf::from("/run/netns/a")));
        s.remove_pci_record("0000:3b:00.2").unwrap();
        s.remove_pci_record("0000:3b:00.2").unwrap();
        let held = s.lock_pci("0000:3b:00.2", Duration::from_millis(5)).unwrap();
        let e = s.lock_pci("0000:3b:00.2", Duration::from_millis(5)).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN);
        assert!(e.msg.contains("0000:3b:00.2"), "{e}");
        drop(held);
        assert!(s.lock_pci("0000:3b:00.2", Duration::from_millis(5)).is_ok());
        assert_eq!(s.load("c1", "net1").unwrap(), None);
        let (list, bad) = s.list();
        assert!(list.is_empty() && bad.is_empty());
    }
}
