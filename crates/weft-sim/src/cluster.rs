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
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weft_alloc::PreparedNode;
use weft_topology::{NodeTopology, PcieGeneration, parse_node, read_node_file};

use crate::SimError;

/// A built-in node type: name, description, `topo -m` text, and product hints the text lacks.
struct Builtin {
    name: &'static str,
    description: &'static str,
    text: &'static str,
    pcie_generation: Option<u8>,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "dgx1-v100",
        description: "DGX-1 V100, hybrid cube-mesh NVLink (NV1/NV2), 4 mlx5 NICs",
        text: include_str!("../topologies/dgx1-v100-mlx5-columns.txt"),
        pcie_generation: Some(3),
    },
    Builtin {
        name: "v100-sxm2",
        description: "8x V100-SXM2, cube-mesh NVLink, 1 NIC",
        text: include_str!("../topologies/v100-sxm2-nic-legend.txt"),
        pcie_generation: Some(3),
    },
    Builtin {
        name: "dgx-a100",
        description: "DGX A100, NVSwitch (NV12 all pairs), 10 NICs, 4 NUMA nodes",
        text: include_str!("../topologies/dgx-a100-nvswitch-10nic.txt"),
        pcie_generation: Some(4),
    },
    Builtin {
        name: "hgx-a100",
        description: "HGX A100 8-GPU, NVSwitch (NV12 all pairs), 4 NICs",
        text: include_str!("../topologies/a100-nvswitch-4nic-gpu-numa-id.txt"),
        pcie_generation: Some(4),
    },
    Builtin {
        name: "a100-pcie-bridges",
        description: "8x A100 PCIe, NVLink bridges in pairs (NV12), SYS otherwise",
        text: include_str!("../topologies/a100-pcie-nvlink-bridges.txt"),
        pcie_generation: Some(4),
    },
    Builtin {
        name: "a100-pcie-4gpu",
        description: "4x A100 PCIe, one NVLink-bridged pair, 2 NICs",
        text: include_str!("../topologies/a100-pcie-4gpu-mlx5.txt"),
        pcie_generation: Some(4),
    },
    Builtin {
        name: "hgx-h100",
        description: "HGX H100 8-GPU, NVSwitch (NV18 all pairs), 8 NICs (synthetic)",
        text: include_str!("../topologies/hgx-h100-nv18-8nic.txt"),
        pcie_generation: Some(5),
    },
    Builtin {
        name: "pcie-8gpu",
        description: "8 PCIe GPUs, no NVLink, pairs behind one switch, two sockets (synthetic)",
        text: include_str!("../topologies/pcie-8gpu-2socket.txt"),
        pcie_generation: Some(4),
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
    Ok(node)
}

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
            node_types: counts
                .iter()
                .map(|(n, c)| NodeTypeSpec { name: n.to_string(), topology: format!("builtin:{n}"), count: *c })
                .collect(),
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

    /// Read a cluster file (YAML or JSON).
    pub fn from_file(path: &Path) -> Result<ClusterSpec, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimError::Io { path: path.display().to_string(), source })?;
        let spec: ClusterSpec = serde_saphyr::from_str(&text)
            .map_err(|e| SimError::Format { source_name: path.display().to_string(), message: e.to_string() })?;
        if spec.kind != "SimCluster" || spec.api_version != crate::API_VERSION {
            return Err(SimError::Format {
                source_name: path.display().to_string(),
                message: format!(
                    "expected apiVersion {} kind SimCluster, found {} {}",
                    crate::API_VERSION,
                    spec.api_version,
                    spec.kind
                ),
            });
        }
        Ok(spec)
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
            let topology = match spec.topology.strip_prefix("builtin:") {
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

    #[test]
    fn unknown_builtin_lists_the_known_ones() {
        let e = builtin_topology("dgx-z900").unwrap_err().to_string();
        assert!(e.contains("dgx-z900") && e.contains("hgx-h100"), "{e}");
    }
}
