//! Reading the CPU/NUMA layout, NICs and PCI device facts from sysfs under a configurable root.
//!
//! Missing files are normal (containers, VMs, kernels without NUMA): they leave the field unknown.
//! Unreadable or malformed files are skipped with a note, so one odd file never stops discovery.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpuset::CpuSet;
use crate::model::{CpuTopology, Nic, NumaNode};

use super::pci::{PciPath, normalize_pci_bus_id};

/// The directory that holds the host's `sys/` and `proc/` trees: `/` on a host, the host mount in a
/// container (`/host`), or a temporary fake tree in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysfsRoot(pub PathBuf);

impl Default for SysfsRoot {
    fn default() -> Self {
        SysfsRoot(PathBuf::from("/"))
    }
}

impl SysfsRoot {
    /// A root at `path`.
    pub fn new(path: impl Into<PathBuf>) -> SysfsRoot {
        SysfsRoot(path.into())
    }

    /// The path of `rel` (`sys/devices/system/cpu/online`; a leading `/` is ignored) under the root.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }
}

/// Facts sysfs gives about one PCI function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciDeviceInfo {
    /// Where it sits in the PCI tree.
    pub path: Option<PciPath>,
    /// `numa_node` (`-1`, meaning none, reads as `None`).
    pub numa_node: Option<u32>,
    /// `local_cpulist`.
    pub local_cpus: Option<CpuSet>,
}

/// A NIC found in sysfs, with its place in the PCI tree.
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoveredNic {
    /// The NIC as the model holds it.
    pub nic: Nic,
    /// Where it sits in the PCI tree, when known.
    pub pci_path: Option<PciPath>,
}

/// Read a small text file, trimmed. `Ok(None)` when it does not exist.
fn read_opt(path: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Read a file, noting (not failing on) errors other than "not found".
pub(crate) fn read_noted(path: &Path, notes: &mut Vec<String>) -> Option<String> {
    match read_opt(path) {
        Ok(v) => v,
        Err(e) => {
            notes.push(format!("ignored {}: {e}", path.display()));
            None
        }
    }
}

fn read_cpuset(path: &Path, notes: &mut Vec<String>) -> Option<CpuSet> {
    let text = read_noted(path, notes)?;
    match text.parse::<CpuSet>() {
        Ok(set) => Some(set),
        Err(e) => {
            notes.push(format!("ignored {}: {e}", path.display()));
            None
        }
    }
}

fn read_numa_node(path: &Path, notes: &mut Vec<String>) -> Option<u32> {
    let text = read_noted(path, notes)?;
    match text.parse::<i64>() {
        Ok(n) if n >= 0 => u32::try_from(n).ok(),
        Ok(_) => None,
        Err(_) => {
            notes.push(format!("ignored {}: '{text}' is not a NUMA node number", path.display()));
            None
        }
    }
}

/// Sorted entries of a directory; empty when it does not exist.
fn list_dir(path: &Path, notes: &mut Vec<String>) -> Vec<String> {
    match std::fs::read_dir(path) {
        Ok(rd) => {
            let mut names: Vec<String> =
                rd.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort_by(|a, b| natural_cmp(a, b));
            names
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            notes.push(format!("ignored {}: {e}", path.display()));
            Vec::new()
        }
    }
}

/// Compare names so that embedded numbers sort numerically (`mlx5_2` < `mlx5_10`, `node2` < `node10`).
pub(crate) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(s: &str) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut text = String::new();
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
            } else {
                if !digits.is_empty() {
                    out.push((std::mem::take(&mut text), digits.parse().unwrap_or(u64::MAX)));
                    digits.clear();
                }
                text.push(c);
            }
        }
        out.push((text, if digits.is_empty() { 0 } else { digits.parse().unwrap_or(u64::MAX) }));
        out
    }
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

/// Resolve a sysfs link (such as `/sys/class/infiniband/mlx5_0/device`) to the PCI device it names.
fn pci_path_of(link: &Path) -> Option<PciPath> {
    let real = std::fs::canonicalize(link).ok()?;
    PciPath::from_sysfs_path(&real)
}

/// Facts about the PCI function `bus_id` from `sys/bus/pci/devices/<bus_id>`.
pub fn read_pci_device(root: &SysfsRoot, bus_id: &str, notes: &mut Vec<String>) -> PciDeviceInfo {
    let Some(bus) = normalize_pci_bus_id(bus_id) else {
        notes.push(format!("'{bus_id}' is not a PCI bus id; its sysfs facts are unknown"));
        return PciDeviceInfo::default();
    };
    let dir = root.join(&format!("sys/bus/pci/devices/{bus}"));
    if !dir.exists() {
        return PciDeviceInfo::default();
    }
    PciDeviceInfo {
        path: pci_path_of(&dir),
        numa_node: read_numa_node(&dir.join("numa_node"), notes),
        local_cpus: read_cpuset(&dir.join("local_cpulist"), notes),
    }
}

/// The CPU/NUMA layout: online CPUs (`cpu/online`), NUMA nodes (`node/node*/cpulist`) and the socket
/// count (distinct `cpu*/topology/physical_package_id`).
pub fn read_cpu_topology(root: &SysfsRoot, notes: &mut Vec<String>) -> CpuTopology {
    let online = read_cpuset(&root.join("sys/devices/system/cpu/online"), notes);
    let node_dir = root.join("sys/devices/system/node");
    let mut numa_nodes = Vec::new();
    for name in list_dir(&node_dir, notes) {
        let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cpus = read_cpuset(&node_dir.join(&name).join("cpulist"), notes).unwrap_or_default();
        numa_nodes.push(NumaNode { id, cpus });
    }
    numa_nodes.sort_by_key(|n| n.id);
    let cpu_dir = root.join("sys/devices/system/cpu");
    let mut packages = BTreeSet::new();
    for name in list_dir(&cpu_dir, notes) {
        let is_cpu = name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let file = cpu_dir.join(&name).join("topology/physical_package_id");
        if let Some(id) = read_noted(&file, notes) {
            match id.parse::<i64>() {
                Ok(id) => {
                    packages.insert(id);
                }
                Err(_) => notes.push(format!("ignored {}: '{id}' is not a package id", file.display())),
            }
        }
    }
    let sockets = (!packages.is_empty()).then_some(packages.len() as u32);
    CpuTopology { numa_nodes, sockets, online }
}

/// NICs: every RDMA device in `class/infiniband` (name, PCI bus id, NUMA node, first netdev), then, when
/// `netdevs` is set, every PCI network interface in `class/net` that no RDMA device already covers.
/// SR-IOV virtual functions (a `physfn` link) and virtual interfaces (no PCI device) are left out.
pub fn read_nics(root: &SysfsRoot, netdevs: bool, notes: &mut Vec<String>) -> Vec<DiscoveredNic> {
    let mut nics = Vec::new();
    let ib = root.join("sys/class/infiniband");
    for name in list_dir(&ib, notes) {
        let device = ib.join(&name).join("device");
        if device.join("physfn").exists() {
            continue;
        }
        let pci_path = pci_path_of(&device);
        let netdev = list_dir(&device.join("net"), notes).into_iter().next();
        let numa_node = read_numa_node(&device.join("numa_node"), notes);
        let nic = Nic {
            name: name.clone(),
            rdma_device: Some(name),
            netdev,
            pci_bus_id: pci_path.as_ref().map(|p| p.bus_id().to_string()),
            numa_node,
        };
        nics.push(DiscoveredNic { nic, pci_path });
    }
    if netdevs {
        let net = root.join("sys/class/net");
        for name in list_dir(&net, notes) {
            let device = net.join(&name).join("device");
            if device.join("physfn").exists() {
                continue;
            }
            let Some(pci_path) = pci_path_of(&device) else { continue };
            let bus = pci_path.bus_id().to_string();
            if let Some(existing) = nics.iter_mut().find(|n| n.nic.pci_bus_id.as_deref() == Some(bus.as_str())) {
                if existing.nic.netdev.is_none() {
                    existing.nic.netdev = Some(name);
                }
                continue;
            }
            let numa_node = read_pci_device(root, &bus, notes).numa_node;
            let nic =
                Nic { name: name.clone(), rdma_device: None, netdev: Some(name), pci_bus_id: Some(bus), numa_node };
            nics.push(DiscoveredNic { nic, pci_path: Some(pci_path) });
        }
    }
    nics
}

/// The kernel's boot id (`proc/sys/kernel/random/boot_id`), which changes on every boot.
pub fn read_boot_id(root: &SysfsRoot, notes: &mut Vec<String>) -> Option<String> {
    read_noted(&root.join("proc/sys/kernel/random/boot_id"), notes).filter(|s| !s.is_empty())
}

/// The host name (`proc/sys/kernel/hostname`).
pub fn read_hostname(root: &SysfsRoot, notes: &mut Vec<String>) -> Option<String> {
    read_noted(&root.join("proc/sys/kernel/hostname"), notes).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_sorts_numbers_by_value() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "eth0", "node10", "node2"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["eth0", "mlx5_1", "mlx5_2", "mlx5_10", "node2", "node10"]);
    }
}
