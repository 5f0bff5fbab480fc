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
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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
        let free: Vec<u128> = cluster
            .nodes
            .iter()
            .map(|n| {
                let g = cluster.types[n.node_type].topology.gpu_count();
                if g == 128 { u128::MAX } else { (1u128 << g) - 1 }
            })
            .collect();
        let total_free = free.iter().map(|m| m.count_ones() as usize).sum();
        let stranded = vec![0; free.len()];
        State { cluster, free, stranded, total_stranded: 0, total_free }
    }

    fn set_free(&mut self, node: usize, mask: u128) {
        let prepared = &self.cluster.types[self.cluster.nodes[node].node_type].prepared;
        self.total_free = self.total_free + mask.count_ones() as usize - self.free[node].count_ones() as usize;
        self.free[node] = mask;
        let s = stranded_gpus(prepared, mask);
        self.total_stranded = self.total_stranded + s - self.stranded[node];
        self.stranded[node] = s;
    }
}

fn mask_to_vec(mask: u128) -> Vec<usize> {
    (0..128).filter(|&i| mask & (1u128 << i) != 0).collect()
}

/// go-gpuallocator-style node-local allocation: the best-effort objective for ≥ 2 GPUs, the lowest
/// free GPU for 1 (upstream's behaviour, reference §1.3).
fn gpuallocator_style(cluster: &Cluster, node: usize, free: u128, count: usize) -> Result<Vec<usize>, SimError> {
    let avail = mask_to_vec(free);
    if count == 1 {
        return Ok(vec![avail[0]]);
    }
    let prepared = &cluster.types[cluster.nodes[node].node_type].prepared;
    Ok(allocate(prepared, &Policy::BestEffort, &Request { count, available: &avail, required: &[] })?.gpus)
}

/// Run one policy over the pod stream. `progress` is called with the number of pods handled so far.
pub fn run_policy(
    cluster: &Cluster,
    pods: &[SimPod],
    policy: PlacementPolicy,
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(usize),
) -> Result<PolicyReport, SimError> {
    let started = Instant::now();
    let mut state = State::new(cluster);
    let mut departures: BinaryHeap<Reverse<Departure>> = BinaryHeap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Nodes of one type in the same state score the same: the cache computes each (type, free set,
    // size) once.
    let mut fit_cache = ScoreCache::new();
    let mut by_size: BTreeMap<usize, SizeCount> = BTreeMap::new();
    let mut bandwidths: Vec<f64> = Vec::new();
    let mut all_nvlink = 0usize;
    let (mut placed, mut unplaced) = (0usize, 0usize);
    let (mut stranded_sum, mut free_sum) = (0f64, 0f64);
    let step = (pods.len() / 100).max(1);

    for (i, pod) in pods.iter().enumerate() {
        while departures.peek().is_some_and(|d| d.0.at <= pod.arrival) {
            if let Some(Reverse(d)) = departures.pop() {
                let mask = state.free[d.node] | d.gpus;
                state.set_free(d.node, mask);
            }
        }
        stranded_sum += state.total_stranded as f64;
        free_sum += state.total_free as f64;
        let entry = by_size.entry(pod.gpus).or_default();
        entry.offered += 1;

        let choice: Option<(usize, Vec<usize>)> = match policy {
            PlacementPolicy::Weft => {
                let mut best: Option<(u8, u32, usize, Vec<usize>)> = None;
                for (n, node) in cluster.nodes.iter().enumerate() {
                    let free = state.free[n];
                    if (free.count_ones() as usize) < pod.gpus {
                        continue;
                    }
                    let prepared = &cluster.types[node.node_type].prepared;
                    let Ok(fit) = fit_cache.score(prepared, &mask_to_vec(free), pod.gpus, score_config) else {
                        continue;
                    };
                    let free_count = free.count_ones();
                    let better = match &best {
                        None => true,
                        Some((s, fc, _, _)) => fit.score > *s || (fit.score == *s && free_count < *fc),
                    };
                    if better {
                        best = Some((fit.score, free_count, n, fit.gpus));
                    }
                }
                best.map(|(_, _, n, g)| (n, g))
            }
            PlacementPolicy::Blind => {
                let fits: Vec<usize> =
                    (0..cluster.nodes.len()).filter(|&n| state.free[n].count_ones() as usize >= pod.gpus).collect();
                if fits.is_empty() {
                    None
                } else {
                    let n = fits[rng.random_range(0..fits.len())];
                    Some((n, gpuallocator_style(cluster, n, state.free[n], pod.gpus)?))
                }
            }
            PlacementPolicy::LeastAllocated => {
                let mut best: Option<(f64, usize)> = None;
                for n in 0..cluster.nodes.len() {
                    let free = state.free[n].count_ones() as usize;
                    if free < pod.gpus {
                        continue;
                    }
                    let total = cluster.types[cluster.nodes[n].node_type].topology.gpu_count();
                    let share = free as f64 / total as f64;
                    if best.is_none_or(|(s, _)| share > s) {
                        best = Some((share, n));
                    }
                }
                match best {
                    Some((_, n)) => Some((n, gpuallocator_style(cluster, n, state.free[n], pod.gpus)?)),
                    None => None,
                }
            }
        };

        match choice {
            Some((n, gpus)) => {
                let mut mask = 0u128;
                for &g in &gpus {
                    mask |= 1u128 << g;
                }
                debug_assert_eq!(state.free[n] & mask, mask, "allocated GPUs must be free");
                debug_assert_eq!(gpus.len(), pod.gpus);
                let remaining = state.free[n] & !mask;
                state.set_free(n, remaining);
                departures.push(Reverse(Departure { at: pod.arrival + pod.duration, node: n, gpus: mask }));
                placed += 1;
                entry.placed += 1;
                if gpus.len() >= 2 {
                    let topo = &cluster.types[cluster.nodes[n].node_type].topology;
                    bandwidths.push(topo.mean_pair_bandwidth_gbps(&gpus));
                    all_nvlink += usize::from(topo.all_nvlinked(&gpus));
                }
            }
            None => unplaced += 1,
        }
        if i % step == 0 {
            progress(i);
        }
    }
    progress(pods.len());

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
