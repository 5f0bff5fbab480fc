//! weft-alloc: pure allocators over the weft topology model.
//!
//! - [`allocate`]: choose a GPU set on one node (policies `best-effort`, `static`, `simple`).
//! - [`score_node`]: score a node 0–100 for a pod asking for `count` GPUs.
//! - [`stranded_gpus`]: the fragmentation measure shared by scoring and the simulator.
//!
//! No I/O; every function is deterministic.

pub mod besteffort;
pub mod error;
pub mod score;
pub mod static_policy;

use std::hash::{Hash, Hasher};

use rustc_hash::FxHasher;
use serde::{Deserialize, Serialize};
use weft_topology::NodeTopology;

pub use besteffort::{BestEffortOptions, Solution, TopPruning};
pub use error::AllocError;
pub use score::{NodeFit, ScoreCache, ScoreConfig, SetQuality, choose_set, score_node, stranded_gpus};
pub use static_policy::StaticTable;

/// Most GPUs one node (or one NVLink domain modelled as a node) may have: GPU sets are `u128` masks.
pub const MAX_GPUS: usize = 128;

/// A node prepared for allocation: pair scores and NVLink neighbourhoods, computed once per node.
#[derive(Clone, Debug)]
pub struct PreparedNode {
    n: usize,
    scores: Vec<u32>,
    /// Row-major `n × n` pair bandwidths, GB/s per direction (the rates of the bottleneck ring).
    bandwidths: Vec<f64>,
    nvlink_peers: Vec<u128>,
    fingerprint: u64,
}

impl PreparedNode {
    /// Prepare a node. Errors if it has more than [`MAX_GPUS`] GPUs.
    pub fn new(node: &NodeTopology) -> Result<PreparedNode, AllocError> {
        let n = node.gpu_count();
        if n > MAX_GPUS {
            return Err(AllocError::TooManyGpus { n });
        }
        let scores = node.pair_scores();
        let mut nvlink_peers = vec![0u128; n];
        for (a, peers) in nvlink_peers.iter_mut().enumerate() {
            for b in 0..n {
                if a != b && node.link(a, b).nvlinks > 0 {
                    *peers |= 1u128 << b;
                }
            }
        }
        let bandwidths = (0..n * n).map(|i| node.pair_bandwidth_gbps(i / n, i % n)).collect();
        Ok(PreparedNode::assemble(n, scores, bandwidths, nvlink_peers))
    }

    fn assemble(n: usize, scores: Vec<u32>, bandwidths: Vec<f64>, nvlink_peers: Vec<u128>) -> PreparedNode {
        // FxHash over the GPU count, the score and bandwidth matrices and the NVLink masks (slices
        // hash their length too).
        let mut h = FxHasher::default();
        n.hash(&mut h);
        scores.hash(&mut h);
        bandwidths.iter().for_each(|b| b.to_bits().hash(&mut h));
        nvlink_peers.hash(&mut h);
        let h = h.finish();
        PreparedNode { n, scores, bandwidths, nvlink_peers, fingerprint: h }
    }

    /// Prepare from a raw symmetric score matrix (row-major `n × n`, zero diagonal), for tests and
    /// benchmarks. NVLink peers are the pairs scoring ≥ 100; a pair's score stands in for its
    /// bandwidth (GB/s), which keeps the rings' order the scores' order.
    pub fn from_scores(n: usize, scores: Vec<u32>) -> Result<PreparedNode, AllocError> {
        if n > MAX_GPUS {
            return Err(AllocError::TooManyGpus { n });
        }
        if scores.len() != n * n {
            return Err(AllocError::BadScoreMatrix(format!("{} entries for {n} GPUs", scores.len())));
        }
        for a in 0..n {
            if scores[a * n + a] != 0 {
                return Err(AllocError::BadScoreMatrix(format!("GPU{a} scores {} with itself", scores[a * n + a])));
            }
            for b in 0..n {
                if scores[a * n + b] != scores[b * n + a] {
                    return Err(AllocError::BadScoreMatrix(format!("GPU{a}-GPU{b} is not symmetric")));
                }
            }
        }
        let nvlink_peers = (0..n)
            .map(|a| (0..n).filter(|&b| b != a && scores[a * n + b] >= 100).fold(0u128, |m, b| m | (1u128 << b)))
            .collect();
        let bandwidths = scores.iter().map(|&s| f64::from(s)).collect();
        Ok(PreparedNode::assemble(n, scores, bandwidths, nvlink_peers))
    }

    /// A 64-bit fingerprint of the node's scores and NVLink masks: equal nodes have equal
    /// fingerprints (used to share [`ScoreCache`] entries between nodes of one topology).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The row-major `n × n` pair-score matrix.
    pub fn scores(&self) -> &[u32] {
        &self.scores
    }

    /// Whether two prepared nodes have identical scores and NVLink masks.
    pub fn same_topology(&self, other: &PreparedNode) -> bool {
        self.fingerprint == other.fingerprint
            && self.n == other.n
            && self.scores == other.scores
            && self.bandwidths == other.bandwidths
            && self.nvlink_peers == other.nvlink_peers
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Bytes this node holds on the heap and inline (for caches that bound their memory).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<PreparedNode>()
            + self.scores.capacity() * std::mem::size_of::<u32>()
            + self.bandwidths.capacity() * std::mem::size_of::<f64>()
            + self.nvlink_peers.capacity() * std::mem::size_of::<u128>()
    }

    /// Whether the node has no GPUs.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// go-gpuallocator score of the pair `a`, `b`.
    pub fn pair_score(&self, a: usize, b: usize) -> u32 {
        self.scores[a * self.n + b]
    }

    /// Sum of pair scores over all pairs of `set`.
    pub fn set_score(&self, set: &[usize]) -> u32 {
        let mut total = 0;
        for (i, &a) in set.iter().enumerate() {
            for &b in &set[i + 1..] {
                total += self.pair_score(a, b);
            }
        }
        total
    }

    /// Estimated bandwidth between GPUs `a` and `b`, GB/s per direction.
    pub fn pair_bandwidth_gbps(&self, a: usize, b: usize) -> f64 {
        self.bandwidths[a * self.n + b]
    }

    /// The best ring over `set` (its slowest hop, GB/s per direction; [`weft_topology::ring`]);
    /// None for fewer than two GPUs.
    pub fn ring(&self, set: &[usize]) -> Option<weft_topology::RingBandwidth> {
        weft_topology::best_ring(set.len(), &|a, b| self.pair_bandwidth_gbps(set[a], set[b]))
    }

    /// GPUs with at least one NVLink to `gpu`, as a mask.
    pub fn nvlink_peers(&self, gpu: usize) -> u128 {
        self.nvlink_peers[gpu]
    }
}

/// What to allocate.
///
/// Every policy checks a request the same way, in this order, and reports the first rule broken:
/// count ≥ 1 ([`AllocError::ZeroCount`]); every available GPU exists and is listed once
/// ([`AllocError::UnknownGpu`], [`AllocError::DuplicateGpu`]); every required GPU exists, is
/// available and is listed once ([`AllocError::RequiredNotAvailable`]); no more required GPUs than
/// requested ([`AllocError::TooManyRequired`]); enough available GPUs
/// ([`AllocError::InsufficientGpus`]).
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Number of GPUs wanted (≥ 1).
    pub count: usize,
    /// Free GPUs, by index. The order is the tie-break order (earlier wins), as in go-gpuallocator.
    pub available: &'a [usize],
    /// GPUs that must be in the result (a subset of `available`).
    pub required: &'a [usize],
}

/// How good the returned set is known to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Optimality {
    /// The objective is the exact optimum.
    Exact,
    /// Found by a heuristic; the optimum is at most `upper_bound`.
    Heuristic {
        /// Objective value reached.
        objective: u64,
        /// Proven upper bound on the optimum.
        upper_bound: u64,
    },
    /// The policy has no objective (`simple`, `static`).
    NotApplicable,
}

impl Optimality {
    /// Relative gap to the bound (0 when exact).
    pub fn gap(self) -> f64 {
        match self {
            Optimality::Heuristic { objective, upper_bound } if upper_bound > 0 => {
                (upper_bound.saturating_sub(objective)) as f64 / upper_bound as f64
            }
            _ => 0.0,
        }
    }
}

/// A chosen GPU set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The GPUs, ascending; exactly `count` of them, all from `available`, holding every `required`.
    pub gpus: Vec<usize>,
    /// Sum of pair scores of the set.
    pub set_score: u32,
    /// For best-effort: the partition objective reached (total score of packing all free GPUs).
    pub objective: u64,
    /// How the objective relates to the optimum.
    pub optimality: Optimality,
}

/// Allocation policy.
#[derive(Clone, Debug, Default)]
pub enum Policy {
    /// go-gpuallocator's objective, solved exactly where the DP is cheap and by a heuristic with a
    /// proven bound otherwise (see [`besteffort`]).
    #[default]
    BestEffort,
    /// Required GPUs plus the lowest-index free ones.
    Simple,
    /// Only sets listed in a partition table.
    Static(StaticTable),
}

impl Policy {
    /// Name as used on the command line.
    pub fn name(&self) -> &str {
        match self {
            Policy::BestEffort => "best-effort",
            Policy::Simple => "simple",
            Policy::Static(_) => "static",
        }
    }
}

/// Check a request against the node; returns the available mask and required mask.
///
/// Rules, in this order (the first that fails is reported): count ≥ 1 ([`AllocError::ZeroCount`]);
/// every available GPU exists and is listed once ([`AllocError::UnknownGpu`],
/// [`AllocError::DuplicateGpu`]); every required GPU exists, is available and is listed once
/// ([`AllocError::RequiredNotAvailable`]); no more required GPUs than requested
/// ([`AllocError::TooManyRequired`]); enough available GPUs ([`AllocError::InsufficientGpus`]).
pub(crate) fn validate(node: &PreparedNode, req: &Request<'_>) -> Result<(u128, u128), AllocError> {
    if req.count == 0 {
        return Err(AllocError::ZeroCount);
    }
    let mut avail = 0u128;
    for &g in req.available {
        if g >= node.len() {
            return Err(AllocError::UnknownGpu { gpu: g, n: node.len() });
        }
        if avail & (1u128 << g) != 0 {
            return Err(AllocError::DuplicateGpu { gpu: g });
        }
        avail |= 1u128 << g;
    }
    let mut required = 0u128;
    for &g in req.required {
        if g >= node.len() {
            return Err(AllocError::UnknownGpu { gpu: g, n: node.len() });
        }
        if avail & (1u128 << g) == 0 {
            return Err(AllocError::RequiredNotAvailable { gpu: g });
        }
        if required & (1u128 << g) != 0 {
            return Err(AllocError::DuplicateGpu { gpu: g });
        }
        required |= 1u128 << g;
    }
    if req.required.len() > req.count {
        return Err(AllocError::TooManyRequired { required: req.required.len(), count: req.count });
    }
    if req.available.len() < req.count {
        return Err(AllocError::InsufficientGpus { requested: req.count, available: req.available.len() });
    }
    Ok((avail, required))
}

/// Choose `req.count` GPUs on `node` under `policy`.
///
/// Invalid requests are typed errors (validation rules on [`Request`]), never panics and never an
/// empty or short result.
pub fn allocate(node: &PreparedNode, policy: &Policy, req: &Request<'_>) -> Result<Allocation, AllocError> {
    validate(node, req)?;
    match policy {
        Policy::BestEffort => besteffort::allocate(node, req),
        Policy::Simple => {
            let mut gpus: Vec<usize> = req.required.to_vec();
            let mut free: Vec<usize> = req.available.iter().copied().filter(|g| !req.required.contains(g)).collect();
            free.sort_unstable();
            gpus.extend(free.into_iter().take(req.count - req.required.len()));
            gpus.sort_unstable();
            let set_score = node.set_score(&gpus);
            Ok(Allocation { gpus, set_score, objective: u64::from(set_score), optimality: Optimality::NotApplicable })
        }
        Policy::Static(table) => table.allocate(node, req),
    }
}
