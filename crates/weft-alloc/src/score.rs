//! Node scoring for the scheduler: how well a node can serve a pod asking for q GPUs.
//!
//! # Formula
//! Let F be the node's free GPUs and S the set best-effort would hand out (see [`crate::besteffort`];
//! the free list is taken in ascending GPU order, so the score does not depend on list order).
//!
//! - **Affinity** A (0–100), the link quality of S. For q ≥ 2, with `s̄ = set_score / C(q,2)` the
//!   mean pair score of S: `A = 100 · ln(1 + s̄) / ln(1 + 1860)`; for q = 1, `A = 100`. On the
//!   go-gpuallocator scale this gives SYS ≈ 32, NODE ≈ 40, PIX ≈ 52, NV1+SYS ≈ 63, NV2+PHB ≈ 72,
//!   NV12 ≈ 94, NV18+SameBoard = 100.
//! - **Remainder** R (0–100), what the allocation leaves behind:
//!   `R = 100 · (1 − stranded(F ∖ S) / max(1, |F ∖ S|))`, where [`stranded_gpus`] counts free GPUs
//!   that have NVLink peers on the node but no free one. A node where the pod would split the last
//!   NVLinked pairs scores lower than one where it takes a whole pair.
//! - `score = clamp(round((1 − w)·A + w·R), 1, 100)` with `w` = [`ScoreConfig::remainder_weight`]
//!   (default 0.2; values outside 0..=1 are clamped, NaN means the default).
//!
//! # Why not the KEP's formula
//! KEP-690 proposed `score = set_score · 100 / (q(q−1)/2 · 1800)` in integer arithmetic. It has three
//! defects, all fixed here:
//! 1. q = 1 gives `maxScore = 0`, a division by zero: here q = 1 has A = 100 and the node is ranked by
//!    what it leaves behind (R).
//! 2. The largest real pair score is 1860 (18 NVLinks + SameBoard), not 1800, so the KEP's score can
//!    exceed 100: here the scale is 1860 and the result is clamped.
//! 3. Integer division sends every node without NVLink (SYS = 10, PIX = 50 per pair) to 0, so the
//!    scheduler cannot tell a PIX node from a SYS node: here the log scale keeps them apart (SYS ≈ 32,
//!    PIX ≈ 52), the final score is at least 1, and NVLink still dominates: a pair with one NVLink
//!    (≥ 110, A ≥ 63) has a higher A than any PCIe-only pair (≤ 60, A ≤ 55), and even one that
//!    strands every GPU left behind (R = 0) beats a SYS-only node (0.8 · 63 = 50 > 0.8 · 32 + 20).
//!
//! # Caching
//! Clusters have thousands of nodes but only a handful of topologies. [`ScoreCache`] keys the
//! best-effort result by (topology, free mask, q): a hit skips the allocator and costs a hash lookup
//! (the topology is recognised by [`PreparedNode::fingerprint`] and confirmed by comparing the score
//! matrix, so a fingerprint collision cannot return a wrong answer).

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::{AllocError, PreparedNode, Request};

/// What the affinity term measures of a GPU set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetQuality {
    /// The bandwidth of the set's best ring, its slowest hop ([`ring_affinity`]): what a ring
    /// all-reduce over the set gets.
    #[default]
    Ring,
    /// The mean go-gpuallocator pair score ([`affinity`]): upstream's measure, which a slow hop
    /// hides in the mean.
    PairScore,
}

/// Scoring knobs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoreConfig {
    /// Weight (0..1) of the remainder-quality term; the rest goes to the set's link quality.
    pub remainder_weight: f64,
    /// What the affinity term measures.
    #[serde(default)]
    pub set_quality: SetQuality,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        ScoreConfig { remainder_weight: 0.2, set_quality: SetQuality::Ring }
    }
}

impl ScoreConfig {
    /// The weight actually used: clamped to 0..=1, NaN → the default 0.2.
    pub fn effective_weight(&self) -> f64 {
        if self.remainder_weight.is_nan() { 0.2 } else { self.remainder_weight.clamp(0.0, 1.0) }
    }
}

/// A node's fit for a pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeFit {
    /// 1..=100.
    pub score: u8,
    /// The set the pod would get (ascending).
    pub gpus: Vec<usize>,
    /// Pair-score sum of that set.
    pub set_score: u32,
    /// Affinity term A (0–100) before weighting.
    pub affinity: f64,
    /// Remainder term R (0–100) before weighting.
    pub remainder: f64,
    /// The slowest hop of the set's best ring, GB/s per direction (0 for one GPU).
    #[serde(default)]
    pub ring_gbps: f64,
}

/// Score a node for a pod asking `count` GPUs, given its free GPUs (any order).
///
/// Errors: [`AllocError::InsufficientGpus`] if fewer than `count` are free (callers filter such
/// nodes first), [`AllocError::ZeroCount`], and the request-validation errors for unknown or
/// duplicate GPUs.
pub fn score_node(node: &PreparedNode, free: &[usize], count: usize, cfg: &ScoreConfig) -> Result<NodeFit, AllocError> {
    let free_mask = free_mask(node, free, count)?;
    let (gpus, set_score) = best_set(node, free_mask, count, cfg.set_quality)?;
    let ring = ring_gbps(node, &gpus);
    Ok(fit(node, free_mask, gpus, set_score, ring, count, cfg))
}

fn ring_gbps(node: &PreparedNode, gpus: &[usize]) -> f64 {
    node.ring(gpus).map_or(0.0, |r| r.gbps)
}

/// The bandwidth on which [`ring_affinity`] reaches 100: 18 NVLink 5 links, 900 GB/s per direction.
pub const RING_SCALE_GBPS: f64 = 900.0;

/// The affinity term for a set whose best ring runs at `gbps` (its slowest hop, GB/s per
/// direction): `100 · ln(1 + gbps) / ln(1 + 900)`, 100 for one GPU (`count` < 2). A cross-socket
/// hop (10 GB/s) gives 35, a PCIe Gen4 switch 51, NV1 on V100 48, NV2 58, A100's NV12 84, H100's
/// NV18 90.
pub fn ring_affinity(gbps: f64, count: usize) -> f64 {
    if count < 2 {
        return 100.0;
    }
    let g = if gbps.is_finite() && gbps > 0.0 { gbps } else { 0.0 };
    (100.0 * (1.0 + g).ln() / (1.0 + RING_SCALE_GBPS).ln()).clamp(0.0, 100.0)
}

/// Validate the free list and return it as a mask.
fn free_mask(node: &PreparedNode, free: &[usize], count: usize) -> Result<u128, AllocError> {
    let (mask, _) = crate::validate(node, &Request { count, available: free, required: &[] })?;
    Ok(mask)
}

/// Best-effort set over the free mask (ascending order).
fn best_set(
    node: &PreparedNode,
    free_mask: u128,
    count: usize,
    quality: SetQuality,
) -> Result<(Vec<usize>, u32), AllocError> {
    let sorted: Vec<usize> = (0..node.len()).filter(|&g| free_mask >> g & 1 == 1).collect();
    let a = choose_set(node, &sorted, count, quality)?;
    Ok((a.gpus, a.set_score))
}

/// Most candidate sets (`count`-subsets of the free GPUs) [`choose_set`] searches for a faster
/// ring; with more, the best-effort set stands.
pub const MAX_RING_CANDIDATES: usize = 4096;

/// The GPU set for `count` GPUs among `available` (the tie-break order, as in [`Request`]).
///
/// - [`SetQuality::PairScore`]: the best-effort set (go-gpuallocator's objective), unchanged.
/// - [`SetQuality::Ring`]: the best-effort set, unless another set of the same size has a faster
///   best ring (its slowest hop, [`PreparedNode::ring`]). Then the set with the fastest ring wins;
///   among those, the highest pair score, then the fewest GPUs stranded among those left
///   ([`stranded_gpus`]), then the earliest in `available`. Every `count`-subset is tried (the
///   answer is exact) when there are at most [`MAX_RING_CANDIDATES`]; beyond that the best-effort
///   set stands. A set chosen for its ring carries its pair score as its objective and
///   [`crate::Optimality::Exact`]: it is the exact optimum of the ring-first order.
///
/// Where the best-effort set already has the fastest ring it is returned as is, so go-gpuallocator's
/// packing of what is left decides among the sets a job cannot tell apart.
pub fn choose_set(
    node: &PreparedNode,
    available: &[usize],
    count: usize,
    quality: SetQuality,
) -> Result<crate::Allocation, AllocError> {
    let base = crate::besteffort::allocate(node, &Request { count, available, required: &[] })?;
    if quality == SetQuality::PairScore || count < 2 || !fits_search(available.len(), count) {
        return Ok(base);
    }
    let base_ring = ring_gbps(node, &base.gpus);
    let free_mask = available.iter().fold(0u128, |m, &g| m | 1u128 << g);
    // (ring, set score, -stranded) of the best so far, and the set.
    let mut best: Option<((f64, u32, i64), Vec<usize>)> = None;
    let mut pick = vec![0usize; count];
    for_each_subset(available.len(), count, &mut pick, &mut |positions| {
        let set: Vec<usize> = positions.iter().map(|&i| available[i]).collect();
        let ring = ring_gbps(node, &set);
        if ring <= base_ring || best.as_ref().is_some_and(|(k, _)| ring < k.0) {
            return;
        }
        let taken = set.iter().fold(0u128, |m, &g| m | 1u128 << g);
        let key = (ring, node.set_score(&set), -(stranded_gpus(node, free_mask & !taken) as i64));
        if best.as_ref().is_none_or(|(k, _)| key.0 > k.0 || (key.0 == k.0 && (key.1, key.2) > (k.1, k.2))) {
            best = Some((key, set));
        }
    });
    Ok(match best {
        None => base,
        Some(((_, set_score, _), mut gpus)) => {
            gpus.sort_unstable();
            crate::Allocation { gpus, set_score, objective: u64::from(set_score), optimality: crate::Optimality::Exact }
        }
    })
}

/// Whether C(n, k) ≤ [`MAX_RING_CANDIDATES`] (and k ≤ n).
fn fits_search(n: usize, k: usize) -> bool {
    if k > n {
        return false;
    }
    let mut c: u128 = 1;
    for i in 0..k.min(n - k) {
        // C(n, i + 1) = C(n, i) · (n − i) / (i + 1), exact at every step.
        c = c * (n - i) as u128 / (i + 1) as u128;
        if c > MAX_RING_CANDIDATES as u128 {
            return false;
        }
    }
    true
}

/// Calls `f` with every `k`-subset of `0..n` as ascending positions, in lexicographic order.
fn for_each_subset(n: usize, k: usize, pick: &mut [usize], f: &mut dyn FnMut(&[usize])) {
    fn go(start: usize, depth: usize, n: usize, pick: &mut [usize], f: &mut dyn FnMut(&[usize])) {
        if depth == pick.len() {
            f(pick);
            return;
        }
        for i in start..=n - (pick.len() - depth) {
            pick[depth] = i;
            go(i + 1, depth + 1, n, pick, f);
        }
    }
    if k <= n {
        go(0, 0, n, pick, f);
    }
}

/// The affinity term for a set of `count` GPUs with pair-score sum `set_score`.
pub fn affinity(set_score: u32, count: usize) -> f64 {
    if count < 2 {
        return 100.0;
    }
    let pairs = (count * (count - 1) / 2) as f64;
    let mean = f64::from(set_score) / pairs;
    let a = 100.0 * (1.0 + mean).ln() / (1.0 + f64::from(weft_topology::MAX_PAIR_SCORE)).ln();
    a.clamp(0.0, 100.0)
}

/// The remainder term for free GPUs `free_mask` after taking `taken`.
pub fn remainder(node: &PreparedNode, free_mask: u128, taken: u128) -> f64 {
    let rest = free_mask & !taken;
    let left = rest.count_ones() as f64;
    100.0 * (1.0 - stranded_gpus(node, rest) as f64 / left.max(1.0))
}

fn fit(
    node: &PreparedNode,
    free_mask: u128,
    gpus: Vec<usize>,
    set_score: u32,
    ring_gbps: f64,
    count: usize,
    cfg: &ScoreConfig,
) -> NodeFit {
    let taken = gpus.iter().fold(0u128, |m, &g| m | (1u128 << g));
    let a = match cfg.set_quality {
        SetQuality::Ring => ring_affinity(ring_gbps, count),
        SetQuality::PairScore => affinity(set_score, count),
    };
    let r = remainder(node, free_mask, taken);
    let w = cfg.effective_weight();
    let score = ((1.0 - w) * a + w * r).round().clamp(1.0, 100.0) as u8;
    NodeFit { score, gpus, set_score, affinity: a, remainder: r, ring_gbps }
}

/// Free GPUs that have NVLink peers on the node but no free one.
pub fn stranded_gpus(node: &PreparedNode, free_mask: u128) -> usize {
    (0..node.len())
        .filter(|&g| free_mask & (1u128 << g) != 0)
        .filter(|&g| node.nvlink_peers(g) != 0 && node.nvlink_peers(g) & free_mask == 0)
        .count()
}

/// What a cached set is for: free GPUs, the count, the quality it was chosen under.
type FitKey = (u128, usize, SetQuality);
/// A cached set: its GPUs, pair score and best ring (GB/s).
type CachedSet = (Vec<usize>, u32, f64);

/// One topology's cached best-effort results.
#[derive(Debug)]
struct TopologySlot {
    node: PreparedNode,
    fits: FxHashMap<FitKey, CachedSet>,
}

/// A cache of best-effort results for [`score_node`], keyed by (topology, free mask, q).
///
/// A plain struct: the caller owns it (one per scheduling cycle or per worker) and decides when to
/// drop it. It holds at most `capacity` results and is cleared when full. Scores are computed from
/// the cached set on every call, so the [`ScoreConfig`] may change between calls.
#[derive(Debug)]
pub struct ScoreCache {
    topologies: FxHashMap<u64, Vec<TopologySlot>>,
    entries: usize,
    capacity: usize,
    hits: u64,
    misses: u64,
}

impl Default for ScoreCache {
    fn default() -> Self {
        ScoreCache::new()
    }
}

impl ScoreCache {
    /// A cache holding up to 2^20 results.
    pub fn new() -> ScoreCache {
        ScoreCache::with_capacity(1 << 20)
    }

    /// A cache holding up to `capacity` results (at least 1).
    pub fn with_capacity(capacity: usize) -> ScoreCache {
        ScoreCache { topologies: FxHashMap::default(), entries: 0, capacity: capacity.max(1), hits: 0, misses: 0 }
    }

    /// Same contract and result as [`score_node`], using and filling the cache.
    pub fn score(
        &mut self,
        node: &PreparedNode,
        free: &[usize],
        count: usize,
        cfg: &ScoreConfig,
    ) -> Result<NodeFit, AllocError> {
        let free_mask = free_mask(node, free, count)?;
        let key = (free_mask, count, cfg.set_quality);
        let slots = self.topologies.entry(node.fingerprint()).or_default();
        let idx = match slots.iter().position(|s| s.node.same_topology(node)) {
            Some(i) => i,
            None => {
                slots.push(TopologySlot { node: node.clone(), fits: FxHashMap::default() });
                slots.len() - 1
            }
        };
        if let Some((gpus, set_score, ring)) = slots.get(idx).and_then(|s| s.fits.get(&key)) {
            self.hits += 1;
            return Ok(fit(node, free_mask, gpus.clone(), *set_score, *ring, count, cfg));
        }
        self.misses += 1;
        let (gpus, set_score) = best_set(node, free_mask, count, cfg.set_quality)?;
        let ring = ring_gbps(node, &gpus);
        if self.entries >= self.capacity {
            self.clear_entries();
        }
        let slots = self.topologies.entry(node.fingerprint()).or_default();
        if let Some(slot) = slots.iter_mut().find(|s| s.node.same_topology(node)) {
            slot.fits.insert(key, (gpus.clone(), set_score, ring));
            self.entries += 1;
        }
        Ok(fit(node, free_mask, gpus, set_score, ring, count, cfg))
    }

    fn clear_entries(&mut self) {
        for slots in self.topologies.values_mut() {
            for s in slots.iter_mut() {
                s.fits.clear();
            }
        }
        self.entries = 0;
    }

    /// Drop every cached result and topology.
    pub fn clear(&mut self) {
        self.topologies.clear();
        self.entries = 0;
    }

    /// Number of cached results.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Number of distinct topologies seen.
    pub fn topologies(&self) -> usize {
        self.topologies.values().map(Vec::len).sum()
    }

    /// (hits, misses) since creation.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_scale_matches_the_documented_points() {
        assert_eq!(affinity(10, 2).round(), 32.0);
        assert_eq!(affinity(110, 2).round(), 63.0);
        assert_eq!(affinity(1210, 2).round(), 94.0);
        assert_eq!(affinity(1860, 2), 100.0);
        assert_eq!(affinity(0, 1), 100.0);
        assert_eq!(affinity(0, 2), 0.0);
        assert!(affinity(u32::MAX, 2) <= 100.0);
    }

    #[test]
    fn weight_is_clamped_and_nan_means_default() {
        let w = |remainder_weight| ScoreConfig { remainder_weight, ..ScoreConfig::default() }.effective_weight();
        assert_eq!(w(f64::NAN), 0.2);
        assert_eq!(w(7.0), 1.0);
        assert_eq!(w(-1.0), 0.0);
    }

    #[test]
    fn ring_affinity_matches_the_documented_points() {
        for (gbps, want) in [(10.0, 35.0), (31.5, 51.0), (25.0, 48.0), (50.0, 58.0), (300.0, 84.0), (450.0, 90.0)] {
            assert_eq!(ring_affinity(gbps, 2).round(), want, "{gbps} GB/s");
        }
        assert_eq!(ring_affinity(900.0, 2), 100.0);
        assert_eq!(ring_affinity(1e9, 2), 100.0);
        assert_eq!(ring_affinity(f64::NAN, 2), 0.0);
        assert_eq!(ring_affinity(0.0, 1), 100.0);
    }
}
