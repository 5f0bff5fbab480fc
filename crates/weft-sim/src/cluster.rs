//! The simulated cluster: node types (a topology each) and how many nodes of each.
//!
//! Built-in node types are the `nvidia-smi topo -m` dumps in `topologies/` (the shared fixtures plus a
//! synthetic HGX H100 and a PCIe-only node). A cluster file names built-in types or topology files:
//!
//! ```yaml
//! apiVersion: weft.io/v1alpha1
//! kind: SimCluster
//! nodeTypes:
//!   - {name: dgx-a100, topology: builtin:dgx-a100, count: 8}
//!   - {name: mine, topology: ./my-node.json, count: 4}   # path relative to the cluster file
//!   - {name: quiet, topology: builtin:hgx-h100, count: 2, vfsPerNic: 0}   # no SR-IOV VFs
//! ```
//!
//! Every NIC of a node type offers SR-IOV VFs in one physnet: [`DEFAULT_VFS_PER_NIC`] VFs in
//! [`DEFAULT_PHYSNET`] unless the node type says `vfsPerNic` (0: none) or `physnet`. The VFs'
//! PCI addresses are synthetic, derived from the NIC's position (NIC k's VF v is
//! `0000:<0x10 + k>:<2 + v / 8>.<v % 8>`), so a node type's VFs sort by NIC, then by VF. A
//! topology file that lists VFs of its own (weft's inventory `vfs`) keeps them unless the node type
//! sets `vfsPerNic` or `physnet`. A node has at most [`MAX_VFS_PER_NODE`] VFs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weft_alloc::PreparedNode;
use weft_topology::{NodeTopology, NvlinkGeneration, PcieGeneration, Vf, parse_node, read_node_file};

use crate::SimError;

/// A built-in node type: name, description, `topo -m` text, and product hints the text lacks.
struct Builtin {
    name: &'static str,
    description: &'static str,
    text: &'static str,
    pcie_generation: Option<u8>,
    /// The NVLink generation when the link counts alone would infer another.
    nvlink_generation: Option<NvlinkGeneration>,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "dgx1-v100",
        description: "DGX-1 V100, hybrid cube-mesh NVLink (NV1/NV2), 4 mlx5 NICs",
        text: include_str!("../topologies/dgx1-v100-mlx5-columns.txt"),
        pcie_generation: Some(3),
        nvlink_generation: None,
    },
    Builtin {
        name: "v100-sxm2",
        description: "8x V100-SXM2, cube-mesh NVLink, 1 NIC",
        text: include_str!("../topologies/v100-sxm2-nic-legend.txt"),
        pcie_generation: Some(3),
        nvlink_generation: None,
    },
    Builtin {
        name: "dgx-a100",
        description: "DGX A100, NVSwitch (NV12 all pairs), 10 NICs, 4 NUMA nodes",
        text: include_str!("../topologies/dgx-a100-nvswitch-10nic.txt"),
        pcie_generation: Some(4),
        nvlink_generation: None,
    },
    Builtin {
        name: "hgx-a100",
        description: "HGX A100 8-GPU, NVSwitch (NV12 all pairs), 4 NICs",
        text: include_str!("../topologies/a100-nvswitch-4nic-gpu-numa-id.txt"),
        pcie_generation: Some(4),
        nvlink_generation: None,
    },
    Builtin {
        name: "a100-pcie-bridges",
        description: "8x A100 PCIe, NVLink bridges in pairs (NV12), SYS otherwise",
        text: include_str!("../topologies/a100-pcie-nvlink-bridges.txt"),
        pcie_generation: Some(4),
        nvlink_generation: None,
    },
    Builtin {
        name: "a100-pcie-4gpu",
        description: "4x A100 PCIe, one NVLink-bridged pair, 2 NICs",
        text: include_str!("../topologies/a100-pcie-4gpu-mlx5.txt"),
        pcie_generation: Some(4),
        nvlink_generation: None,
    },
    Builtin {
        name: "hgx-h100",
        description: "HGX H100 8-GPU, NVSwitch (NV18 all pairs), 8 NICs (synthetic)",
        text: include_str!("../topologies/hgx-h100-nv18-8nic.txt"),
        pcie_generation: Some(5),
        nvlink_generation: None,
    },
    Builtin {
        name: weft_gang::builtin::GB200_NVL72_TRAY,
        description: weft_gang::builtin::GB200_NVL72_TRAY_DESCRIPTION,
        text: weft_gang::builtin::GB200_NVL72_TRAY_TEXT,
        pcie_generation: Some(5),
        // NV18 alone reads as NVLink 4 (H100); the tray's B200s have NVLink 5.
        nvlink_generation: Some(NvlinkGeneration::Nvlink5),
    },
    Builtin {
        name: "pcie-8gpu",
        description: "8 PCIe GPUs, no NVLink, pairs behind one switch, two sockets (synthetic)",
        text: include_str!("../topologies/pcie-8gpu-2socket.txt"),
        pcie_generation: Some(4),
        nvlink_generation: None,
    },
];

/// Names and descriptions of the built-in node types.
pub fn builtin_types() -> Vec<(&'static str, &'static str)> {
    BUILTINS.iter().map(|b| (b.name, b.description)).collect()
}

/// The topology of a built-in node type.
pub fn builtin_topology(name: &str) -> Result<NodeTopology, SimError> {
    let b = BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| SimError::UnknownBuiltin {
        name: name.to_string(),
        known: BUILTINS.iter().map(|b| b.name).collect::<Vec<_>>().join(", "),
    })?;
    let mut node = parse_node(b.text, &format!("builtin:{name}"))?;
    node.name = Some(name.to_string());
    if node.pcie_generation.is_none() {
        node.pcie_generation = b.pcie_generation.map(PcieGeneration);
    }
    if let Some(g) = b.nvlink_generation {
        node.nvlink_generation = Some(g);
    }
    Ok(node)
}

/// SR-IOV VFs each NIC offers unless a node type says otherwise.
pub const DEFAULT_VFS_PER_NIC: usize = 8;
/// The physnet a node type's VFs serve unless it says otherwise (`sriov.weft.io/fabric`).
pub const DEFAULT_PHYSNET: &str = "fabric";
/// Most VFs one node may have (the engine keeps a node's free VFs as a 128-bit set).
pub const MAX_VFS_PER_NODE: usize = 128;

/// One node type of a cluster file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeTypeSpec {
    /// Type name; nodes are named `<name>-<i>`.
    pub name: String,
    /// `builtin:<type>` or a topology file (topo -m text, inventory JSON or YAML).
    pub topology: String,
    /// How many nodes of this type.
    pub count: usize,
    /// SR-IOV VFs on each NIC (0: none); default [`DEFAULT_VFS_PER_NIC`], or the VFs a topology
    /// file lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfs_per_nic: Option<usize>,
    /// The physnet of those VFs; default [`DEFAULT_PHYSNET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
}

impl NodeTypeSpec {
    /// A node type of `count` nodes of the built-in type `name`, with the default VFs.
    pub fn builtin(name: &str, count: usize) -> NodeTypeSpec {
        NodeTypeSpec {
            name: name.to_string(),
            topology: format!("builtin:{name}"),
            count,
            vfs_per_nic: None,
            physnet: None,
        }
    }
}

pub use weft_net::config::valid_physnet_name as valid_physnet;

/// The synthetic PCI address of VF `vf` of NIC `nic` (see the module docs).
pub fn synthetic_vf_address(nic: usize, vf: usize) -> String {
    format!("0000:{:02x}:{:02x}.{}", 0x10 + nic, 2 + vf / 8, vf % 8)
}

/// Give `node` its VFs as node type `at` (`nodeTypes[i]`) of the cluster file says; see the
/// module docs. The VFs end up sorted by PCI address.
fn set_node_vfs(node: &mut NodeTopology, spec: &NodeTypeSpec, at: &str) -> Result<(), SimError> {
    let bad = |message: String| SimError::Format { source_name: "cluster".into(), message };
    if let Some(p) = &spec.physnet
        && !valid_physnet(p)
    {
        return Err(bad(format!(
            "{at}.physnet: '{p}' cannot name the resource sriov.weft.io/<physnet>: use 1-63 letters, digits, \
             '-', '_' and '.', starting and ending with a letter or digit"
        )));
    }
    let mut vfs = if spec.vfs_per_nic.is_none() && spec.physnet.is_none() && !node.vfs().is_empty() {
        if node.vfs().len() > MAX_VFS_PER_NODE {
            return Err(bad(format!(
                "{at}.topology: lists {} VFs; the simulator takes at most {MAX_VFS_PER_NODE} per node",
                node.vfs().len()
            )));
        }
        node.vfs().to_vec()
    } else {
        let per_nic = spec.vfs_per_nic.unwrap_or(DEFAULT_VFS_PER_NIC);
        let total = per_nic.checked_mul(node.nics.len()).filter(|&t| t <= MAX_VFS_PER_NODE);
        if total.is_none() {
            return Err(bad(format!(
                "{at}.vfsPerNic: {per_nic} VFs on each of {} NICs is more than the simulator takes \
                 (at most {MAX_VFS_PER_NODE} per node)",
                node.nics.len()
            )));
        }
        let physnet = spec.physnet.clone().unwrap_or_else(|| DEFAULT_PHYSNET.to_string());
        let mut vfs = Vec::new();
        for (k, nic) in node.nics.iter().enumerate() {
            for v in 0..per_nic {
                vfs.push(Vf {
                    pci_address: synthetic_vf_address(k, v),
                    nic: nic.name.clone(),
                    physnet: Some(physnet.clone()),
                });
            }
        }
        vfs
    };
    vfs.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    node.set_vfs(vfs)?;
    Ok(())
}

/// A cluster file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// `weft.io/v1alpha1`.
    pub api_version: String,
    /// `SimCluster`.
    pub kind: String,
    /// Node types.
    pub node_types: Vec<NodeTypeSpec>,
}

impl ClusterSpec {
    /// The embedded default: every built-in type, sized so the cluster has a mix of NVSwitch,
    /// cube-mesh, bridged-pair and PCIe-only nodes (88 nodes, 672 GPUs).
    pub fn embedded_default() -> ClusterSpec {
        let counts = [
            ("dgx1-v100", 12),
            ("v100-sxm2", 8),
            ("dgx-a100", 8),
            ("hgx-a100", 8),
            ("a100-pcie-bridges", 16),
            ("a100-pcie-4gpu", 8),
            ("hgx-h100", 8),
            ("pcie-8gpu", 20),
        ];
        ClusterSpec {
            api_version: crate::API_VERSION.to_string(),
            kind: "SimCluster".to_string(),
            node_types: counts.iter().map(|(n, c)| NodeTypeSpec::builtin(n, *c)).collect(),
        }
    }

    /// The same mix of node types scaled to `nodes` nodes in all (largest-remainder rounding, so the
    /// counts add up exactly; a type may get 0 nodes when `nodes` is smaller than the number of types).
    pub fn scaled(&self, nodes: usize) -> ClusterSpec {
        let total: usize = self.node_types.iter().map(|t| t.count).sum();
        let mut out = self.clone();
        if total == 0 {
            return out;
        }
        let exact: Vec<f64> = self.node_types.iter().map(|t| t.count as f64 * nodes as f64 / total as f64).collect();
        let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
        let mut order: Vec<usize> = (0..counts.len()).collect();
        order.sort_by(|&a, &b| (exact[b] - counts[b] as f64).total_cmp(&(exact[a] - counts[a] as f64)).then(a.cmp(&b)));
        let short = nodes.saturating_sub(counts.iter().sum::<usize>());
        for &i in order.iter().take(short) {
            counts[i] += 1;
        }
        for (t, c) in out.node_types.iter_mut().zip(counts) {
            t.count = c;
        }
        out
    }

    /// Read a cluster file (YAML or JSON). A `network:` section (for `weft simulate --jobs`) is
    /// accepted and left out; [`ClusterSpec::from_file_with_network`] keeps it.
    pub fn from_file(path: &Path) -> Result<ClusterSpec, SimError> {
        Ok(Self::from_file_with_network(path)?.0)
    }

    /// Read a cluster file with its optional `network:` section ([`crate::jobs::NetworkSpec`]:
    /// leaves, spines, NVLink domains, link rates), checked against the file's node types.
    pub fn from_file_with_network(path: &Path) -> Result<(ClusterSpec, Option<crate::jobs::NetworkSpec>), SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimError::Io { path: path.display().to_string(), source })?;
        Self::parse_with_network(&text, &path.display().to_string())
    }

    /// [`ClusterSpec::from_file_with_network`] of a file's text; `source` names it in errors.
    pub fn parse_with_network(
        text: &str,
        source: &str,
    ) -> Result<(ClusterSpec, Option<crate::jobs::NetworkSpec>), SimError> {
        let file: ClusterFile = serde_saphyr::from_str(text)
            .map_err(|e| SimError::Format { source_name: source.to_string(), message: e.to_string() })?;
        let spec = ClusterSpec { api_version: file.api_version, kind: file.kind, node_types: file.node_types };
        if spec.kind != "SimCluster" || spec.api_version != crate::API_VERSION {
            return Err(SimError::Format {
                source_name: source.to_string(),
                message: format!(
                    "expected apiVersion {} kind SimCluster, found {} {}",
                    crate::API_VERSION,
                    spec.api_version,
                    spec.kind
                ),
            });
        }
        if let Some(n) = &file.network {
            n.validate(&spec)
                .map_err(|e| SimError::Format { source_name: source.to_string(), message: e.to_string() })?;
        }
        Ok((spec, file.network))
    }

    /// Build the cluster; file topologies are resolved relative to `base_dir`.
    pub fn build(&self, base_dir: Option<&Path>) -> Result<Cluster, SimError> {
        let nodes: u128 = self.node_types.iter().map(|t| t.count as u128).sum();
        if nodes > crate::MAX_NODES as u128 {
            return Err(SimError::TooLarge { what: "nodes".into(), asked: nodes, limit: crate::MAX_NODES });
        }
        let mut types = Vec::new();
        let mut nodes = Vec::new();
        for (t, spec) in self.node_types.iter().enumerate() {
            let mut topology = match spec.topology.strip_prefix("builtin:") {
                Some(b) => builtin_topology(b)?,
                None => {
                    let p = PathBuf::from(&spec.topology);
                    let p = match base_dir {
                        Some(d) if p.is_relative() => d.join(p),
                        _ => p,
                    };
                    read_node_file(&p)?
                }
            };
            set_node_vfs(&mut topology, spec, &format!("nodeTypes[{t}] ('{}')", spec.name))?;
            let prepared = PreparedNode::new(&topology)?;
            types.push(NodeType {
                name: spec.name.clone(),
                topology: Arc::new(topology),
                prepared: Arc::new(prepared),
            });
            for i in 0..spec.count {
                nodes.push(SimNode { name: format!("{}-{i}", spec.name), node_type: t });
            }
        }
        if nodes.is_empty() {
            return Err(SimError::EmptyCluster);
        }
        Ok(Cluster { types, nodes })
    }
}

/// A cluster file as written: [`ClusterSpec`] and the network section of job simulation.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClusterFile {
    api_version: String,
    kind: String,
    node_types: Vec<NodeTypeSpec>,
    #[serde(default)]
    network: Option<crate::jobs::NetworkSpec>,
}

/// A node type with its prepared allocator model.
#[derive(Clone, Debug)]
pub struct NodeType {
    /// Type name.
    pub name: String,
    /// Topology.
    pub topology: Arc<NodeTopology>,
    /// Allocator model.
    pub prepared: Arc<PreparedNode>,
}

/// One node.
#[derive(Clone, Debug)]
pub struct SimNode {
    /// Node name.
    pub name: String,
    /// Index into [`Cluster::types`].
    pub node_type: usize,
}

/// A built cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Node types.
    pub types: Vec<NodeType>,
    /// Nodes.
    pub nodes: Vec<SimNode>,
}

impl Cluster {
    /// Total GPUs.
    pub fn total_gpus(&self) -> usize {
        self.nodes.iter().map(|n| self.types[n.node_type].topology.gpu_count()).sum()
    }

    /// Largest GPU count of any node.
    pub fn max_node_gpus(&self) -> usize {
        self.types.iter().map(|t| t.topology.gpu_count()).max().unwrap_or(0)
    }

    /// Total SR-IOV VFs.
    pub fn total_vfs(&self) -> usize {
        self.nodes.iter().map(|n| self.types[n.node_type].topology.vfs().len()).sum()
    }
}

impl NodeType {
    /// The position of the VF at `pci_address` in the topology's VFs (sorted by address).
    pub fn vf_position(&self, pci_address: &str) -> Option<usize> {
        self.topology.vfs().binary_search_by(|v| v.pci_address.as_str().cmp(pci_address)).ok()
    }

    /// The VFs of `physnet`, as a set of positions (of the first [`MAX_VFS_PER_NODE`]).
    pub fn vf_mask(&self, physnet: &str) -> u128 {
        self.topology
            .vfs()
            .iter()
            .enumerate()
            .filter(|(i, v)| *i < MAX_VFS_PER_NODE && v.physnet.as_deref() == Some(physnet))
            .fold(0, |m, (i, _)| m | 1u128 << i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses_and_has_gpus() {
        for (name, _) in builtin_types() {
            let t = builtin_topology(name).unwrap();
            assert!(t.gpu_count() >= 4, "{name}");
            assert!(t.pcie_generation.is_some(), "{name}");
        }
        assert_eq!(builtin_topology("hgx-h100").unwrap().link(0, 7).nvlinks, 18);
        assert!(!builtin_topology("pcie-8gpu").unwrap().has_nvlink());
    }

    /// The GB200 NVL72 tray is weft-gang's, NVLink 5 included: 4 GPUs at 18 × 50 GB/s a pair.
    #[test]
    fn the_gb200_tray_is_the_gang_crates_with_nvlink5() {
        let sim = builtin_topology("gb200-nvl72-tray").unwrap();
        let gang = weft_gang::builtin::gb200_nvl72_tray().unwrap();
        assert_eq!(sim.gpu_count(), 4);
        assert_eq!(sim.nvlink_generation, Some(NvlinkGeneration::Nvlink5));
        assert_eq!(sim.pcie_generation, gang.pcie_generation);
        assert_eq!(sim.pair_bandwidth_gbps(0, 3), 900.0);
        assert_eq!(sim.ring_bandwidth(&[0, 1, 2, 3]).unwrap().gbps, gang.ring_bandwidth(&[0, 1, 2, 3]).unwrap().gbps);
    }

    #[test]
    fn embedded_default_builds() {
        let c = ClusterSpec::embedded_default().build(None).unwrap();
        assert_eq!(c.nodes.len(), 88);
        assert_eq!(c.total_gpus(), 12 * 8 + 8 * 8 + 8 * 8 + 8 * 8 + 16 * 8 + 8 * 4 + 8 * 8 + 20 * 8);
    }

    #[test]
    fn scaling_keeps_the_mix_and_hits_the_node_count() {
        let base = ClusterSpec::embedded_default();
        for n in [1, 7, 88, 500, 1000] {
            let s = base.scaled(n);
            assert_eq!(s.node_types.iter().map(|t| t.count).sum::<usize>(), n);
        }
        let s = base.scaled(176);
        for (a, b) in base.node_types.iter().zip(&s.node_types) {
            assert_eq!(b.count, 2 * a.count, "{}", a.name);
        }
    }

    fn spec(types: Vec<NodeTypeSpec>) -> ClusterSpec {
        ClusterSpec { api_version: crate::API_VERSION.into(), kind: "SimCluster".into(), node_types: types }
    }

    #[test]
    fn every_nic_offers_the_default_vfs_with_unique_addresses_in_fabric() {
        let c = ClusterSpec::embedded_default().build(None).unwrap();
        for t in &c.types {
            let vfs = t.topology.vfs();
            assert_eq!(vfs.len(), DEFAULT_VFS_PER_NIC * t.topology.nics.len(), "{}", t.name);
            assert!(vfs.windows(2).all(|w| w[0].pci_address < w[1].pci_address), "{}: sorted, unique", t.name);
            assert!(vfs.iter().all(|v| v.physnet.as_deref() == Some(DEFAULT_PHYSNET)), "{}", t.name);
            for (i, v) in vfs.iter().enumerate() {
                assert_eq!(t.vf_position(&v.pci_address), Some(i));
                let parts: Vec<&str> = v.pci_address.split([':', '.']).collect();
                assert_eq!(parts.len(), 4, "{}", v.pci_address);
                assert_eq!(parts[0], "0000");
                assert!(u8::from_str_radix(parts[1], 16).is_ok() && u8::from_str_radix(parts[2], 16).unwrap() < 32);
                assert!(parts[3].parse::<u8>().unwrap() < 8, "{}", v.pci_address);
            }
        }
        let count = |name: &str| c.types.iter().find(|t| t.name == name).unwrap().topology.vfs().len();
        assert_eq!(count("dgx-a100"), 80, "10 NICs");
        assert_eq!(count("v100-sxm2"), 8, "1 NIC");
        assert_eq!(count("pcie-8gpu"), 0, "no NICs, no VFs");
        assert_eq!(count("a100-pcie-bridges"), 0);
        // NIC k's VFs are its own: the first VF of the second NIC is 0000:11:02.0.
        let dgx = c.types.iter().find(|t| t.name == "dgx-a100").unwrap();
        let second = &dgx.topology.vfs()[DEFAULT_VFS_PER_NIC];
        assert_eq!((second.pci_address.as_str(), second.nic.as_str()), ("0000:11:02.0", "mlx5_1"));
        assert_eq!(c.total_vfs(), (12 * 4 + 8 + 8 * 10 + 8 * 4 + 8 * 2 + 8 * 8) * DEFAULT_VFS_PER_NIC);
    }

    #[test]
    fn a_node_type_sets_its_vfs_per_nic_and_physnet() {
        let c = spec(vec![
            NodeTypeSpec { vfs_per_nic: Some(0), ..NodeTypeSpec::builtin("dgx-a100", 1) },
            NodeTypeSpec {
                vfs_per_nic: Some(16),
                physnet: Some("storage".into()),
                ..NodeTypeSpec::builtin("hgx-h100", 1)
            },
        ])
        .build(None)
        .unwrap();
        assert!(c.types[0].topology.vfs().is_empty(), "vfsPerNic: 0 disables VFs");
        assert_eq!(c.types[1].topology.vfs().len(), 128);
        assert_eq!(c.types[1].vf_mask("storage"), u128::MAX);
        assert_eq!(c.types[1].vf_mask("fabric"), 0);
        // VF 15 of a NIC: device 2 + 15 / 8 = 3, function 7.
        assert_eq!(c.types[1].topology.vfs()[15].pci_address, "0000:10:03.7");
    }

    #[test]
    fn bad_vf_settings_name_the_node_type_and_field() {
        let e = spec(vec![NodeTypeSpec { vfs_per_nic: Some(13), ..NodeTypeSpec::builtin("dgx-a100", 1) }])
            .build(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodeTypes[0] ('dgx-a100').vfsPerNic") && e.contains("at most 128"), "{e}");
        let e = spec(vec![NodeTypeSpec { vfs_per_nic: Some(usize::MAX), ..NodeTypeSpec::builtin("hgx-h100", 1) }])
            .build(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("vfsPerNic"), "{e}");
        let e = spec(vec![
            NodeTypeSpec::builtin("hgx-h100", 1),
            NodeTypeSpec { physnet: Some("no/slash".into()), ..NodeTypeSpec::builtin("pcie-8gpu", 1) },
        ])
        .build(None)
        .unwrap_err()
        .to_string();
        assert!(e.contains("nodeTypes[1] ('pcie-8gpu').physnet") && e.contains("no/slash"), "{e}");
        let yaml = "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  - {name: a, topology: builtin:hgx-h100, count: 1, vfsPerNic: -1}\n";
        let path = std::env::temp_dir().join(format!("weft-sim-bad-vfs-{}.yaml", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        let e = ClusterSpec::from_file(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("line 4 column 64") && e.contains("invalid"), "the negative count is pointed at: {e}");
    }

    #[test]
    fn an_inventory_file_keeps_its_vfs_unless_the_node_type_sets_them() {
        let mut node = builtin_topology("a100-pcie-4gpu").unwrap();
        let nic = node.nics[1].name.clone();
        node.set_vfs(vec![
            Vf { pci_address: "0000:3b:02.1".into(), nic: nic.clone(), physnet: Some("rail".into()) },
            Vf { pci_address: "0000:3b:02.0".into(), nic, physnet: None },
        ])
        .unwrap();
        let path = std::env::temp_dir().join(format!("weft-sim-inventory-{}.json", std::process::id()));
        std::fs::write(&path, weft_topology::inventory::to_json(&node)).unwrap();
        let file = |vfs_per_nic| NodeTypeSpec {
            name: "lab".into(),
            topology: path.display().to_string(),
            count: 1,
            vfs_per_nic,
            physnet: None,
        };
        let kept = spec(vec![file(None)]).build(None);
        let replaced = spec(vec![file(Some(2))]).build(None);
        std::fs::remove_file(&path).unwrap();
        let kept = kept.unwrap();
        let addresses: Vec<&str> = kept.types[0].topology.vfs().iter().map(|v| v.pci_address.as_str()).collect();
        assert_eq!(addresses, ["0000:3b:02.0", "0000:3b:02.1"], "listed VFs kept, sorted by address");
        assert_eq!(kept.types[0].vf_mask("rail"), 0b10);
        assert_eq!(replaced.unwrap().types[0].topology.vfs().len(), 4, "vfsPerNic replaces them");
    }

    #[test]
    fn unknown_builtin_lists_the_known_ones() {
        let e = builtin_topology("dgx-z900").unwrap_err().to_string();
        assert!(e.contains("dgx-z900") && e.contains("hgx-h100"), "{e}");
    }
}
