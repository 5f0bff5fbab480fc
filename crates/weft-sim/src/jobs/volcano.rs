//! Volcano's allocate action with the network-topology-aware plugin, as a pure decision over the
//! cluster's free GPUs (read from volcano-sh/volcano at v1.16.0-alpha.1; the facts with file
//! references are in shared/reference/job-topology.md §2). HyperNodes are the network model's
//! domains: tier numbers as the model numbers them (GPU clique 1, leaf 2, spine 3) and the
//! virtual `<cluster-top-hypernode>` one above the highest (the model's root).
//!
//! A job with a topology (`hard` up to a tier, or `soft`, which Volcano since v1.15 turns into
//! `hard` up to the virtual root, `session.go` `convertSoftToHardTopology`) takes the hard path
//! (`allocate.go` `allocateForJob`):
//!
//! 1. Gradients (`network_topology_aware.go` `hyperNodeGradientFn`): the HyperNodes of each tier up
//!    to the highest allowed, lowest tier first, eligible when their summed idle GPUs cover the
//!    job's `minResources` (here every member's GPUs, minAvailable = members).
//! 2. In the first gradient where some candidate's dry run places every member, the candidate with
//!    the highest HyperNode binpack score wins (`getSubJobHyperNodeBinPackingScore`:
//!    `(used + request) / allocatable` of the GPU, the only weighted resource here, as
//!    `hypernode.binpack.resources: nvidia.com/gpu` configures it; the tie bonus is 0 for a job
//!    with no placed task). A dry run inside a candidate places every member exactly when its nodes
//!    hold that many whole pods (each task takes any node with its GPUs idle), and the default
//!    SubJob's re-search inside the candidate finds no lower-tier success (those were this
//!    gradient's predecessors), so both are computed directly.
//! 3. Inside the winner, task by task (`allocateResourcesForTasks`): among nodes with the task's
//!    GPUs idle, the network-aware node score (`networkTopologyAwareScore`): 0 while the job has
//!    no allocated HyperNode; else, with `h` the node's HyperNode at the globally lowest tier
//!    (`FindHyperNodeForNode` looks only there), 1 when `h` is the allocated one, else
//!    `(maxTier − tier(LCA)) / (maxTier − minTier)`, 0 when the node has no lowest-tier HyperNode;
//!    nodes tied at the top get `+ tasks of the job in h / tasks`; the job's allocated HyperNode
//!    becomes the LCA of its old value and `h` (`getNewAllocatedHyperNode`).
//!
//! A job without a topology takes the normal path over every node with the plugin's normal-pod
//! score (`batchNodeOrderFnForNormalPods`, fading 0.8): `Σ_t 0.8^(t−1) · τ_t / Σ_t 0.8^(t−1)` over
//! tiers 1 to the virtual root, `τ_t` the pod-level binpack of the node's tier-t HyperNode (1 when
//! it has none), with what the job's earlier tasks took counted as used.
//!
//! Deterministic stand-ins for Volcano's arbitrary choices (§6.3 of the reference): HyperNode
//! ties go to the first by name (Go map order upstream), node ties to the first node in the
//! model's depth-first order (random upstream). Not modelled: other plugins' node scores
//! (`nodeorder`, `binpack`), pipelining onto releasing resources, preemption, queues and quotas.

use super::policies::DevicePluginSets;
use super::{JobAsk, JobPlacement, JobPolicy, NetCluster};
use weft_gang::Mode;

/// The normal-pod score's fading (`hypernode.binpack.normal-pod.fading`, default 0.8).
pub const FADING: f64 = 0.8;

/// Volcano's node per member (in task order), or None when the job does not fit. `free[i]` is node
/// i's idle GPUs.
pub fn decide(net: &NetCluster, free: &[u32], job: &JobAsk) -> Option<Vec<usize>> {
    decide_in(net, &lowest_hypernodes(net), free, job)
}

/// Each node's HyperNode at the globally lowest tier (`FindHyperNodeForNode`).
pub fn lowest_hypernodes(net: &NetCluster) -> Vec<Option<usize>> {
    (0..net.cluster.nodes.len()).map(|n| net.domain_at(n, 0)).collect()
}

/// [`decide`] with [`lowest_hypernodes`] computed once.
pub fn decide_in(net: &NetCluster, lowest_hn: &[Option<usize>], free: &[u32], job: &JobAsk) -> Option<Vec<usize>> {
    let m = &net.model;
    let root = m.tiers().len() - 1;
    let limit = match &job.constraint {
        None => None,
        Some(c) => match (c.mode, &c.highest) {
            (Mode::Soft, _) => Some(root),
            (Mode::Hard, None) => None,
            (Mode::Hard, Some(tier)) => Some(m.tier_index(tier)?),
        },
    };
    let st = State::new(net, lowest_hn, free, job.gpus);
    match limit {
        Some(limit) => st.hard(job, limit),
        None => st.normal(job),
    }
}

struct State<'a> {
    net: &'a NetCluster,
    free: Vec<u32>,
    g: u32,
    /// Per domain: allocatable and used GPUs, and whole pods it holds.
    alloc: Vec<u64>,
    used: Vec<u64>,
    slots: Vec<u64>,
    /// Per node: its HyperNode at the lowest tier.
    lowest_hn: &'a [Option<usize>],
}

impl<'a> State<'a> {
    fn new(net: &'a NetCluster, lowest_hn: &'a [Option<usize>], free: &[u32], g: usize) -> State<'a> {
        let m = &net.model;
        let c = &net.cluster;
        let order = m.order();
        let (mut ap, mut ip, mut sp) = (vec![0u64], vec![0u64], vec![0u64]);
        for &n in order {
            let cap = c.types[c.nodes[n].node_type].topology.gpu_count() as u64;
            ap.push(ap.last().copied().unwrap_or(0) + cap);
            ip.push(ip.last().copied().unwrap_or(0) + u64::from(free[n]));
            sp.push(sp.last().copied().unwrap_or(0) + u64::from(free[n]) / g as u64);
        }
        let range = |p: &[u64], d: usize| p[m.domains()[d].nodes.end] - p[m.domains()[d].nodes.start];
        let nd = m.domains().len();
        let alloc: Vec<u64> = (0..nd).map(|d| range(&ap, d)).collect();
        let used: Vec<u64> = (0..nd).map(|d| alloc[d] - range(&ip, d)).collect();
        let slots = (0..nd).map(|d| range(&sp, d)).collect();
        State { net, free: free.to_vec(), g: g as u32, alloc, used, slots, lowest_hn }
    }

    fn number(&self, d: usize) -> u32 {
        let m = &self.net.model;
        m.tiers()[m.domains()[d].tier].number
    }

    fn lca(&self, a: usize, b: usize) -> usize {
        let m = &self.net.model;
        let mut y = Some(b);
        while let Some(d) = y {
            let mut x = Some(a);
            while let Some(e) = x {
                if e == d {
                    return d;
                }
                x = m.domains()[e].parent;
            }
            y = m.domains()[d].parent;
        }
        m.root()
    }

    /// The hard path: the first tier with an eligible HyperNode that holds the job, the fullest of
    /// them, then task by task inside it.
    fn hard(mut self, job: &JobAsk, limit: usize) -> Option<Vec<usize>> {
        let net = self.net;
        let m = &net.model;
        let req = (job.members * job.gpus) as u64;
        for t in 0..=limit {
            let mut best: Option<(f64, usize)> = None;
            for &d in m.tier_domains(t) {
                let idle = self.alloc[d] - self.used[d];
                if idle < req || self.slots[d] < job.members as u64 {
                    continue;
                }
                let s = (self.used[d] + req) as f64 / self.alloc[d] as f64;
                if best.is_none_or(|(b, _)| s > b) {
                    best = Some((s, d));
                }
            }
            if let Some((_, h)) = best {
                return self.inside(job, h);
            }
        }
        None
    }

    fn inside(&mut self, job: &JobAsk, h: usize) -> Option<Vec<usize>> {
        let net = self.net;
        let m = &net.model;
        let (min_t, max_t) = (m.tiers()[0].number, m.tiers()[m.tiers().len() - 1].number);
        let mut allocated: Option<usize> = None;
        let mut out: Vec<usize> = Vec::with_capacity(job.members);
        let range = m.domains()[h].nodes.clone();
        for _ in 0..job.members {
            // (score, position, node), the highest score, then the first position.
            let mut scored: Vec<(f64, usize)> = Vec::new();
            let mut top = f64::NEG_INFINITY;
            for p in range.clone() {
                let n = m.order()[p];
                if self.free[n] < self.g {
                    continue;
                }
                let s = match (allocated, self.lowest_hn[n]) {
                    (None, _) | (_, None) => 0.0,
                    (Some(a), Some(hn)) if a == hn => 1.0,
                    (Some(a), Some(hn)) => {
                        let t = self.number(self.lca(hn, a));
                        if min_t == max_t {
                            1.0
                        } else if (min_t..=max_t).contains(&t) {
                            f64::from(max_t - t) / f64::from(max_t - min_t)
                        } else {
                            0.0
                        }
                    }
                };
                top = top.max(s);
                scored.push((s, n));
            }
            let mut best: Option<(f64, usize)> = None;
            for &(s, n) in &scored {
                let mut total = s;
                if s == top
                    && let Some(hn) = self.lowest_hn[n]
                {
                    let pos = m.domains()[hn].nodes.clone();
                    let in_h = out.iter().filter(|&&o| pos.contains(&m.position(o))).count();
                    total += in_h as f64 / job.members as f64;
                }
                if best.is_none_or(|(b, _)| total > b) {
                    best = Some((total, n));
                }
            }
            let (_, n) = best?;
            self.free[n] -= self.g;
            out.push(n);
            allocated = match (allocated, self.lowest_hn[n]) {
                (None, hn) => hn,
                (Some(a), Some(hn)) => Some(self.lca(hn, a)),
                (Some(a), None) => Some(a),
            };
        }
        Some(out)
    }

    /// The normal path: every node, the normal-pod score, task by task.
    fn normal(mut self, job: &JobAsk) -> Option<Vec<usize>> {
        let net = self.net;
        let m = &net.model;
        let tiers = m.tiers().len();
        let weights: Vec<f64> = (0..tiers).map(|t| FADING.powi(m.tiers()[t].number as i32 - 1)).collect();
        let wsum: f64 = weights.iter().sum();
        // Groups of nodes with the same HyperNodes: each domain's direct nodes, in the model's order.
        let mut groups: Vec<usize> = (0..m.domains().len()).filter(|&d| !m.domains()[d].direct.is_empty()).collect();
        groups.sort_by_key(|&d| m.domains()[d].direct.start);
        let mut tau = vec![1.0; tiers];
        let mut out = Vec::with_capacity(job.members);
        for _ in 0..job.members {
            let req = u64::from(self.g);
            // The highest score among groups with a node that fits, the first in order among equals.
            let mut chosen: Option<(f64, usize, usize)> = None;
            for &d in &groups {
                // τ per tier along the chain from d up, 1 where the node has no HyperNode.
                tau.fill(1.0);
                let mut x = Some(d);
                while let Some(e) = x {
                    let t = m.domains()[e].tier;
                    tau[t] = if self.used[e] + req > self.alloc[e] {
                        0.0
                    } else {
                        (self.used[e] + req) as f64 / self.alloc[e] as f64
                    };
                    x = m.domains()[e].parent;
                }
                let s: f64 = weights.iter().zip(&tau).map(|(w, t)| w * t).sum::<f64>() / wsum;
                if chosen.is_some_and(|(b, _, _)| s <= b) {
                    continue;
                }
                if let Some(p) = m.domains()[d].direct.clone().find(|&p| self.free[m.order()[p]] >= self.g) {
                    chosen = Some((s, m.order()[p], d));
                }
            }
            let chosen = chosen.map(|(_, n, d)| (n, d));
            let (n, d) = chosen?;
            self.free[n] -= self.g;
            let mut x = Some(d);
            while let Some(e) = x {
                self.used[e] += req;
                x = m.domains()[e].parent;
            }
            out.push(n);
        }
        Some(out)
    }
}

/// [`decide`] with the device plugin's GPU sets.
pub struct Volcano {
    sets: DevicePluginSets,
    lowest_hn: Vec<Option<usize>>,
}

impl Volcano {
    /// The policy over `net`.
    pub fn new(net: &NetCluster) -> Volcano {
        Volcano { sets: DevicePluginSets::default(), lowest_hn: lowest_hypernodes(net) }
    }
}

impl JobPolicy for Volcano {
    fn name(&self) -> &'static str {
        "volcano"
    }

    fn place(&mut self, net: &NetCluster, free: &[u128], job: &JobAsk) -> Option<JobPlacement> {
        let counts: Vec<u32> = free.iter().map(|f| f.count_ones()).collect();
        let nodes = decide_in(net, &self.lowest_hn, &counts, job)?;
        self.sets.assign(net, free, &nodes, job.gpus)
    }
}
