//! The cluster's network: an ordered list of tiers (innermost first: a multi-node NVLink domain, a
//! leaf or rack, a spine or block, a zone) and a tree of domains, one tier per level, with the
//! whole cluster as the root tier.
//!
//! Built from node labels ([`from_labels`], with a configurable ordered list of label keys and a
//! Topograph preset), or from Volcano HyperNodes ([`crate::hypernode::from_hypernodes`]). Rails
//! (which leaf each NIC of a node reaches) are added with [`NetworkModel::set_rails`] or
//! [`NetworkModel::rails_from_labels`].
//!
//! Nodes are held in one depth-first order of the tree (a domain's own nodes by name, then its
//! child domains by name), so every domain's nodes are one contiguous range of that order: a
//! domain's free capacity is a difference of two prefix sums, and "the tightest domain that fits N
//! members" costs one pass over the nodes and one over the domains.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// GFD's multi-node NVLink clique label: `<clusterUUID>.<cliqueId>`.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
/// Topograph's switch-fabric tiers, closest first: `fabric.topograph.run/tier-0`, `-1`, ...
pub const TOPOGRAPH_TIER_PREFIX: &str = "fabric.topograph.run/tier-";
/// Topograph's accelerator-interconnect (NVLink) domain.
pub const TOPOGRAPH_DOMAIN: &str = "accelerator.topograph.run/domain";
/// Topograph's legacy (v0.5.0 and earlier) keys, top first.
pub const TOPOGRAPH_LEGACY: [&str; 4] = [
    "network.topology.nvidia.com/core",
    "network.topology.nvidia.com/spine",
    "network.topology.nvidia.com/leaf",
    "network.topology.nvidia.com/accelerator",
];
/// weft's rail labels: `rail.weft.io/<NIC name>: <leaf>` on a node says NIC `<NIC name>` reaches
/// leaf `<leaf>`.
pub const RAIL_LABEL_PREFIX: &str = "rail.weft.io/";
/// The name of the root tier, the whole cluster (Volcano's virtual `<cluster-top-hypernode>`).
pub const ROOT_TIER: &str = "cluster";

/// A node as the model needs it: its name and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl ClusterNode {
    /// A node with these labels.
    pub fn new(name: &str, labels: &[(&str, &str)]) -> ClusterNode {
        ClusterNode {
            name: name.to_string(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }
}

/// One tier of the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tier {
    /// Its name: the label key of a label level, the HyperNodes' `tierName` (else `tier<N>`), or
    /// [`ROOT_TIER`].
    pub name: String,
    /// Its number as Volcano counts tiers (higher is farther): a HyperNode's `spec.tier`; for
    /// label levels 1 for the innermost level, 2 for the next; the root is one above the highest.
    pub number: u32,
}

/// One domain: a clique, a leaf, a spine, ..., or the whole cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// Its name: the label value, or the HyperNode's name; [`ROOT_TIER`] for the root.
    pub name: String,
    /// Index of its tier in [`NetworkModel::tiers`].
    pub tier: usize,
    /// The domain it sits in (None for the root).
    pub parent: Option<usize>,
    /// Its child domains, by name.
    pub children: Vec<usize>,
    /// Its nodes (with every descendant's), as positions in [`NetworkModel::order`].
    pub nodes: Range<usize>,
    /// The nodes directly in it (in no child domain): the first positions of `nodes`.
    pub direct: Range<usize>,
}

/// One level of a label-built network, top first as Kueue's `Topology.spec.levels` and KAI take them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LevelSpec {
    /// The label keys that give a node's domain at this level; the first one a node carries wins
    /// (Topograph's `accelerator.topograph.run/domain`, else GFD's `nvidia.com/gpu.clique`).
    pub keys: Vec<String>,
    /// A node without any of the keys is in no domain of this tier (it sits directly in its domain
    /// of the tier above). Otherwise such a node is an error.
    #[serde(default)]
    pub optional: bool,
}

impl LevelSpec {
    /// A required level of one key.
    pub fn required(key: &str) -> LevelSpec {
        LevelSpec { keys: vec![key.to_string()], optional: false }
    }

    /// An optional level of these keys (first present wins).
    pub fn optional(keys: &[&str]) -> LevelSpec {
        LevelSpec { keys: keys.iter().map(|k| k.to_string()).collect(), optional: true }
    }
}

/// The ordered list of label levels, top (broadest) first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelLevels {
    /// Levels, top first.
    pub levels: Vec<LevelSpec>,
}

impl LabelLevels {
    /// Required levels of these keys, top first (Kueue's `levels[].nodeLabel` order).
    pub fn new(keys: &[&str]) -> LabelLevels {
        LabelLevels { levels: keys.iter().map(|k| LevelSpec::required(k)).collect() }
    }

    /// These levels with GFD's clique label as an optional innermost level: nodes in a multi-node
    /// NVLink domain carry it, others do not.
    pub fn with_clique(mut self) -> LabelLevels {
        self.levels.push(LevelSpec::optional(&[CLIQUE_LABEL]));
        self
    }

    /// Topograph's labels (v1.0.0 and later) with `depth` fabric tiers: `fabric.topograph.run/tier-
    /// <depth-1>` .. `tier-0` (closest-first in Topograph's numbering, so top first here), then the
    /// accelerator domain as an optional innermost level, read from `accelerator.topograph.run/
    /// domain`, else from `nvidia.com/gpu.clique` (Topograph's `acceleratorDomainSourceLabel`
    /// setting leaves its own label out in favour of GFD's).
    pub fn topograph(depth: usize) -> LabelLevels {
        let mut levels: Vec<LevelSpec> =
            (0..depth).rev().map(|i| LevelSpec::required(&format!("{TOPOGRAPH_TIER_PREFIX}{i}"))).collect();
        levels.push(LevelSpec::optional(&[TOPOGRAPH_DOMAIN, CLIQUE_LABEL]));
        LabelLevels { levels }
    }

    /// [`LabelLevels::topograph`] with the depth the nodes carry: the highest `tier-N` any node has,
    /// plus one.
    pub fn topograph_for(nodes: &[ClusterNode]) -> LabelLevels {
        let depth = nodes
            .iter()
            .flat_map(|n| n.labels.keys())
            .filter_map(|k| k.strip_prefix(TOPOGRAPH_TIER_PREFIX)?.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1);
        LabelLevels::topograph(depth)
    }

    /// Topograph's legacy labels (v0.5.0 and earlier): core, spine, leaf required; the accelerator
    /// optional, else the GPU clique (the legacy scheme left its label out when GFD's was there).
    pub fn topograph_legacy() -> LabelLevels {
        let mut levels: Vec<LevelSpec> = TOPOGRAPH_LEGACY[..3].iter().map(|k| LevelSpec::required(k)).collect();
        levels.push(LevelSpec::optional(&[TOPOGRAPH_LEGACY[3], CLIQUE_LABEL]));
        LabelLevels { levels }
    }
}

/// Which leaf each NIC of a node reaches: `nodes: {<node>: {<NIC name>: <leaf>}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RailConfig {
    /// Node → NIC name (as the node's topology names it, `mlx5_0`) → leaf switch.
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
}

/// A domain as [`NetworkModel::describe`] shows it: comparable between models built differently.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DomainView {
    /// The tier's number.
    pub tier: u32,
    /// The domain's name.
    pub name: String,
    /// Its parent's name (None for the root).
    pub parent: Option<String>,
    /// Every node in it, by name.
    pub nodes: Vec<String>,
}

/// The cluster's network model. Build it with [`from_labels`] or
/// [`crate::hypernode::from_hypernodes`]; it is read-only afterwards except for rails.
#[derive(Clone, Debug)]
pub struct NetworkModel {
    tiers: Vec<Tier>,
    domains: Vec<Domain>,
    by_tier: Vec<Vec<usize>>,
    names: Vec<String>,
    index: FxHashMap<String, usize>,
    order: Vec<usize>,
    position: Vec<usize>,
    lowest: Vec<usize>,
    rails: Vec<BTreeMap<String, String>>,
    warnings: Vec<String>,
}

impl NetworkModel {
    /// Tiers, innermost first; the last is the root ([`ROOT_TIER`]).
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Every domain; the root is [`NetworkModel::root`].
    pub fn domains(&self) -> &[Domain] {
        &self.domains
    }

    /// The root domain's index (the whole cluster).
    pub fn root(&self) -> usize {
        0
    }

    /// The domains of tier `tier`, by name.
    pub fn tier_domains(&self, tier: usize) -> &[usize] {
        self.by_tier.get(tier).map_or(&[], Vec::as_slice)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.names.len()
    }

    /// A node's name.
    pub fn node_name(&self, node: usize) -> &str {
        &self.names[node]
    }

    /// A node's index, by name.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Nodes in depth-first order (every domain is a range of it).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// A node's position in [`NetworkModel::order`].
    pub fn position(&self, node: usize) -> usize {
        self.position[node]
    }

    /// The innermost domain a node is in (the root when it is in no other).
    pub fn lowest_domain(&self, node: usize) -> usize {
        self.lowest[node]
    }

    /// The nodes of a domain.
    pub fn domain_nodes(&self, domain: usize) -> &[usize] {
        &self.order[self.domains[domain].nodes.clone()]
    }

    /// The leaf a node's NIC reaches, when the rails say.
    pub fn rail(&self, node: usize, nic: &str) -> Option<&str> {
        self.rails.get(node)?.get(nic).map(String::as_str)
    }

    /// Whether any node has rails.
    pub fn has_rails(&self) -> bool {
        self.rails.iter().any(|r| !r.is_empty())
    }

    /// What the build skipped, as Volcano does (a member HyperNode or node that does not exist).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tier whose name is `name`.
    pub fn tier_by_name(&self, name: &str) -> Option<usize> {
        self.tiers.iter().position(|t| t.name == name)
    }

    /// The tier a constraint names: by number, the highest tier numbered at most it (Volcano's
    /// `highestTierAllowed`; None when every tier is numbered above it); by name, that tier.
    pub fn tier_index(&self, tier: &crate::TierRef) -> Option<usize> {
        match tier {
            crate::TierRef::Number(n) => self.tiers.iter().rposition(|t| t.number <= *n),
            crate::TierRef::Name(name) => self.tier_by_name(name),
        }
    }

    /// The innermost domain holding every one of `nodes` (model node indexes; the root when they
    /// share no other); None when `nodes` is empty.
    pub fn common_domain(&self, nodes: &[usize]) -> Option<usize> {
        let (&first, rest) = nodes.split_first()?;
        let mut d = self.lowest_domain(first);
        for &n in rest {
            let p = self.position(n);
            while !self.domains[d].nodes.contains(&p) {
                match self.domains[d].parent {
                    Some(up) => d = up,
                    None => break,
                }
            }
        }
        Some(d)
    }

    /// Tiers as `1 (nvidia.com/gpu.clique), 2 (leaf), 3 (cluster)`.
    pub fn tiers_text(&self) -> String {
        self.tiers.iter().map(|t| format!("{} ({})", t.number, t.name)).collect::<Vec<_>>().join(", ")
    }

    /// Every domain with its tier number, parent and nodes, sorted: two models of one cluster are
    /// the same tree when their descriptions are equal.
    pub fn describe(&self) -> Vec<DomainView> {
        let mut v: Vec<DomainView> = self
            .domains
            .iter()
            .map(|d| {
                let mut nodes: Vec<String> = self.domain_nodes_of(d).map(|n| self.names[n].clone()).collect();
                nodes.sort();
                DomainView {
                    tier: self.tiers[d.tier].number,
                    name: d.name.clone(),
                    parent: d.parent.map(|p| self.domains[p].name.clone()),
                    nodes,
                }
            })
            .collect();
        v.sort();
        v
    }

    fn domain_nodes_of<'a>(&'a self, d: &Domain) -> impl Iterator<Item = usize> + 'a {
        self.order[d.nodes.clone()].iter().copied()
    }

    /// Set rails from a config. Every node it names must be in the model; NIC and leaf names must
    /// not be empty. Replaces the rails of the nodes it names.
    pub fn set_rails(&mut self, cfg: &RailConfig) -> Result<(), ModelError> {
        for (node, nics) in &cfg.nodes {
            let i = self.node_index(node).ok_or_else(|| ModelError::Rail {
                node: node.clone(),
                message: "not a node of the network model".into(),
            })?;
            for (nic, leaf) in nics {
                if nic.is_empty() || leaf.is_empty() {
                    return Err(ModelError::Rail {
                        node: node.clone(),
                        message: format!("NIC `{nic}` → leaf `{leaf}`: neither may be empty"),
                    });
                }
            }
            self.rails[i] = nics.clone();
        }
        Ok(())
    }

    /// Set rails from weft's rail labels (`rail.weft.io/<NIC name>: <leaf>`) on the nodes given;
    /// nodes the model does not have are an error, nodes without rail labels keep what they had.
    pub fn rails_from_labels(&mut self, nodes: &[ClusterNode]) -> Result<(), ModelError> {
        let mut cfg = RailConfig::default();
        for n in nodes {
            let rails: BTreeMap<String, String> = n
                .labels
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(RAIL_LABEL_PREFIX)?.to_string(), v.clone())))
                .collect();
            if !rails.is_empty() {
                cfg.nodes.insert(n.name.clone(), rails);
            }
        }
        self.set_rails(&cfg)
    }
}

/// What both builders produce: tiers (innermost first, without the root), domains with their tier
/// and parent, and each node's innermost domain.
pub(crate) struct Skeleton {
    pub tiers: Vec<Tier>,
    /// (name, tier index, parent domain).
    pub domains: Vec<(String, usize, Option<usize>)>,
    pub nodes: Vec<String>,
    pub node_domain: Vec<Option<usize>>,
    pub warnings: Vec<String>,
}

impl Skeleton {
    /// The model: the root added above every parentless domain and node, the depth-first order.
    pub fn finish(self) -> Result<NetworkModel, ModelError> {
        let Skeleton { mut tiers, domains: raw, nodes: names, node_domain, warnings } = self;
        let root_tier = tiers.len();
        let root_number = tiers.iter().map(|t| t.number).max().map_or(1, |m| m.saturating_add(1));
        tiers.push(Tier { name: ROOT_TIER.to_string(), number: root_number });
        // Domain i of the skeleton is i + 1 here; 0 is the root.
        let mut domains: Vec<Domain> = Vec::with_capacity(raw.len() + 1);
        domains.push(Domain {
            name: ROOT_TIER.to_string(),
            tier: root_tier,
            parent: None,
            children: Vec::new(),
            nodes: 0..0,
            direct: 0..0,
        });
        for (name, tier, parent) in &raw {
            domains.push(Domain {
                name: name.clone(),
                tier: *tier,
                parent: Some(parent.map_or(0, |p| p + 1)),
                children: Vec::new(),
                nodes: 0..0,
                direct: 0..0,
            });
        }
        for d in 1..domains.len() {
            if let Some(p) = domains[d].parent {
                domains[p].children.push(d);
            }
        }
        let mut direct: Vec<Vec<usize>> = vec![Vec::new(); domains.len()];
        for (n, d) in node_domain.iter().enumerate() {
            direct[d.map_or(0, |d| d + 1)].push(n);
        }
        for list in &mut direct {
            list.sort_by(|&a, &b| names[a].cmp(&names[b]));
        }
        for d in 0..domains.len() {
            let mut children = std::mem::take(&mut domains[d].children);
            children.sort_by(|&a, &b| domains[a].name.cmp(&domains[b].name).then(a.cmp(&b)));
            domains[d].children = children;
        }
        // Depth-first, iteratively: (domain, next child to visit).
        let mut order = Vec::with_capacity(names.len());
        let mut visited = vec![false; domains.len()];
        let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
        visited[0] = true;
        domains[0].nodes.start = 0;
        order.extend(direct[0].iter().copied());
        domains[0].direct = 0..order.len();
        while let Some(top) = stack.last_mut() {
            let (d, next) = *top;
            if let Some(&c) = domains[d].children.get(next) {
                top.1 += 1;
                visited[c] = true;
                let start = order.len();
                order.extend(direct[c].iter().copied());
                domains[c].nodes.start = start;
                domains[c].direct = start..order.len();
                stack.push((c, 0));
            } else {
                domains[d].nodes.end = order.len();
                stack.pop();
            }
        }
        if let Some(d) = visited.iter().position(|v| !v) {
            return Err(ModelError::HyperNodeCycle {
                chain: format!("`{}` is not reachable from the root", domains[d].name),
            });
        }
        let mut position = vec![0; names.len()];
        for (p, &n) in order.iter().enumerate() {
            position[n] = p;
        }
        let mut by_tier: Vec<Vec<usize>> = vec![Vec::new(); tiers.len()];
        for (i, d) in domains.iter().enumerate() {
            by_tier[d.tier].push(i);
        }
        for list in &mut by_tier {
            list.sort_by(|&a, &b| domains[a].name.cmp(&domains[b].name).then(a.cmp(&b)));
        }
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        let lowest = node_domain.iter().map(|d| d.map_or(0, |d| d + 1)).collect();
        let rails = vec![BTreeMap::new(); names.len()];
        Ok(NetworkModel { tiers, domains, by_tier, names, index, order, position, lowest, rails, warnings })
    }
}

/// Build the model from node labels: `levels` top first (as Kueue's `Topology.spec.levels`), each
/// node's domain at a level is its label value there.
///
/// A domain is identified by (level, value): the value names one switch or domain cluster-wide,
/// as Topograph writes them. A value seen under two different parents is an error (it names both
/// nodes), and so is a node without a required level's label. Nodes without an optional level's
/// label sit directly in their domain of the level above. Values of `nvidia.com/gpu.clique` must
/// be GFD's `<clusterUUID>.<cliqueId>`.
pub fn from_labels(levels: &LabelLevels, nodes: &[ClusterNode]) -> Result<NetworkModel, ModelError> {
    let mut seen_keys = BTreeSet::new();
    for (i, l) in levels.levels.iter().enumerate() {
        if l.keys.is_empty() {
            return Err(ModelError::EmptyLevel { index: i });
        }
        for k in &l.keys {
            if !seen_keys.insert(k.as_str()) {
                return Err(ModelError::DuplicateLevel { key: k.clone() });
            }
        }
    }
    let k = levels.levels.len();
    // Tier index of level i (top first) is k - 1 - i.
    let tiers: Vec<Tier> =
        (0..k).map(|t| Tier { name: levels.levels[k - 1 - t].keys[0].clone(), number: t as u32 + 1 }).collect();
    let mut names = Vec::with_capacity(nodes.len());
    let mut seen_nodes: FxHashMap<&str, ()> = FxHashMap::default();
    // (level, value) → skeleton domain index; per domain: (parent, node where the parent was seen).
    let mut ids: FxHashMap<(usize, &str), usize> = FxHashMap::default();
    let mut domains: Vec<(String, usize, Option<usize>)> = Vec::new();
    let mut seen_at: Vec<usize> = Vec::new();
    let mut node_domain = Vec::with_capacity(nodes.len());
    for (ni, node) in nodes.iter().enumerate() {
        if seen_nodes.insert(node.name.as_str(), ()).is_some() {
            return Err(ModelError::DuplicateNode { name: node.name.clone() });
        }
        names.push(node.name.clone());
        let mut parent: Option<usize> = None;
        for (li, level) in levels.levels.iter().enumerate() {
            let found = level.keys.iter().find_map(|key| node.labels.get(key).map(|v| (key, v)));
            let Some((key, value)) = found else {
                if level.optional {
                    continue;
                }
                return Err(ModelError::MissingLabel { node: node.name.clone(), key: level.keys[0].clone() });
            };
            if key == CLIQUE_LABEL && !is_clique(value) {
                return Err(ModelError::BadClique { node: node.name.clone(), key: key.clone(), value: value.clone() });
            }
            let d = match ids.get(&(li, value.as_str())) {
                Some(&d) => {
                    if domains[d].2 != parent {
                        let show = |p: Option<usize>| p.map_or("(none)".to_string(), |p| domains[p].0.clone());
                        return Err(ModelError::TwoParents {
                            tier: level.keys[0].clone(),
                            domain: value.clone(),
                            first: format!("`{}` (node `{}`)", show(domains[d].2), nodes[seen_at[d]].name),
                            second: format!("`{}` (node `{}`)", show(parent), node.name),
                        });
                    }
                    d
                }
                None => {
                    let d = domains.len();
                    domains.push((value.clone(), k - 1 - li, parent));
                    seen_at.push(ni);
                    ids.insert((li, value.as_str()), d);
                    d
                }
            };
            parent = Some(d);
        }
        node_domain.push(parent);
    }
    Skeleton { tiers, domains, nodes: names, node_domain, warnings: Vec::new() }.finish()
}

/// Whether `v` is GFD's clique value: a canonical UUID, a dot, a decimal clique id.
pub fn is_clique(v: &str) -> bool {
    let Some((uuid, id)) = v.rsplit_once('.') else { return false };
    let groups: Vec<&str> = uuid.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    groups.len() == 5
        && groups.iter().zip(lens).all(|(g, l)| g.len() == l && g.bytes().all(|b| b.is_ascii_hexdigit()))
        && !id.is_empty()
        && id.len() <= 10
        && id.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn clique_values_follow_gfd() {
        assert!(is_clique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"));
        assert!(is_clique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31.4294967295"));
        assert!(!is_clique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31"));
        assert!(!is_clique("7b968a6d-c8aa-45e1-9e07.1"));
        assert!(!is_clique("7b968a6d-c8aa-45e1-9e07-e1e51be99c3z.1"));
        assert!(!is_clique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31.x"));
    }

    #[test]
    fn topograph_preset_reads_the_depth_the_nodes_carry() {
        let nodes =
            [ClusterNode::new("a", &[("fabric.topograph.run/tier-0", "l1"), ("fabric.topograph.run/tier-2", "z")])];
        let l = LabelLevels::topograph_for(&nodes);
        let keys: Vec<&str> = l.levels.iter().map(|l| l.keys[0].as_str()).collect();
        assert_eq!(
            keys,
            [
                "fabric.topograph.run/tier-2",
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-0",
                "accelerator.topograph.run/domain"
            ]
        );
        assert!(l.levels[3].optional && l.levels[3].keys[1] == CLIQUE_LABEL);
    }
}
