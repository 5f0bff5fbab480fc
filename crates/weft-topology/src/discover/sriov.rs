//! The node's SR-IOV functions, read from sysfs under a [`SysfsRoot`]: each physical function (PF)
//! with SR-IOV enabled, its virtual functions (VFs), where each sits in the PCI tree, its NUMA node,
//! driver, RDMA device, netdev and link.
//!
//! sysfs facts used (kernel `Documentation/ABI/testing/sysfs-bus-pci`, and what
//! sriov-network-device-plugin and sriov-cni read):
//! - `sys/bus/pci/devices/<pf>/sriov_totalvfs`, `sriov_numvfs`, and one `virtfn<N>` link per VF
//!   (`N` is the VF index the PF's netlink VF calls take);
//! - `sys/bus/pci/devices/<vf>/physfn`, the link back to the PF;
//! - `<dev>/net/<ifname>/` (the netdev while it is in the reader's network namespace: a VF moved
//!   into a pod disappears from here), with `operstate`, `speed` (Mb/s, `-1` when unknown),
//!   `address` and `mtu`; `<dev>/infiniband/<rdma>` for RDMA-capable functions, with their verbs
//!   device `<dev>/infiniband_verbs/uverbs<N>` (`/dev/infiniband/uverbs<N>`); `<dev>/driver`,
//!   a link whose last component names the driver; `<dev>/numa_node`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::pci::{PciPath, normalize_pci_bus_id};
use super::sysfs::{SysfsRoot, list_dir, read_noted, read_numa_node};
use crate::error::TopologyError;

/// A network link as sysfs shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkInfo {
    /// `operstate`: `up`, `down`, `lowerlayerdown`, `unknown`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operstate: Option<String>,
    /// `speed` in Mb/s, when the driver knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<u32>,
    /// `address`, the MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `mtu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl LinkInfo {
    /// Whether the link is known to be down (`down` or `lowerlayerdown`); an unknown state is not.
    pub fn is_down(&self) -> bool {
        matches!(self.operstate.as_deref(), Some("down" | "lowerlayerdown"))
    }
}

/// What sysfs says of any network PCI function, PF or VF.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciFunction {
    /// The netdev, while it is in this network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// The bound driver (`mlx5_core`, `iavf`, `vfio-pci`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The RDMA device (`mlx5_4`), when the function has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// The RDMA device's verbs character device (`uverbs4`, `/dev/infiniband/uverbs4` on the
    /// host), when the function has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uverbs: Option<String>,
    /// NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Where it sits in the PCI tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_path: Option<PciPath>,
    /// Its netdev's link, when the netdev is here (a PF's link state is its VFs' health: a VF
    /// of a PF whose link is down carries nothing).
    #[serde(default)]
    pub link: LinkInfo,
}

/// One virtual function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualFunction {
    /// The VF index on its PF (`virtfn<N>`).
    pub index: u32,
    /// PCI address (`0000:3b:02.1`).
    pub pci_address: String,
    /// The PF's PCI address.
    pub pf_pci_address: String,
    /// Netdev, driver, RDMA device, NUMA node, PCI path, link.
    #[serde(flatten)]
    pub function: PciFunction,
}

/// One physical function with SR-IOV enabled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalFunction {
    /// PCI address.
    pub pci_address: String,
    /// Netdev (`ens1f0`), driver, RDMA device, NUMA node, PCI path, link.
    #[serde(flatten)]
    pub function: PciFunction,
    /// `sriov_totalvfs`.
    pub total_vfs: u32,
    /// Its VFs, by index.
    pub vfs: Vec<VirtualFunction>,
}

/// Every SR-IOV PF of the node with its VFs, PFs in PCI-address order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SriovInventory {
    /// The PFs.
    pub pfs: Vec<PhysicalFunction>,
}

impl SriovInventory {
    /// Every VF with its PF.
    pub fn vfs(&self) -> impl Iterator<Item = (&PhysicalFunction, &VirtualFunction)> {
        self.pfs.iter().flat_map(|pf| pf.vfs.iter().map(move |vf| (pf, vf)))
    }

    /// The VF at `pci_address`, with its PF.
    pub fn vf(&self, pci_address: &str) -> Option<(&PhysicalFunction, &VirtualFunction)> {
        self.vfs().find(|(_, vf)| vf.pci_address == pci_address)
    }

    /// The PF named by `name`: its netdev name or its PCI address.
    pub fn pf(&self, name: &str) -> Option<&PhysicalFunction> {
        let bus = normalize_pci_bus_id(name);
        self.pfs
            .iter()
            .find(|pf| pf.function.netdev.as_deref() == Some(name) || bus.as_deref() == Some(&pf.pci_address))
    }
}

fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path).ok()?.file_name().map(|n| n.to_string_lossy().into_owned())
}

fn read_u32(path: &Path, notes: &mut Vec<String>) -> Option<u32> {
    let text = read_noted(path, notes)?;
    match text.parse::<i64>() {
        Ok(n) => u32::try_from(n).ok(),
        Err(_) => {
            notes.push(format!("ignored {}: '{text}' is not a number", path.display()));
            None
        }
    }
}

fn read_link_info(dev: &Path, netdev: Option<&str>, notes: &mut Vec<String>) -> LinkInfo {
    let Some(name) = netdev else { return LinkInfo::default() };
    let dir = dev.join("net").join(name);
    LinkInfo {
        operstate: read_noted(&dir.join("operstate"), notes),
        speed_mbps: read_u32(&dir.join("speed"), notes),
        mac: read_noted(&dir.join("address"), notes),
        mtu: read_u32(&dir.join("mtu"), notes),
    }
}

fn read_function(dev: &Path, notes: &mut Vec<String>) -> PciFunction {
    let netdev = list_dir(&dev.join("net"), notes).into_iter().next();
    let link = read_link_info(dev, netdev.as_deref(), notes);
    PciFunction {
        driver: link_name(&dev.join("driver")),
        rdma_device: list_dir(&dev.join("infiniband"), notes).into_iter().next(),
        uverbs: list_dir(&dev.join("infiniband_verbs"), notes).into_iter().next(),
        numa_node: read_numa_node(&dev.join("numa_node"), notes),
        pci_path: std::fs::canonicalize(dev).ok().and_then(|p| PciPath::from_sysfs_path(&p)),
        netdev,
        link,
    }
}

/// The `virtfn<N>` links of the PF whose device directory is `dev`: (index, VF PCI address), by
/// index. Reads links only, no VF's files.
fn virtfn_links(dev: &Path, notes: &mut Vec<String>) -> Vec<(u32, String)> {
    let mut links = Vec::new();
    for entry in list_dir(dev, notes) {
        let Some(index) = entry.strip_prefix("virtfn").and_then(|n| n.parse::<u32>().ok()) else { continue };
        match link_name(&dev.join(&entry)).and_then(|b| normalize_pci_bus_id(&b)) {
            Some(bus) => links.push((index, bus)),
            None => notes.push(format!("ignored {}: not a link to a PCI function", dev.join(&entry).display())),
        }
    }
    links.sort_by_key(|(index, _)| *index);
    links
}

/// VF `index` at `bus` of the PF at `pf_bus`, whose device directory is `pf_dev`.
fn read_vf_at(pf_dev: &Path, pf_bus: &str, index: u32, bus: String, notes: &mut Vec<String>) -> VirtualFunction {
    let function = read_function(&pf_dev.join(format!("virtfn{index}")), notes);
    VirtualFunction { index, pci_address: bus, pf_pci_address: pf_bus.to_string(), function }
}

/// Read every PF that has VFs enabled (`sriov_totalvfs` and at least one `virtfn` link), with
/// its VFs.
/// Unreadable or odd files are skipped with a note, as everywhere in discovery.
pub fn read_sriov(root: &SysfsRoot, notes: &mut Vec<String>) -> SriovInventory {
    let devices = root.join("sys/bus/pci/devices");
    let mut pfs = Vec::new();
    for name in list_dir(&devices, notes) {
        let Some(bus) = normalize_pci_bus_id(&name) else { continue };
        let dev = devices.join(&name);
        let Some(total_vfs) = read_u32(&dev.join("sriov_totalvfs"), notes) else { continue };
        let links = virtfn_links(&dev, notes);
        if links.is_empty() {
            continue;
        }
        let vfs = links.into_iter().map(|(index, vf_bus)| read_vf_at(&dev, &bus, index, vf_bus, notes)).collect();
        let function = read_function(&dev, notes);
        pfs.push(PhysicalFunction { pci_address: bus, function, total_vfs, vfs });
    }
    pfs.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    SriovInventory { pfs }
}

/// One VF by PCI address, with its PF's PCI address and netdev: what a CNI plugin needs to move it
/// and to configure it through the PF. An error names the address and what is missing.
pub fn read_vf(root: &SysfsRoot, pci_address: &str) -> Result<(VirtualFunction, Option<String>), TopologyError> {
    let bus = normalize_pci_bus_id(pci_address)
        .ok_or_else(|| TopologyError::Invalid(format!("'{pci_address}' is not a PCI address")))?;
    let dev = root.join(&format!("sys/bus/pci/devices/{bus}"));
    if !dev.exists() {
        return Err(TopologyError::Invalid(format!("no PCI device {bus} in {}", dev.display())));
    }
    let pf_bus = link_name(&dev.join("physfn"))
        .and_then(|b| normalize_pci_bus_id(&b))
        .ok_or_else(|| TopologyError::Invalid(format!("PCI device {bus} is not an SR-IOV VF (no physfn link)")))?;
    let pf_dev = root.join(&format!("sys/bus/pci/devices/{pf_bus}"));
    let mut notes = Vec::new();
    let (index, _) = virtfn_links(&pf_dev, &mut notes)
        .into_iter()
        .find(|(_, vf_bus)| *vf_bus == bus)
        .ok_or_else(|| TopologyError::Invalid(format!("PF {pf_bus} lists no virtfn link to {bus}")))?;
    let vf = read_vf_at(&pf_dev, &pf_bus, index, bus, &mut notes);
    let pf_netdev = list_dir(&pf_dev.join("net"), &mut notes).into_iter().next();
    Ok((vf, pf_netdev))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use crate::discover::FakeSriovTree;

    #[test]
    fn reads_pfs_and_vfs_with_their_place_numa_rdma_and_link() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:3b:00.0", &["0000:00:02.0", "0000:3a:00.0", "0000:3a:01.0"], "ens1f0", 1)
            .link("ens1f0", "up", 100_000)
            .rdma("mlx5_0");
        tree.vf("0000:3b:00.0", 1, "0000:3b:00.3", Some("ens1f0v1"))
            .rdma("mlx5_3")
            .uverbs("uverbs3")
            .driver("mlx5_core");
        tree.vf("0000:3b:00.0", 0, "0000:3b:00.2", Some("ens1f0v0")).link("ens1f0v0", "down", 100_000);
        // A PF without VFs enabled, and a plain device, are not SR-IOV inventory.
        tree.pf("0000:5e:00.0", &["0000:00:03.0"], "ens2f0", 0);
        let mut notes = Vec::new();
        let inv = read_sriov(&tree.root(), &mut notes);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(inv.pfs.len(), 1);
        let pf = &inv.pfs[0];
        assert_eq!(pf.function.netdev.as_deref(), Some("ens1f0"));
        assert_eq!(pf.function.rdma_device.as_deref(), Some("mlx5_0"));
        assert_eq!(pf.function.numa_node, Some(1));
        assert_eq!(pf.total_vfs, 8);
        assert_eq!(pf.function.link.speed_mbps, Some(100_000));
        assert!(!pf.function.link.is_down());
        assert_eq!(
            pf.function.pci_path.as_ref().unwrap().chain,
            ["0000:00:02.0", "0000:3a:00.0", "0000:3a:01.0", "0000:3b:00.0"]
        );
        let idx: Vec<u32> = pf.vfs.iter().map(|v| v.index).collect();
        assert_eq!(idx, [0, 1]);
        assert_eq!(pf.vfs[0].pci_address, "0000:3b:00.2");
        assert!(pf.vfs[0].function.link.is_down());
        assert_eq!(pf.vfs[1].function.rdma_device.as_deref(), Some("mlx5_3"));
        assert_eq!(pf.vfs[1].function.uverbs.as_deref(), Some("uverbs3"));
        assert_eq!(pf.vfs[0].function.uverbs, None);
        assert_eq!(pf.vfs[1].function.driver.as_deref(), Some("mlx5_core"));
        assert_eq!(pf.vfs[1].function.numa_node, Some(1));
        assert_eq!(pf.vfs[1].function.pci_path.as_ref().unwrap().root, "pci0000:00");
        assert_eq!(inv.vf("0000:3b:00.3").unwrap().0.pci_address, "0000:3b:00.0");
        assert_eq!(inv.pf("ens1f0").unwrap().pci_address, "0000:3b:00.0");
        assert_eq!(inv.pf("3b:00.0").unwrap().function.netdev.as_deref(), Some("ens1f0"));
    }

    #[test]
    fn one_vf_by_address_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:3b:00.0", &["0000:00:02.0"], "ens1f0", 0);
        tree.vf("0000:3b:00.0", 5, "0000:3b:00.7", Some("ens1f0v5"));
        let (vf, pf_netdev) = read_vf(&tree.root(), "3b:00.7").unwrap();
        assert_eq!(
            (vf.index, vf.function.netdev.as_deref(), pf_netdev.as_deref()),
            (5, Some("ens1f0v5"), Some("ens1f0"))
        );
        let err = read_vf(&tree.root(), "0000:3b:00.0").unwrap_err().to_string();
        assert!(err.contains("0000:3b:00.0 is not an SR-IOV VF"), "{err}");
        let err = read_vf(&tree.root(), "0000:99:00.0").unwrap_err().to_string();
        assert!(err.contains("no PCI device 0000:99:00.0"), "{err}");
        let err = read_vf(&tree.root(), "eth0").unwrap_err().to_string();
        assert!(err.contains("'eth0' is not a PCI address"), "{err}");
    }
}
