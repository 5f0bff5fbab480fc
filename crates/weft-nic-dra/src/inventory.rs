//! The VFs the driver offers, as ResourceSlice devices: one device per VF of the node's physnets,
//! named from its PCI address ([`device_name`]), with the attributes a claim's selectors and
//! constraints read ([`attributes`]). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use weft_net::nic_claim::device_name;
use weft_topology::discover::{PhysicalFunction, VirtualFunction};

/// `nic.weft.io/pciAddress`: the VF's PCI address (`0000:3b:02.1`).
pub const ATTR_PCI_ADDRESS: &str = "nic.weft.io/pciAddress";
/// `resource.kubernetes.io/pcieRoot`: the PCI root the VF hangs off (`pci0000:3a`), the standard
/// attribute a claim's `matchAttribute` constraint aligns a NIC and a GPU on.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// `nic.weft.io/numaNode` (int).
pub const ATTR_NUMA_NODE: &str = "nic.weft.io/numaNode";
/// `nic.weft.io/physnet`: the physnet the VF serves.
pub const ATTR_PHYSNET: &str = "nic.weft.io/physnet";
/// `nic.weft.io/pf`: the PF's netdev (its PCI address when the netdev is not known).
pub const ATTR_PF: &str = "nic.weft.io/pf";
/// `nic.weft.io/rdma` (bool): the VF has an RDMA device.
pub const ATTR_RDMA: &str = "nic.weft.io/rdma";
/// `nic.weft.io/linkSpeed` (int, Mb/s): the VF's link speed, else its PF's; absent when unknown.
pub const ATTR_LINK_SPEED: &str = "nic.weft.io/linkSpeed";
/// `nic.weft.io/vfIndex` (int): the VF's index on its PF.
pub const ATTR_VF_INDEX: &str = "nic.weft.io/vfIndex";
/// The longest string attribute value the API server accepts.
pub const MAX_ATTRIBUTE_LEN: usize = 64;

/// One VF the driver offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicDevice {
    /// The device's name in the ResourceSlice ([`device_name`] of the PCI address).
    pub name: String,
    /// The VF's PCI address.
    pub pci_address: String,
    /// Its PF's PCI address.
    pub pf_pci_address: String,
    /// Its PF's netdev (what the VLAN is set through), when in this network namespace.
    pub pf_netdev: Option<String>,
    /// Its index on the PF.
    pub vf_index: u32,
    /// The physnet it serves.
    pub physnet: String,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// The PCI root it hangs off (`pci0000:3a`).
    pub pcie_root: Option<String>,
    /// Whether it has an RDMA device.
    pub rdma: bool,
    /// Link speed in Mb/s (the VF's, else the PF's), when known.
    pub link_speed_mbps: Option<u32>,
}

impl NicDevice {
    /// The VF `vf` of `pf`, serving `physnet`.
    pub fn of(physnet: &str, pf: &PhysicalFunction, vf: &VirtualFunction) -> NicDevice {
        let f = &vf.function;
        NicDevice {
            name: device_name(&vf.pci_address),
            pci_address: vf.pci_address.clone(),
            pf_pci_address: pf.pci_address.clone(),
            pf_netdev: pf.function.netdev.clone(),
            vf_index: vf.index,
            physnet: physnet.to_string(),
            numa_node: f.numa_node.or(pf.function.numa_node),
            pcie_root: f.pci_path.as_ref().or(pf.function.pci_path.as_ref()).map(|p| p.root.clone()),
            rdma: f.rdma_device.is_some(),
            link_speed_mbps: f.link.speed_mbps.or(pf.function.link.speed_mbps),
        }
    }

    /// The PF as the VLAN call names it: its netdev.
    pub fn pf_name(&self) -> &str {
        self.pf_netdev.as_deref().unwrap_or(&self.pf_pci_address)
    }

    /// The ResourceSlice device.
    pub fn api_device(&self) -> Device {
        Device { name: self.name.clone(), attributes: Some(attributes(self)), ..Device::default() }
    }
}

fn string(v: &str) -> Option<DeviceAttribute> {
    (v.len() <= MAX_ATTRIBUTE_LEN)
        .then(|| DeviceAttribute { string: Some(v.to_string()), ..DeviceAttribute::default() })
}

fn int(v: impl Into<i64>) -> DeviceAttribute {
    DeviceAttribute { int: Some(v.into()), ..DeviceAttribute::default() }
}

/// The device's attributes (a string longer than [`MAX_ATTRIBUTE_LEN`] is left out rather than
/// make the API server refuse the whole slice).
pub fn attributes(d: &NicDevice) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: Option<DeviceAttribute>| {
        if let Some(v) = v {
            a.insert(k.to_string(), v);
        }
    };
    put(ATTR_PCI_ADDRESS, string(&d.pci_address));
    put(ATTR_PCIE_ROOT, d.pcie_root.as_deref().and_then(string));
    put(ATTR_NUMA_NODE, d.numa_node.map(int));
    put(ATTR_PHYSNET, string(&d.physnet));
    put(ATTR_PF, string(d.pf_name()));
    put(ATTR_RDMA, Some(DeviceAttribute { bool: Some(d.rdma), ..DeviceAttribute::default() }));
    put(ATTR_LINK_SPEED, d.link_speed_mbps.map(int));
    put(ATTR_VF_INDEX, Some(int(d.vf_index)));
    a
}

/// The VFs the driver offers, by device name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicInventory {
    by_name: BTreeMap<String, NicDevice>,
}

impl NicInventory {
    /// The inventory of `devices`. A VF given twice (two physnets naming one VF) is kept once, in
    /// the first physnet, and noted.
    pub fn new(devices: impl IntoIterator<Item = NicDevice>, notes: &mut Vec<String>) -> NicInventory {
        let mut by_name = BTreeMap::new();
        for d in devices {
            if let Some(first) = by_name.get(&d.name) {
                let first: &NicDevice = first;
                notes.push(format!(
                    "VF {} is in physnets {} and {}: offered once, as {}",
                    d.pci_address, first.physnet, d.physnet, first.physnet
                ));
                continue;
            }
            by_name.insert(d.name.clone(), d);
        }
        NicInventory { by_name }
    }

    /// The VFs of each physnet (as [`weft_net::config::PhysnetConfig::assign`] gives them).
    pub fn from_physnets(
        assigned: &BTreeMap<String, Vec<(&PhysicalFunction, &VirtualFunction)>>,
        notes: &mut Vec<String>,
    ) -> NicInventory {
        let devices =
            assigned.iter().flat_map(|(physnet, vfs)| vfs.iter().map(|(pf, vf)| NicDevice::of(physnet, pf, vf)));
        Self::new(devices, notes)
    }

    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&NicDevice> {
        self.by_name.get(name)
    }

    /// The device of the VF at `pci_address`.
    pub fn by_pci(&self, pci_address: &str) -> Option<&NicDevice> {
        self.by_name.get(&device_name(pci_address))
    }

    /// Every device, by name.
    pub fn devices(&self) -> impl Iterator<Item = &NicDevice> {
        self.by_name.values()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The ResourceSlice devices, by name.
    pub fn api_devices(&self) -> Vec<Device> {
        self.by_name.values().map(NicDevice::api_device).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use weft_topology::discover::{FakeSriovTree, read_sriov};

    #[test]
    fn device_names_are_dns_labels_from_the_pci_address() {
        assert_eq!(device_name("0000:3b:02.1"), "vf-0000-3b-02-1");
        assert_eq!(device_name("0000:AF:00.7"), "vf-0000-af-00-7");
    }

    #[test]
    fn attributes_come_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:3b:00.0", &["0000:3a:00.0", "0000:3a:01.0"], "ens1f0", 1).link("ens1f0", "up", 100_000);
        tree.vf("0000:3b:00.0", 1, "0000:3b:00.3", None).rdma("mlx5_3");
        tree.vf("0000:3b:00.0", 0, "0000:3b:00.2", None);
        let inv = read_sriov(&tree.root(), &mut Vec::new());
        let assigned: BTreeMap<String, Vec<_>> = [("fabric".to_string(), inv.vfs().collect())].into();
        let mut notes = Vec::new();
        let nics = NicInventory::from_physnets(&assigned, &mut notes);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(nics.len(), 2);
        let d = nics.device("vf-0000-3b-00-3").unwrap();
        let a = attributes(d);
        let s = |k: &str| a[k].string.clone().unwrap();
        assert_eq!(s(ATTR_PCI_ADDRESS), "0000:3b:00.3");
        assert_eq!(s(ATTR_PF), "ens1f0");
        assert_eq!(s(ATTR_PHYSNET), "fabric");
        assert_eq!(s(ATTR_PCIE_ROOT), d.pcie_root.clone().unwrap());
        assert!(s(ATTR_PCIE_ROOT).starts_with("pci0000:"), "{}", s(ATTR_PCIE_ROOT));
        assert_eq!(a[ATTR_NUMA_NODE].int, Some(1));
        assert_eq!(a[ATTR_RDMA].bool, Some(true));
        assert_eq!(a[ATTR_LINK_SPEED].int, Some(100_000), "the PF's speed stands in for the VF's");
        assert_eq!(a[ATTR_VF_INDEX].int, Some(1));
        assert_eq!(attributes(nics.device("vf-0000-3b-00-2").unwrap())[ATTR_RDMA].bool, Some(false));
        assert_eq!(nics.by_pci("0000:3b:00.2").unwrap().vf_index, 0);
        // A VF in two physnets is offered once.
        let twice: BTreeMap<String, Vec<_>> =
            [("a".to_string(), inv.vfs().collect()), ("b".to_string(), inv.vfs().take(1).collect())].into();
        let nics = NicInventory::from_physnets(&twice, &mut notes);
        assert_eq!(nics.len(), 2);
        assert!(notes[0].contains("physnets a and b"), "{notes:?}");
    }

    #[test]
    fn long_strings_are_left_out_not_sent() {
        let d = NicDevice {
            name: "vf-x".into(),
            pci_address: "0000:00:00.1".into(),
            pf_pci_address: "0000:00:00.0".into(),
            pf_netdev: None,
            vf_index: 0,
            physnet: "p".repeat(65),
            numa_node: None,
            pcie_root: None,
            rdma: false,
            link_speed_mbps: None,
        };
        let a = attributes(&d);
        assert!(!a.contains_key(ATTR_PHYSNET) && !a.contains_key(ATTR_LINK_SPEED) && !a.contains_key(ATTR_NUMA_NODE));
        assert_eq!(a[ATTR_PF].string.as_deref(), Some("0000:00:00.0"));
    }
}
