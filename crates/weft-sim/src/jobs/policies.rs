//! weft's two job policies (the gang plan and today's per-pod choice, member by member), and the
//! GPU sets the upstream baselines get (go-gpuallocator's best effort, as NVIDIA's device plugin
//! gives kube-scheduler's and Volcano's pods).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use rustc_hash::FxHashMap;
use weft_alloc::{Policy, Request, ScoreCache, ScoreConfig, allocate};
use weft_gang::{AllocSets, Gang, NodeFree, TierConstraint};

use super::{JobAsk, JobPlacement, JobPolicy, NetCluster, mask_gpus};
use crate::SimError;

fn to_mask(gpus: &[usize]) -> u128 {
    gpus.iter().fold(0u128, |m, &g| m | 1u128 << g)
}

/// weft's gang plan ([`weft_gang::plan`]) for the whole job; a job without a constraint is planned
/// `soft` (the tightest domain that fits, up to the whole cluster).
pub struct WeftGang {
    sets: AllocSets,
    free: Vec<NodeFree>,
}

impl WeftGang {
    /// Over `net`, GPU sets by weft-alloc's ring-first choice.
    pub fn new(net: &NetCluster, config: &ScoreConfig) -> Result<WeftGang, SimError> {
        let c = &net.cluster;
        let types: Vec<_> = c.types.iter().map(|t| (*t.topology).clone()).collect();
        let sets = AllocSets::new(&types, c.nodes.iter().map(|n| n.node_type).collect(), config.set_quality)
            .map_err(|e| SimError::Format { source_name: "weft-gang".into(), message: e.to_string() })?;
        let free = c.nodes.iter().map(|n| NodeFree::all_gpus(c.types[n.node_type].topology.gpu_count())).collect();
        Ok(WeftGang { sets, free })
    }
}

impl JobPolicy for WeftGang {
    fn name(&self) -> &'static str {
        "weft-gang"
    }

    fn place(&mut self, net: &NetCluster, _free: &[u128], job: &JobAsk) -> Option<JobPlacement> {
        let gang = Gang {
            members: job.members,
            gpus_per_member: job.gpus,
            vfs_per_member: Default::default(),
            constraint: job.constraint.clone().unwrap_or_else(TierConstraint::soft),
            rail_align: Some(false),
        };
        let plan = weft_gang::plan(&net.model, &self.free, &gang, &mut self.sets).ok()?;
        plan.members.iter().map(|m| Some((net.model.node_index(&m.node)?, to_mask(&m.gpus)))).collect()
    }

    fn changed(&mut self, node: usize, _before: u128, after: u128) {
        self.free[node].gpus = after;
    }
}

/// Where a node stands for a member: the score (descending), its free GPUs, the node; least wins.
type RankKey = (Reverse<u8>, u32, usize);

/// Today's per-pod weft policy, member after member: every node that fits is scored with
/// [`weft_alloc::score_node`] (through [`ScoreCache`]); the best score wins, ties to the node with
/// fewer free GPUs, then the lower node; the member gets the scored set. A member that fits
/// nowhere undoes the job's earlier members. Constraints are not read (today's policy has none).
///
/// Nodes of one type with the same free GPUs score alike, so they are kept in groups and each
/// group is scored once per decision (the index of the pod engine, without VFs).
pub struct WeftPods {
    config: ScoreConfig,
    cache: ScoreCache,
    groups: FxHashMap<(usize, u128), BTreeSet<usize>>,
    node_type: Vec<usize>,
    /// (type, free GPUs, count) → the score and the set.
    fits: FxHashMap<(usize, u128, usize), Option<(u8, u128)>>,
}

impl WeftPods {
    /// Over `net`, every node free.
    pub fn new(net: &NetCluster, config: &ScoreConfig) -> WeftPods {
        let mut groups: FxHashMap<(usize, u128), BTreeSet<usize>> = FxHashMap::default();
        for (i, n) in net.cluster.nodes.iter().enumerate() {
            let all = NodeFree::all_gpus(net.cluster.types[n.node_type].topology.gpu_count()).gpus;
            groups.entry((n.node_type, all)).or_default().insert(i);
        }
        WeftPods {
            config: config.clone(),
            cache: ScoreCache::new(),
            groups,
            node_type: net.cluster.nodes.iter().map(|n| n.node_type).collect(),
            fits: FxHashMap::default(),
        }
    }
}

impl JobPolicy for WeftPods {
    fn name(&self) -> &'static str {
        "weft-pods"
    }

    fn place(&mut self, net: &NetCluster, free: &[u128], job: &JobAsk) -> Option<JobPlacement> {
        let c = &net.cluster;
        // Nodes this job has taken GPUs of so far, with what they have left.
        let mut touched: Vec<(usize, u128)> = Vec::new();
        let mut out = Vec::with_capacity(job.members);
        for _ in 0..job.members {
            // (Reverse(score), free GPUs, node) → the least wins; and the set.
            let mut best: Option<(RankKey, u128)> = None;
            let (cache, fits, config, groups) = (&mut self.cache, &mut self.fits, &self.config, &self.groups);
            let mut consider = |t: usize, mask: u128, node: usize| {
                if (mask.count_ones() as usize) < job.gpus {
                    return;
                }
                let fit = *fits.entry((t, mask, job.gpus)).or_insert_with(|| {
                    let fit = cache.score(&c.types[t].prepared, &mask_gpus(mask), job.gpus, config).ok()?;
                    Some((fit.score, to_mask(&fit.gpus)))
                });
                let Some((score, set)) = fit else { return };
                let key = (Reverse(score), mask.count_ones(), node);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, set));
                }
            };
            for (&(t, mask), nodes) in groups {
                if let Some(&n) = nodes.iter().find(|n| !touched.iter().any(|(x, _)| x == *n)) {
                    consider(t, mask, n);
                }
            }
            for &(n, mask) in &touched {
                consider(c.nodes[n].node_type, mask, n);
            }
            let ((_, _, node), set) = best?;
            match touched.iter_mut().find(|(x, _)| *x == node) {
                Some((_, m)) => *m &= !set,
                None => touched.push((node, free[node] & !set)),
            }
            out.push((node, set));
        }
        Some(out)
    }

    fn honours_constraints(&self) -> bool {
        false
    }

    fn changed(&mut self, node: usize, before: u128, after: u128) {
        let t = self.node_type[node];
        if let Some(set) = self.groups.get_mut(&(t, before)) {
            set.remove(&node);
            if set.is_empty() {
                self.groups.remove(&(t, before));
            }
        }
        self.groups.entry((t, after)).or_default().insert(node);
    }
}

/// go-gpuallocator's best-effort set per (node type, free GPUs, count), cached: the GPUs NVIDIA's
/// device plugin hands a pod the upstream schedulers placed (they choose nodes, not GPUs).
#[derive(Default)]
pub struct DevicePluginSets {
    cache: FxHashMap<(usize, u128, usize), u128>,
}

impl DevicePluginSets {
    /// Member GPUs for pods of `gpus` GPUs on `nodes` (one entry per member), taken from `free` in
    /// order; None when a node has too few left (a policy error, not expected).
    pub fn assign(&mut self, net: &NetCluster, free: &[u128], nodes: &[usize], gpus: usize) -> Option<JobPlacement> {
        let mut left: Vec<(usize, u128)> = Vec::new();
        let mut out = Vec::with_capacity(nodes.len());
        for &n in nodes {
            let avail = match left.iter().find(|(x, _)| *x == n) {
                Some(&(_, m)) => m,
                None => free[n],
            };
            let t = net.cluster.nodes[n].node_type;
            let set = match self.cache.get(&(t, avail, gpus)) {
                Some(&s) => s,
                None => {
                    let a = mask_gpus(avail);
                    let r = allocate(
                        &net.cluster.types[t].prepared,
                        &Policy::BestEffort,
                        &Request { count: gpus, available: &a, required: &[] },
                    )
                    .ok()?;
                    let s = to_mask(&r.gpus);
                    self.cache.insert((t, avail, gpus), s);
                    s
                }
            };
            match left.iter_mut().find(|(x, _)| *x == n) {
                Some((_, m)) => *m &= !set,
                None => left.push((n, avail & !set)),
            }
            out.push((n, set));
        }
        Some(out)
    }
}
