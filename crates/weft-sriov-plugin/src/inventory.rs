//! The VFs one physnet has on this node, as the kubelet counts them: one device per VF, its device
//! ID the VF's PCI address (as sriov-network-device-plugin's), with its NUMA node; and the node's
//! GPUs as places in the PCI tree, which the VFs are chosen near.

use std::collections::{BTreeMap, BTreeSet};

use weft_deviceplugin::api;
use weft_net::choice::{DevicePlace, VfPlace};
use weft_net::config::PhysnetConfig;
use weft_topology::NodeTopology;
use weft_topology::discover::{LinkInfo, PciPath, PhysicalFunction, SriovInventory, SysfsRoot, VirtualFunction};

use crate::error::SriovError;

/// One VF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfDevice {
    /// PCI address: the device ID.
    pub pci_address: String,
    /// Its PF's PCI address.
    pub pf_pci_address: String,
    /// Its PF's netdev, when in this network namespace (for messages).
    pub pf_netdev: Option<String>,
    /// Its index on the PF.
    pub index: u32,
    /// Where it sits in the PCI tree.
    pub pci_path: Option<PciPath>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// RDMA device (`mlx5_3`), when it has one.
    pub rdma_device: Option<String>,
    /// The RDMA device's verbs device (`uverbs3`), when known.
    pub uverbs: Option<String>,
    /// Its PF's link when the inventory was read.
    pub pf_link: LinkInfo,
}

impl VfDevice {
    /// The VF `vf` of `pf`.
    pub fn of(pf: &PhysicalFunction, vf: &VirtualFunction) -> VfDevice {
        VfDevice {
            pci_address: vf.pci_address.clone(),
            pf_pci_address: pf.pci_address.clone(),
            pf_netdev: pf.function.netdev.clone(),
            index: vf.index,
            pci_path: vf.function.pci_path.clone(),
            numa_node: vf.function.numa_node,
            rdma_device: vf.function.rdma_device.clone(),
            uverbs: vf.function.uverbs.clone(),
            pf_link: pf.function.link.clone(),
        }
    }

    /// Where it sits, for the choice.
    pub fn place(&self) -> VfPlace<'_> {
        VfPlace {
            pci_address: &self.pci_address,
            pf: &self.pf_pci_address,
            pci_path: self.pci_path.as_ref(),
            numa_node: self.numa_node,
        }
    }

    /// Why the VF cannot carry traffic in `now` (a fresh read of the node's SR-IOV functions):
    /// it is gone from sysfs, or its PF's link is down. `None` when it can.
    pub fn unhealthy_in(&self, now: &SriovInventory) -> Option<String> {
        match now.vf(&self.pci_address) {
            None => Some("the VF is gone from sysfs".to_string()),
            Some((pf, _)) if pf.function.link.is_down() => Some(pf_down(pf)),
            Some(_) => None,
        }
    }
}

fn pf_down(pf: &PhysicalFunction) -> String {
    let name = pf.function.netdev.as_deref().unwrap_or(&pf.pci_address);
    let state = pf.function.link.operstate.as_deref().unwrap_or("down");
    format!("PF {name} link is {state}")
}

/// The VFs of one physnet on this node, by PCI address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VfInventory {
    vfs: BTreeMap<String, VfDevice>,
}

impl VfInventory {
    /// The inventory of `vfs`, the physnet's VFs with their PFs as
    /// [`PhysnetConfig::assign`] gives them. A VF given twice is an error.
    pub fn new(vfs: &[(&PhysicalFunction, &VirtualFunction)]) -> Result<VfInventory, SriovError> {
        Self::from_devices(vfs.iter().map(|(pf, vf)| VfDevice::of(pf, vf)))
    }

    /// The inventory of `devices`. A VF given twice is an error.
    pub fn from_devices(devices: impl IntoIterator<Item = VfDevice>) -> Result<VfInventory, SriovError> {
        let mut vfs = BTreeMap::new();
        for d in devices {
            if let Some(twice) = vfs.insert(d.pci_address.clone(), d) {
                return Err(SriovError::DuplicateVf(twice.pci_address));
            }
        }
        Ok(VfInventory { vfs })
    }

    /// The inventories of every physnet of `config` on this node (`inventory`), by physnet; what
    /// the node lacks is noted, as [`PhysnetConfig::assign`] notes it.
    pub fn per_physnet(
        config: &PhysnetConfig,
        inventory: &SriovInventory,
        notes: &mut Vec<String>,
    ) -> Result<BTreeMap<String, VfInventory>, SriovError> {
        config.assign(inventory, notes).into_iter().map(|(physnet, vfs)| Ok((physnet, Self::new(&vfs)?))).collect()
    }

    /// The VFs, by PCI address.
    pub fn devices(&self) -> impl Iterator<Item = &VfDevice> {
        self.vfs.values()
    }

    /// How many VFs.
    pub fn len(&self) -> usize {
        self.vfs.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.vfs.is_empty()
    }

    /// The VF at `pci_address`.
    pub fn get(&self, pci_address: &str) -> Option<&VfDevice> {
        self.vfs.get(pci_address)
    }

    /// The VFs of device IDs, in their order; the error names the first unknown one.
    pub fn lookup(&self, resource: &str, ids: &[String]) -> Result<Vec<&VfDevice>, SriovError> {
        ids.iter()
            .map(|id| {
                self.vfs.get(id).ok_or_else(|| SriovError::UnknownDevice { resource: resource.into(), id: id.clone() })
            })
            .collect()
    }

    /// Why each VF that cannot carry traffic cannot, by PCI address: from the PF links read with
    /// the inventory when `now` is `None`, else from `now`.
    pub fn unhealthy(&self, now: Option<&SriovInventory>) -> BTreeMap<String, String> {
        self.vfs
            .values()
            .filter_map(|d| {
                let why = match now {
                    Some(now) => d.unhealthy_in(now),
                    None => d.pf_link.is_down().then(|| format!("PF {} link is down", d.pf_pci_address)),
                };
                why.map(|w| (d.pci_address.clone(), w))
            })
            .collect()
    }

    /// The device list for ListAndWatch: every VF, healthy unless in `unhealthy`.
    pub fn api_devices(&self, unhealthy: &BTreeMap<String, String>) -> Vec<api::Device> {
        self.vfs
            .values()
            .map(|d| weft_deviceplugin::device(&d.pci_address, !unhealthy.contains_key(&d.pci_address), d.numa_node))
            .collect()
    }
}

/// One GPU of the node, as a place the VFs are chosen near.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuPlace {
    /// Its index (what `weft.io/gpu-ids` lists).
    pub index: usize,
    /// Where it sits in the PCI tree.
    pub pci_path: Option<PciPath>,
    /// NUMA node.
    pub numa_node: Option<u32>,
}

impl GpuPlace {
    /// The place, for the choice.
    pub fn place(&self) -> DevicePlace<'_> {
        DevicePlace { pci_path: self.pci_path.as_ref(), numa_node: self.numa_node }
    }
}

/// The GPU table of a node: each GPU of `topology` placed in the PCI tree under `root` by its PCI
/// bus id (`sys/bus/pci/devices/<bus>`, canonicalised), its NUMA node the topology's, else
/// sysfs's. A GPU without a bus id, or one sysfs does not show, keeps only its NUMA node (noted).
pub fn gpu_places(topology: &NodeTopology, root: &SysfsRoot, notes: &mut Vec<String>) -> Vec<GpuPlace> {
    topology
        .gpus
        .iter()
        .map(|g| {
            let index = usize::try_from(g.index).unwrap_or(usize::MAX);
            let info = g.pci_bus_id.as_deref().map(|bus| weft_topology::discover::read_pci_device(root, bus, notes));
            let pci_path = info.as_ref().and_then(|i| i.path.clone());
            if pci_path.is_none() {
                notes.push(format!("GPU {index}: no place in the PCI tree; VFs are chosen near its NUMA node"));
            }
            GpuPlace { index, pci_path, numa_node: g.numa_node.or(info.and_then(|i| i.numa_node)) }
        })
        .collect()
}

/// The places of the GPUs `indices` in `table`; indices the table lacks are left out.
pub fn places_of<'a>(table: &'a [GpuPlace], indices: &[usize]) -> Vec<DevicePlace<'a>> {
    let wanted: BTreeSet<usize> = indices.iter().copied().collect();
    table.iter().filter(|g| wanted.contains(&g.index)).map(GpuPlace::place).collect()
}
