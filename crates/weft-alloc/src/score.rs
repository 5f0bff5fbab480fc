//! Node scoring for the scheduler.

use serde::{Deserialize, Serialize};

use crate::{AllocError, PreparedNode};

/// Scoring knobs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoreConfig {
    /// Weight (0..1) of the remainder-quality term; the rest goes to the set's link quality.
    pub remainder_weight: f64,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        ScoreConfig { remainder_weight: 0.2 }
    }
}

/// A node's fit for a pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeFit {
    /// 1..=100.
    pub score: u8,
    /// The set the pod would get.
    pub gpus: Vec<usize>,
    /// Pair-score sum of that set.
    pub set_score: u32,
}

/// Score a node (PLACEHOLDER formula: mean pair score on a log scale).
pub fn score_node(node: &PreparedNode, free: &[usize], count: usize, cfg: &ScoreConfig) -> Result<NodeFit, AllocError> {
    let _ = cfg;
    let a = crate::allocate(node, &crate::Policy::BestEffort, &crate::Request { count, available: free, required: &[] })?;
    let pairs = (count * count.saturating_sub(1) / 2).max(1) as f64;
    let mean = f64::from(a.set_score) / pairs;
    let s = if count == 1 { 100.0 } else { 100.0 * (1.0 + mean).ln() / (1.0 + f64::from(weft_topology::MAX_PAIR_SCORE)).ln() };
    Ok(NodeFit { score: s.round().clamp(1.0, 100.0) as u8, gpus: a.gpus, set_score: a.set_score })
}

/// Free GPUs that have NVLink peers on the node but no free one.
pub fn stranded_gpus(node: &PreparedNode, free_mask: u128) -> usize {
    (0..node.len())
        .filter(|&g| free_mask & (1u128 << g) != 0)
        .filter(|&g| node.nvlink_peers(g) != 0 && node.nvlink_peers(g) & free_mask == 0)
        .count()
}
