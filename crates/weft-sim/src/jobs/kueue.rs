//! Kueue's Topology-Aware Scheduling (TAS) assignment, as a pure decision over the cluster's free
//! GPUs (read from kubernetes-sigs/kueue at v0.20.0-devel; the facts with file references are in
//! shared/reference/job-topology.md §3; `pkg/cache/scheduler/tas_flavor_snapshot.go`).
//!
//! - **Flavors.** One ResourceFlavor per node type (its `nodeLabels` select that type), tried in
//!   the cluster file's order, the first that fits winning (flavor fungibility without borrowing or
//!   preemption; one ClusterQueue whose quota covers the cluster). Each flavor's Topology has the
//!   levels every one of its nodes carries, top first: spine, leaf, the GPU clique when the type
//!   has NVLink domains, then `kubernetes.io/hostname` (a node missing a level's label would not be
//!   in the flavor at all, `tas_nodes_cache.go`).
//! - **The request.** A job's hard tier is `podset-required-topology` at that level (a flavor
//!   without the level cannot take the job); `soft` is `podset-preferred-topology` at the flavor's
//!   lowest level above the hostname; no constraint is implied TAS (unconstrained, at the hostname
//!   level). Slices are 1 pod, no leader PodSet.
//! - **Counts.** A host holds `⌊free GPUs / GPUs per pod⌋` pods; a domain the sum of its children
//!   (`fillInCounts`).
//! - **The level** (`findLevelWithFitDomains`): BestFit for required and preferred, and
//!   LeastFreeCapacity for unconstrained (`TASProfileMixed`, on by default since 0.15). Domains of
//!   the level sorted by count (BestFit descending, LFC ascending), then by their level values.
//!   BestFit: when the first holds the job, the domain with the smallest count that does (ties:
//!   the first in that order); LFC: the first in ascending order that holds it. Else: required
//!   fails; preferred climbs one level; at the top level, or unconstrained, several domains of the
//!   level are taken in order until the job is covered, BestFit swapping the last one for the best
//!   fit among those not yet taken.
//! - **The descent** (`findTopologyAssignment`, `updateCountsToMinimumGeneric`): at each lower level
//!   the children of all chosen domains are pooled, sorted the same way, and the job's pods taken
//!   greedily as above (the slice level is the hostname, so the pooled rule holds at every level).
//! - **Ranks.** Hosts sorted by their level values (`buildAssignment`), members in that order.
//!
//! Not modelled: taints, tolerations and affinities (every node is schedulable), quotas,
//! preemption, balanced placement and multi-layer slices (off by default or not asked).

use super::policies::DevicePluginSets;
use super::{JobAsk, JobPlacement, JobPolicy, NetCluster};
use weft_gang::Mode;

/// One entity of a flavor's level: a domain (a model domain index) or a host (a node index).
#[derive(Clone, Debug)]
struct Entity {
    id: usize,
    /// Indexes in the next level down.
    children: Vec<usize>,
}

/// A flavor: its levels, top first (the last is the hostname level), each sorted by level values.
#[derive(Clone, Debug)]
pub struct Flavor {
    /// The node type it selects.
    pub node_type: usize,
    /// The model tier of each level (None: the hostname level).
    pub tiers: Vec<Option<usize>>,
    levels: Vec<Vec<Entity>>,
}

/// How a level is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `podset-required-topology` at this level (an index into the flavor's levels).
    Required(usize),
    /// `podset-preferred-topology` at this level.
    Preferred(usize),
    /// Unconstrained: LeastFreeCapacity at the hostname level.
    Unconstrained,
}

impl Flavor {
    /// The flavors of `net`: one per node type that has nodes, in the cluster's order.
    pub fn of(net: &NetCluster) -> Vec<Flavor> {
        let m = &net.model;
        let c = &net.cluster;
        let mut out = Vec::new();
        for t in 0..c.types.len() {
            let nodes: Vec<usize> = (0..c.nodes.len()).filter(|&n| c.nodes[n].node_type == t).collect();
            if nodes.is_empty() {
                continue;
            }
            let mut tiers: Vec<Option<usize>> = vec![Some(net.spine_tier), Some(net.leaf_tier)];
            if let Some(ct) = net.clique_tier
                && nodes.iter().all(|&n| net.domain_at(n, ct).is_some())
            {
                tiers.push(Some(ct));
            }
            tiers.push(None);
            // Each node's value path (names top first); the level's entities sorted by it.
            let path = |n: usize, upto: usize| -> Vec<&str> {
                tiers[..=upto]
                    .iter()
                    .map(|t| match t {
                        Some(t) => net.domain_at(n, *t).map_or("", |d| m.domains()[d].name.as_str()),
                        None => m.node_name(n),
                    })
                    .collect()
            };
            let mut levels: Vec<Vec<Entity>> = Vec::new();
            // Per level: entity id → index, and the node's entity.
            let mut node_entity: Vec<Vec<usize>> = Vec::new();
            for (li, t) in tiers.iter().enumerate() {
                let mut ids: Vec<(Vec<&str>, usize)> = Vec::new();
                let mut seen = rustc_hash::FxHashSet::default();
                for &n in &nodes {
                    let id = match t {
                        Some(t) => net.domain_at(n, *t).unwrap_or(m.root()),
                        None => n,
                    };
                    if seen.insert(id) {
                        ids.push((path(n, li), id));
                    }
                }
                ids.sort();
                let index: rustc_hash::FxHashMap<usize, usize> =
                    ids.iter().enumerate().map(|(k, (_, id))| (*id, k)).collect();
                node_entity.push(
                    nodes
                        .iter()
                        .map(|&n| {
                            index[&match t {
                                Some(t) => net.domain_at(n, *t).unwrap_or(m.root()),
                                None => n,
                            }]
                        })
                        .collect(),
                );
                levels.push(ids.into_iter().map(|(_, id)| Entity { id, children: Vec::new() }).collect());
            }
            for li in 0..levels.len() - 1 {
                for (&p, &ch) in node_entity[li].iter().zip(&node_entity[li + 1]) {
                    if !levels[li][p].children.contains(&ch) {
                        levels[li][p].children.push(ch);
                    }
                }
                for e in &mut levels[li] {
                    e.children.sort_unstable();
                }
            }
            out.push(Flavor { node_type: t, tiers, levels });
        }
        out
    }

    /// The request for a job with this constraint, or None when this flavor cannot take it (a
    /// required level it lacks).
    pub fn request(&self, net: &NetCluster, job: &JobAsk) -> Option<Request> {
        let m = &net.model;
        let root = m.tiers().len() - 1;
        let Some(c) = &job.constraint else { return Some(Request::Unconstrained) };
        let tier = match (c.mode, &c.highest) {
            (Mode::Soft, _) => return Some(Request::Preferred(self.tiers.len() - 2)),
            (Mode::Hard, None) => return Some(Request::Unconstrained),
            (Mode::Hard, Some(tier)) => m.tier_index(tier)?,
        };
        if tier >= root {
            return Some(Request::Unconstrained);
        }
        self.tiers.iter().position(|t| *t == Some(tier)).map(Request::Required)
    }

    /// Kueue's assignment of `members` pods of `gpus` GPUs: the host of each pod, in rank order.
    pub fn assign(&self, free: &[u32], gpus: usize, members: usize, req: Request) -> Option<Vec<usize>> {
        let host = self.levels.len() - 1;
        // Counts per level, bottom-up.
        let mut counts: Vec<Vec<usize>> = vec![Vec::new(); self.levels.len()];
        counts[host] = self.levels[host].iter().map(|e| free[e.id] as usize / gpus).collect();
        for li in (0..host).rev() {
            counts[li] = self.levels[li].iter().map(|e| e.children.iter().map(|&c| counts[li + 1][c]).sum()).collect();
        }
        let (start, lfc, required) = match req {
            Request::Required(l) => (l, false, true),
            Request::Preferred(l) => (l, false, false),
            Request::Unconstrained => (host, true, false),
        };
        let sorted = |li: usize, among: &[usize]| -> Vec<usize> {
            let mut v = among.to_vec();
            if lfc {
                v.sort_by_key(|&i| (counts[li][i], i));
            } else {
                v.sort_by_key(|&i| (std::cmp::Reverse(counts[li][i]), i));
            }
            v
        };
        // The level and its domains with their counts.
        let mut li = start;
        // LeastFreeCapacity's single domain without the sort: the least count that holds the job,
        // the first index among equals (what the scan of the ascending order finds first).
        if lfc {
            let mut best: Option<usize> = None;
            for (i, &c) in counts[li].iter().enumerate() {
                if c >= members && best.is_none_or(|b| c < counts[li][b]) {
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                return Some(vec![self.levels[li][i].id; members]);
            }
        }
        let chosen: Vec<(usize, usize)> = loop {
            let all: Vec<usize> = (0..self.levels[li].len()).collect();
            let order = sorted(li, &all);
            let fits = |i: usize| counts[li][i] >= members;
            if lfc {
                if let Some(&i) = order.iter().find(|&&i| fits(i)) {
                    break vec![(i, members)];
                }
            } else if order.first().is_some_and(|&i| fits(i)) {
                break vec![(best_fit(&order, &counts[li], members)?, members)];
            }
            if required {
                return None;
            }
            if !lfc && li > 0 {
                li -= 1;
                continue;
            }
            break greedy(&order, &counts[li], members, !lfc)?;
        };
        // Descend, pooling the children of every chosen domain.
        let mut current = chosen;
        while li < host {
            let total: usize = current.iter().map(|&(_, c)| c).sum();
            let pool: Vec<usize> =
                current.iter().flat_map(|&(i, _)| self.levels[li][i].children.iter().copied()).collect();
            let order = sorted(li + 1, &pool);
            current = greedy(&order, &counts[li + 1], total, !lfc)?;
            li += 1;
        }
        current.sort_by_key(|&(i, _)| i);
        Some(current.iter().flat_map(|&(i, c)| std::iter::repeat_n(self.levels[host][i].id, c)).collect())
    }
}

/// BestFit's pick (`findBestFitDomainBy`): the smallest count ≥ `need` among `order`, the first in
/// `order` among equals.
fn best_fit(order: &[usize], counts: &[usize], need: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &i in order {
        if counts[i] >= need && best.is_none_or(|b| counts[i] < counts[b]) {
            best = Some(i);
        }
    }
    best
}

/// Take domains in `order` until `need` pods are covered; BestFit swaps the domain that would
/// cover the rest for the best fit among those not yet taken. None when they cannot cover it.
fn greedy(order: &[usize], counts: &[usize], need: usize, best_fit_last: bool) -> Option<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let mut rest = need;
    for (k, &i) in order.iter().enumerate() {
        if rest == 0 {
            break;
        }
        if best_fit_last && counts[i] >= rest {
            let j = best_fit(&order[k..], counts, rest)?;
            out.push((j, rest));
            rest = 0;
            break;
        }
        let take = counts[i].min(rest);
        if take > 0 {
            out.push((i, take));
        }
        rest -= take;
    }
    (rest == 0).then_some(out)
}

/// Kueue's decision: the first flavor that assigns every pod.
pub fn decide(net: &NetCluster, flavors: &[Flavor], free: &[u32], job: &JobAsk) -> Option<Vec<usize>> {
    flavors.iter().find_map(|f| {
        let req = f.request(net, job)?;
        f.assign(free, job.gpus, job.members, req)
    })
}

/// [`decide`] with the device plugin's GPU sets.
pub struct Kueue {
    flavors: Vec<Flavor>,
    sets: DevicePluginSets,
}

impl Kueue {
    /// The flavors of `net`.
    pub fn new(net: &NetCluster) -> Kueue {
        Kueue { flavors: Flavor::of(net), sets: DevicePluginSets::default() }
    }
}

impl JobPolicy for Kueue {
    fn name(&self) -> &'static str {
        "kueue"
    }

    fn place(&mut self, net: &NetCluster, free: &[u128], job: &JobAsk) -> Option<JobPlacement> {
        let counts: Vec<u32> = free.iter().map(|f| f.count_ones()).collect();
        let nodes = decide(net, &self.flavors, &counts, job)?;
        self.sets.assign(net, free, &nodes, job.gpus)
    }
}
