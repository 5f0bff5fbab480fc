//! GPU discovery: the [`GpuSource`] seam, the NVML-shaped [`NvmlLike`] trait and the logic over it
//! (topology-level mapping, per-pair NVLink counting including the NVSwitch rule).
//!
//! The real NVML binding implements [`NvmlLike`] behind the `nvml` feature; [`super::FakeNvml`]
//! implements it for tests. Everything in this file runs the same over both.

use crate::cpuset::CpuSet;
use crate::error::TopologyError;
use crate::model::{Gpu, MAX_NVLINKS, PairLink, PcieGeneration, PcieRelation};

use super::pci::{PciPath, normalize_pci_bus_id};
use super::sysfs::{SysfsRoot, read_pci_device};

/// Number of NVLink ports NVML lets one query per GPU (`NVML_NVLINK_MAX_LINKS`).
pub const NVLINK_MAX_LINKS: u32 = 18;

/// PCI vendor id of NVIDIA.
pub const NVIDIA_PCI_VENDOR: u16 = 0x10de;

/// NVML's `nvmlGpuTopologyLevel_t`: how far apart two GPUs sit in the PCIe tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NvmlTopologyLevel {
    /// `NVML_TOPOLOGY_INTERNAL`: both on one multi-GPU board.
    Internal,
    /// `NVML_TOPOLOGY_SINGLE`: a single PCIe switch.
    Single,
    /// `NVML_TOPOLOGY_MULTIPLE`: several switches, no host bridge.
    Multiple,
    /// `NVML_TOPOLOGY_HOSTBRIDGE`: the same host bridge.
    HostBridge,
    /// `NVML_TOPOLOGY_NODE` (was `CPU`): one NUMA node, different host bridges.
    Node,
    /// `NVML_TOPOLOGY_SYSTEM`: across NUMA nodes.
    System,
}

impl NvmlTopologyLevel {
    /// The `topo -m` relation of this level (reference §1.1): Internal→SameBoard, Single→PIX,
    /// Multiple→PXB, HostBridge→PHB, Node→NODE, System→SYS.
    pub fn relation(self) -> PcieRelation {
        match self {
            NvmlTopologyLevel::Internal => PcieRelation::SameBoard,
            NvmlTopologyLevel::Single => PcieRelation::Pix,
            NvmlTopologyLevel::Multiple => PcieRelation::Pxb,
            NvmlTopologyLevel::HostBridge => PcieRelation::Phb,
            NvmlTopologyLevel::Node => PcieRelation::Node,
            NvmlTopologyLevel::System => PcieRelation::Sys,
        }
    }
}

/// What NVML says is at the far end of an NVLink (`nvmlIntNvLinkDeviceType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RemoteDeviceType {
    /// Another GPU.
    Gpu,
    /// An NVSwitch.
    Switch,
    /// An IBM POWER NPU (CPU-attached NVLink).
    IbmNpu,
    /// NVML could not say (old drivers, or bindings that do not return the value).
    Unknown,
}

/// The far end of one active NVLink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvlinkRemote {
    /// PCI bus id of the remote device, as NVML prints it.
    pub pci_bus_id: String,
    /// NVML's combined PCI id of the remote device: device id in the high 16 bits, vendor in the low 16.
    pub pci_device_id: Option<u32>,
    /// The remote device type, as NVML reports it.
    pub device_type: RemoteDeviceType,
}

/// Per-GPU facts NVML gives without link queries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlDeviceInfo {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name.
    pub name: Option<String>,
    /// PCI bus id as NVML prints it (`00000000:07:00.0`).
    pub pci_bus_id: String,
    /// NVML's combined PCI id of the GPU (device id high 16 bits, vendor low 16).
    pub pci_device_id: Option<u32>,
    /// NUMA node, if NVML knows it (sysfs is asked first).
    pub numa_node: Option<u32>,
    /// CPUs NVML calls ideal for the GPU.
    pub cpu_affinity: Option<CpuSet>,
    /// Highest PCIe generation the GPU and its slot support.
    pub max_pcie_link_gen: Option<u32>,
    /// Widest PCIe link the GPU and its slot support.
    pub max_pcie_link_width: Option<u32>,
}

/// The NVML calls discovery makes, as a trait so the logic over them runs against a fake.
/// Indices are NVML device indices. Errors are [`TopologyError::Nvml`].
pub trait NvmlLike {
    /// The driver version (`nvmlSystemGetDriverVersion`).
    fn driver_version(&self) -> Result<String, TopologyError>;
    /// Number of GPUs (`nvmlDeviceGetCount`).
    fn device_count(&self) -> Result<u32, TopologyError>;
    /// The UUID of one GPU (cheap; used for the cache fingerprint).
    fn device_uuid(&self, index: u32) -> Result<String, TopologyError>;
    /// Per-GPU facts: UUID, name, bus id, affinity, PCIe link.
    fn device_info(&self, index: u32) -> Result<NvmlDeviceInfo, TopologyError>;
    /// `nvmlDeviceGetTopologyCommonAncestor` of two GPUs.
    fn common_ancestor(&self, a: u32, b: u32) -> Result<NvmlTopologyLevel, TopologyError>;
    /// The far end of NVLink `link` of GPU `index`; `Ok(None)` when the link is inactive or absent.
    fn nvlink_remote(&self, index: u32, link: u32) -> Result<Option<NvlinkRemote>, TopologyError>;
}

/// Driver version and GPU UUIDs: what identifies a node's GPU set without the slow link queries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuIdentity {
    /// Driver version, when a driver answered.
    pub driver_version: Option<String>,
    /// GPU UUIDs in index order.
    pub uuids: Vec<String>,
}

/// What a GPU source found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReport {
    /// Driver version, when a driver answered.
    pub driver_version: Option<String>,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
    /// Row-major `n × n` pair matrix (symmetric, default diagonal).
    pub links: Vec<PairLink>,
    /// PCIe generation of the GPU links (the lowest over all GPUs), when measured.
    pub pcie_generation: Option<PcieGeneration>,
    /// What was skipped, guessed or could not be read.
    pub notes: Vec<String>,
}

/// A source of GPUs and their pair relations.
pub trait GpuSource {
    /// Driver version and UUIDs, cheaply (no NVLink queries). Used to key the discovery cache.
    fn identity(&self) -> Result<GpuIdentity, TopologyError>;
    /// The full GPU report; may be slow (NVLink queries). `root` is where sysfs facts about the GPUs'
    /// PCI functions are read.
    fn report(&self, root: &SysfsRoot) -> Result<GpuReport, TopologyError>;
}

/// A source with no GPUs, carrying the reason (NVML missing, discovery disabled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoGpuSource {
    /// Why there are no GPUs; becomes a discovery note.
    pub reason: String,
}

impl NoGpuSource {
    /// A source that reports no GPUs because of `reason`.
    pub fn new(reason: impl Into<String>) -> NoGpuSource {
        NoGpuSource { reason: reason.into() }
    }
}

impl GpuSource for NoGpuSource {
    fn identity(&self) -> Result<GpuIdentity, TopologyError> {
        Ok(GpuIdentity::default())
    }

    fn report(&self, _root: &SysfsRoot) -> Result<GpuReport, TopologyError> {
        Ok(GpuReport { notes: vec![self.reason.clone()], ..GpuReport::default() })
    }
}

/// GPU discovery over an [`NvmlLike`].
#[derive(Clone, Debug)]
pub struct NvmlGpuSource<N> {
    nvml: N,
}

impl<N: NvmlLike> NvmlGpuSource<N> {
    /// Discover through `nvml`.
    pub fn new(nvml: N) -> Self {
        NvmlGpuSource { nvml }
    }

    /// The underlying NVML.
    pub fn nvml(&self) -> &N {
        &self.nvml
    }
}

/// What one NVLink port of a GPU connects to, as far as pair counting cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkEnd {
    /// The GPU at this index on the node.
    Gpu(usize),
    /// An NVSwitch.
    Switch,
    /// Anything else (a CPU NPU, a GPU not visible on this node).
    Other,
}

/// Classify the far end of a link given the node's GPU bus ids (normalised, by index) and the PCI ids
/// of its GPU models.
///
/// A bus id that is one of this node's GPUs is that GPU. Otherwise NVML's device type decides; when it
/// is `Unknown`, the remote PCI vendor is NVIDIA and the remote PCI id is not one of this node's GPU
/// models, the end is taken to be an NVSwitch (NVSwitches are the only non-GPU NVIDIA devices at the end
/// of an NVLink; `nvml-wrapper` 0.13's `remote_device_type` always returns `Unknown`, see
/// docs/topology.md). A GPU model's PCI id at an unknown bus id is a GPU this node cannot place (an
/// unhealthy one whose facts did not read): `Other`, so it is not mistaken for a switch.
pub fn classify_remote(remote: &NvlinkRemote, gpu_bus_ids: &[Option<String>], gpu_pci_ids: &[u32]) -> LinkEnd {
    let bus = normalize_pci_bus_id(&remote.pci_bus_id);
    if let Some(bus) = &bus
        && let Some(peer) = gpu_bus_ids.iter().position(|g| g.as_deref() == Some(bus.as_str()))
    {
        return LinkEnd::Gpu(peer);
    }
    match remote.device_type {
        RemoteDeviceType::Switch => LinkEnd::Switch,
        RemoteDeviceType::Gpu | RemoteDeviceType::IbmNpu => LinkEnd::Other,
        RemoteDeviceType::Unknown => {
            let is_nvidia = remote.pci_device_id.is_some_and(|id| (id & 0xffff) as u16 == NVIDIA_PCI_VENDOR);
            let is_gpu_model = remote.pci_device_id.is_some_and(|id| gpu_pci_ids.contains(&id));
            if is_nvidia && !is_gpu_model { LinkEnd::Switch } else { LinkEnd::Other }
        }
    }
}

/// NVLink count of every GPU pair from each GPU's link ends (row-major `n × n`, zero diagonal), with
/// notes where the two sides of a pair disagree.
///
/// Rule (go-gpuallocator, with HAMi's NVSwitch fix, reference §1.1): count the links of `a` whose far end
/// is `b`; if there are none, and both GPUs have links into NVSwitches, the pair gets
/// `min(switch links of a, switch links of b)`. Direct counts are read from both sides and the larger
/// is kept (a link seen from either end exists; a lower count means a query failed on the other end).
pub fn count_nvlinks(ends: &[Vec<LinkEnd>], notes: &mut Vec<String>) -> Vec<u8> {
    let n = ends.len();
    let mut counts = vec![0u8; n * n];
    let switch_links: Vec<usize> = ends.iter().map(|e| e.iter().filter(|x| **x == LinkEnd::Switch).count()).collect();
    for a in 0..n {
        for b in (a + 1)..n {
            let ab = ends[a].iter().filter(|x| **x == LinkEnd::Gpu(b)).count();
            let ba = ends[b].iter().filter(|x| **x == LinkEnd::Gpu(a)).count();
            if ab != ba {
                notes.push(format!("GPU{a} sees {ab} NVLinks to GPU{b} but GPU{b} sees {ba}; using {}", ab.max(ba)));
            }
            let direct = ab.max(ba);
            let count = if direct > 0 { direct } else { switch_links[a].min(switch_links[b]) };
            let count = u8::try_from(count.min(usize::from(MAX_NVLINKS))).unwrap_or(MAX_NVLINKS);
            counts[a * n + b] = count;
            counts[b * n + a] = count;
        }
    }
    counts
}

impl<N: NvmlLike> GpuSource for NvmlGpuSource<N> {
    fn identity(&self) -> Result<GpuIdentity, TopologyError> {
        let count = self.nvml.device_count()?;
        let mut uuids = Vec::with_capacity(count as usize);
        for i in 0..count {
            uuids.push(self.nvml.device_uuid(i).unwrap_or_else(|e| format!("GPU{i}:unreadable({e})")));
        }
        Ok(GpuIdentity { driver_version: self.nvml.driver_version().ok(), uuids })
    }

    fn report(&self, root: &SysfsRoot) -> Result<GpuReport, TopologyError> {
        let nvml = &self.nvml;
        let mut notes = Vec::new();
        let driver_version = match nvml.driver_version() {
            Ok(v) => Some(v),
            Err(e) => {
                notes.push(format!("driver version unknown: {e}"));
                None
            }
        };
        let count = nvml.device_count()?;
        let n = count as usize;

        // Per-GPU facts. A GPU whose facts cannot be read stays in the list (indices must not shift) with
        // only its index known, and every pair involving it degrades to SYS below.
        let mut gpus = Vec::with_capacity(n);
        let mut bus_ids: Vec<Option<String>> = Vec::with_capacity(n);
        let mut paths: Vec<Option<PciPath>> = Vec::with_capacity(n);
        let mut pcie_gen: Option<u32> = None;
        let mut pci_ids: Vec<u32> = Vec::new();
        for i in 0..count {
            let mut gpu = Gpu::with_index(i);
            let info = match nvml.device_info(i) {
                Ok(info) => info,
                Err(e) => {
                    notes.push(format!("GPU{i}: {e}; its links are unknown and treated as SYS"));
                    gpus.push(gpu);
                    bus_ids.push(None);
                    paths.push(None);
                    continue;
                }
            };
            let bus = normalize_pci_bus_id(&info.pci_bus_id);
            if bus.is_none() {
                notes.push(format!("GPU{i}: NVML bus id '{}' is not a PCI address", info.pci_bus_id));
            }
            let sys = bus.as_deref().map(|b| read_pci_device(root, b, &mut notes)).unwrap_or_default();
            pci_ids.extend(info.pci_device_id);
            gpu.uuid = Some(info.uuid);
            gpu.model = info.name;
            gpu.pci_bus_id = bus.clone();
            gpu.numa_node = sys.numa_node.or(info.numa_node);
            gpu.cpu_affinity = info.cpu_affinity.filter(|c| !c.is_empty()).or(sys.local_cpus);
            if let Some(g) = info.max_pcie_link_gen {
                pcie_gen = Some(pcie_gen.map_or(g, |p| p.min(g)));
            }
            if let Some(w) = info.max_pcie_link_width
                && w < 16
            {
                notes.push(format!("GPU{i}: PCIe link is x{w}; bandwidth estimates assume x16"));
            }
            gpus.push(gpu);
            bus_ids.push(bus);
            paths.push(sys.path);
        }

        // NVLink ends, queried once per GPU and port (18·n calls rather than go-gpuallocator's 18·n² —
        // this is where NVML is slow, reference §1.4).
        let mut ends: Vec<Vec<LinkEnd>> = Vec::with_capacity(n);
        for i in 0..count {
            let mut mine = Vec::new();
            if bus_ids[i as usize].is_some() {
                let mut failed = None;
                for link in 0..NVLINK_MAX_LINKS {
                    match nvml.nvlink_remote(i, link) {
                        Ok(Some(remote)) => mine.push(classify_remote(&remote, &bus_ids, &pci_ids)),
                        Ok(None) => {}
                        Err(e) => failed = Some((link, e)),
                    }
                }
                if let Some((link, e)) = failed {
                    notes.push(format!("GPU{i}: NVLink {link}: {e}; counted the links that answered"));
                }
            }
            ends.push(mine);
        }
        let nvlinks = count_nvlinks(&ends, &mut notes);

        // PCIe relation of each pair: NVML, else the sysfs PCI tree, else SYS.
        let mut links = vec![PairLink::default(); n * n];
        for a in 0..n {
            for b in (a + 1)..n {
                let pcie = if bus_ids[a].is_none() || bus_ids[b].is_none() {
                    PcieRelation::Sys
                } else {
                    match nvml.common_ancestor(a as u32, b as u32) {
                        Ok(level) => level.relation(),
                        Err(e) => {
                            let same_numa =
                                matches!((gpus[a].numa_node, gpus[b].numa_node), (Some(x), Some(y)) if x == y);
                            let fallback = match (&paths[a], &paths[b]) {
                                (Some(pa), Some(pb)) => pa.relation_to(pb, same_numa),
                                _ => PcieRelation::Sys,
                            };
                            notes.push(format!("GPU{a}-GPU{b}: {e}; PCIe relation taken as {fallback}"));
                            fallback
                        }
                    }
                };
                let link = PairLink { pcie: Some(pcie), nvlinks: nvlinks[a * n + b] };
                links[a * n + b] = link;
                links[b * n + a] = link;
            }
        }
        let pcie_generation = pcie_gen.and_then(|g| u8::try_from(g).ok()).filter(|g| *g > 0).map(PcieGeneration);
        Ok(GpuReport { driver_version, gpus, links, pcie_generation, notes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_maps_to_its_token() {
        let pairs = [
            (NvmlTopologyLevel::Internal, "SameBoard"),
            (NvmlTopologyLevel::Single, "PIX"),
            (NvmlTopologyLevel::Multiple, "PXB"),
            (NvmlTopologyLevel::HostBridge, "PHB"),
            (NvmlTopologyLevel::Node, "NODE"),
            (NvmlTopologyLevel::System, "SYS"),
        ];
        for (level, token) in pairs {
            assert_eq!(level.relation().token(), token, "{level:?}");
        }
    }

    #[test]
    fn remote_classification() {
        let gpus = vec![Some("0000:07:00.0".to_string()), None, Some("0000:0f:00.0".to_string())];
        let a100 = 0x20b0_10de;
        let ids = [a100];
        let remote =
            |bus: &str, id: Option<u32>, t| NvlinkRemote { pci_bus_id: bus.into(), pci_device_id: id, device_type: t };
        assert_eq!(
            classify_remote(&remote("00000000:0F:00.0", None, RemoteDeviceType::Unknown), &gpus, &ids),
            LinkEnd::Gpu(2)
        );
        assert_eq!(
            classify_remote(&remote("0000:c4:00.0", None, RemoteDeviceType::Switch), &gpus, &ids),
            LinkEnd::Switch
        );
        assert_eq!(
            classify_remote(&remote("0000:c4:00.0", Some(0x1af1_10de), RemoteDeviceType::Unknown), &gpus, &ids),
            LinkEnd::Switch,
            "unknown type, NVIDIA vendor, not a GPU here: an NVSwitch"
        );
        assert_eq!(
            classify_remote(&remote("0000:c4:00.0", Some(0x04ea_1014), RemoteDeviceType::Unknown), &gpus, &ids),
            LinkEnd::Other
        );
        assert_eq!(classify_remote(&remote("0000:99:00.0", None, RemoteDeviceType::Gpu), &gpus, &ids), LinkEnd::Other);
        assert_eq!(
            classify_remote(&remote("0000:99:00.0", None, RemoteDeviceType::IbmNpu), &gpus, &ids),
            LinkEnd::Other
        );
        assert_eq!(
            classify_remote(&remote("0000:99:00.0", Some(a100), RemoteDeviceType::Unknown), &gpus, &ids),
            LinkEnd::Other,
            "a GPU model at an unknown bus id is a GPU that did not read, not a switch"
        );
    }
}
