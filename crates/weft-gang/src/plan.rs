//! The gang decision: the tightest domain that fits every member, the node per member, each
//! member's GPU set, and rail-aligned NICs when the gang asks VFs. Pure and deterministic.
//!
//! # The rule
//! 1. **Slots.** A node holds `min(⌊free GPUs / GPUs per member⌋, ⌊free VFs of p / VFs per member
//!    of p⌋ for each physnet p)` members (capped at the gang's size). A domain holds the sum over
//!    its nodes: what members of this shape can really use, not its summed free resources.
//! 2. **Domain.** Tiers are tried innermost first, up to the highest the constraint allows (hard)
//!    or the whole cluster (soft). The first tier with a domain holding every member wins. Among
//!    its domains: the fewest slots (best fit: the bigger domains stay whole for bigger gangs),
//!    then the fewest free GPUs (the least left behind), then the name.
//! 3. **Nodes.** From the chosen domain down: its child domains and own nodes are taken largest
//!    first (slots descending, then name), and the last one taken is the smallest that covers what
//!    is left (best fit), so the members span as few child domains, and at the bottom as few nodes,
//!    as possible; each chosen child is filled the same way with its share.
//! 4. **GPU sets.** Members are ranked in that order (rank 0 first; consecutive ranks share a node
//!    or the nearest domain) and each gets the caller's set ([`GpuSets::choose`], weft-alloc's
//!    ring-first choice in [`AllocSets`]) among the GPUs its node has left.
//! 5. **Rails** (when VFs are asked, or `rail_align` says so, and the model has rails): the first
//!    member's GPUs fix the rails (the leaves their NICs reach); every later member chooses among
//!    its node's GPUs on those rails, and keeps that set when its rails are the same. A member that
//!    cannot match takes its unrestricted set and the plan says `rail_aligned: false`. Each
//!    member's GPUs are listed by rail, so GPU i of every member is on one rail.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use weft_alloc::{MAX_GPUS, PreparedNode, SetQuality, choose_set};
use weft_topology::NodeTopology;

use crate::constraint::{Mode, TierConstraint, TierRef};
use crate::error::PlanError;
use crate::network::NetworkModel;

/// What a node has free: GPUs (a mask, bit i = GPU i) and VFs per physnet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFree {
    /// Free GPUs.
    pub gpus: u128,
    /// Free VFs per physnet.
    pub vfs: BTreeMap<String, u32>,
}

impl NodeFree {
    /// A node with GPUs `0..n` free and no VFs.
    pub fn all_gpus(n: usize) -> NodeFree {
        NodeFree { gpus: if n >= 128 { u128::MAX } else { (1u128 << n) - 1 }, vfs: BTreeMap::new() }
    }
}

/// A gang: `members` pods of one shape and the constraint on how far apart they may be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gang {
    /// Pods (≥ 1).
    pub members: usize,
    /// GPUs per pod (0 for a gang that asks only VFs).
    pub gpus_per_member: usize,
    /// VFs per pod, per physnet.
    pub vfs_per_member: BTreeMap<String, u32>,
    /// Hard or soft, and the highest tier.
    pub constraint: TierConstraint,
    /// Align members' GPUs on rails; None: when VFs are asked.
    pub rail_align: Option<bool>,
}

/// The caller's per-node GPU set decision (weft-alloc's, in [`AllocSets`]).
pub trait GpuSets {
    /// `count` GPUs among `available` (ascending) on node `node` (a model node index).
    fn choose(&mut self, node: usize, available: &[usize], count: usize) -> Result<Vec<usize>, String>;
    /// The NIC nearest GPU `gpu` of node `node`, by name, when the node has one.
    fn nic(&self, node: usize, gpu: usize) -> Option<&str>;
}

/// One member's place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberPlan {
    /// 0-based; consecutive ranks are neighbours.
    pub rank: usize,
    /// Node name.
    pub node: String,
    /// GPUs, by rail when the node has rails (GPU i of every member on one rail), else ascending.
    pub gpus: Vec<usize>,
    /// The NIC nearest each GPU (same order).
    pub nics: Vec<Option<String>>,
    /// The leaf each of those NICs reaches (same order).
    pub rails: Vec<Option<String>>,
}

/// A gang's plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The domain every member is in.
    pub domain: String,
    /// Its tier's name.
    pub tier: String,
    /// Its tier's number.
    pub tier_number: u32,
    /// Members, by rank.
    pub members: Vec<MemberPlan>,
    /// Distinct nodes used.
    pub nodes: usize,
    /// Whether every member's GPUs are on the first member's rails; None when not asked or when
    /// the model has no rails.
    pub rail_aligned: Option<bool>,
}

/// Plan `gang` over `model` with each node's free capacity (`free[i]` for model node i).
pub fn plan(model: &NetworkModel, free: &[NodeFree], gang: &Gang, sets: &mut dyn GpuSets) -> Result<Plan, PlanError> {
    if gang.members == 0 {
        return Err(PlanError::EmptyGang);
    }
    if gang.gpus_per_member > MAX_GPUS {
        return Err(PlanError::TooManyGpus { gpus: gang.gpus_per_member, max: MAX_GPUS });
    }
    if free.len() != model.node_count() {
        return Err(PlanError::FreeLength { got: free.len(), nodes: model.node_count() });
    }
    let limit = highest_tier(model, &gang.constraint)?;
    // Slots and free GPUs per node, and prefix sums over the depth-first order.
    let m = gang.members;
    let slots: Vec<usize> = free.iter().map(|f| node_slots(f, gang)).collect();
    let order = model.order();
    let mut slot_prefix = Vec::with_capacity(order.len() + 1);
    let mut gpu_prefix = Vec::with_capacity(order.len() + 1);
    slot_prefix.push(0usize);
    gpu_prefix.push(0usize);
    for &n in order {
        slot_prefix.push(slot_prefix.last().copied().unwrap_or(0) + slots[n]);
        gpu_prefix.push(gpu_prefix.last().copied().unwrap_or(0) + free[n].gpus.count_ones() as usize);
    }
    let domains = model.domains();
    let cap = |d: usize| slot_prefix[domains[d].nodes.end] - slot_prefix[domains[d].nodes.start];
    let gpus_in = |d: usize| gpu_prefix[domains[d].nodes.end] - gpu_prefix[domains[d].nodes.start];
    let mut chosen = None;
    if let Some(limit) = limit {
        'tiers: for t in 0..=limit {
            let mut best: Option<(usize, usize, usize)> = None;
            for &d in model.tier_domains(t) {
                let c = cap(d);
                if c < m {
                    continue;
                }
                // by_tier is in name order, so the first of equal (slots, GPUs) has the least name.
                if best.is_none_or(|(bc, bg, _)| (c, gpus_in(d)) < (bc, bg)) {
                    best = Some((c, gpus_in(d), d));
                }
            }
            if let Some((_, _, d)) = best {
                chosen = Some(d);
                break 'tiers;
            }
        }
    }
    let Some(domain) = chosen else {
        return Err(no_fit(model, gang, limit, &cap));
    };
    // Members per node.
    let mut per_node: Vec<(usize, usize)> = Vec::new();
    assign(model, domain, m, &slots, &cap, &mut per_node);
    // GPU sets.
    let align = gang.rail_align.unwrap_or(gang.vfs_per_member.values().any(|&v| v > 0))
        && gang.gpus_per_member > 0
        && model.has_rails();
    let mut target: Option<Vec<String>> = None;
    let mut aligned = true;
    let mut members = Vec::with_capacity(m);
    for &(node, count) in &per_node {
        let mut left = free[node].gpus;
        // Each free GPU's nearest NIC and that NIC's rail, by GPU index.
        let top = 128 - left.leading_zeros() as usize;
        let nics: Vec<Option<String>> = (0..top).map(|g| sets.nic(node, g).map(str::to_string)).collect();
        let rails: Vec<Option<String>> =
            nics.iter().map(|nic| nic.as_deref().and_then(|nic| model.rail(node, nic)).map(str::to_string)).collect();
        let rail_of = |g: usize| rails.get(g).cloned().flatten();
        for _ in 0..count {
            let available = mask_to_vec(left);
            let mut gpus = None;
            if gang.gpus_per_member == 0 {
                gpus = Some(Vec::new());
            } else if align && let Some(want) = &target {
                let on_rails: Vec<usize> =
                    available.iter().copied().filter(|&g| rail_of(g).is_some_and(|r| want.contains(&r))).collect();
                if on_rails.len() >= gang.gpus_per_member
                    && let Ok(set) = sets.choose(node, &on_rails, gang.gpus_per_member)
                {
                    let mut rails: Vec<String> = set.iter().filter_map(|&g| rail_of(g)).collect();
                    rails.sort();
                    if &rails == want {
                        gpus = Some(set);
                    }
                }
                if gpus.is_none() {
                    aligned = false;
                }
            }
            let set = match gpus {
                Some(s) => s,
                None => sets
                    .choose(node, &available, gang.gpus_per_member)
                    .map_err(|reason| PlanError::Sets { node: model.node_name(node).to_string(), reason })?,
            };
            if set.len() != gang.gpus_per_member || set.iter().any(|&g| g >= 128 || left >> g & 1 == 0) {
                return Err(PlanError::Sets {
                    node: model.node_name(node).to_string(),
                    reason: format!("chose {set:?}, not {} of the free GPUs {available:?}", gang.gpus_per_member),
                });
            }
            let mut with_rails: Vec<(Option<String>, usize)> = set.iter().map(|&g| (rail_of(g), g)).collect();
            if align && target.is_none() {
                if with_rails.iter().all(|(r, _)| r.is_some()) {
                    let mut rails: Vec<String> = with_rails.iter().filter_map(|(r, _)| r.clone()).collect();
                    rails.sort();
                    target = Some(rails);
                } else {
                    aligned = false;
                }
            }
            // By rail (GPUs without one last), then index.
            with_rails.sort_by(|a, b| (a.0.is_none(), &a.0, a.1).cmp(&(b.0.is_none(), &b.0, b.1)));
            for &(_, g) in &with_rails {
                left &= !(1u128 << g);
            }
            members.push(MemberPlan {
                rank: members.len(),
                node: model.node_name(node).to_string(),
                gpus: with_rails.iter().map(|&(_, g)| g).collect(),
                nics: with_rails.iter().map(|&(_, g)| nics.get(g).cloned().flatten()).collect(),
                rails: with_rails.into_iter().map(|(r, _)| r).collect(),
            });
        }
    }
    let d = &domains[domain];
    let tier = &model.tiers()[d.tier];
    Ok(Plan {
        domain: d.name.clone(),
        tier: tier.name.clone(),
        tier_number: tier.number,
        members,
        nodes: per_node.len(),
        rail_aligned: align.then_some(aligned),
    })
}

/// Members of this gang a node holds.
fn node_slots(f: &NodeFree, gang: &Gang) -> usize {
    let mut s = gang.members;
    if let Some(by_gpus) = (f.gpus.count_ones() as usize).checked_div(gang.gpus_per_member) {
        s = s.min(by_gpus);
    }
    for (p, &v) in &gang.vfs_per_member {
        if let Some(by_vfs) = f.vfs.get(p).copied().unwrap_or(0).checked_div(v) {
            s = s.min(by_vfs as usize);
        }
    }
    s
}

/// The highest tier index the constraint allows: None when none is (a hard tier number below the
/// innermost tier).
fn highest_tier(model: &NetworkModel, c: &TierConstraint) -> Result<Option<usize>, PlanError> {
    let root = model.tiers().len() - 1;
    match (c.mode, &c.highest) {
        (Mode::Soft, _) | (Mode::Hard, None) => Ok(Some(root)),
        (Mode::Hard, Some(tier @ TierRef::Number(_))) => Ok(model.tier_index(tier)),
        (Mode::Hard, Some(tier @ TierRef::Name(name))) => model
            .tier_index(tier)
            .map(Some)
            .ok_or_else(|| PlanError::UnknownTier { tier: name.clone(), known: model.tiers_text() }),
    }
}

fn no_fit(model: &NetworkModel, gang: &Gang, limit: Option<usize>, cap: &dyn Fn(usize) -> usize) -> PlanError {
    let (tier, best) = match limit {
        None => (
            gang.constraint.highest.as_ref().map_or_else(String::new, |t| t.to_string()),
            format!("no tier of this cluster is that low (tiers: {})", model.tiers_text()),
        ),
        Some(t) => {
            let tier = &model.tiers()[t];
            // The first (by name) of the domains holding the most.
            let mut most: Option<(usize, usize)> = None;
            for &d in model.tier_domains(t) {
                if most.is_none_or(|(c, _)| cap(d) > c) {
                    most = Some((cap(d), d));
                }
            }
            let best = match most {
                None => format!("the cluster has no {} domain", tier.name),
                Some((c, d)) => format!(
                    "the most members one {} domain holds is {c} (`{}`), {} short",
                    tier.name,
                    model.domains()[d].name,
                    gang.members - c.min(gang.members)
                ),
            };
            (format!("{} ({})", tier.number, tier.name), best)
        }
    };
    PlanError::NoFit { members: gang.members, gpus: gang.gpus_per_member, tier, best }
}

/// Spread `k` members over domain `d`: its children and own nodes, largest first, the last one
/// taken the smallest that covers the rest; then each chosen child the same way.
fn assign(
    model: &NetworkModel,
    d: usize,
    k: usize,
    slots: &[usize],
    cap: &dyn Fn(usize) -> usize,
    out: &mut Vec<(usize, usize)>,
) {
    #[derive(Clone, Copy)]
    enum Item {
        Node(usize),
        Domain(usize),
    }
    let dom = &model.domains()[d];
    let mut items: Vec<(usize, Item)> = Vec::new();
    for &n in &model.order()[dom.direct.clone()] {
        if slots[n] > 0 {
            items.push((slots[n], Item::Node(n)));
        }
    }
    for &c in &dom.children {
        let s = cap(c);
        if s > 0 {
            items.push((s, Item::Domain(c)));
        }
    }
    let name = |i: &Item| match *i {
        Item::Node(n) => model.node_name(n),
        Item::Domain(c) => model.domains()[c].name.as_str(),
    };
    items.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| name(&a.1).cmp(name(&b.1))));
    let mut taken: Vec<(usize, usize)> = Vec::new(); // (item position, members)
    let mut used = vec![false; items.len()];
    let mut rest = k;
    while rest > 0 {
        // The smallest unused item that covers the rest (the first of equals in sort order).
        let fit = items
            .iter()
            .enumerate()
            .filter(|(i, it)| !used[*i] && it.0 >= rest)
            .min_by(|a, b| a.1.0.cmp(&b.1.0).then(a.0.cmp(&b.0)))
            .map(|(i, _)| i);
        let (i, take) = match fit {
            Some(i) => (i, rest),
            None => match used.iter().position(|u| !u) {
                Some(i) => (i, items[i].0.min(rest)),
                // Unreachable: the domain's slots cover k.
                None => break,
            },
        };
        used[i] = true;
        taken.push((i, take));
        rest -= take;
    }
    taken.sort_unstable();
    for (i, take) in taken {
        match items[i].1 {
            Item::Node(n) => out.push((n, take)),
            Item::Domain(c) => assign(model, c, take, slots, cap, out),
        }
    }
}

fn mask_to_vec(m: u128) -> Vec<usize> {
    (0..128).filter(|&g| m >> g & 1 == 1).collect()
}

/// Most sets [`AllocSets`] keeps; it starts over when full.
pub const MAX_CACHED_SETS: usize = 1 << 16;

/// [`GpuSets`] over weft-alloc: each node's type (a [`NodeTopology`]), the ring-first set choice
/// ([`choose_set`]) cached per (type, free GPUs, count), and each GPU's nearest NIC (the closest
/// PCIe relation, the lowest NIC index among equals).
#[derive(Debug)]
pub struct AllocSets {
    types: Vec<(PreparedNode, Vec<Option<String>>)>,
    node_type: Vec<usize>,
    quality: SetQuality,
    cache: FxHashMap<(usize, u128, usize), Vec<usize>>,
}

impl AllocSets {
    /// `node_type[i]` is the index in `types` of model node i's topology.
    pub fn new(types: &[NodeTopology], node_type: Vec<usize>, quality: SetQuality) -> Result<AllocSets, PlanError> {
        let mut prepared = Vec::with_capacity(types.len());
        for (i, t) in types.iter().enumerate() {
            let p = PreparedNode::new(t).map_err(|e| PlanError::NodeType { index: i, message: e.to_string() })?;
            let nics = (0..t.gpu_count())
                .map(|g| {
                    (0..t.nics.len())
                        .filter_map(|n| t.nic_link(g, n).map(|r| (r, n)))
                        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                        .map(|(_, n)| t.nics[n].name.clone())
                })
                .collect();
            prepared.push((p, nics));
        }
        if let Some((node, &t)) = node_type.iter().enumerate().find(|&(_, &t)| t >= types.len()) {
            return Err(PlanError::NodeType {
                index: t,
                message: format!("node {node} names type {t}; {} types were given", types.len()),
            });
        }
        Ok(AllocSets { types: prepared, node_type, quality, cache: FxHashMap::default() })
    }
}

impl GpuSets for AllocSets {
    fn choose(&mut self, node: usize, available: &[usize], count: usize) -> Result<Vec<usize>, String> {
        let t = *self.node_type.get(node).ok_or_else(|| format!("node {node} has no type"))?;
        let mask = available.iter().filter(|&&g| g < 128).fold(0u128, |m, &g| m | 1u128 << g);
        if let Some(set) = self.cache.get(&(t, mask, count)) {
            return Ok(set.clone());
        }
        let a = choose_set(&self.types[t].0, available, count, self.quality).map_err(|e| e.to_string())?;
        if self.cache.len() >= MAX_CACHED_SETS {
            self.cache.clear();
        }
        self.cache.insert((t, mask, count), a.gpus.clone());
        Ok(a.gpus)
    }

    fn nic(&self, node: usize, gpu: usize) -> Option<&str> {
        let t = *self.node_type.get(node)?;
        self.types[t].1.get(gpu)?.as_deref()
    }
}
