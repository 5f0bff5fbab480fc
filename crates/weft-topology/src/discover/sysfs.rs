//! Reading the CPU/NUMA layout, NICs and PCI device facts from sysfs under a configurable root.
//!
//! Missing files are normal (containers, VMs, kernels without NUMA): they leave the field unknown.
//! Unreadable or malformed files are skipped with a note, so one odd file never stops discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use crate::cpu_layout::{CpuInfo, CpuLayout};
use crate::cpuset::CpuSet;
use crate::error::TopologyError;
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

pub(crate) fn read_numa_node(path: &Path, notes: &mut Vec<String>) -> Option<u32> {
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
pub(crate) fn list_dir(path: &Path, notes: &mut Vec<String>) -> Vec<String> {
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

/// Read a required file, trimmed: a missing or unreadable file is an error naming it.
fn read_required(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| TopologyError::Io { path: path.display().to_string(), source })
}

/// Read an optional topology id (`physical_package_id`, `core_id`): `Ok(None)` when missing; a negative
/// id (`-1` on some platforms without the information) reads as `None`; anything else that is not a
/// number is an error naming the file.
fn read_topology_id(path: &Path) -> Result<Option<u32>, TopologyError> {
    let text = match read_opt(path) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(source) => return Err(TopologyError::Io { path: path.display().to_string(), source }),
    };
    match text.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| TopologyError::Invalid(format!("{}: id {n} is out of range", path.display()))),
        Err(_) => Err(TopologyError::Invalid(format!("{}: '{text}' is not a number", path.display()))),
    }
}

/// `MemTotal` of a NUMA node's `meminfo` (`Node 0 MemTotal:  13986004 kB`), in bytes.
fn parse_node_memtotal(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (_, rest) = line.split_once("MemTotal:")?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | Some("KB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// The logical-CPU layout for the CPU manager: every CPU in `cpu/online` with its socket
/// (`cpuN/topology/physical_package_id`), core (`cpuN/topology/core_id`) and NUMA node (the
/// `node/nodeN/cpulist` that lists it), plus each NUMA node's `MemTotal` from `node/nodeN/meminfo`.
///
/// Tolerated, as on VMs and kernels without the information: missing topology files (socket 0; the
/// CPU is its own core), a negative id, no `node/` directory (every CPU on NUMA node 0), a missing or
/// unreadable `meminfo` (memory unknown). Errors, naming the file: no or a malformed `cpu/online`, a
/// malformed id or `cpulist`, an online CPU that no NUMA node lists, a CPU two nodes list.
pub fn read_cpu_layout(root: &SysfsRoot) -> Result<CpuLayout, TopologyError> {
    let online_path = root.join("sys/devices/system/cpu/online");
    let online: CpuSet = read_required(&online_path)?.parse()?;
    if online.is_empty() {
        return Err(TopologyError::Invalid(format!("{}: no CPU is online", online_path.display())));
    }

    let node_dir = root.join("sys/devices/system/node");
    let mut notes = Vec::new();
    let mut numa_of: BTreeMap<u32, u32> = BTreeMap::new();
    let mut memory: BTreeMap<u32, u64> = BTreeMap::new();
    let mut any_node = false;
    for name in list_dir(&node_dir, &mut notes) {
        let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
        any_node = true;
        let cpulist_path = node_dir.join(&name).join("cpulist");
        let cpus: CpuSet = match read_opt(&cpulist_path) {
            Ok(Some(text)) => text.parse()?,
            Ok(None) => CpuSet::new(),
            Err(source) => return Err(TopologyError::Io { path: cpulist_path.display().to_string(), source }),
        };
        for cpu in cpus.iter() {
            if let Some(other) = numa_of.insert(cpu, id) {
                return Err(TopologyError::Invalid(format!(
                    "CPU {cpu} is listed by both NUMA node {other} and NUMA node {id} in {}",
                    node_dir.display()
                )));
            }
        }
        if let Some(bytes) =
            read_noted(&node_dir.join(&name).join("meminfo"), &mut notes).and_then(|m| parse_node_memtotal(&m))
        {
            memory.insert(id, bytes);
        }
    }

    let cpu_dir = root.join("sys/devices/system/cpu");
    let mut cpus = Vec::with_capacity(online.len());
    for id in online.iter() {
        let topo = cpu_dir.join(format!("cpu{id}/topology"));
        let socket = read_topology_id(&topo.join("physical_package_id"))?.unwrap_or(0);
        let core = read_topology_id(&topo.join("core_id"))?.unwrap_or(id);
        let numa = match numa_of.get(&id) {
            Some(n) => *n,
            None if !any_node => 0,
            None => {
                return Err(TopologyError::Invalid(format!(
                    "CPU {id} is online but no NUMA node under {} lists it",
                    node_dir.display()
                )));
            }
        };
        cpus.push(CpuInfo { id, core, socket, numa });
    }
    for note in notes {
        tracing::debug!(note, "reading the CPU layout");
    }
    let mut layout = CpuLayout::new(cpus)?;
    for (node, bytes) in memory {
        layout.set_numa_memory(node, bytes);
    }
    Ok(layout)
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
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }

    /// Two sockets × 1 NUMA node × 2 cores × 2 threads, Linux numbering (siblings 0/4, 1/5, ...).
    fn fake_cpus(r: &Path) {
        write(r, "sys/devices/system/cpu/online", "0-7\n");
        for cpu in 0..8u32 {
            let core = cpu % 4;
            write(
                r,
                &format!("sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                &format!("{}\n", core / 2),
            );
            // core_id is unique per socket only: both sockets have cores 0 and 1
            write(r, &format!("sys/devices/system/cpu/cpu{cpu}/topology/core_id"), &format!("{}\n", core % 2));
        }
        write(r, "sys/devices/system/node/node0/cpulist", "0-1,4-5\n");
        write(r, "sys/devices/system/node/node1/cpulist", "2-3,6-7\n");
        write(
            r,
            "sys/devices/system/node/node0/meminfo",
            "Node 0 MemTotal:       13986004 kB\nNode 0 MemFree:        13597620 kB\n",
        );
        write(r, "sys/devices/system/node/online", "0-1\n");
    }

    #[test]
    fn cpu_layout_from_a_fake_tree() {
        let tmp = tempfile::tempdir().unwrap();
        fake_cpus(tmp.path());
        let l = read_cpu_layout(&SysfsRoot::new(tmp.path())).unwrap();
        assert_eq!(l.len(), 8);
        assert_eq!(l.siblings(0).to_string(), "0,4");
        assert_eq!(l.siblings(3).to_string(), "3,7");
        assert_eq!(l.socket_cpus(1).to_string(), "2-3,6-7");
        assert_eq!(l.numa_cpus(0).to_string(), "0-1,4-5");
        assert_eq!(l.cores().len(), 4, "core ids repeat across sockets but name distinct cores");
        assert_eq!(l.numa_memory(0), Some(13_986_004 * 1024));
        assert_eq!(l.numa_memory(1), None, "node1 has no meminfo");
    }

    #[test]
    fn cpu_layout_tolerates_missing_topology_and_nodes() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "sys/devices/system/cpu/online", "0-2\n");
        write(tmp.path(), "sys/devices/system/cpu/cpu1/topology/physical_package_id", "-1\n");
        let l = read_cpu_layout(&SysfsRoot::new(tmp.path())).unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l.numa_nodes(), [0]);
        assert_eq!(l.sockets(), [0]);
        assert_eq!(l.siblings(1).to_string(), "1", "without core_id every CPU is its own core");
    }

    #[test]
    fn cpu_layout_errors_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SysfsRoot::new(tmp.path());
        let err = read_cpu_layout(&root).unwrap_err().to_string();
        assert!(err.contains("cpu/online"), "{err}");

        fake_cpus(tmp.path());
        write(tmp.path(), "sys/devices/system/cpu/cpu5/topology/core_id", "five\n");
        let err = read_cpu_layout(&root).unwrap_err().to_string();
        assert!(err.contains("cpu5/topology/core_id") && err.contains("'five'"), "{err}");

        fake_cpus(tmp.path());
        write(tmp.path(), "sys/devices/system/node/node1/cpulist", "2,6-7\n");
        let err = read_cpu_layout(&root).unwrap_err().to_string();
        assert!(err.contains("CPU 3") && err.contains("no NUMA node"), "{err}");

        fake_cpus(tmp.path());
        write(tmp.path(), "sys/devices/system/node/node1/cpulist", "1-3,6-7\n");
        let err = read_cpu_layout(&root).unwrap_err().to_string();
        assert!(err.contains("CPU 1") && err.contains("node 0") && err.contains("node 1"), "{err}");

        fake_cpus(tmp.path());
        write(tmp.path(), "sys/devices/system/cpu/online", "0-x\n");
        assert!(read_cpu_layout(&root).is_err());
    }

    #[test]
    fn node_meminfo_parsing() {
        assert_eq!(parse_node_memtotal("Node 0 MemTotal:  4 kB\n"), Some(4096));
        assert_eq!(parse_node_memtotal("Node 0 MemFree:  4 kB\n"), None);
        assert_eq!(parse_node_memtotal("Node 0 MemTotal:  x kB\n"), None);
        assert_eq!(parse_node_memtotal("Node 0 MemTotal:  4 MB\n"), None);
    }

    /// This machine's real sysfs gives a sane layout (whatever its size): every online CPU once, each
    /// on a NUMA node and socket the layout lists, siblings sharing socket and node.
    #[test]
    fn cpu_layout_of_this_machine_is_sane() {
        let root = SysfsRoot::default();
        if !root.join("sys/devices/system/cpu/online").exists() {
            return; // not Linux
        }
        let l = read_cpu_layout(&root).unwrap();
        let online: CpuSet =
            std::fs::read_to_string(root.join("sys/devices/system/cpu/online")).unwrap().parse().unwrap();
        assert_eq!(l.online(), online);
        assert!(!l.numa_nodes().is_empty());
        let mut covered = 0;
        for node in l.numa_nodes() {
            covered += l.numa_cpus(node).len();
        }
        assert_eq!(covered, l.len());
        for c in l.cpus() {
            assert!(l.siblings(c.id).contains(c.id));
            for s in l.siblings(c.id).iter() {
                let sc = l.cpu(s).unwrap();
                assert_eq!((sc.socket, sc.numa), (c.socket, c.numa), "siblings {} and {s}", c.id);
            }
        }
        eprintln!("this machine: {} CPUs, NUMA {:?}, memory {:?}", l.len(), l.numa_nodes(), l.numa_memories());
    }

    #[test]
    fn natural_order_sorts_numbers_by_value() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_1", "eth0", "node10", "node2"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["eth0", "mlx5_1", "mlx5_2", "mlx5_10", "node2", "node10"]);
    }
}
