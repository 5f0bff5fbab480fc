//! The simulated cluster's network: leaves, spines and multi-node NVLink domains (GPU cliques)
//! described per node type in a cluster file's `network:` section, turned into node labels and fed
//! to [`weft_gang::from_labels`], plus the link rates that give a job's estimated collective
//! bandwidth (its slowest hop).
//!
//! ```yaml
//! network:
//!   nicGbps: 50                # GB/s per direction of each GPU's NIC (400 Gb/s)
//!   spineOversubscription: 2   # leaf uplinks: traffic between leaves gets nicGbps / 2
//!   coreOversubscription: 2    # spine uplinks: traffic between spines gets nicGbps / (2 × 2)
//!   leavesPerSpine: 8
//!   groups:
//!     - {nodeType: nvl72, nodesPerLeaf: 36, nodesPerNvlinkDomain: 18, nvlinkDomainGbps: 900}
//!     - {nodeType: h100, nodesPerLeaf: 32}
//! ```
//!
//! Nodes of each type are cut, in order, into leaves of `nodesPerLeaf` (a type's last leaf may be
//! short), and leaves, in order over all types, into spines of `leavesPerSpine`. A type with
//! `nodesPerNvlinkDomain` has its leaves cut into NVLink domains of that many nodes (a multiple of
//! it per leaf, so a domain never spans two leaves), each one GPU clique
//! (`nvidia.com/gpu.clique: <uuid>.1`, GFD's format). A node type the section does not list gets
//! leaves of [`DEFAULT_NODES_PER_LEAF`] and no NVLink domain, except the built-in
//! `gb200-nvl72-tray`, whose default is its rack: [`weft_gang::builtin::NVL72_TRAYS`] trays per
//! domain, two domains per leaf.

use serde::{Deserialize, Serialize};
use weft_gang::{ClusterNode, LabelLevels, NetworkModel, from_labels};

use crate::SimError;
use crate::cluster::{Cluster, ClusterSpec};

/// The spine label the simulator writes.
pub const SPINE_LABEL: &str = "sim.weft.io/spine";
/// The leaf label the simulator writes.
pub const LEAF_LABEL: &str = "sim.weft.io/leaf";
/// GFD's multi-node NVLink domain label.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
/// Leaf size of a node type the network section does not list.
pub const DEFAULT_NODES_PER_LEAF: usize = 32;

fn default_nic() -> f64 {
    50.0
}
fn one() -> f64 {
    1.0
}
fn default_leaves_per_spine() -> usize {
    8
}

/// A cluster file's `network:` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSpec {
    /// GB/s per direction of the NIC each GPU sends through (rail-optimised: one NIC per GPU).
    #[serde(default = "default_nic")]
    pub nic_gbps: f64,
    /// Leaf downlink : uplink ratio; traffic between two leaves of a spine gets `nicGbps / this`.
    #[serde(default = "one")]
    pub spine_oversubscription: f64,
    /// Spine downlink : uplink ratio; traffic between spines gets
    /// `nicGbps / (spineOversubscription × this)`.
    #[serde(default = "one")]
    pub core_oversubscription: f64,
    /// Leaves under one spine.
    #[serde(default = "default_leaves_per_spine")]
    pub leaves_per_spine: usize,
    /// Per node type: leaf size and NVLink domains.
    #[serde(default)]
    pub groups: Vec<GroupNetwork>,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        NetworkSpec {
            nic_gbps: default_nic(),
            spine_oversubscription: 1.0,
            core_oversubscription: 1.0,
            leaves_per_spine: default_leaves_per_spine(),
            groups: Vec::new(),
        }
    }
}

/// The network of one node type's nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupNetwork {
    /// A `nodeTypes[].name` of the cluster file.
    pub node_type: String,
    /// Nodes per leaf switch.
    pub nodes_per_leaf: usize,
    /// Nodes per multi-node NVLink domain (18 for GB200 NVL72); none: no such domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_per_nvlink_domain: Option<usize>,
    /// GB/s per direction between two GPUs of the domain on different nodes; default: the node
    /// type's own NVLink pair bandwidth (GPU 0 to GPU 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain_gbps: Option<f64>,
}

/// A cluster with its network: the gang model (tiers clique < leaf < spine < cluster, node i of the
/// model is node i of the cluster) and the link rates.
#[derive(Clone, Debug)]
pub struct NetCluster {
    /// The nodes.
    pub cluster: Cluster,
    /// The network model.
    pub model: NetworkModel,
    /// The section it was built from.
    pub spec: NetworkSpec,
    /// Per node: the GB/s of its NVLink domain (0 when it is in none).
    pub domain_gbps: Vec<f64>,
    /// Tier index of the NVLink domain (clique) tier, when some node has one.
    pub clique_tier: Option<usize>,
    /// Tier index of the leaf tier.
    pub leaf_tier: usize,
    /// Tier index of the spine tier.
    pub spine_tier: usize,
}

fn bad(message: String) -> SimError {
    SimError::Format { source_name: "cluster network".into(), message }
}

/// The group of node type `name`: the section's, else the default.
fn group_for(spec: &NetworkSpec, types: &ClusterSpec, t: usize) -> GroupNetwork {
    let ty = &types.node_types[t];
    if let Some(g) = spec.groups.iter().find(|g| g.node_type == ty.name) {
        return g.clone();
    }
    if ty.topology == format!("builtin:{}", weft_gang::builtin::GB200_NVL72_TRAY) {
        return GroupNetwork {
            node_type: ty.name.clone(),
            nodes_per_leaf: 2 * weft_gang::builtin::NVL72_TRAYS,
            nodes_per_nvlink_domain: Some(weft_gang::builtin::NVL72_TRAYS),
            nvlink_domain_gbps: None,
        };
    }
    GroupNetwork {
        node_type: ty.name.clone(),
        nodes_per_leaf: DEFAULT_NODES_PER_LEAF,
        nodes_per_nvlink_domain: None,
        nvlink_domain_gbps: None,
    }
}

/// A synthetic GFD clique value for NVLink domain `i`: a canonical UUID, `.1`.
pub fn clique_value(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}.1")
}

impl NetworkSpec {
    /// Check the section against the cluster file's node types: every rate positive and finite,
    /// sizes ≥ 1, a group per listed type at most once and naming a type the file has, leaves a
    /// multiple of the NVLink domain.
    pub fn validate(&self, types: &ClusterSpec) -> Result<(), SimError> {
        for (name, v) in [
            ("nicGbps", self.nic_gbps),
            ("spineOversubscription", self.spine_oversubscription),
            ("coreOversubscription", self.core_oversubscription),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(format!("network.{name}: {v} is not a positive number")));
            }
        }
        if self.spine_oversubscription < 1.0 || self.core_oversubscription < 1.0 {
            return Err(bad("network: an oversubscription is a ratio ≥ 1 (1: non-blocking)".into()));
        }
        if self.leaves_per_spine == 0 {
            return Err(bad("network.leavesPerSpine: must be at least 1".into()));
        }
        for (i, g) in self.groups.iter().enumerate() {
            let at = format!("network.groups[{i}] ('{}')", g.node_type);
            if !types.node_types.iter().any(|t| t.name == g.node_type) {
                let known: Vec<&str> = types.node_types.iter().map(|t| t.name.as_str()).collect();
                return Err(bad(format!(
                    "{at}.nodeType: no node type of that name; the file has {}",
                    known.join(", ")
                )));
            }
            if self.groups[..i].iter().any(|o| o.node_type == g.node_type) {
                return Err(bad(format!("{at}: the node type is listed twice")));
            }
            if g.nodes_per_leaf == 0 {
                return Err(bad(format!("{at}.nodesPerLeaf: must be at least 1")));
            }
            if let Some(d) = g.nodes_per_nvlink_domain
                && (d == 0 || !g.nodes_per_leaf.is_multiple_of(d))
            {
                return Err(bad(format!(
                    "{at}.nodesPerNvlinkDomain: {d} must be ≥ 1 and divide nodesPerLeaf ({}): an NVLink domain \
                     sits under one leaf",
                    g.nodes_per_leaf
                )));
            }
            if let Some(v) = g.nvlink_domain_gbps
                && !(v.is_finite() && v > 0.0)
            {
                return Err(bad(format!("{at}.nvlinkDomainGbps: {v} is not a positive number")));
            }
            if g.nvlink_domain_gbps.is_some() && g.nodes_per_nvlink_domain.is_none() {
                return Err(bad(format!("{at}.nvlinkDomainGbps: given without nodesPerNvlinkDomain")));
            }
        }
        Ok(())
    }

    /// Each node's labels (cluster order): its spine, its leaf and, in an NVLink domain, its clique.
    pub fn labels(&self, types: &ClusterSpec, cluster: &Cluster) -> Vec<ClusterNode> {
        let mut out = Vec::with_capacity(cluster.nodes.len());
        let (mut leaf, mut clique) = (0usize, 0usize);
        let mut first = 0usize;
        for (t, ty) in types.node_types.iter().enumerate() {
            let g = group_for(self, types, t);
            for i in 0..ty.count {
                let node = &cluster.nodes[first + i];
                let l = leaf + i / g.nodes_per_leaf;
                let mut labels = vec![
                    (SPINE_LABEL.to_string(), format!("spine-{}", l / self.leaves_per_spine)),
                    (LEAF_LABEL.to_string(), format!("leaf-{l}")),
                ];
                if let Some(d) = g.nodes_per_nvlink_domain {
                    labels.push((CLIQUE_LABEL.to_string(), clique_value(clique + i / d)));
                }
                out.push(ClusterNode { name: node.name.clone(), labels: labels.into_iter().collect() });
            }
            leaf += ty.count.div_ceil(g.nodes_per_leaf);
            if let Some(d) = g.nodes_per_nvlink_domain {
                clique += ty.count.div_ceil(d);
            }
            first += ty.count;
        }
        out
    }

    /// Build the cluster and its network.
    pub fn build(&self, types: &ClusterSpec, base_dir: Option<&std::path::Path>) -> Result<NetCluster, SimError> {
        self.validate(types)?;
        let cluster = types.build(base_dir)?;
        let labels = self.labels(types, &cluster);
        let with_clique = labels.iter().any(|n| n.labels.contains_key(CLIQUE_LABEL));
        let mut levels = LabelLevels::new(&[SPINE_LABEL, LEAF_LABEL]);
        if with_clique {
            levels = levels.with_clique();
        }
        let model = from_labels(&levels, &labels).map_err(|e| bad(e.to_string()))?;
        let mut domain_gbps = vec![0.0; cluster.nodes.len()];
        let mut first = 0usize;
        for (t, ty) in types.node_types.iter().enumerate() {
            let g = group_for(self, types, t);
            if g.nodes_per_nvlink_domain.is_some() {
                let topo = &cluster.types[t].topology;
                let own = if topo.gpu_count() >= 2 { topo.pair_bandwidth_gbps(0, 1) } else { 0.0 };
                let gbps = g.nvlink_domain_gbps.unwrap_or(own);
                domain_gbps[first..first + ty.count].fill(gbps);
            }
            first += ty.count;
        }
        let tier = |name: &str| model.tier_by_name(name);
        let leaf_tier = tier(LEAF_LABEL).ok_or_else(|| bad("no leaf tier".into()))?;
        let spine_tier = tier(SPINE_LABEL).ok_or_else(|| bad("no spine tier".into()))?;
        Ok(NetCluster {
            clique_tier: tier(CLIQUE_LABEL),
            leaf_tier,
            spine_tier,
            cluster,
            model,
            spec: self.clone(),
            domain_gbps,
        })
    }
}

impl NetCluster {
    /// The innermost domain holding every node of `nodes` (model node indexes; the root for none).
    pub fn common_domain(&self, nodes: &[usize]) -> usize {
        self.model.common_domain(nodes).unwrap_or_else(|| self.model.root())
    }

    /// The node's domain at tier `tier`, when it is in one.
    pub fn domain_at(&self, node: usize, tier: usize) -> Option<usize> {
        let mut d = Some(self.model.lowest_domain(node));
        while let Some(x) = d {
            let dt = self.model.domains()[x].tier;
            if dt == tier {
                return Some(x);
            }
            if dt > tier {
                return None;
            }
            d = self.model.domains()[x].parent;
        }
        None
    }

    /// GB/s per direction between GPUs of two different nodes whose innermost common domain is
    /// `domain`: the NVLink domain's rate inside a clique; the NIC inside a leaf; the NIC over the
    /// spine's oversubscription inside a spine; over both oversubscriptions across spines.
    pub fn hop_gbps(&self, domain: usize, any_node: usize) -> f64 {
        let tier = self.model.domains()[domain].tier;
        let s = &self.spec;
        if Some(tier) == self.clique_tier {
            self.domain_gbps[any_node]
        } else if tier == self.leaf_tier {
            s.nic_gbps
        } else if tier == self.spine_tier {
            s.nic_gbps / s.spine_oversubscription
        } else {
            s.nic_gbps / (s.spine_oversubscription * s.core_oversubscription)
        }
    }
}
