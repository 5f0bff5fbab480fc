//! The node model: GPUs, the two relations between every GPU pair (PCIe path and NVLink count),
//! NICs and their PCIe relation to each GPU, and the CPU/NUMA layout.
//!
//! Facts used here (see `shared/reference/gpu-topology.md`):
//! - go-gpuallocator keeps, for each GPU pair, one PCIe-hierarchy entry and one NVLink-count entry and
//!   scores a pair as the *sum* of both (§1.1, §1.2).
//! - Per-link NVLink rates per generation and PCIe x16 rates per generation (§5).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;
use crate::error::TopologyError;

/// The PCIe relation between two devices, as NVML's `GetTopologyCommonAncestor` reports it and as
/// `nvidia-smi topo -m` prints it. Ordered from farthest to closest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PcieRelation {
    /// `SYS` (legacy `SOC`): PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI).
    #[serde(rename = "SYS", alias = "SOC")]
    Sys,
    /// `NODE`: PCIe plus the interconnect between host bridges within one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// `PHB`: PCIe plus a PCIe host bridge (typically the CPU).
    #[serde(rename = "PHB")]
    Phb,
    /// `PXB`: several PCIe bridges, without the host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// `PIX`: at most one PCIe bridge.
    #[serde(rename = "PIX")]
    Pix,
    /// Both GPUs sit on one multi-GPU board (NVML `TOPOLOGY_INTERNAL`); `topo -m` has no token for it.
    #[serde(rename = "SameBoard")]
    SameBoard,
}

impl PcieRelation {
    /// All relations, farthest first.
    pub const ALL: [PcieRelation; 6] = [
        PcieRelation::Sys,
        PcieRelation::Node,
        PcieRelation::Phb,
        PcieRelation::Pxb,
        PcieRelation::Pix,
        PcieRelation::SameBoard,
    ];

    /// The token `nvidia-smi topo -m` prints (`SameBoard` has none; we print the go-gpuallocator name).
    pub fn token(self) -> &'static str {
        match self {
            PcieRelation::Sys => "SYS",
            PcieRelation::Node => "NODE",
            PcieRelation::Phb => "PHB",
            PcieRelation::Pxb => "PXB",
            PcieRelation::Pix => "PIX",
            PcieRelation::SameBoard => "SameBoard",
        }
    }

    /// go-gpuallocator's score for this PCIe entry (reference §1.2).
    pub fn score(self) -> u32 {
        match self {
            PcieRelation::Sys => 10,
            PcieRelation::Node => 20,
            PcieRelation::Phb => 30,
            PcieRelation::Pxb => 40,
            PcieRelation::Pix => 50,
            PcieRelation::SameBoard => 60,
        }
    }

    /// Whether traffic on this path crosses the CPU's host bridge (and so pays the P2P-through-CPU cost).
    pub fn crosses_host_bridge(self) -> bool {
        matches!(self, PcieRelation::Phb | PcieRelation::Node | PcieRelation::Sys)
    }
}

impl fmt::Display for PcieRelation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.token())
    }
}

impl FromStr for PcieRelation {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "SYS" | "SOC" => Ok(PcieRelation::Sys),
            "NODE" => Ok(PcieRelation::Node),
            "PHB" => Ok(PcieRelation::Phb),
            "PXB" => Ok(PcieRelation::Pxb),
            "PIX" => Ok(PcieRelation::Pix),
            "SameBoard" | "SAMEBOARD" => Ok(PcieRelation::SameBoard),
            other => Err(TopologyError::UnknownRelation(other.to_string())),
        }
    }
}

/// Largest NVLink count one GPU pair can carry (NVLink 4/5: 18 links per GPU).
pub const MAX_NVLINKS: u8 = 18;

/// Both relations between one GPU pair. `pcie` is `None` where the source did not say (a
/// `topo -m` dump prints only `NV#` for NVLinked pairs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PairLink {
    /// PCIe relation, if known.
    pub pcie: Option<PcieRelation>,
    /// Number of NVLinks bonded between the pair (0 = none). On NVSwitch systems this is the number of
    /// links both GPUs have into the shared switch fabric.
    pub nvlinks: u8,
}

impl PairLink {
    /// go-gpuallocator's pair score: the sum over the pair's link entries (PCIe entry plus 100 per NVLink).
    pub fn score(self) -> u32 {
        self.pcie.map_or(0, PcieRelation::score) + 100 * u32::from(self.nvlinks)
    }
}

/// Largest pair score any real pair can reach: 18 NVLinks (1800) plus a SameBoard PCIe entry (60).
pub const MAX_PAIR_SCORE: u32 = 1800 + 60;

/// NVLink generation, which fixes the per-link rate (reference §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkGeneration {
    /// NVLink 1 (P100): 20 GB/s per link per direction.
    Nvlink1,
    /// NVLink 2 (V100): 25 GB/s.
    Nvlink2,
    /// NVLink 3 (A100): 25 GB/s.
    Nvlink3,
    /// NVLink 3 on GA102 boards (RTX 3090, A40, A6000): 14.0625 GB/s.
    Nvlink3Ga102,
    /// NVLink 4 (H100, H200): 25 GB/s.
    Nvlink4,
    /// NVLink 5 (B200, GB200): 50 GB/s.
    Nvlink5,
}

impl NvlinkGeneration {
    /// Bandwidth of one link in one direction, GB/s.
    pub fn per_link_gbps(self) -> f64 {
        match self {
            NvlinkGeneration::Nvlink1 => 20.0,
            NvlinkGeneration::Nvlink2 | NvlinkGeneration::Nvlink3 | NvlinkGeneration::Nvlink4 => 25.0,
            NvlinkGeneration::Nvlink3Ga102 => 14.0625,
            NvlinkGeneration::Nvlink5 => 50.0,
        }
    }

    /// Guess the generation from a GPU product name (`NVIDIA A100-SXM4-80GB`, `Tesla V100-SXM2-32GB`).
    pub fn from_product_name(name: &str) -> Option<NvlinkGeneration> {
        let n = name.to_ascii_uppercase();
        let has = |k: &str| n.contains(k);
        if has("B200") || has("B100") || has("GB200") || has("B300") {
            Some(NvlinkGeneration::Nvlink5)
        } else if has("H100") || has("H200") || has("H800") || has("H20") {
            Some(NvlinkGeneration::Nvlink4)
        } else if has("A100") || has("A800") || has("A30") {
            Some(NvlinkGeneration::Nvlink3)
        } else if has("A40") || has("A6000") || has("3090") || has("A5000") {
            Some(NvlinkGeneration::Nvlink3Ga102)
        } else if has("V100") {
            Some(NvlinkGeneration::Nvlink2)
        } else if has("P100") {
            Some(NvlinkGeneration::Nvlink1)
        } else {
            None
        }
    }

    /// The name people use for it (`NVLink 2`).
    pub fn label(self) -> &'static str {
        match self {
            NvlinkGeneration::Nvlink1 => "NVLink 1",
            NvlinkGeneration::Nvlink2 => "NVLink 2",
            NvlinkGeneration::Nvlink3 => "NVLink 3",
            NvlinkGeneration::Nvlink3Ga102 => "NVLink 3 (GA102 bridge)",
            NvlinkGeneration::Nvlink4 => "NVLink 4",
            NvlinkGeneration::Nvlink5 => "NVLink 5",
        }
    }

    /// Guess the generation from the largest NVLink count seen between two GPUs, for sources without
    /// product names (a `topo -m` dump): 18 → NVLink 4, 12 → NVLink 3, 4 → GA102 bridges,
    /// 1..3 or 6 → NVLink 2 (V100 hybrid cube-mesh). Documented in docs/topology.md.
    pub fn from_max_nvlinks(max: u8) -> Option<NvlinkGeneration> {
        match max {
            0 => None,
            13..=18 => Some(NvlinkGeneration::Nvlink4),
            7..=12 => Some(NvlinkGeneration::Nvlink3),
            4 => Some(NvlinkGeneration::Nvlink3Ga102),
            _ => Some(NvlinkGeneration::Nvlink2),
        }
    }
}

impl fmt::Display for NvlinkGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// PCIe generation of the GPUs' x16 links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PcieGeneration(pub u8);

impl PcieGeneration {
    /// The generations there are: PCIe 1.0 to 7.0.
    pub const KNOWN: std::ops::RangeInclusive<u8> = 1..=7;

    /// Raw x16 rate per direction in GB/s (GT/s × 16 lanes × encoding / 8): Gen3 15.75, Gen4 31.5,
    /// Gen5 63, Gen6 ≈121, Gen7 ≈242.
    pub fn x16_gbps(self) -> f64 {
        match self.0 {
            0..=1 => 4.0,
            2 => 8.0,
            3 => 15.75,
            4 => 31.5,
            5 => 63.0,
            6 => 121.0,
            _ => 242.0,
        }
    }

    /// The PCIe generation of the GPUs of an NVLink generation, for sources that name neither the
    /// product nor the PCIe generation (a `topo -m` dump): P100 and V100 are Gen3, A100 and the
    /// GA102 boards Gen4, H100 and B200 Gen5.
    pub fn of_nvlink_generation(g: NvlinkGeneration) -> PcieGeneration {
        match g {
            NvlinkGeneration::Nvlink1 | NvlinkGeneration::Nvlink2 => PcieGeneration(3),
            NvlinkGeneration::Nvlink3 | NvlinkGeneration::Nvlink3Ga102 => PcieGeneration(4),
            NvlinkGeneration::Nvlink4 | NvlinkGeneration::Nvlink5 => PcieGeneration(5),
        }
    }

    /// Guess from a GPU product name.
    pub fn from_product_name(name: &str) -> Option<PcieGeneration> {
        let n = name.to_ascii_uppercase();
        let has = |k: &str| n.contains(k);
        if has("B200") || has("B100") || has("GB200") || has("H100") || has("H200") || has("H800") {
            Some(PcieGeneration(5))
        } else if has("A100") || has("A800") || has("A30") || has("A40") || has("A6000") || has("3090") {
            Some(PcieGeneration(4))
        } else if has("V100") || has("P100") {
            Some(PcieGeneration(3))
        } else {
            None
        }
    }
}

/// Highest NUMA node number Linux supports (`CONFIG_NODES_SHIFT` is at most 10).
pub const MAX_NUMA_NODE: u32 = 1023;

/// Largest socket count accepted.
pub const MAX_SOCKETS: u32 = 64;

/// Largest inter-socket bandwidth accepted, GB/s per direction (today's links are in the hundreds).
pub const MAX_INTER_SOCKET_GBPS: f64 = 10_000.0;

/// Cost factor of peer-to-peer traffic through the CPU root complex (NCCL's `INTEL_P2P_OVERHEAD`, 6/5).
pub const P2P_THROUGH_CPU_OVERHEAD: f64 = 1.2;

/// Default inter-socket bandwidth, GB/s per direction (NCCL's model for Skylake UPI), used when the node
/// description does not give one.
pub const DEFAULT_INTER_SOCKET_GBPS: f64 = 10.0;

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// NVML/nvidia-smi index; equals the GPU's position in [`NodeTopology::gpus`].
    pub index: u32,
    /// `GPU-…` UUID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// PCI bus id (`0000:07:00.0`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// NUMA node the GPU is attached to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPUs local to the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<CpuSet>,
    /// Product name (`NVIDIA H100 80GB HBM3`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl Gpu {
    /// A GPU with only its index known.
    pub fn with_index(index: u32) -> Gpu {
        Gpu { index, uuid: None, pci_bus_id: None, numa_node: None, cpu_affinity: None, model: None }
    }
}

/// One NIC (an RDMA-capable port or a plain netdev).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    /// Name as the source shows it: the RDMA device (`mlx5_0`) or `NICn` when no legend names it.
    pub name: String,
    /// RDMA device name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Kernel network interface, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// PCI bus id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// NUMA node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
}

/// One SR-IOV virtual function a NIC offers, and the pool (physnet) it serves. A VF sits beside
/// its PF in the PCI tree, so its relation to a GPU is its NIC's (`nicLinks`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Vf {
    /// PCI address (`0000:3b:02.1`): the device ID the VF device plugin gives the kubelet.
    pub pci_address: String,
    /// Name of its PF in `nics`.
    pub nic: String,
    /// The physnet it serves (`sriov.weft.io/<physnet>`), when one is configured for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
}

/// One NUMA node and its CPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    /// NUMA node id.
    pub id: u32,
    /// CPUs on the node.
    pub cpus: CpuSet,
}

/// CPU layout of the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    /// NUMA nodes, by id.
    #[serde(default)]
    pub numa_nodes: Vec<NumaNode>,
    /// Number of CPU sockets, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Logical CPUs online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<CpuSet>,
}

/// A node: its GPUs, every pair's relations, its NICs and CPUs.
///
/// Invariants (checked by [`NodeTopology::new`] and every parser): GPU indices are `0..n` in order;
/// the pair matrix is `n × n`, symmetric, with a default diagonal; the GPU–NIC matrix is `n × m`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTopology {
    /// Node name, when known.
    pub name: Option<String>,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
    /// NICs in the source's order.
    pub nics: Vec<Nic>,
    links: Vec<PairLink>,
    nic_links: Vec<Option<PcieRelation>>,
    /// SR-IOV VFs, each naming its PF in `nics` (set with [`NodeTopology::set_vfs`]).
    vfs: Vec<Vf>,
    /// NVLink generation, when known or inferred.
    pub nvlink_generation: Option<NvlinkGeneration>,
    /// PCIe generation of the GPU links, when known or inferred.
    pub pcie_generation: Option<PcieGeneration>,
    /// Inter-socket bandwidth, GB/s per direction, when known.
    pub inter_socket_gbps: Option<f64>,
    /// CPU/NUMA layout.
    pub cpus: CpuTopology,
}

impl NodeTopology {
    /// Build a node from GPUs, NICs and the full pair matrices (row-major `n × n` and `n × m`).
    pub fn new(
        name: Option<String>,
        gpus: Vec<Gpu>,
        nics: Vec<Nic>,
        links: Vec<PairLink>,
        nic_links: Vec<Option<PcieRelation>>,
    ) -> Result<NodeTopology, TopologyError> {
        let n = gpus.len();
        for (pos, gpu) in gpus.iter().enumerate() {
            if gpu.index as usize != pos {
                return Err(TopologyError::Invalid(format!(
                    "GPU indices must be 0..{n} in order; position {pos} holds GPU{}",
                    gpu.index
                )));
            }
        }
        if links.len() != n * n {
            return Err(TopologyError::Invalid(format!(
                "pair matrix has {} entries, expected {} for {n} GPUs",
                links.len(),
                n * n
            )));
        }
        if nic_links.len() != n * nics.len() {
            return Err(TopologyError::Invalid(format!(
                "GPU-NIC matrix has {} entries, expected {} for {n} GPUs and {} NICs",
                nic_links.len(),
                n * nics.len(),
                nics.len()
            )));
        }
        for i in 0..n {
            if links[i * n + i] != PairLink::default() {
                return Err(TopologyError::Invalid(format!("GPU{i} has a link to itself")));
            }
            for j in (i + 1)..n {
                let (a, b) = (links[i * n + j], links[j * n + i]);
                if a != b {
                    return Err(TopologyError::Asymmetric { a: i, b: j, ab: describe(a), ba: describe(b) });
                }
                if a.nvlinks > MAX_NVLINKS {
                    return Err(TopologyError::Invalid(format!(
                        "GPU{i}-GPU{j} has {} NVLinks; at most {MAX_NVLINKS} exist",
                        a.nvlinks
                    )));
                }
            }
        }
        let mut node = NodeTopology {
            name,
            gpus,
            nics,
            links,
            nic_links,
            vfs: Vec::new(),
            nvlink_generation: None,
            pcie_generation: None,
            inter_socket_gbps: None,
            cpus: CpuTopology::default(),
        };
        node.infer_generations();
        Ok(node)
    }

    /// Fill unknown NVLink/PCIe generations from GPU product names, else from the NVLink counts.
    pub fn infer_generations(&mut self) {
        let model = self.gpus.iter().find_map(|g| g.model.clone());
        if self.nvlink_generation.is_none() {
            self.nvlink_generation = model
                .as_deref()
                .and_then(NvlinkGeneration::from_product_name)
                .or_else(|| NvlinkGeneration::from_max_nvlinks(self.max_nvlinks()));
        }
        if self.pcie_generation.is_none() {
            self.pcie_generation = model
                .as_deref()
                .and_then(PcieGeneration::from_product_name)
                .or_else(|| self.nvlink_generation.map(PcieGeneration::of_nvlink_generation));
        }
    }

    /// Checks the values a description can get wrong that the structure does not catch; errors
    /// name the field as the inventory spells it (`gpus[3].numaNode`).
    pub fn check_values(&self) -> Result<(), TopologyError> {
        let bad = |field: String, why: String| Err(TopologyError::Invalid(format!("{field}: {why}")));
        if let Some(g) = self.pcie_generation
            && !PcieGeneration::KNOWN.contains(&g.0)
        {
            return bad("pcieGeneration".into(), format!("{} is not a PCIe generation (1 to 7)", g.0));
        }
        if let Some(bw) = self.inter_socket_gbps
            && !(bw > 0.0 && bw <= MAX_INTER_SOCKET_GBPS)
        {
            return bad(
                "interSocketGbps".into(),
                format!("{bw} is not a bandwidth in GB/s (above 0, at most {MAX_INTER_SOCKET_GBPS})"),
            );
        }
        let numa = |field: String, id: Option<u32>| match id {
            Some(id) if id > MAX_NUMA_NODE => {
                bad(field, format!("{id} is above the highest NUMA node Linux supports ({MAX_NUMA_NODE})"))
            }
            _ => Ok(()),
        };
        for (i, g) in self.gpus.iter().enumerate() {
            numa(format!("gpus[{i}].numaNode"), g.numa_node)?;
        }
        for (i, n) in self.nics.iter().enumerate() {
            numa(format!("nics[{i}].numaNode"), n.numa_node)?;
        }
        for (i, n) in self.cpus.numa_nodes.iter().enumerate() {
            numa(format!("cpus.numaNodes[{i}].id"), Some(n.id))?;
        }
        if let Some(s) = self.cpus.sockets
            && !(1..=MAX_SOCKETS).contains(&s)
        {
            return bad("cpus.sockets".into(), format!("{s} is not a socket count (1 to {MAX_SOCKETS})"));
        }
        Ok(())
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// Relations between GPU `a` and GPU `b` (positions). Panics if out of range; use with indices
    /// from this node only.
    pub fn link(&self, a: usize, b: usize) -> PairLink {
        self.links[a * self.gpus.len() + b]
    }

    /// PCIe relation between GPU `gpu` and NIC `nic` (positions), when known.
    pub fn nic_link(&self, gpu: usize, nic: usize) -> Option<PcieRelation> {
        self.nic_links[gpu * self.nics.len() + nic]
    }

    /// The SR-IOV VFs.
    pub fn vfs(&self) -> &[Vf] {
        &self.vfs
    }

    /// Sets the SR-IOV VFs. Each must name a NIC of this node and have a PCI address of its own;
    /// errors name the entry as the inventory spells it (`vfs[3].nic`).
    pub fn set_vfs(&mut self, vfs: Vec<Vf>) -> Result<(), TopologyError> {
        for (i, vf) in vfs.iter().enumerate() {
            if !self.nics.iter().any(|n| n.name == vf.nic) {
                return Err(TopologyError::Invalid(format!("vfs[{i}].nic: '{}' is not in nics", vf.nic)));
            }
            if vfs[..i].iter().any(|v| v.pci_address == vf.pci_address) {
                return Err(TopologyError::Invalid(format!(
                    "vfs[{i}].pciAddress: '{}' is listed twice",
                    vf.pci_address
                )));
            }
            if vf.physnet.as_deref() == Some("") {
                return Err(TopologyError::Invalid(format!("vfs[{i}].physnet: empty; leave it out instead")));
            }
        }
        self.vfs = vfs;
        Ok(())
    }

    /// The NIC position of VF `vf` (a position in [`NodeTopology::vfs`]).
    pub fn vf_nic(&self, vf: usize) -> usize {
        let name = &self.vfs[vf].nic;
        // set_vfs checked that every VF names a NIC.
        self.nics.iter().position(|n| &n.name == name).unwrap_or_default()
    }

    /// The nearest PCIe relation between VF `vf` and any of `gpus` (positions), when known: its
    /// NIC's relation, since a VF sits beside its PF.
    pub fn vf_nearest(&self, vf: usize, gpus: &[usize]) -> Option<PcieRelation> {
        let nic = self.vf_nic(vf);
        gpus.iter().filter_map(|&g| self.nic_link(g, nic)).max()
    }

    /// The row-major pair matrix.
    pub fn links(&self) -> &[PairLink] {
        &self.links
    }

    /// Largest NVLink count between any pair.
    pub fn max_nvlinks(&self) -> u8 {
        self.links.iter().map(|l| l.nvlinks).max().unwrap_or(0)
    }

    /// Whether any pair is NVLinked.
    pub fn has_nvlink(&self) -> bool {
        self.max_nvlinks() > 0
    }

    /// go-gpuallocator pair score of every pair, row-major `n × n` (0 on the diagonal).
    pub fn pair_scores(&self) -> Vec<u32> {
        self.links.iter().map(|l| l.score()).collect()
    }

    /// Estimated bandwidth between two GPUs, GB/s per direction (reference §5): NV#n → n × per-link
    /// rate of the generation; PIX/PXB/SameBoard → the PCIe x16 rate; PHB/NODE → the PCIe rate through
    /// the CPU (÷1.2); SYS → the lesser of that and the inter-socket rate. An NVLinked pair gets the
    /// NVLink rate (data takes the faster path).
    pub fn pair_bandwidth_gbps(&self, a: usize, b: usize) -> f64 {
        if a == b {
            return 0.0;
        }
        let link = self.link(a, b);
        let pcie = self.pcie_generation.unwrap_or(PcieGeneration(4)).x16_gbps();
        let pcie_bw = match link.pcie {
            None | Some(PcieRelation::Pix | PcieRelation::Pxb | PcieRelation::SameBoard) => pcie,
            Some(PcieRelation::Phb | PcieRelation::Node) => pcie / P2P_THROUGH_CPU_OVERHEAD,
            Some(PcieRelation::Sys) => {
                (pcie / P2P_THROUGH_CPU_OVERHEAD).min(self.inter_socket_gbps.unwrap_or(DEFAULT_INTER_SOCKET_GBPS))
            }
        };
        if link.nvlinks > 0 {
            let per_link = self.nvlink_generation.unwrap_or(NvlinkGeneration::Nvlink2).per_link_gbps();
            (f64::from(link.nvlinks) * per_link).max(pcie_bw)
        } else {
            pcie_bw
        }
    }

    /// Mean of [`pair_bandwidth_gbps`](Self::pair_bandwidth_gbps) over all pairs of `gpus`
    /// (positions); 0 for fewer than two GPUs.
    pub fn mean_pair_bandwidth_gbps(&self, gpus: &[usize]) -> f64 {
        let (mut sum, mut pairs) = (0.0, 0u32);
        for (i, &a) in gpus.iter().enumerate() {
            for &b in &gpus[i + 1..] {
                sum += self.pair_bandwidth_gbps(a, b);
                pairs += 1;
            }
        }
        if pairs == 0 { 0.0 } else { sum / f64::from(pairs) }
    }

    /// The best ring over `gpus` (positions) and its slowest hop, GB/s per direction: what a ring
    /// all-reduce over the set gets ([`crate::ring`]). None for fewer than two GPUs.
    pub fn ring_bandwidth(&self, gpus: &[usize]) -> Option<crate::ring::RingBandwidth> {
        crate::ring::best_ring(gpus.len(), &|a, b| self.pair_bandwidth_gbps(gpus[a], gpus[b]))
    }

    /// Whether every pair of `gpus` (positions) is NVLinked.
    pub fn all_nvlinked(&self, gpus: &[usize]) -> bool {
        gpus.iter().enumerate().all(|(i, &a)| gpus[i + 1..].iter().all(|&b| self.link(a, b).nvlinks > 0))
    }

    /// Set a pair's relations symmetrically (used by builders and tests).
    pub fn set_link(&mut self, a: usize, b: usize, link: PairLink) {
        let n = self.gpus.len();
        self.links[a * n + b] = link;
        self.links[b * n + a] = link;
    }
}

fn describe(l: PairLink) -> String {
    match (l.pcie, l.nvlinks) {
        (None, 0) => "none".to_string(),
        (Some(p), 0) => p.token().to_string(),
        (None, n) => format!("NV{n}"),
        (Some(p), n) => format!("NV{n}+{p}"),
    }
}

/// Short label for a pair as `topo -m` would print it (NVLink wins over PCIe).
pub fn pair_label(l: PairLink) -> String {
    if l.nvlinks > 0 { format!("NV{}", l.nvlinks) } else { l.pcie.map_or("?".to_string(), |p| p.token().to_string()) }
}

/// A builder for synthetic nodes: every pair starts as `base`.
pub fn uniform_node(name: &str, n: usize, base: PairLink) -> NodeTopology {
    let gpus = (0..n).map(|i| Gpu::with_index(i as u32)).collect();
    let mut links = vec![base; n * n];
    for i in 0..n {
        links[i * n + i] = PairLink::default();
    }
    // Cannot fail: indices are 0..n, the matrix is symmetric and sized n × n.
    match NodeTopology::new(Some(name.to_string()), gpus, Vec::new(), links, Vec::new()) {
        Ok(node) => node,
        Err(e) => unreachable!("uniform node is valid by construction: {e}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    #[test]
    fn pair_score_sums_pcie_and_nvlink_entries() {
        assert_eq!(PairLink { pcie: Some(PcieRelation::Phb), nvlinks: 2 }.score(), 230);
        assert_eq!(PairLink { pcie: Some(PcieRelation::SameBoard), nvlinks: 18 }.score(), MAX_PAIR_SCORE);
        assert_eq!(PairLink { pcie: None, nvlinks: 12 }.score(), 1200);
        assert_eq!(PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 }.score(), 10);
        assert_eq!(PairLink::default().score(), 0);
    }

    #[test]
    fn relation_tokens_round_trip_and_soc_is_sys() {
        for r in PcieRelation::ALL {
            assert_eq!(r.token().parse::<PcieRelation>().ok(), Some(r));
        }
        assert_eq!("SOC".parse::<PcieRelation>().ok(), Some(PcieRelation::Sys));
        assert!("PXBNODE".parse::<PcieRelation>().is_err());
    }

    #[test]
    fn asymmetric_matrix_is_rejected_with_both_sides_named() {
        let gpus = vec![Gpu::with_index(0), Gpu::with_index(1)];
        let nv1 = PairLink { pcie: None, nvlinks: 1 };
        let nv2 = PairLink { pcie: None, nvlinks: 2 };
        let links = vec![PairLink::default(), nv1, nv2, PairLink::default()];
        let err = NodeTopology::new(None, gpus, vec![], links, vec![]).unwrap_err().to_string();
        assert!(err.contains("GPU0") && err.contains("NV1") && err.contains("NV2"), "{err}");
    }

    #[test]
    fn bandwidth_follows_generation_and_path() {
        let mut node = uniform_node("t", 4, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
        node.set_link(0, 1, PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 });
        node.set_link(2, 3, PairLink { pcie: None, nvlinks: 4 });
        node.pcie_generation = Some(PcieGeneration(4));
        node.nvlink_generation = Some(NvlinkGeneration::Nvlink3Ga102);
        assert!((node.pair_bandwidth_gbps(0, 1) - 31.5).abs() < 1e-9);
        assert!((node.pair_bandwidth_gbps(2, 3) - 56.25).abs() < 1e-9);
        assert!((node.pair_bandwidth_gbps(0, 2) - DEFAULT_INTER_SOCKET_GBPS).abs() < 1e-9);
        node.nvlink_generation = Some(NvlinkGeneration::Nvlink3);
        assert!((node.pair_bandwidth_gbps(2, 3) - 100.0).abs() < 1e-9);
        // The set {0, 2, 3}: 0-2 and 0-3 are SYS (inter-socket rate), 2-3 is NV4 of NVLink 3 (100).
        let expected = (DEFAULT_INTER_SOCKET_GBPS * 2.0 + 100.0) / 3.0;
        assert!((node.mean_pair_bandwidth_gbps(&[0, 2, 3]) - expected).abs() < 1e-9);
        assert_eq!(node.mean_pair_bandwidth_gbps(&[1]), 0.0);
        assert!(node.all_nvlinked(&[2, 3]) && !node.all_nvlinked(&[0, 2, 3]) && node.all_nvlinked(&[1]));
    }

    #[test]
    fn generation_is_inferred_from_product_name_before_link_counts() {
        assert_eq!(NvlinkGeneration::from_product_name("NVIDIA H100 80GB HBM3"), Some(NvlinkGeneration::Nvlink4));
        assert_eq!(NvlinkGeneration::from_product_name("Tesla V100-SXM2-32GB"), Some(NvlinkGeneration::Nvlink2));
        assert_eq!(NvlinkGeneration::from_max_nvlinks(12), Some(NvlinkGeneration::Nvlink3));
        assert_eq!(NvlinkGeneration::from_max_nvlinks(18), Some(NvlinkGeneration::Nvlink4));
        assert_eq!(NvlinkGeneration::from_max_nvlinks(0), None);
    }
}
