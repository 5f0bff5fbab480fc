//! The event loop: pods arrive in order, run for their duration and leave; each placement policy
//! places the same stream on its own copy of the cluster.
//!
//! Policies:
//! - `weft`: every node that fits is scored with [`weft_alloc::score_node`] (link quality of the
//!   best-effort set plus the quality of what it leaves); the best node wins (ties: the node with fewer
//!   free GPUs, to keep whole nodes free for large pods; then the lower node number), and the pod gets
//!   the scored set.
//! - `blind`: topology-blind node choice (uniformly random among nodes that fit, seeded) and
//!   go-gpuallocator-style node-local allocation (its best-effort objective; lowest free GPU for
//!   1-GPU pods), as kube-scheduler plus NVIDIA's device plugin do today.
//! - `least-allocated`: kube-scheduler's `LeastAllocated` node choice (largest free share; ties: lower
//!   node number) with the same go-gpuallocator-style node-local allocation.
//!
//! A pod that fits nowhere at arrival is counted as not placed (no queue): that is the signal of
//! fragmentation this model measures.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Instant;

use ftree::FenwickTree;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use weft_alloc::{Policy, Request, ScoreCache, ScoreConfig, allocate, stranded_gpus};

use crate::SimError;
use crate::cluster::Cluster;
use crate::workload::SimPod;

/// A placement policy of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementPolicy {
    /// weft's scoring and allocation.
    Weft,
    /// Topology-blind node choice plus go-gpuallocator-style allocation.
    Blind,
    /// Least-allocated node choice plus go-gpuallocator-style allocation.
    LeastAllocated,
}

impl PlacementPolicy {
    /// All policies, in report order.
    pub const ALL: [PlacementPolicy; 3] =
        [PlacementPolicy::Weft, PlacementPolicy::Blind, PlacementPolicy::LeastAllocated];

    /// Name used in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PlacementPolicy::Weft => "weft",
            PlacementPolicy::Blind => "blind",
            PlacementPolicy::LeastAllocated => "least-allocated",
        }
    }
}

/// Results of one policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// Policy name.
    pub policy: String,
    /// Pods placed.
    pub placed: usize,
    /// Pods that fit nowhere at arrival.
    pub unplaced: usize,
    /// Per pod size: (placed, offered).
    pub by_size: BTreeMap<usize, SizeCount>,
    /// Placed pods with ≥ 2 GPUs.
    pub multi_gpu_placed: usize,
    /// Mean over placed multi-GPU pods of the mean pairwise bandwidth of their set, GB/s per direction.
    pub mean_pair_bandwidth_gbps: f64,
    /// 10th percentile of the same, GB/s.
    pub p10_pair_bandwidth_gbps: f64,
    /// Share of placed multi-GPU pods whose every GPU pair is NVLinked.
    pub all_nvlink_share: f64,
    /// Mean (over arrivals) number of free GPUs that can no longer form an NVLinked set: free GPUs that
    /// have NVLink peers on their node, none of them free.
    pub mean_stranded_gpus: f64,
    /// The same as a share of the free GPUs.
    pub stranded_share_of_free: f64,
    /// Wall time of the policy's decisions, milliseconds.
    pub run_ms: f64,
}

/// Placed and offered pods of one size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeCount {
    /// Placed.
    pub placed: usize,
    /// Offered.
    pub offered: usize,
}

#[derive(PartialEq)]
struct Departure {
    at: f64,
    node: usize,
    gpus: u128,
}

impl Eq for Departure {}
impl PartialOrd for Departure {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Departure {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.node.cmp(&other.node)).then(self.gpus.cmp(&other.gpus))
    }
}

struct State<'c> {
    cluster: &'c Cluster,
    free: Vec<u128>,
    stranded: Vec<usize>,
    total_stranded: usize,
    total_free: usize,
}

impl<'c> State<'c> {
    fn new(cluster: &'c Cluster) -> State<'c> {
        let free: Vec<u128> =
            cluster.nodes.iter().map(|n| all_gpus(cluster.types[n.node_type].topology.gpu_count())).collect();
        let total_free = free.iter().map(|m| m.count_ones() as usize).sum();
        let stranded = vec![0; free.len()];
        State { cluster, free, stranded, total_stranded: 0, total_free }
    }

    /// Set a node's free GPUs; returns the set it had.
    fn set_free(&mut self, node: usize, mask: u128) -> u128 {
        let prepared = &self.cluster.types[self.cluster.nodes[node].node_type].prepared;
        let old = self.free[node];
        self.total_free = self.total_free + mask.count_ones() as usize - old.count_ones() as usize;
        self.free[node] = mask;
        let s = stranded_gpus(prepared, mask);
        self.total_stranded = self.total_stranded + s - self.stranded[node];
        self.stranded[node] = s;
        old
    }
}

/// Every GPU of a node with `gpus` GPUs.
fn all_gpus(gpus: usize) -> u128 {
    if gpus >= 128 { u128::MAX } else { (1u128 << gpus) - 1 }
}

fn mask_to_vec(mask: u128) -> Vec<usize> {
    (0..128).filter(|&i| mask & (1u128 << i) != 0).collect()
}

fn vec_to_mask(gpus: &[usize]) -> u128 {
    gpus.iter().fold(0u128, |m, &g| m | (1u128 << g))
}

/// go-gpuallocator-style node-local allocation: the best-effort objective for ≥ 2 GPUs, the lowest
/// free GPU for 1 (upstream's behaviour, reference §1.3).
fn gpuallocator_style(cluster: &Cluster, node: usize, free: u128, count: usize) -> Result<u128, SimError> {
    if count == 1 {
        return Ok(free & free.wrapping_neg());
    }
    let prepared = &cluster.types[cluster.nodes[node].node_type].prepared;
    let avail = mask_to_vec(free);
    Ok(vec_to_mask(
        &allocate(prepared, &Policy::BestEffort, &Request { count, available: &avail, required: &[] })?.gpus,
    ))
}

/// The distinct GPU counts the stream asks for, ascending: each index keeps one view per size.
#[derive(Clone, Debug)]
struct Sizes(Vec<usize>);

impl Sizes {
    fn of(pods: &[SimPod]) -> Sizes {
        Sizes(pods.iter().map(|p| p.gpus).collect::<BTreeSet<usize>>().into_iter().collect())
    }

    /// Position of a size, if the stream asks for it.
    fn index(&self, gpus: usize) -> Option<usize> {
        self.0.binary_search(&gpus).ok()
    }
}

/// weft's node choice without scanning every node. Nodes of one type with the same free set score
/// alike for every size, so they form one group, scored once when the group appears; per size, a
/// ranking holds each group that can take the size under the key of the scan it replaces (score
/// descending, free GPUs ascending, lowest node), and its first entry is the scan's answer.
struct WeftIndex<'c> {
    cluster: &'c Cluster,
    config: ScoreConfig,
    sizes: Sizes,
    cache: ScoreCache,
    groups: FxHashMap<(usize, u128), Group>,
    ranking: Vec<BTreeSet<(Reverse<u8>, u32, usize)>>,
}

/// The nodes of one (type, free set), and per size the score and set weft would give.
struct Group {
    nodes: BTreeSet<usize>,
    fits: Vec<Option<(u8, u128)>>,
}

impl<'c> WeftIndex<'c> {
    fn new(cluster: &'c Cluster, state: &State<'_>, sizes: Sizes, config: &ScoreConfig) -> WeftIndex<'c> {
        let ranking = vec![BTreeSet::new(); sizes.0.len()];
        let mut index = WeftIndex {
            cluster,
            config: config.clone(),
            sizes,
            cache: ScoreCache::new(),
            groups: FxHashMap::default(),
            ranking,
        };
        for (n, &mask) in state.free.iter().enumerate() {
            index.join(n, mask);
        }
        index
    }

    fn key(&self, node: usize, mask: u128) -> (usize, u128) {
        (self.cluster.nodes[node].node_type, mask)
    }

    /// Re-rank a group whose lowest node went from `before` to `after`.
    fn rerank(&mut self, key: (usize, u128), before: Option<usize>, after: Option<usize>) {
        if before == after {
            return;
        }
        let Some(group) = self.groups.get(&key) else { return };
        let free = key.1.count_ones();
        for (k, fit) in group.fits.iter().enumerate() {
            let Some((score, _)) = *fit else { continue };
            if let Some(b) = before {
                self.ranking[k].remove(&(Reverse(score), free, b));
            }
            if let Some(a) = after {
                self.ranking[k].insert((Reverse(score), free, a));
            }
        }
    }

    fn join(&mut self, node: usize, mask: u128) {
        let key = self.key(node, mask);
        if !self.groups.contains_key(&key) {
            let prepared = &self.cluster.types[key.0].prepared;
            let free = mask_to_vec(mask);
            let fits = self
                .sizes
                .0
                .iter()
                .map(|&size| {
                    if size > free.len() {
                        return None;
                    }
                    // A set the allocator refuses leaves the node out, as the scan skipped it.
                    let fit = self.cache.score(prepared, &free, size, &self.config).ok()?;
                    Some((fit.score, vec_to_mask(&fit.gpus)))
                })
                .collect();
            self.groups.insert(key, Group { nodes: BTreeSet::new(), fits });
        }
        let Some(group) = self.groups.get_mut(&key) else { return };
        let before = group.nodes.first().copied();
        group.nodes.insert(node);
        let after = group.nodes.first().copied();
        self.rerank(key, before, after);
    }

    fn leave(&mut self, node: usize, mask: u128) {
        let key = self.key(node, mask);
        let Some(group) = self.groups.get_mut(&key) else { return };
        let before = group.nodes.first().copied();
        group.nodes.remove(&node);
        let after = group.nodes.first().copied();
        self.rerank(key, before, after);
        if after.is_none() {
            self.groups.remove(&key);
        }
    }

    fn choose(&self, state: &State<'_>, gpus: usize) -> Option<(usize, u128)> {
        let k = self.sizes.index(gpus)?;
        let &(_, _, node) = self.ranking[k].first()?;
        let group = self.groups.get(&self.key(node, state.free[node]))?;
        let (_, set) = group.fits[k]?;
        Some((node, set))
    }
}

/// The blind policy's candidates without a scan: per size, a Fenwick tree over the nodes (1 where a
/// node has that many free GPUs), so the scan's `fits[r]`, the r-th fitting node by number, is found
/// in O(log nodes) and the seeded random draw is the same.
struct FitIndex {
    sizes: Sizes,
    fits: Vec<FenwickTree<usize>>,
}

impl FitIndex {
    fn new(state: &State<'_>, sizes: Sizes) -> FitIndex {
        let fits = sizes
            .0
            .iter()
            .map(|&size| state.free.iter().map(|m| usize::from(m.count_ones() as usize >= size)).collect())
            .collect();
        FitIndex { sizes, fits }
    }

    fn moved(&mut self, node: usize, old: u128, new: u128) {
        let (old, new) = (old.count_ones() as usize, new.count_ones() as usize);
        for (k, &size) in self.sizes.0.iter().enumerate() {
            match (old >= size, new >= size) {
                (false, true) => self.fits[k].add_at(node, 1),
                (true, false) => self.fits[k].sub_at(node, 1),
                _ => {}
            }
        }
    }

    /// How many nodes have `gpus` free.
    fn count(&self, gpus: usize) -> usize {
        self.sizes.index(gpus).map_or(0, |k| self.fits[k].prefix_sum(self.fits[k].len(), 0))
    }

    /// The node with `gpus` free that is `rank`-th (from 0) by node number; `rank < count(gpus)`.
    fn nth(&self, gpus: usize, rank: usize) -> Option<usize> {
        Some(self.fits[self.sizes.index(gpus)?].index_of(rank + 1))
    }
}

/// kube-scheduler's LeastAllocated choice without a scan: per size, the nodes that can take it keyed
/// by free share (largest first; the share is a non-negative float, whose bits order as its values)
/// and node number, as the scan's strict `>` kept the lowest node of a tie.
struct ShareIndex<'c> {
    cluster: &'c Cluster,
    sizes: Sizes,
    ranking: Vec<BTreeSet<(Reverse<u64>, usize)>>,
}

impl<'c> ShareIndex<'c> {
    fn new(cluster: &'c Cluster, state: &State<'_>, sizes: Sizes) -> ShareIndex<'c> {
        let ranking = vec![BTreeSet::new(); sizes.0.len()];
        let mut index = ShareIndex { cluster, sizes, ranking };
        for (n, &mask) in state.free.iter().enumerate() {
            index.moved(n, 0, mask);
        }
        index
    }

    fn share(&self, node: usize, free: usize) -> Reverse<u64> {
        let total = self.cluster.types[self.cluster.nodes[node].node_type].topology.gpu_count();
        Reverse((free as f64 / total as f64).to_bits())
    }

    fn moved(&mut self, node: usize, old: u128, new: u128) {
        let (old, new) = (old.count_ones() as usize, new.count_ones() as usize);
        for k in 0..self.sizes.0.len() {
            let size = self.sizes.0[k];
            if old >= size {
                let key = (self.share(node, old), node);
                self.ranking[k].remove(&key);
            }
            if new >= size {
                let key = (self.share(node, new), node);
                self.ranking[k].insert(key);
            }
        }
    }

    fn choose(&self, gpus: usize) -> Option<usize> {
        self.ranking[self.sizes.index(gpus)?].first().map(|&(_, n)| n)
    }
}

/// Where a policy looks for a node.
enum Chooser<'c> {
    Weft(WeftIndex<'c>),
    Blind(FitIndex),
    LeastAllocated(ShareIndex<'c>),
    /// The scans the indexes replace, kept to check them against.
    #[cfg(test)]
    Scan(PlacementPolicy, ScoreConfig, ScoreCache),
}

impl<'c> Chooser<'c> {
    fn new(
        cluster: &'c Cluster,
        state: &State<'_>,
        pods: &[SimPod],
        policy: PlacementPolicy,
        cfg: &ScoreConfig,
    ) -> Self {
        let sizes = Sizes::of(pods);
        match policy {
            PlacementPolicy::Weft => Chooser::Weft(WeftIndex::new(cluster, state, sizes, cfg)),
            PlacementPolicy::Blind => Chooser::Blind(FitIndex::new(state, sizes)),
            PlacementPolicy::LeastAllocated => Chooser::LeastAllocated(ShareIndex::new(cluster, state, sizes)),
        }
    }

    /// A node's free set went from `old` to `new`.
    fn moved(&mut self, node: usize, old: u128, new: u128) {
        match self {
            Chooser::Weft(index) => {
                index.leave(node, old);
                index.join(node, new);
            }
            Chooser::Blind(index) => index.moved(node, old, new),
            Chooser::LeastAllocated(index) => index.moved(node, old, new),
            #[cfg(test)]
            Chooser::Scan(..) => {}
        }
    }

    /// The node and GPU set for a pod of `gpus` GPUs, or None if no node can take it.
    fn choose(
        &mut self,
        state: &State<'_>,
        gpus: usize,
        rng: &mut ChaCha8Rng,
    ) -> Result<Option<(usize, u128)>, SimError> {
        let cluster = state.cluster;
        Ok(match self {
            Chooser::Weft(index) => index.choose(state, gpus),
            Chooser::Blind(index) => match index.count(gpus) {
                0 => None,
                len => match index.nth(gpus, rng.random_range(0..len)) {
                    Some(n) => Some((n, gpuallocator_style(cluster, n, state.free[n], gpus)?)),
                    None => None,
                },
            },
            Chooser::LeastAllocated(index) => match index.choose(gpus) {
                Some(n) => Some((n, gpuallocator_style(cluster, n, state.free[n], gpus)?)),
                None => None,
            },
            #[cfg(test)]
            Chooser::Scan(policy, cfg, cache) => scan(state, *policy, gpus, cfg, cache, rng)?,
        })
    }
}

/// The policies as plain scans over every node (what the indexes must agree with).
#[cfg(test)]
fn scan(
    state: &State<'_>,
    policy: PlacementPolicy,
    gpus: usize,
    cfg: &ScoreConfig,
    cache: &mut ScoreCache,
    rng: &mut ChaCha8Rng,
) -> Result<Option<(usize, u128)>, SimError> {
    let cluster = state.cluster;
    let free_count = |n: usize| state.free[n].count_ones() as usize;
    Ok(match policy {
        PlacementPolicy::Weft => {
            let mut best: Option<(u8, u32, usize, u128)> = None;
            for (n, node) in cluster.nodes.iter().enumerate() {
                if free_count(n) < gpus {
                    continue;
                }
                let prepared = &cluster.types[node.node_type].prepared;
                let Ok(fit) = cache.score(prepared, &mask_to_vec(state.free[n]), gpus, cfg) else { continue };
                let fc = state.free[n].count_ones();
                if best.as_ref().is_none_or(|(s, f, _, _)| fit.score > *s || (fit.score == *s && fc < *f)) {
                    best = Some((fit.score, fc, n, vec_to_mask(&fit.gpus)));
                }
            }
            best.map(|(_, _, n, g)| (n, g))
        }
        PlacementPolicy::Blind => {
            let fits: Vec<usize> = (0..cluster.nodes.len()).filter(|&n| free_count(n) >= gpus).collect();
            if fits.is_empty() {
                None
            } else {
                let n = fits[rng.random_range(0..fits.len())];
                Some((n, gpuallocator_style(cluster, n, state.free[n], gpus)?))
            }
        }
        PlacementPolicy::LeastAllocated => {
            let mut best: Option<(f64, usize)> = None;
            for n in 0..cluster.nodes.len() {
                if free_count(n) < gpus {
                    continue;
                }
                let share =
                    free_count(n) as f64 / cluster.types[cluster.nodes[n].node_type].topology.gpu_count() as f64;
                if best.is_none_or(|(s, _)| share > s) {
                    best = Some((share, n));
                }
            }
            match best {
                Some((_, n)) => Some((n, gpuallocator_style(cluster, n, state.free[n], gpus)?)),
                None => None,
            }
        }
    })
}

/// How far a run has got, for progress displays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Pods handled (placed or not).
    pub handled: usize,
    /// Pods placed so far.
    pub placed: usize,
}

/// Run one policy over the pod stream. `progress` is called now and then with how far it has got,
/// and once at the end.
///
/// Each decision costs O(sizes · log nodes), not a scan of the nodes: see [`WeftIndex`],
/// [`FitIndex`] and [`ShareIndex`]; the scans they replace are kept in the tests, which check that
/// both make every decision alike.
pub fn run_policy(
    cluster: &Cluster,
    pods: &[SimPod],
    policy: PlacementPolicy,
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<PolicyReport, SimError> {
    check_pods(pods)?;
    let state = State::new(cluster);
    let chooser = Chooser::new(cluster, &state, pods, policy, score_config);
    run(state, chooser, pods, policy, seed, progress, None)
}

/// Pods the engine cannot take: none of 0 GPUs (the workload readers refuse them already).
fn check_pods(pods: &[SimPod]) -> Result<(), SimError> {
    match pods.iter().find(|p| p.gpus == 0) {
        Some(p) => Err(SimError::Format {
            source_name: "workload".into(),
            message: format!("pod '{}' requests no GPU; the simulator places GPU pods", p.name),
        }),
        None => Ok(()),
    }
}

fn run(
    mut state: State<'_>,
    mut chooser: Chooser<'_>,
    pods: &[SimPod],
    policy: PlacementPolicy,
    seed: u64,
    progress: &mut dyn FnMut(Progress),
    mut trace: Option<&mut Vec<Option<(usize, u128)>>>,
) -> Result<PolicyReport, SimError> {
    let started = Instant::now();
    let cluster = state.cluster;
    let mut departures: BinaryHeap<Reverse<Departure>> = BinaryHeap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut by_size: BTreeMap<usize, SizeCount> = BTreeMap::new();
    let mut bandwidths: Vec<f64> = Vec::new();
    let mut all_nvlink = 0usize;
    let (mut placed, mut unplaced) = (0usize, 0usize);
    let (mut stranded_sum, mut free_sum) = (0f64, 0f64);
    let step = (pods.len() / 1000).max(1);

    for (i, pod) in pods.iter().enumerate() {
        while departures.peek().is_some_and(|d| d.0.at <= pod.arrival) {
            if let Some(Reverse(d)) = departures.pop() {
                let old = state.set_free(d.node, state.free[d.node] | d.gpus);
                chooser.moved(d.node, old, state.free[d.node]);
            }
        }
        stranded_sum += state.total_stranded as f64;
        free_sum += state.total_free as f64;
        let entry = by_size.entry(pod.gpus).or_default();
        entry.offered += 1;

        let choice = chooser.choose(&state, pod.gpus, &mut rng)?;
        if let Some(t) = trace.as_deref_mut() {
            t.push(choice);
        }
        match choice {
            Some((n, mask)) => {
                debug_assert_eq!(state.free[n] & mask, mask, "allocated GPUs must be free");
                debug_assert_eq!(mask.count_ones() as usize, pod.gpus);
                let old = state.set_free(n, state.free[n] & !mask);
                chooser.moved(n, old, state.free[n]);
                departures.push(Reverse(Departure { at: pod.arrival + pod.duration, node: n, gpus: mask }));
                placed += 1;
                entry.placed += 1;
                if pod.gpus >= 2 {
                    let topo = &cluster.types[cluster.nodes[n].node_type].topology;
                    let gpus = mask_to_vec(mask);
                    bandwidths.push(topo.mean_pair_bandwidth_gbps(&gpus));
                    all_nvlink += usize::from(topo.all_nvlinked(&gpus));
                }
            }
            None => unplaced += 1,
        }
        if i % step == 0 {
            progress(Progress { handled: i + 1, placed });
        }
    }
    progress(Progress { handled: pods.len(), placed });

    let multi = bandwidths.len();
    let mean_bw = if multi == 0 { 0.0 } else { bandwidths.iter().sum::<f64>() / multi as f64 };
    bandwidths.sort_by(f64::total_cmp);
    // Nearest-rank 10th percentile.
    let p10 = if multi == 0 { 0.0 } else { bandwidths[(multi as f64 * 0.1).ceil() as usize - 1] };
    let arrivals = pods.len().max(1) as f64;
    Ok(PolicyReport {
        policy: policy.name().to_string(),
        placed,
        unplaced,
        by_size,
        multi_gpu_placed: multi,
        mean_pair_bandwidth_gbps: mean_bw,
        p10_pair_bandwidth_gbps: p10,
        all_nvlink_share: if multi == 0 { 0.0 } else { all_nvlink as f64 / multi as f64 },
        mean_stranded_gpus: stranded_sum / arrivals,
        stranded_share_of_free: if free_sum > 0.0 { stranded_sum / free_sum } else { 0.0 },
        run_ms: started.elapsed().as_secs_f64() * 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cluster::{ClusterSpec, NodeTypeSpec, builtin_types};
    use crate::workload::Generate;

    /// Every decision of a run: the node and GPU set per pod, or None.
    fn trace(
        cluster: &Cluster,
        pods: &[SimPod],
        policy: PlacementPolicy,
        cfg: &ScoreConfig,
        seed: u64,
        scan_only: bool,
    ) -> (Vec<Option<(usize, u128)>>, PolicyReport) {
        let state = State::new(cluster);
        let chooser = if scan_only {
            Chooser::Scan(policy, cfg.clone(), ScoreCache::new())
        } else {
            Chooser::new(cluster, &state, pods, policy, cfg)
        };
        let mut decisions = Vec::new();
        let report = run(state, chooser, pods, policy, seed, &mut |_| {}, Some(&mut decisions)).unwrap();
        (decisions, report)
    }

    fn cluster(counts: &[usize]) -> Cluster {
        let types = builtin_types();
        let spec = ClusterSpec {
            api_version: crate::API_VERSION.into(),
            kind: "SimCluster".into(),
            node_types: counts
                .iter()
                .zip(&types)
                .map(|(&count, (name, _))| NodeTypeSpec {
                    name: name.to_string(),
                    topology: format!("builtin:{name}"),
                    count,
                })
                .collect(),
        };
        spec.build(None).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

        /// The indexes decide exactly as the scans over every node do, pod by pod, for every policy:
        /// mixed node types, pod sizes some nodes cannot take (3, 5, 16), loads from light to far
        /// over capacity, any remainder weight and seed.
        #[test]
        fn indexes_decide_as_the_scans_do(
            counts in proptest::collection::vec(0usize..6, 8),
            sizes in proptest::collection::btree_map(prop::sample::select(vec![1usize, 2, 3, 4, 5, 8, 16]), 0.05f64..1.0, 1..5),
            pods in 50usize..400,
            load in 0.3f64..3.0,
            weight in 0.0f64..1.0,
            seed in any::<u64>(),
        ) {
            let mut counts = counts;
            if counts.iter().all(|&c| c == 0) {
                counts[seed as usize % 8] = 1;
            }
            let cluster = cluster(&counts);
            let mean_size: f64 = sizes.iter().map(|(s, p)| *s as f64 * p).sum::<f64>() / sizes.values().sum::<f64>();
            let generate = Generate {
                pods,
                seed,
                sizes,
                mean_interarrival_seconds: 3600.0 * mean_size / (load * cluster.total_gpus() as f64),
                mean_duration_seconds: 3600.0,
            };
            let stream = generate.pods().unwrap();
            let cfg = ScoreConfig { remainder_weight: weight };
            for policy in PlacementPolicy::ALL {
                let (indexed, a) = trace(&cluster, &stream, policy, &cfg, seed, false);
                let (scanned, b) = trace(&cluster, &stream, policy, &cfg, seed, true);
                if let Some(i) = (0..stream.len()).find(|&i| indexed[i] != scanned[i]) {
                    prop_assert!(false, "{}: pod {i} ({} GPUs): index chose {:?}, scan {:?}",
                        policy.name(), stream[i].gpus, indexed[i], scanned[i]);
                }
                prop_assert_eq!(PolicyReport { run_ms: 0.0, ..a }, PolicyReport { run_ms: 0.0, ..b });
            }
        }
    }

    #[test]
    fn a_pod_of_no_gpus_is_an_error_naming_it() {
        let cluster = cluster(&[1]);
        let pods = vec![SimPod { name: "idle".into(), gpus: 0, arrival: 0.0, duration: 1.0 }];
        let e = run_policy(&cluster, &pods, PlacementPolicy::Weft, &ScoreConfig::default(), 1, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("'idle'") && e.contains("no GPU"), "{e}");
    }

    #[test]
    fn progress_ends_with_every_pod_handled_and_the_placed_count() {
        let cluster = cluster(&[2, 0, 1]);
        let pods = Generate::default_for(cluster.total_gpus(), 300, 5).pods().unwrap();
        let mut seen = Vec::new();
        let report =
            run_policy(&cluster, &pods, PlacementPolicy::Blind, &ScoreConfig::default(), 5, &mut |p| seen.push(p))
                .unwrap();
        assert_eq!(seen.last(), Some(&Progress { handled: 300, placed: report.placed }));
        assert!(seen.windows(2).all(|w| w[0].handled <= w[1].handled && w[0].placed <= w[1].placed));
        assert!(seen.len() > 2, "progress is reported along the way: {seen:?}");
    }
}
