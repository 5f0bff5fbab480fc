//! The event loop: pods arrive in order, run for their duration and leave; each placement policy
//! places the same stream on its own copy of the cluster.
//!
//! A node holds GPUs and SR-IOV VFs (each VF serves one physnet). A pod asks for GPUs and maybe
//! VFs of some physnets; it fits a node with enough free GPUs and, per physnet, enough free VFs.
//!
//! Policies:
//! - `weft`: a pod that asks no VFs goes first to the nodes with no VF free that VF pods of the
//!   stream could use ([`spares_vfs`]), and only when none of them can take it to the others. Among
//!   those, every node that fits is scored with [`weft_alloc::score_node`] (link quality of the
//!   chosen set plus the quality of what it leaves); the best node wins (ties: the node with fewer
//!   free GPUs, to keep whole nodes free for large pods; then the lower node number), and the pod gets
//!   the scored set. A pod that asks for VFs gets its GPUs and VFs from
//!   [`weft_net::joint::decide`] (the decision the scheduler extender makes) and the node is scored
//!   [`weft_net::joint::joint_score`] over that GPU score (ties as above).
//! - `blind`: topology-blind node choice (uniformly random among nodes that fit, seeded) and
//!   go-gpuallocator-style node-local allocation (its best-effort objective; lowest free GPU for
//!   1-GPU pods), as kube-scheduler plus NVIDIA's device plugin do today; VFs are the lowest free PCI
//!   addresses of each physnet, as a topology-blind VF device plugin hands them out.
//! - `least-allocated`: kube-scheduler's `LeastAllocated` node choice (largest free GPU share; ties:
//!   lower node number) with the same go-gpuallocator-style GPUs and lowest-address VFs.
//!
//! A pod that fits nowhere at arrival is counted as not placed (no queue): that is the signal of
//! fragmentation this model measures.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Instant;

use ftree::FenwickTree;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use weft_alloc::{Policy, Request, ScoreCache, ScoreConfig, allocate, stranded_gpus};
use weft_net::choice::near_enough;
use weft_net::joint::{VfAsk, VfPlan, decide, joint_score};
use weft_topology::NodeTopology;

use crate::SimError;
use crate::cluster::{Cluster, MAX_VFS_PER_NODE};
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
    /// Of those, pods that asked for VFs and were not placed although some node had their GPUs free:
    /// no such node had the VFs free too.
    #[serde(default)]
    pub unplaced_for_vfs: usize,
    /// Per pod size: (placed, offered).
    pub by_size: BTreeMap<usize, SizeCount>,
    /// Placed pods with ≥ 2 GPUs.
    pub multi_gpu_placed: usize,
    /// Mean over placed multi-GPU pods of the bandwidth of the best ring over their set (its slowest
    /// hop, what a ring all-reduce gets: [`weft_topology::ring`]), GB/s per direction.
    #[serde(default)]
    pub mean_ring_bandwidth_gbps: f64,
    /// 10th percentile of the same, GB/s: the pods that fared worst.
    #[serde(default)]
    pub p10_ring_bandwidth_gbps: f64,
    /// Mean over placed multi-GPU pods of the mean pairwise bandwidth of their set, GB/s per direction.
    pub mean_pair_bandwidth_gbps: f64,
    /// 10th percentile of the same, GB/s.
    pub p10_pair_bandwidth_gbps: f64,
    /// Share of placed multi-GPU pods whose every GPU pair is NVLinked.
    pub all_nvlink_share: f64,
    /// Placed pods that asked for VFs.
    #[serde(default)]
    pub vf_pods_placed: usize,
    /// Share of those whose every VF shares a PCIe switch (tree) with one of their GPUs, so
    /// GPUDirect RDMA does not cross the CPU's host bridge (`weft_net::joint::JointChoice::all_near`).
    #[serde(default)]
    pub vf_near_gpu_share: f64,
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

/// What one pod got under one policy, handed to the record callback of [`run_policy_recorded`] as
/// the pod is decided (the records of `weft simulate --pods-out`; nothing is kept).
#[derive(Clone, Debug, PartialEq)]
pub struct PodOutcome<'a> {
    /// The policy.
    pub policy: PlacementPolicy,
    /// The pod's position in the stream, from 0.
    pub index: usize,
    /// The pod: name, GPUs and VFs asked, arrival and duration.
    pub pod: &'a SimPod,
    /// Where it went, or why it did not.
    pub placement: Result<PodPlacement<'a>, NotPlaced>,
    /// The whole cluster just after this decision (the timeline of `weft simulate --report`).
    pub cluster: ClusterNow,
}

/// The cluster's state after a decision: every pod's [`PodOutcome`] carries one, so a caller that
/// wants a timeline samples it at the arrivals it likes. Made only when a record callback is
/// given ([`run_policy_recorded`]): a run without one pays nothing for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterNow {
    /// Pods running (placed and not yet gone), this one included when it was placed.
    pub running_pods: usize,
    /// GPUs held by running pods.
    pub gpus_in_use: usize,
    /// Free GPUs whose NVLink peers on their node are all busy ([`PolicyReport::mean_stranded_gpus`]
    /// is the mean of this over arrivals, taken before each decision).
    pub stranded_gpus: usize,
    /// Pods placed so far, this one included.
    pub placed: usize,
    /// Pods not placed so far, this one included.
    pub not_placed: usize,
}

/// Where a placed pod went and what it got there.
#[derive(Clone, Debug, PartialEq)]
pub struct PodPlacement<'a> {
    /// The node's name.
    pub node: &'a str,
    /// Its node type's name.
    pub node_type: &'a str,
    /// The GPUs it got (indexes on the node), ascending.
    pub gpus: Vec<usize>,
    /// The VFs it got, by PCI address (with their NIC and physnet).
    pub vfs: Vec<&'a weft_topology::Vf>,
    /// Whether every VF shares a PCIe switch with one of its GPUs; None when it asked no VFs.
    pub vfs_near_gpus: Option<bool>,
    /// Bandwidth of the best ring over its GPUs (the slowest hop), GB/s per direction; None for
    /// one GPU.
    pub ring_gbps: Option<f64>,
    /// Mean bandwidth over its GPU pairs, GB/s per direction; None for one GPU.
    pub mean_pair_gbps: Option<f64>,
    /// When it started (its arrival: there is no queue), seconds.
    pub start: f64,
    /// When it ends and frees what it holds, seconds.
    pub end: f64,
}

/// Why a pod was not placed (the engine's two counts of unplaced pods).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotPlaced {
    /// No node had its GPUs (and VFs) free.
    NoGpus,
    /// It asked VFs, and some node had its GPUs free, but none had the VFs free too
    /// ([`PolicyReport::unplaced_for_vfs`]).
    ShortOfVfs,
}

impl NotPlaced {
    /// The reason as the records spell it: `no-gpus` or `short-of-vfs`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotPlaced::NoGpus => "no-gpus",
            NotPlaced::ShortOfVfs => "short-of-vfs",
        }
    }
}

/// The callback that takes each [`PodOutcome`]; an error stops the run.
pub type RecordPod<'r> = dyn FnMut(&PodOutcome<'_>) -> std::io::Result<()> + 'r;

/// What is free on a node (or what a pod holds there): GPUs and VFs, each a set of positions (VF
/// positions in the node type's VFs, which are sorted by PCI address).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Free {
    gpus: u128,
    vfs: u128,
}

/// A decision: the node and what the pod gets there.
type Placement = (usize, Free);

#[derive(PartialEq)]
struct Departure {
    at: f64,
    node: usize,
    held: Free,
}

impl Eq for Departure {}
impl PartialOrd for Departure {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Departure {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.total_cmp(&other.at).then(self.node.cmp(&other.node)).then(self.held.cmp(&other.held))
    }
}

struct State<'c> {
    cluster: &'c Cluster,
    free: Vec<Free>,
    stranded: Vec<usize>,
    total_stranded: usize,
    total_free: usize,
    /// Every GPU of the cluster.
    total_gpus: usize,
}

impl<'c> State<'c> {
    fn new(cluster: &'c Cluster) -> State<'c> {
        let free: Vec<Free> = cluster
            .nodes
            .iter()
            .map(|n| {
                let t = &cluster.types[n.node_type].topology;
                Free { gpus: all_of(t.gpu_count()), vfs: all_of(t.vfs().len()) }
            })
            .collect();
        let total_free = free.iter().map(|m| m.gpus.count_ones() as usize).sum();
        let stranded = vec![0; free.len()];
        State { cluster, free, stranded, total_stranded: 0, total_free, total_gpus: total_free }
    }

    /// Set what is free on a node; returns what it had.
    fn set_free(&mut self, node: usize, free: Free) -> Free {
        let prepared = &self.cluster.types[self.cluster.nodes[node].node_type].prepared;
        let old = self.free[node];
        self.total_free = self.total_free + free.gpus.count_ones() as usize - old.gpus.count_ones() as usize;
        self.free[node] = free;
        if free.gpus != old.gpus {
            let s = stranded_gpus(prepared, free.gpus);
            self.total_stranded = self.total_stranded + s - self.stranded[node];
            self.stranded[node] = s;
        }
        old
    }
}

/// Every one of `n` positions (GPUs or VFs; at most 128).
pub(crate) fn all_of(n: usize) -> u128 {
    if n >= 128 { u128::MAX } else { (1u128 << n) - 1 }
}

pub(crate) fn mask_to_vec(mask: u128) -> Vec<usize> {
    (0..128).filter(|&i| mask & (1u128 << i) != 0).collect()
}

pub(crate) fn vec_to_mask(gpus: &[usize]) -> u128 {
    gpus.iter().fold(0u128, |m, &g| m | (1u128 << g))
}

/// go-gpuallocator-style node-local allocation: the best-effort objective for ≥ 2 GPUs, the lowest
/// free GPU for 1 (upstream's behaviour, reference §1.3).
pub(crate) fn gpuallocator_style(cluster: &Cluster, node: usize, free: u128, count: usize) -> Result<u128, SimError> {
    if count == 1 {
        return Ok(free & free.wrapping_neg());
    }
    let prepared = &cluster.types[cluster.nodes[node].node_type].prepared;
    let avail = mask_to_vec(free);
    Ok(vec_to_mask(
        &allocate(prepared, &Policy::BestEffort, &Request { count, available: &avail, required: &[] })?.gpus,
    ))
}

/// Whether every VF at `vfs` shares a PCIe switch with one of the GPUs at `gpus`.
pub(crate) fn all_near(topology: &NodeTopology, gpus: u128, vfs: u128) -> bool {
    let gpus = mask_to_vec(gpus);
    mask_to_vec(vfs).into_iter().all(|v| near_enough(topology.vf_nearest(v, &gpus)))
}

/// One kind of pod: a GPU count and, per physnet (a position in [`Kinds::physnets`]), a VF count.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct KindKey {
    gpus: usize,
    vfs: Vec<(usize, usize)>,
}

struct Kind {
    key: KindKey,
    /// The same ask by physnet name, as `weft_net::joint` takes it.
    ask: VfAsk,
}

/// The distinct kinds of pod the stream has (GPU count and VF ask), in a fixed order: each index
/// keeps one view per kind. Every GPU count also has its kind without VFs, so a pod left out can
/// be told apart: no GPUs anywhere, or GPUs but not beside the VFs.
struct Kinds {
    /// The physnets pods ask for, sorted.
    physnets: Vec<Arc<str>>,
    list: Vec<Kind>,
    index: FxHashMap<KindKey, usize>,
    /// Per node type, per physnet: its VFs.
    masks: Vec<Vec<u128>>,
}

impl Kinds {
    fn of_stream(cluster: &Cluster, pods: &[SimPod]) -> Kinds {
        let physnets: Vec<Arc<str>> = pods
            .iter()
            .flat_map(|p| p.vfs.iter().filter(|(_, n)| *n > 0).map(|(name, _)| name.clone()))
            .collect::<BTreeSet<Arc<str>>>()
            .into_iter()
            .collect();
        let mut kinds = Kinds { physnets, list: Vec::new(), index: FxHashMap::default(), masks: Vec::new() };
        let mut keys = BTreeSet::new();
        for p in pods {
            if let Some(key) = kinds.key(p) {
                keys.insert(KindKey { gpus: p.gpus, vfs: Vec::new() });
                keys.insert(key);
            }
        }
        for key in keys {
            let ask = key.vfs.iter().map(|&(p, n)| (kinds.physnets[p].to_string(), n)).collect();
            kinds.index.insert(key.clone(), kinds.list.len());
            kinds.list.push(Kind { key, ask });
        }
        kinds.masks = cluster.types.iter().map(|t| kinds.physnets.iter().map(|p| t.vf_mask(p)).collect()).collect();
        kinds
    }

    /// The kind of a pod (VF counts of 0 left out, a physnet named twice counted once with the
    /// sum); None when a physnet is not in the stream's.
    fn key(&self, pod: &SimPod) -> Option<KindKey> {
        let mut vfs: Vec<(usize, usize)> = Vec::new();
        for (name, n) in &pod.vfs {
            if *n > 0 {
                vfs.push((self.physnets.binary_search(name).ok()?, *n));
            }
        }
        vfs.sort_unstable();
        vfs.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.saturating_add(later.1);
            }
            same
        });
        Some(KindKey { gpus: pod.gpus, vfs })
    }

    /// Position of a pod's kind.
    fn of(&self, pod: &SimPod) -> Option<usize> {
        self.index.get(&self.key(pod)?).copied()
    }

    /// Position of the kind of `gpus` GPUs and no VFs.
    fn gpus_only(&self, gpus: usize) -> Option<usize> {
        self.index.get(&KindKey { gpus, vfs: Vec::new() }).copied()
    }

    /// A node type's VFs of every physnet the stream asks for.
    fn stream_vfs(&self, t: usize) -> u128 {
        self.masks[t].iter().fold(0, |a, b| a | b)
    }

    fn asks_vfs(&self, kind: usize) -> bool {
        !self.list[kind].key.vfs.is_empty()
    }

    /// Whether a node of type `t` with `free` free has the GPUs and VFs of `kind`.
    fn fits(&self, kind: usize, t: usize, free: Free) -> bool {
        let key = &self.list[kind].key;
        free.gpus.count_ones() as usize >= key.gpus
            && key.vfs.iter().all(|&(p, n)| (free.vfs & self.masks[t][p]).count_ones() as usize >= n)
    }

    /// The lowest free VFs of each physnet `kind` asks for (what a topology-blind VF plugin gives);
    /// the node must have them ([`Kinds::fits`]).
    fn lowest_vfs(&self, kind: usize, t: usize, free_vfs: u128) -> u128 {
        let mut taken = 0u128;
        for &(p, n) in &self.list[kind].key.vfs {
            let mut avail = free_vfs & self.masks[t][p];
            for _ in 0..n {
                let low = avail & avail.wrapping_neg();
                taken |= low;
                avail &= !low;
            }
        }
        taken
    }
}

/// Per node type, each VF's position by PCI address (a hash lookup: `decide` asks whether a VF is
/// free many times per call).
struct VfPositions<'c>(Vec<FxHashMap<&'c str, usize>>);

impl<'c> VfPositions<'c> {
    fn of(cluster: &'c Cluster) -> VfPositions<'c> {
        VfPositions(
            cluster
                .types
                .iter()
                .map(|t| t.topology.vfs().iter().enumerate().map(|(i, v)| (v.pci_address.as_str(), i)).collect())
                .collect(),
        )
    }

    fn get(&self, t: usize, pci_address: &str) -> Option<usize> {
        self.0[t].get(pci_address).copied()
    }

    /// The VFs of a plan, as positions in node type `t`'s VFs.
    fn mask(&self, t: usize, plan: &VfPlan) -> u128 {
        plan.vfs.values().flatten().filter_map(|a| self.get(t, a)).fold(0, |m, i| m | 1u128 << i)
    }
}

/// weft's fit of a node of type `t` with `free` free for a pod of `kind`: the node score and what the
/// pod gets. GPU-only pods: [`ScoreCache::score`] (`score_node`). Pods asking VFs: that GPU score
/// made [`joint_score`] of the [`decide`] decision, which gives the GPUs and VFs. None when the node
/// cannot take the pod.
#[allow(clippy::too_many_arguments)]
fn weft_fit(
    cluster: &Cluster,
    positions: &VfPositions<'_>,
    kinds: &Kinds,
    kind: usize,
    t: usize,
    free: Free,
    cache: &mut ScoreCache,
    cfg: &ScoreConfig,
) -> Option<(u8, Free)> {
    if !kinds.fits(kind, t, free) {
        return None;
    }
    let node_type = &cluster.types[t];
    let Kind { key, ask } = &kinds.list[kind];
    let gpus = mask_to_vec(free.gpus);
    // A set the allocator refuses leaves the node out.
    let fit = cache.score(&node_type.prepared, &gpus, key.gpus, cfg).ok()?;
    if key.vfs.is_empty() {
        return Some((fit.score, Free { gpus: vec_to_mask(&fit.gpus), vfs: 0 }));
    }
    let vf_free = |a: &str| positions.get(t, a).is_some_and(|i| free.vfs >> i & 1 == 1);
    let choice = decide(&node_type.prepared, &node_type.topology, &gpus, &vf_free, key.gpus, ask, &[]).ok()?;
    let held = Free { gpus: vec_to_mask(&choice.gpus), vfs: positions.mask(t, &choice.vfs) };
    Some((joint_score(fit.score, &choice), held))
}

/// The first key of weft's node ranking: 1 when a pod that asks no VFs would take GPUs of a node
/// that still has VFs free (`free_vfs`: its free VFs of the physnets the stream asks for), else 0.
/// Such a pod goes to a node whose VFs are all taken, or that has none, when one can take it, and
/// only then to one of the nodes VF pods can use: GPUs beside free VFs are what VF pods are short
/// of (measured in docs/gpu-placement.md, "GPUs and VFs packed together"). Within a class the
/// score and the fit decide as before.
fn spares_vfs(kinds: &Kinds, kind: usize, free_vfs: u128) -> u8 {
    u8::from(!kinds.asks_vfs(kind) && free_vfs != 0)
}

/// weft's node choice without scanning every node. Nodes of one type with the same free GPUs and
/// VFs score alike for every kind of pod, so they form one group, scored once when the group
/// appears; per kind, a ranking holds each group that can take it under the key of the scan it
/// replaces ([`spares_vfs`] ascending, score descending, free GPUs ascending, lowest node), and its
/// first entry is the scan's answer.
///
/// A group appears again and again as nodes fill and empty; the fits of kinds asking VFs (a
/// `decide` each) are kept in a cache of their own, as [`ScoreCache`] keeps the GPU scores.
struct WeftIndex<'c> {
    cluster: &'c Cluster,
    config: ScoreConfig,
    cache: ScoreCache,
    positions: VfPositions<'c>,
    joint: FxHashMap<(usize, Free, usize), Option<(u8, Free)>>,
    groups: FxHashMap<(usize, Free), Group>,
    ranking: Vec<BTreeSet<RankKey>>,
    /// Per node type: its VFs of every physnet the stream asks for.
    vf_union: Vec<u128>,
}

/// Where a group stands in a kind's ranking: [`spares_vfs`], the score (descending), its free GPUs
/// and its lowest node; the least key is the answer.
type RankKey = (u8, Reverse<u8>, u32, usize);

/// Most joint fits [`WeftIndex`] keeps (about 80 bytes each); it starts over when full.
const JOINT_CACHE_ENTRIES: usize = 1 << 20;

/// The nodes of one (type, free GPUs and VFs), and per kind the score and what weft would give.
struct Group {
    nodes: BTreeSet<usize>,
    fits: Vec<Option<(u8, Free)>>,
    classes: Vec<u8>,
}

impl<'c> WeftIndex<'c> {
    fn new(cluster: &'c Cluster, state: &State<'_>, kinds: &Kinds, config: &ScoreConfig) -> WeftIndex<'c> {
        let ranking = vec![BTreeSet::new(); kinds.list.len()];
        let mut index = WeftIndex {
            cluster,
            config: config.clone(),
            cache: ScoreCache::new(),
            positions: VfPositions::of(cluster),
            joint: FxHashMap::default(),
            groups: FxHashMap::default(),
            ranking,
            vf_union: (0..kinds.masks.len()).map(|t| kinds.stream_vfs(t)).collect(),
        };
        for (n, &free) in state.free.iter().enumerate() {
            index.join(kinds, n, free);
        }
        index
    }

    fn key(&self, node: usize, free: Free) -> (usize, Free) {
        (self.cluster.nodes[node].node_type, free)
    }

    /// Re-rank a group whose lowest node went from `before` to `after`.
    fn rerank(&mut self, key: (usize, Free), before: Option<usize>, after: Option<usize>) {
        if before == after {
            return;
        }
        let Some(group) = self.groups.get(&key) else { return };
        let free = key.1.gpus.count_ones();
        for (k, fit) in group.fits.iter().enumerate() {
            let Some((score, _)) = *fit else { continue };
            let class = group.classes[k];
            if let Some(b) = before {
                self.ranking[k].remove(&(class, Reverse(score), free, b));
            }
            if let Some(a) = after {
                self.ranking[k].insert((class, Reverse(score), free, a));
            }
        }
    }

    fn join(&mut self, kinds: &Kinds, node: usize, free: Free) {
        let key = self.key(node, free);
        if !self.groups.contains_key(&key) {
            let fits = (0..kinds.list.len()).map(|k| self.fit(kinds, k, key.0, free)).collect();
            let classes = (0..kinds.list.len()).map(|k| self.class(kinds, k, key.0, free)).collect();
            self.groups.insert(key, Group { nodes: BTreeSet::new(), fits, classes });
        }
        let Some(group) = self.groups.get_mut(&key) else { return };
        let before = group.nodes.first().copied();
        group.nodes.insert(node);
        let after = group.nodes.first().copied();
        self.rerank(key, before, after);
    }

    /// [`spares_vfs`] for a group of nodes of type `t` with `free` free.
    fn class(&self, kinds: &Kinds, kind: usize, t: usize, free: Free) -> u8 {
        spares_vfs(kinds, kind, free.vfs & self.vf_union[t])
    }

    /// [`weft_fit`], through the joint cache for kinds asking VFs.
    fn fit(&mut self, kinds: &Kinds, kind: usize, t: usize, free: Free) -> Option<(u8, Free)> {
        if !kinds.asks_vfs(kind) || !kinds.fits(kind, t, free) {
            return weft_fit(self.cluster, &self.positions, kinds, kind, t, free, &mut self.cache, &self.config);
        }
        if let Some(&fit) = self.joint.get(&(t, free, kind)) {
            return fit;
        }
        let fit = weft_fit(self.cluster, &self.positions, kinds, kind, t, free, &mut self.cache, &self.config);
        if self.joint.len() >= JOINT_CACHE_ENTRIES {
            self.joint.clear();
        }
        self.joint.insert((t, free, kind), fit);
        fit
    }

    fn leave(&mut self, node: usize, free: Free) {
        let key = self.key(node, free);
        let Some(group) = self.groups.get_mut(&key) else { return };
        let before = group.nodes.first().copied();
        group.nodes.remove(&node);
        let after = group.nodes.first().copied();
        self.rerank(key, before, after);
        if after.is_none() {
            self.groups.remove(&key);
        }
    }

    fn choose(&self, state: &State<'_>, kind: usize) -> Option<Placement> {
        let &(_, _, _, node) = self.ranking[kind].first()?;
        let group = self.groups.get(&self.key(node, state.free[node]))?;
        let (_, held) = group.fits[kind]?;
        Some((node, held))
    }
}

/// The blind policy's candidates without a scan: per kind, a Fenwick tree over the nodes (1 where a
/// node has that kind's GPUs and VFs free), so the scan's `fits[r]`, the r-th fitting node by
/// number, is found in O(log nodes) and the seeded random draw is the same.
struct FitIndex {
    fits: Vec<FenwickTree<usize>>,
}

impl FitIndex {
    fn new(cluster: &Cluster, state: &State<'_>, kinds: &Kinds) -> FitIndex {
        let fits = (0..kinds.list.len())
            .map(|k| {
                state
                    .free
                    .iter()
                    .enumerate()
                    .map(|(n, &free)| usize::from(kinds.fits(k, cluster.nodes[n].node_type, free)))
                    .collect()
            })
            .collect();
        FitIndex { fits }
    }

    fn moved(&mut self, kinds: &Kinds, t: usize, node: usize, old: Free, new: Free) {
        for (k, fits) in self.fits.iter_mut().enumerate() {
            match (kinds.fits(k, t, old), kinds.fits(k, t, new)) {
                (false, true) => fits.add_at(node, 1),
                (true, false) => fits.sub_at(node, 1),
                _ => {}
            }
        }
    }

    /// How many nodes can take a pod of `kind`.
    fn count(&self, kind: usize) -> usize {
        self.fits[kind].prefix_sum(self.fits[kind].len(), 0)
    }

    /// The node that can take `kind` that is `rank`-th (from 0) by node number; `rank < count(kind)`.
    fn nth(&self, kind: usize, rank: usize) -> usize {
        self.fits[kind].index_of(rank + 1)
    }
}

/// kube-scheduler's LeastAllocated choice without a scan: per kind, the nodes that can take it keyed
/// by free GPU share (largest first; the share is a non-negative float, whose bits order as its
/// values) and node number, as the scan's strict `>` kept the lowest node of a tie.
struct ShareIndex<'c> {
    cluster: &'c Cluster,
    ranking: Vec<BTreeSet<(Reverse<u64>, usize)>>,
}

impl<'c> ShareIndex<'c> {
    fn new(cluster: &'c Cluster, state: &State<'_>, kinds: &Kinds) -> ShareIndex<'c> {
        let ranking = vec![BTreeSet::new(); kinds.list.len()];
        let mut index = ShareIndex { cluster, ranking };
        for (n, &free) in state.free.iter().enumerate() {
            let t = cluster.nodes[n].node_type;
            for k in 0..kinds.list.len() {
                if kinds.fits(k, t, free) {
                    let key = (index.share(n, free.gpus), n);
                    index.ranking[k].insert(key);
                }
            }
        }
        index
    }

    fn share(&self, node: usize, free: u128) -> Reverse<u64> {
        let total = self.cluster.types[self.cluster.nodes[node].node_type].topology.gpu_count();
        Reverse((free.count_ones() as f64 / total as f64).to_bits())
    }

    fn moved(&mut self, kinds: &Kinds, t: usize, node: usize, old: Free, new: Free) {
        let (old_share, new_share) = (self.share(node, old.gpus), self.share(node, new.gpus));
        for (k, ranking) in self.ranking.iter_mut().enumerate() {
            let (before, after) = (kinds.fits(k, t, old), kinds.fits(k, t, new));
            if before && after && old_share == new_share {
                continue;
            }
            if before {
                ranking.remove(&(old_share, node));
            }
            if after {
                ranking.insert((new_share, node));
            }
        }
    }

    fn choose(&self, kind: usize) -> Option<usize> {
        self.ranking[kind].first().map(|&(_, n)| n)
    }
}

/// Where a policy looks for a node.
enum Chooser<'c> {
    Weft(WeftIndex<'c>),
    Blind(FitIndex),
    LeastAllocated(ShareIndex<'c>),
    /// The scans the indexes replace, kept to check them against.
    #[cfg(test)]
    Scan(PlacementPolicy, ScoreConfig, ScoreCache, VfPositions<'c>),
}

impl<'c> Chooser<'c> {
    fn new(cluster: &'c Cluster, state: &State<'_>, kinds: &Kinds, policy: PlacementPolicy, cfg: &ScoreConfig) -> Self {
        match policy {
            PlacementPolicy::Weft => Chooser::Weft(WeftIndex::new(cluster, state, kinds, cfg)),
            PlacementPolicy::Blind => Chooser::Blind(FitIndex::new(cluster, state, kinds)),
            PlacementPolicy::LeastAllocated => Chooser::LeastAllocated(ShareIndex::new(cluster, state, kinds)),
        }
    }

    /// What is free on a node went from `old` to `new`.
    fn moved(&mut self, cluster: &Cluster, kinds: &Kinds, node: usize, old: Free, new: Free) {
        let t = cluster.nodes[node].node_type;
        match self {
            Chooser::Weft(index) => {
                index.leave(node, old);
                index.join(kinds, node, new);
            }
            Chooser::Blind(index) => index.moved(kinds, t, node, old, new),
            Chooser::LeastAllocated(index) => index.moved(kinds, t, node, old, new),
            #[cfg(test)]
            Chooser::Scan(..) => {}
        }
    }

    /// The node and what a pod of `kind` gets there, or None if no node can take it.
    fn choose(
        &mut self,
        state: &State<'_>,
        kinds: &Kinds,
        kind: usize,
        rng: &mut ChaCha8Rng,
    ) -> Result<Option<Placement>, SimError> {
        let cluster = state.cluster;
        let node_local = |n: usize| -> Result<Placement, SimError> {
            let free = state.free[n];
            let gpus = gpuallocator_style(cluster, n, free.gpus, kinds.list[kind].key.gpus)?;
            Ok((n, Free { gpus, vfs: kinds.lowest_vfs(kind, cluster.nodes[n].node_type, free.vfs) }))
        };
        Ok(match self {
            Chooser::Weft(index) => index.choose(state, kind),
            Chooser::Blind(index) => match index.count(kind) {
                0 => None,
                len => Some(node_local(index.nth(kind, rng.random_range(0..len)))?),
            },
            Chooser::LeastAllocated(index) => index.choose(kind).map(node_local).transpose()?,
            #[cfg(test)]
            Chooser::Scan(policy, cfg, cache, positions) => {
                scan(state, kinds, positions, *policy, kind, cfg, cache, rng)?
            }
        })
    }

    /// Whether some node can take a pod of `kind` (used for the GPU-only kind of a pod left out).
    /// The state and kinds are only the scan's.
    #[cfg_attr(not(test), allow(unused_variables))]
    fn any_fits(&self, state: &State<'_>, kinds: &Kinds, kind: usize) -> bool {
        match self {
            Chooser::Weft(index) => !index.ranking[kind].is_empty(),
            Chooser::Blind(index) => index.count(kind) > 0,
            Chooser::LeastAllocated(index) => index.choose(kind).is_some(),
            #[cfg(test)]
            Chooser::Scan(..) => {
                state.free.iter().enumerate().any(|(n, &free)| kinds.fits(kind, state.cluster.nodes[n].node_type, free))
            }
        }
    }
}

/// The policies as plain scans over every node (what the indexes must agree with).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
fn scan(
    state: &State<'_>,
    kinds: &Kinds,
    positions: &VfPositions<'_>,
    policy: PlacementPolicy,
    kind: usize,
    cfg: &ScoreConfig,
    cache: &mut ScoreCache,
    rng: &mut ChaCha8Rng,
) -> Result<Option<Placement>, SimError> {
    let cluster = state.cluster;
    let type_of = |n: usize| cluster.nodes[n].node_type;
    let fits = |n: usize| kinds.fits(kind, type_of(n), state.free[n]);
    let node_local = |n: usize| -> Result<Placement, SimError> {
        let free = state.free[n];
        let gpus = gpuallocator_style(cluster, n, free.gpus, kinds.list[kind].key.gpus)?;
        Ok((n, Free { gpus, vfs: kinds.lowest_vfs(kind, type_of(n), free.vfs) }))
    };
    Ok(match policy {
        PlacementPolicy::Weft => {
            let mut best: Option<(RankKey, Free)> = None;
            for n in 0..cluster.nodes.len() {
                if !fits(n) {
                    continue;
                }
                let Some((score, held)) =
                    weft_fit(cluster, positions, kinds, kind, type_of(n), state.free[n], cache, cfg)
                else {
                    continue;
                };
                let class = spares_vfs(kinds, kind, state.free[n].vfs & kinds.stream_vfs(type_of(n)));
                let key = (class, Reverse(score), state.free[n].gpus.count_ones(), n);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, held));
                }
            }
            best.map(|((.., n), held)| (n, held))
        }
        PlacementPolicy::Blind => {
            let fitting: Vec<usize> = (0..cluster.nodes.len()).filter(|&n| fits(n)).collect();
            if fitting.is_empty() { None } else { Some(node_local(fitting[rng.random_range(0..fitting.len())])?) }
        }
        PlacementPolicy::LeastAllocated => {
            let mut best: Option<(f64, usize)> = None;
            for n in 0..cluster.nodes.len() {
                if !fits(n) {
                    continue;
                }
                let share =
                    state.free[n].gpus.count_ones() as f64 / cluster.types[type_of(n)].topology.gpu_count() as f64;
                if best.is_none_or(|(s, _)| share > s) {
                    best = Some((share, n));
                }
            }
            best.map(|(_, n)| node_local(n)).transpose()?
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
/// Each decision costs O(kinds · log nodes), not a scan of the nodes (a kind is a pod's GPU count
/// and VF ask; the stream's distinct kinds): see [`WeftIndex`], [`FitIndex`] and [`ShareIndex`];
/// the scans they replace are kept in the tests, which check that both make every decision alike.
pub fn run_policy(
    cluster: &Cluster,
    pods: &[SimPod],
    policy: PlacementPolicy,
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<PolicyReport, SimError> {
    check_pods(pods)?;
    check_cluster(cluster)?;
    let kinds = Kinds::of_stream(cluster, pods);
    let state = State::new(cluster);
    let chooser = Chooser::new(cluster, &state, &kinds, policy, score_config);
    run(state, &kinds, chooser, pods, policy, seed, progress, None, None)
}

/// [`run_policy`], handing each pod's [`PodOutcome`] to `record` as it is decided, in stream order.
/// Nothing is kept for it: a caller that writes each record out holds one at a time.
pub fn run_policy_recorded(
    cluster: &Cluster,
    pods: &[SimPod],
    policy: PlacementPolicy,
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(Progress),
    record: &mut RecordPod<'_>,
) -> Result<PolicyReport, SimError> {
    check_pods(pods)?;
    check_cluster(cluster)?;
    let kinds = Kinds::of_stream(cluster, pods);
    let state = State::new(cluster);
    let chooser = Chooser::new(cluster, &state, &kinds, policy, score_config);
    run(state, &kinds, chooser, pods, policy, seed, progress, None, Some(record))
}

/// Node types the engine cannot take: more VFs than it keeps per node ([`ClusterSpec::build`]
/// refuses them already; a [`Cluster`] put together by hand may have them).
///
/// [`ClusterSpec::build`]: crate::ClusterSpec::build
fn check_cluster(cluster: &Cluster) -> Result<(), SimError> {
    match cluster.types.iter().find(|t| t.topology.vfs().len() > MAX_VFS_PER_NODE) {
        Some(t) => Err(SimError::TooLarge {
            what: format!("node type '{}': VFs per node", t.name),
            asked: t.topology.vfs().len() as u128,
            limit: MAX_VFS_PER_NODE,
        }),
        None => Ok(()),
    }
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

#[allow(clippy::too_many_arguments)]
fn run(
    mut state: State<'_>,
    kinds: &Kinds,
    mut chooser: Chooser<'_>,
    pods: &[SimPod],
    policy: PlacementPolicy,
    seed: u64,
    progress: &mut dyn FnMut(Progress),
    mut trace: Option<&mut Vec<Option<Placement>>>,
    mut record: Option<&mut RecordPod<'_>>,
) -> Result<PolicyReport, SimError> {
    let started = Instant::now();
    let cluster = state.cluster;
    let mut departures: BinaryHeap<Reverse<Departure>> = BinaryHeap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut by_size: BTreeMap<usize, SizeCount> = BTreeMap::new();
    let mut bandwidths: Vec<f64> = Vec::new();
    let mut rings: Vec<f64> = Vec::new();
    // The best ring of a set depends on the node type and the set only.
    let mut ring_of: FxHashMap<(usize, u128), f64> = FxHashMap::default();
    let mut all_nvlink = 0usize;
    let (mut placed, mut unplaced, mut unplaced_for_vfs) = (0usize, 0usize, 0usize);
    let (mut vf_placed, mut vf_near) = (0usize, 0usize);
    let (mut stranded_sum, mut free_sum) = (0f64, 0f64);
    let step = (pods.len() / 1000).max(1);

    for (i, pod) in pods.iter().enumerate() {
        while departures.peek().is_some_and(|d| d.0.at <= pod.arrival) {
            if let Some(Reverse(d)) = departures.pop() {
                let f = state.free[d.node];
                let old = state.set_free(d.node, Free { gpus: f.gpus | d.held.gpus, vfs: f.vfs | d.held.vfs });
                chooser.moved(cluster, kinds, d.node, old, state.free[d.node]);
            }
        }
        stranded_sum += state.total_stranded as f64;
        free_sum += state.total_free as f64;
        let entry = by_size.entry(pod.gpus).or_default();
        entry.offered += 1;

        let kind = kinds.of(pod).ok_or_else(|| SimError::Format {
            source_name: "workload".into(),
            message: format!("pod '{}' is not of the stream the run was set up for", pod.name),
        })?;
        let choice = chooser.choose(&state, kinds, kind, &mut rng)?;
        if let Some(t) = trace.as_deref_mut() {
            t.push(choice);
        }
        match choice {
            Some((n, held)) => {
                let f = state.free[n];
                debug_assert_eq!(f.gpus & held.gpus, held.gpus, "allocated GPUs must be free");
                debug_assert_eq!(f.vfs & held.vfs, held.vfs, "allocated VFs must be free");
                debug_assert_eq!(held.gpus.count_ones() as usize, pod.gpus);
                let old = state.set_free(n, Free { gpus: f.gpus & !held.gpus, vfs: f.vfs & !held.vfs });
                chooser.moved(cluster, kinds, n, old, state.free[n]);
                departures.push(Reverse(Departure { at: pod.arrival + pod.duration, node: n, held }));
                placed += 1;
                entry.placed += 1;
                let t = cluster.nodes[n].node_type;
                let topo = &cluster.types[t].topology;
                let (mut ring, mut pair) = (None, None);
                if pod.gpus >= 2 {
                    let gpus = mask_to_vec(held.gpus);
                    let mean_pair = topo.mean_pair_bandwidth_gbps(&gpus);
                    bandwidths.push(mean_pair);
                    let best = *ring_of
                        .entry((t, held.gpus))
                        .or_insert_with(|| topo.ring_bandwidth(&gpus).map_or(0.0, |r| r.gbps));
                    rings.push(best);
                    all_nvlink += usize::from(topo.all_nvlinked(&gpus));
                    (ring, pair) = (Some(best), Some(mean_pair));
                }
                let mut near = None;
                if kinds.asks_vfs(kind) {
                    vf_placed += 1;
                    let all = all_near(topo, held.gpus, held.vfs);
                    vf_near += usize::from(all);
                    near = Some(all);
                }
                if let Some(record) = record.as_deref_mut() {
                    let placement = PodPlacement {
                        node: &cluster.nodes[n].name,
                        node_type: &cluster.types[t].name,
                        gpus: mask_to_vec(held.gpus),
                        vfs: mask_to_vec(held.vfs).into_iter().filter_map(|v| topo.vfs().get(v)).collect(),
                        vfs_near_gpus: near,
                        ring_gbps: ring,
                        mean_pair_gbps: pair,
                        start: pod.arrival,
                        end: pod.arrival + pod.duration,
                    };
                    let now = cluster_now(&state, departures.len(), placed, unplaced);
                    record(&PodOutcome { policy, index: i, pod, placement: Ok(placement), cluster: now })
                        .map_err(SimError::Records)?;
                }
            }
            None => {
                unplaced += 1;
                let short_of_vfs = kinds.asks_vfs(kind)
                    && kinds.gpus_only(pod.gpus).is_some_and(|k| chooser.any_fits(&state, kinds, k));
                unplaced_for_vfs += usize::from(short_of_vfs);
                if let Some(record) = record.as_deref_mut() {
                    let why = if short_of_vfs { NotPlaced::ShortOfVfs } else { NotPlaced::NoGpus };
                    let now = cluster_now(&state, departures.len(), placed, unplaced);
                    record(&PodOutcome { policy, index: i, pod, placement: Err(why), cluster: now })
                        .map_err(SimError::Records)?;
                }
            }
        }
        if i % step == 0 {
            progress(Progress { handled: i + 1, placed });
        }
    }
    progress(Progress { handled: pods.len(), placed });

    let multi = bandwidths.len();
    let (mean_bw, p10) = mean_and_p10(&mut bandwidths);
    let (mean_ring, p10_ring) = mean_and_p10(&mut rings);
    let arrivals = pods.len().max(1) as f64;
    Ok(PolicyReport {
        policy: policy.name().to_string(),
        placed,
        unplaced,
        unplaced_for_vfs,
        by_size,
        multi_gpu_placed: multi,
        mean_ring_bandwidth_gbps: mean_ring,
        p10_ring_bandwidth_gbps: p10_ring,
        mean_pair_bandwidth_gbps: mean_bw,
        p10_pair_bandwidth_gbps: p10,
        all_nvlink_share: if multi == 0 { 0.0 } else { all_nvlink as f64 / multi as f64 },
        vf_pods_placed: vf_placed,
        vf_near_gpu_share: if vf_placed == 0 { 0.0 } else { vf_near as f64 / vf_placed as f64 },
        mean_stranded_gpus: stranded_sum / arrivals,
        stranded_share_of_free: if free_sum > 0.0 { stranded_sum / free_sum } else { 0.0 },
        run_ms: started.elapsed().as_secs_f64() * 1000.0,
    })
}

/// [`ClusterNow`] of a run: `running` pods hold GPUs (the departures not yet due).
fn cluster_now(state: &State<'_>, running: usize, placed: usize, not_placed: usize) -> ClusterNow {
    ClusterNow {
        running_pods: running,
        gpus_in_use: state.total_gpus - state.total_free,
        stranded_gpus: state.total_stranded,
        placed,
        not_placed,
    }
}

/// The mean and the nearest-rank 10th percentile of `values` (sorted in place); zeros when empty.
fn mean_and_p10(values: &mut [f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    values.sort_by(f64::total_cmp);
    (mean, values[(values.len() as f64 * 0.1).ceil() as usize - 1])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cluster::{ClusterSpec, NodeTypeSpec, builtin_types};
    use crate::workload::Generate;

    /// Every decision of a run: the node and what the pod got, or None.
    fn trace(
        cluster: &Cluster,
        pods: &[SimPod],
        policy: PlacementPolicy,
        cfg: &ScoreConfig,
        seed: u64,
        scan_only: bool,
    ) -> (Vec<Option<Placement>>, PolicyReport) {
        let kinds = Kinds::of_stream(cluster, pods);
        let state = State::new(cluster);
        let chooser = if scan_only {
            Chooser::Scan(policy, cfg.clone(), ScoreCache::new(), VfPositions::of(cluster))
        } else {
            Chooser::new(cluster, &state, &kinds, policy, cfg)
        };
        let mut decisions = Vec::new();
        let report = run(state, &kinds, chooser, pods, policy, seed, &mut |_| {}, Some(&mut decisions), None).unwrap();
        (decisions, report)
    }

    fn build(types: Vec<NodeTypeSpec>) -> Cluster {
        ClusterSpec { api_version: crate::API_VERSION.into(), kind: "SimCluster".into(), node_types: types }
            .build(None)
            .unwrap()
    }

    /// The built-in types in order, `counts[i]` nodes of the i-th, default VFs.
    fn cluster(counts: &[usize]) -> Cluster {
        build(
            counts.iter().zip(builtin_types()).map(|(&count, (name, _))| NodeTypeSpec::builtin(name, count)).collect(),
        )
    }

    /// `count` nodes of built-in type `name` with `vfs_per_nic` VFs on each NIC.
    fn with_vfs(name: &str, count: usize, vfs_per_nic: usize) -> NodeTypeSpec {
        NodeTypeSpec { vfs_per_nic: Some(vfs_per_nic), ..NodeTypeSpec::builtin(name, count) }
    }

    /// A pod of `gpus` GPUs and `vfs` VFs of `fabric`.
    fn pod(name: &str, gpus: usize, vfs: usize, arrival: f64, duration: f64) -> SimPod {
        let mut p = SimPod::gpus(name, gpus, arrival, duration);
        if vfs > 0 {
            p.vfs = vec![("fabric".into(), vfs)];
        }
        p
    }

    /// A pod without VFs takes the node without VFs although the VF node scores higher (NVSwitch
    /// against PCIe), so the VF pod after it still finds GPUs beside free VFs; with the VF node's
    /// VFs all taken, it ranks by score again.
    #[test]
    fn a_pod_without_vfs_leaves_the_gpus_beside_free_vfs_to_the_pods_that_need_them() {
        let c = build(vec![NodeTypeSpec::builtin("hgx-h100", 1), with_vfs("pcie-8gpu", 1, 0)]);
        let h100 = c.nodes.iter().position(|n| c.types[n.node_type].name == "hgx-h100").unwrap();
        let pods = [pod("gpu-only", 8, 0, 0.0, 100.0), pod("with-vf", 8, 1, 1.0, 100.0)];
        let cfg = ScoreConfig::default();
        for scan_only in [false, true] {
            let (decisions, report) = trace(&c, &pods, PlacementPolicy::Weft, &cfg, 1, scan_only);
            assert_eq!(report.placed, 2, "scan {scan_only}: {decisions:?}");
            assert_ne!(decisions[0].unwrap().0, h100, "the pod without VFs went to the VF node");
            assert_eq!(decisions[1].unwrap().0, h100);
        }
        // Once a VF pod holds every VF of the H100 (8, one per NIC), a pod without VFs ranks the
        // nodes by their score again and takes an NVSwitch pair over a PCIe one.
        let c = build(vec![with_vfs("hgx-h100", 1, 1), with_vfs("pcie-8gpu", 1, 0)]);
        let h100 = c.nodes.iter().position(|n| c.types[n.node_type].name == "hgx-h100").unwrap();
        let pods = [pod("all-vfs", 1, 8, 0.0, 100.0), pod("pair", 2, 0, 1.0, 100.0)];
        for scan_only in [false, true] {
            let (decisions, _) = trace(&c, &pods, PlacementPolicy::Weft, &cfg, 1, scan_only);
            assert_eq!(decisions[0].unwrap().0, h100);
            assert_eq!(decisions[1].unwrap().0, h100, "scan {scan_only}: {decisions:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

        /// The indexes decide exactly as the scans over every node do, pod by pod, for every policy:
        /// mixed node types with few or many VFs (or none), pod sizes some nodes cannot take (3, 5,
        /// 16), pods asking 1–3 VFs or none, loads from light to far over capacity, any remainder
        /// weight and seed.
        #[test]
        fn indexes_decide_as_the_scans_do(
            counts in proptest::collection::vec(0usize..6, 8),
            vfs_per_nic in proptest::collection::vec(prop::sample::select(vec![0usize, 1, 2, 8]), 8),
            sizes in proptest::collection::btree_map(prop::sample::select(vec![1usize, 2, 3, 4, 5, 8, 16]), 0.05f64..1.0, 1..5),
            vf_share in prop::sample::select(vec![0.0f64, 0.3, 0.7, 1.0]),
            vfs_per_pod in 1usize..4,
            pods in 50usize..400,
            load in 0.3f64..3.0,
            weight in 0.0f64..1.0,
            seed in any::<u64>(),
        ) {
            let mut counts = counts;
            if counts.iter().all(|&c| c == 0) {
                counts[seed as usize % 8] = 1;
            }
            let types = builtin_types();
            let cluster = build(
                (0..8).map(|i| with_vfs(types[i].0, counts[i], vfs_per_nic[i])).collect(),
            );
            let mean_size: f64 = sizes.iter().map(|(s, p)| *s as f64 * p).sum::<f64>() / sizes.values().sum::<f64>();
            let generate = Generate {
                pods,
                seed,
                sizes,
                mean_interarrival_seconds: 3600.0 * mean_size / (load * cluster.total_gpus() as f64),
                mean_duration_seconds: 3600.0,
                vf_share,
                vfs_per_pod,
                vf_physnet: "fabric".into(),
            };
            let stream = generate.pods().unwrap();
            let cfg = ScoreConfig { remainder_weight: weight, ..ScoreConfig::default() };
            for policy in PlacementPolicy::ALL {
                let (indexed, a) = trace(&cluster, &stream, policy, &cfg, seed, false);
                let (scanned, b) = trace(&cluster, &stream, policy, &cfg, seed, true);
                if let Some(i) = (0..stream.len()).find(|&i| indexed[i] != scanned[i]) {
                    prop_assert!(false, "{}: pod {i} ({} GPUs, VFs {:?}): index chose {:?}, scan {:?}",
                        policy.name(), stream[i].gpus, stream[i].vfs, indexed[i], scanned[i]);
                }
                prop_assert_eq!(PolicyReport { run_ms: 0.0, ..a }, PolicyReport { run_ms: 0.0, ..b });
            }
        }
    }

    /// The NIC (position in the topology's NICs) of the VFs held, one per VF.
    fn nics_of(cluster: &Cluster, node: usize, vfs: u128) -> Vec<usize> {
        let topo = &cluster.types[cluster.nodes[node].node_type].topology;
        mask_to_vec(vfs).into_iter().map(|v| topo.vf_nic(v)).collect()
    }

    #[test]
    fn weft_gives_a_vf_pod_the_vf_beside_its_gpu_and_blind_the_lowest_free_vf() {
        // HGX H100: GPU k and NIC k share a PCIe switch (PIX); other NICs are NODE or SYS.
        let cluster = build(vec![with_vfs("hgx-h100", 1, 8)]);
        let pods = [pod("a", 1, 1, 0.0, 100.0), pod("b", 1, 1, 1.0, 100.0), pod("c", 1, 1, 2.0, 100.0)];
        let (weft, report) = trace(&cluster, &pods, PlacementPolicy::Weft, &ScoreConfig::default(), 1, false);
        for d in &weft {
            let (n, held) = d.unwrap();
            let gpus = mask_to_vec(held.gpus);
            assert_eq!(gpus.len(), 1);
            assert_eq!(nics_of(&cluster, n, held.vfs), gpus, "the VF is on the GPU's own NIC: {d:?}");
        }
        assert_eq!((report.vf_pods_placed, report.vf_near_gpu_share), (3, 1.0));

        // blind: lowest free GPU, lowest free VF address. VFs 0 and 1 both sit on NIC0, which
        // shares a switch with GPU0 only, so the second and third pods get a VF across the host
        // bridge.
        let (blind, report) = trace(&cluster, &pods, PlacementPolicy::Blind, &ScoreConfig::default(), 1, false);
        let got: Vec<(u128, u128)> = blind.iter().map(|d| d.map(|(_, h)| (h.gpus, h.vfs)).unwrap()).collect();
        assert_eq!(got, [(0b1, 0b1), (0b10, 0b10), (0b100, 0b100)]);
        assert_eq!(cluster.types[0].topology.vfs()[0].pci_address, "0000:10:02.0", "lowest address first");
        assert_eq!(report.vf_pods_placed, 3);
        assert!((report.vf_near_gpu_share - 1.0 / 3.0).abs() < 1e-9, "{report:?}");
    }

    #[test]
    fn weft_prefers_the_node_where_the_vf_sits_beside_the_gpus() {
        // v100-sxm2's one NIC is NODE to GPUs 0-3 and SYS to the rest: never beside a GPU. The
        // HGX H100 comes second in node order, so only the VF's nearness can make weft pick it.
        let cluster = build(vec![with_vfs("v100-sxm2", 1, 8), with_vfs("hgx-h100", 1, 8)]);
        let pods = [pod("a", 2, 1, 0.0, 100.0)];
        let (weft, report) = trace(&cluster, &pods, PlacementPolicy::Weft, &ScoreConfig::default(), 1, false);
        assert_eq!(weft[0].map(|(n, _)| n), Some(1), "{weft:?}");
        assert_eq!(report.vf_near_gpu_share, 1.0);
        // Without VFs the same pod goes by GPU score alone.
        let gpu_only = [pod("a", 2, 0, 0.0, 100.0)];
        let (weft, report) = trace(&cluster, &gpu_only, PlacementPolicy::Weft, &ScoreConfig::default(), 1, false);
        assert!(weft[0].is_some());
        assert_eq!((report.vf_pods_placed, report.vf_near_gpu_share), (0, 0.0), "no VF pods, no share");
    }

    #[test]
    fn a_node_short_of_vfs_does_not_take_a_vf_pod() {
        // Node 0 has no VFs, node 1 has 8 (one per NIC): every policy would take node 0 first for a
        // GPU-only pod (weft and least-allocated by node order on a tie, blind by chance).
        let cluster = build(vec![with_vfs("hgx-h100", 1, 0), with_vfs("hgx-h100", 1, 1)]);
        assert_eq!(cluster.types[0].topology.vfs().len(), 0);
        assert_eq!(cluster.types[1].topology.vfs().len(), 8);
        let pods = [pod("a", 1, 1, 0.0, 100.0), pod("b", 1, 8, 1.0, 100.0), pod("c", 1, 9, 2.0, 100.0)];
        for policy in PlacementPolicy::ALL {
            for seed in 0..8 {
                let (d, report) = trace(&cluster, &pods, policy, &ScoreConfig::default(), seed, false);
                assert_eq!(d[0].map(|(n, _)| n), Some(1), "{}: {d:?}", policy.name());
                // 7 VFs left on node 1: 8 do not fit, although its GPUs are free.
                assert_eq!(d[1], None, "{}: {d:?}", policy.name());
                assert_eq!(d[2], None, "{}: more VFs than any node has", policy.name());
                assert_eq!((report.placed, report.unplaced, report.unplaced_for_vfs), (1, 2, 2), "{}", policy.name());
            }
        }
    }

    /// The record of each pod is what the decision gave it (node, GPUs, VFs, the set's ring and pair
    /// bandwidth, start and end), and a pod left out says why, as the counts do.
    #[test]
    fn each_pod_is_recorded_with_what_it_got_or_why_it_was_not_placed() {
        // One HGX H100, one VF per NIC (NIC k beside GPU k).
        let cluster = build(vec![with_vfs("hgx-h100", 1, 1)]);
        let pods = [
            pod("pair", 2, 1, 0.0, 100.0),
            pod("one", 1, 0, 1.0, 50.0),
            pod("all-vfs", 1, 7, 2.0, 10.0),    // 7 VFs left: fits
            pod("no-vf-left", 1, 1, 3.0, 10.0), // GPUs free, no VF free
            pod("too-big", 8, 0, 4.0, 10.0),    // 4 GPUs free
        ];
        for policy in PlacementPolicy::ALL {
            let mut records = Vec::new();
            let report = run_policy_recorded(
                &cluster,
                &pods,
                policy,
                &ScoreConfig::default(),
                1,
                &mut |_| {},
                &mut |r: &PodOutcome<'_>| {
                    records.push(format!("{r:?}"));
                    assert_eq!(r.policy, policy);
                    assert_eq!(r.pod.name, pods[r.index].name);
                    if let Ok(p) = &r.placement {
                        assert_eq!(p.node, "hgx-h100-0");
                        assert_eq!(p.node_type, "hgx-h100");
                        assert_eq!(p.gpus.len(), r.pod.gpus);
                        assert_eq!(p.vfs.len(), r.pod.vf_count());
                        assert_eq!((p.start, p.end), (r.pod.arrival, r.pod.arrival + r.pod.duration));
                        assert_eq!(p.vfs_near_gpus.is_some(), r.pod.vf_count() > 0);
                        assert_eq!(p.ring_gbps.is_some(), r.pod.gpus >= 2);
                        assert_eq!(p.mean_pair_gbps.is_some(), r.pod.gpus >= 2);
                    }
                    Ok(())
                },
            )
            .unwrap();
            let (decisions, _) = trace(&cluster, &pods, policy, &ScoreConfig::default(), 1, false);
            assert_eq!(records.len(), pods.len(), "{}: one record per pod", policy.name());
            assert_eq!((report.placed, report.unplaced, report.unplaced_for_vfs), (3, 2, 1), "{}", policy.name());
            assert!(records[3].contains("Err(ShortOfVfs)"), "{}: {}", policy.name(), records[3]);
            assert!(records[4].contains("Err(NoGpus)"), "{}: {}", policy.name(), records[4]);
            // The first pod's GPUs and VF are the decision's.
            let (_, held) = decisions[0].unwrap();
            let gpus = mask_to_vec(held.gpus);
            assert!(records[0].contains(&format!("gpus: {gpus:?}")), "{}: {}", policy.name(), records[0]);
            let topo = &cluster.types[0].topology;
            let vf = &topo.vfs()[mask_to_vec(held.vfs)[0]].pci_address;
            assert!(records[0].contains(vf.as_str()), "{}: {}", policy.name(), records[0]);
            let ring = topo.ring_bandwidth(&gpus).unwrap().gbps;
            assert!(records[0].contains(&format!("ring_gbps: Some({ring:?})")), "{}: {}", policy.name(), records[0]);
        }
        // An error from the callback stops the run and names what failed.
        let e = run_policy_recorded(
            &cluster,
            &pods,
            PlacementPolicy::Weft,
            &ScoreConfig::default(),
            1,
            &mut |_| {},
            &mut |_: &PodOutcome<'_>| Err(std::io::Error::other("disk full")),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "writing the per-pod records: disk full");
    }

    /// Each record carries the cluster just after its decision: running pods, GPUs in use and
    /// stranded, and the placed and not-placed counts so far (the report's timeline).
    #[test]
    fn each_record_carries_the_cluster_after_its_decision() {
        let cluster = build(vec![with_vfs("dgx1-v100", 1, 0)]);
        let pods = [
            pod("four", 4, 0, 0.0, 100.0),
            pod("one", 1, 0, 1.0, 10.0),
            pod("too-big", 8, 0, 2.0, 10.0),
            pod("two", 2, 0, 3.0, 100.0),
            pod("after-one", 1, 0, 20.0, 100.0),
        ];
        let prepared = &cluster.types[0].prepared;
        for policy in PlacementPolicy::ALL {
            let (decisions, _) = trace(&cluster, &pods, policy, &ScoreConfig::default(), 1, false);
            let mut seen = Vec::new();
            run_policy_recorded(&cluster, &pods, policy, &ScoreConfig::default(), 1, &mut |_| {}, &mut |r| {
                seen.push(r.cluster);
                Ok(())
            })
            .unwrap();
            // What each decision leaves: the held sets of the pods still running at that arrival.
            let expected: Vec<ClusterNow> = (0..pods.len())
                .map(|i| {
                    let at = pods[i].arrival;
                    let held: Vec<u128> = (0..=i)
                        .filter(|&j| pods[j].arrival + pods[j].duration > at)
                        .filter_map(|j| decisions[j].map(|(_, h)| h.gpus))
                        .collect();
                    let busy = held.iter().fold(0u128, |m, h| m | h);
                    ClusterNow {
                        running_pods: held.len(),
                        gpus_in_use: busy.count_ones() as usize,
                        stranded_gpus: stranded_gpus(prepared, 0xff & !busy),
                        placed: decisions[..=i].iter().filter(|d| d.is_some()).count(),
                        not_placed: decisions[..=i].iter().filter(|d| d.is_none()).count(),
                    }
                })
                .collect();
            assert_eq!(seen, expected, "{}", policy.name());
            assert_eq!((seen[2].not_placed, seen[4].running_pods), (1, 3), "{}: {seen:?}", policy.name());
        }
    }

    #[test]
    fn a_physnet_named_twice_in_a_pod_counts_once_with_the_sum() {
        let cluster = build(vec![with_vfs("hgx-h100", 1, 1)]);
        let mut twice = pod("a", 1, 1, 0.0, 10.0);
        twice.vfs.push(("fabric".into(), 2));
        let (d, _) = trace(&cluster, &[twice], PlacementPolicy::Blind, &ScoreConfig::default(), 1, false);
        assert_eq!(d[0].map(|(_, h)| h.vfs), Some(0b111), "3 VFs, the lowest three");
    }

    #[test]
    fn departures_free_vfs() {
        // 8 VFs on the node; the first pod holds all of them until t = 10.
        let cluster = build(vec![with_vfs("hgx-h100", 1, 1)]);
        let pods = [pod("all", 1, 8, 0.0, 10.0), pod("early", 1, 1, 5.0, 10.0), pod("late", 1, 1, 20.0, 10.0)];
        for policy in PlacementPolicy::ALL {
            let (d, report) = trace(&cluster, &pods, policy, &ScoreConfig::default(), 1, false);
            assert_eq!(d[0].map(|(_, h)| h.vfs), Some(0xff), "{}", policy.name());
            assert_eq!(d[1], None, "{}: no VF free while 'all' runs", policy.name());
            let (_, late) = d[2].unwrap_or_else(|| panic!("{}: the VFs came back", policy.name()));
            assert_eq!(late.vfs.count_ones(), 1);
            assert_eq!(report.unplaced_for_vfs, 1, "{}", policy.name());
        }
    }

    #[test]
    fn a_hand_built_node_with_more_vfs_than_the_engine_keeps_is_an_error() {
        let mut topology = crate::cluster::builtin_topology("dgx-a100").unwrap();
        let vfs = (0..130)
            .map(|i| weft_topology::Vf {
                pci_address: crate::cluster::synthetic_vf_address(i / 13, i % 13),
                nic: topology.nics[i / 13].name.clone(),
                physnet: Some("fabric".into()),
            })
            .collect();
        topology.set_vfs(vfs).unwrap();
        let prepared = weft_alloc::PreparedNode::new(&topology).unwrap();
        let cluster = Cluster {
            types: vec![crate::cluster::NodeType {
                name: "big".into(),
                topology: std::sync::Arc::new(topology),
                prepared: std::sync::Arc::new(prepared),
            }],
            nodes: vec![crate::cluster::SimNode { name: "big-0".into(), node_type: 0 }],
        };
        let e = run_policy(
            &cluster,
            &[pod("a", 1, 1, 0.0, 1.0)],
            PlacementPolicy::Blind,
            &ScoreConfig::default(),
            1,
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("'big'") && e.contains("130") && e.contains("128"), "{e}");
    }

    #[test]
    fn a_pod_of_no_gpus_is_an_error_naming_it() {
        let cluster = cluster(&[1]);
        let pods = vec![SimPod::gpus("idle", 0, 0.0, 1.0)];
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
