//! PCI bus ids and sysfs device paths, and the PCIe relation between two devices read from where they
//! sit in the PCI tree. Pure string/path logic; no file access.

use std::path::Path;

use crate::model::PcieRelation;

/// Normalise a PCI bus id to the sysfs form `dddd:bb:dd.f` (lower-case hex, 4-digit domain).
///
/// NVML prints an 8-digit upper-case domain (`00000000:B7:00.0`), sysfs a 4-digit lower-case one
/// (`0000:b7:00.0`), and some tools omit the domain (`b7:00.0`). Returns `None` when `id` is not a bus id.
pub fn normalize_pci_bus_id(id: &str) -> Option<String> {
    let id = id.trim();
    let (domain, rest) = match id.matches(':').count() {
        2 => id.split_once(':')?,
        1 => ("0", id),
        _ => return None,
    };
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, max_len: usize| -> Option<u32> {
        if s.is_empty() || s.len() > max_len || !s.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok()
    };
    let domain = hex(domain, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// Whether a path component is a full sysfs PCI address (`0000:07:00.0`).
fn is_sysfs_bdf(s: &str) -> bool {
    s.len() == 12 && normalize_pci_bus_id(s).as_deref() == Some(s)
}

/// Whether a path component names a PCI root (`pci0000:00`).
fn is_pci_root(s: &str) -> bool {
    s.strip_prefix("pci").is_some_and(|r| {
        r.len() == 7 && r.as_bytes()[4] == b':' && r.chars().filter(|c| *c != ':').all(|c| c.is_ascii_hexdigit())
    })
}

/// Where a PCI function sits in the PCI tree, read from its canonical sysfs path
/// (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:07:00.0`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PciPath {
    /// The PCI root (host bridge) the device hangs off, e.g. `pci0000:00`.
    pub root: String,
    /// PCI functions from the root port down to the device itself (the last element).
    pub chain: Vec<String>,
}

impl PciPath {
    /// Read a canonical sysfs device path. Non-PCI components below the last PCI function (a virtio
    /// device, `net/eth0`) are ignored, so the path of a netdev's `device` link works too. `None` when the
    /// path holds no PCI root followed by at least one PCI function.
    pub fn from_sysfs_path(path: &Path) -> Option<PciPath> {
        let comps: Vec<String> = path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let root_pos = comps.iter().rposition(|c| is_pci_root(c))?;
        let chain: Vec<String> = comps[root_pos + 1..].iter().take_while(|c| is_sysfs_bdf(c)).cloned().collect();
        if chain.is_empty() {
            return None;
        }
        Some(PciPath { root: comps[root_pos].clone(), chain })
    }

    /// The device's own bus id (`0000:07:00.0`).
    pub fn bus_id(&self) -> &str {
        self.chain.last().map_or("", String::as_str)
    }

    /// The bridges above the device, root port first.
    fn bridges(&self) -> &[String] {
        &self.chain[..self.chain.len().saturating_sub(1)]
    }

    /// The PCIe relation between two devices, in `nvidia-smi topo -m` terms, from their places in the
    /// tree. `same_numa` says whether both sit on one NUMA node (callers pass `true` on single-node
    /// machines); it only matters when the devices hang off different PCI roots.
    ///
    /// Heuristic (NVML does this for GPU pairs from the same tree, but not for GPU–NIC pairs):
    /// - different roots → `NODE` on one NUMA node, else `SYS`;
    /// - same root, no shared bridge below it → `PHB`;
    /// - otherwise count the PCIe switches on the path (sysfs lists each switch as an upstream and a
    ///   downstream port): at most one → `PIX`, more → `PXB`.
    pub fn relation_to(&self, other: &PciPath, same_numa: bool) -> PcieRelation {
        if self.root != other.root {
            return if same_numa { PcieRelation::Node } else { PcieRelation::Sys };
        }
        let (a, b) = (self.bridges(), other.bridges());
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        if common == 0 {
            return PcieRelation::Phb;
        }
        let (below_a, below_b) = (a.len() - common, b.len() - common);
        // Bridges alternate root port, (upstream, downstream) per switch. An even `common` ends on an
        // upstream port: the devices part inside that switch, and each side's remaining bridges after its
        // downstream port form further switches. An odd `common` ends on a root or downstream port.
        let switches = if common % 2 == 0 {
            1 + below_a.saturating_sub(1).div_ceil(2) + below_b.saturating_sub(1).div_ceil(2)
        } else {
            below_a.div_ceil(2) + below_b.div_ceil(2)
        };
        if switches <= 1 { PcieRelation::Pix } else { PcieRelation::Pxb }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> PciPath {
        PciPath::from_sysfs_path(Path::new(s)).unwrap_or_else(|| panic!("not a PCI path: {s}"))
    }

    #[test]
    fn bus_ids_are_normalised_to_sysfs_form() {
        assert_eq!(normalize_pci_bus_id("00000000:B7:00.0").as_deref(), Some("0000:b7:00.0"));
        assert_eq!(normalize_pci_bus_id("0000:07:00.0").as_deref(), Some("0000:07:00.0"));
        assert_eq!(normalize_pci_bus_id("b7:00.1").as_deref(), Some("0000:b7:00.1"));
        assert_eq!(normalize_pci_bus_id("0001:00:1f.7").as_deref(), Some("0001:00:1f.7"));
        for bad in ["", "GPU0", "0000:07:00", "0000:07:20.0", "0000:07:00.8", "x:07:00.0", "0:0:0:0.0"] {
            assert_eq!(normalize_pci_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn path_skips_non_pci_tail_and_needs_a_root() {
        let p = path("/sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0");
        assert_eq!(p.root, "pci0000:00");
        assert_eq!(p.bus_id(), "0000:00:03.0");
        assert!(PciPath::from_sysfs_path(Path::new("/sys/devices/virtual/net/lo")).is_none());
        assert!(PciPath::from_sysfs_path(Path::new("/sys/devices/pci0000:00")).is_none());
    }

    #[test]
    fn relation_follows_the_tree() {
        let root = "/sys/devices/pci0000:00/0000:00:01.0";
        // One switch (upstream 01:00.0, downstream 02:08.0 / 02:10.0).
        let gpu = path(&format!("{root}/0000:01:00.0/0000:02:08.0/0000:07:00.0"));
        let nic_same_switch = path(&format!("{root}/0000:01:00.0/0000:02:10.0/0000:08:00.0"));
        assert_eq!(gpu.relation_to(&nic_same_switch, true), PcieRelation::Pix);
        // A second switch below the first on the NIC side.
        let nic_two_switches =
            path(&format!("{root}/0000:01:00.0/0000:02:18.0/0000:09:00.0/0000:0a:00.0/0000:0b:00.0"));
        assert_eq!(gpu.relation_to(&nic_two_switches, true), PcieRelation::Pxb);
        assert_eq!(nic_two_switches.relation_to(&gpu, true), PcieRelation::Pxb, "symmetric");
        // Another root port of the same host bridge.
        let other_port = path("/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0");
        assert_eq!(gpu.relation_to(&other_port, true), PcieRelation::Phb);
        // Another host bridge: NODE on one NUMA node, SYS across.
        let other_root = path("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        assert_eq!(gpu.relation_to(&other_root, true), PcieRelation::Node);
        assert_eq!(gpu.relation_to(&other_root, false), PcieRelation::Sys);
        // Two functions of one device.
        let f0 = path(&format!("{root}/0000:01:00.0/0000:02:10.0/0000:08:00.0"));
        let f1 = path(&format!("{root}/0000:01:00.0/0000:02:10.0/0000:08:00.1"));
        assert_eq!(f0.relation_to(&f1, true), PcieRelation::Pix);
    }
}
