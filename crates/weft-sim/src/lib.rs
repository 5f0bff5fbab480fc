//! weft-sim: an embedded cluster model that drives weft's placement code (the same `weft-alloc`
//! functions and `weft-net` joint GPU + VF decision the scheduler extender calls) over a stream of
//! GPU pods, some asking for SR-IOV VFs, side by side with topology-blind baselines; and
//! ([`pipeline`]) Numaflow pipelines on NumaNetworks: each vertex pod's node, GPUs, NIC, address and
//! DNS name. It is the engine of `weft simulate`.

pub mod cluster;
pub mod engine;
pub mod jobs;
pub mod matrix;
pub mod optimum;
pub mod pipeline;
pub mod workload;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use weft_alloc::ScoreConfig;

pub use cluster::{Cluster, ClusterSpec, NodeTypeSpec, builtin_topology, builtin_types};
pub use engine::{
    ClusterNow, NotPlaced, PlacementPolicy, PodOutcome, PodPlacement, PolicyReport, Progress, RecordPod, run_policy,
    run_policy_recorded,
};
pub use pipeline::{PipelineReport, PipelineScenario, read_scenario, simulate_pipelines};
pub use workload::{Generate, SimPod, parse_workload, read_workload};

/// Most nodes a simulated cluster may have (a few hundred bytes each, plus the policies' indexes).
pub const MAX_NODES: usize = 1_000_000;
/// Most pods a workload may have (about 100–150 bytes each while a run lasts, VF asks included).
pub const MAX_PODS: usize = 10_000_000;

/// `apiVersion` of the simulator's files.
pub const API_VERSION: &str = "weft.io/v1alpha1";

/// Simulator errors.
#[derive(Debug, Error)]
pub enum SimError {
    /// A cluster or workload file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A cluster or workload file is malformed.
    #[error("{source_name}: {message}")]
    Format {
        /// File.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// Unknown built-in node type.
    #[error("unknown built-in node type '{name}'; known: {known}")]
    UnknownBuiltin {
        /// Name asked for.
        name: String,
        /// Known names.
        known: String,
    },
    /// The cluster has no nodes.
    #[error("the cluster has no nodes")]
    EmptyCluster,
    /// A cluster or workload larger than the simulator takes.
    #[error("{what}: {asked} is more than the simulator takes (at most {limit})")]
    TooLarge {
        /// What is too large.
        what: String,
        /// Size asked for.
        asked: u128,
        /// The limit.
        limit: usize,
    },
    /// A NumaNetwork's range holds fewer addresses than the vertex pods on it need.
    #[error(
        "NumaNetwork '{network}': ipRange {range} has {usable} usable addresses (network and IPv4 broadcast \
         excluded), but {needed} vertex pods on it need one each; widen the range or lower the replicas"
    )]
    AddressesExhausted {
        /// The network.
        network: String,
        /// Its range.
        range: String,
        /// Addresses it can hand out.
        usable: u128,
        /// Addresses asked for.
        needed: usize,
    },
    /// A topology failed to load.
    #[error(transparent)]
    Topology(#[from] weft_topology::TopologyError),
    /// The allocator refused.
    #[error(transparent)]
    Alloc(#[from] weft_alloc::AllocError),
    /// The per-pod records could not be written.
    #[error("writing the per-pod records: {0}")]
    Records(#[source] std::io::Error),
}

/// Cluster summary for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: usize,
    /// SR-IOV VFs.
    #[serde(default)]
    pub vfs: usize,
    /// Nodes per type.
    pub node_types: BTreeMap<String, usize>,
}

/// Workload summary for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSummary {
    /// Pods.
    pub pods: usize,
    /// Pods per GPU count.
    pub by_size: BTreeMap<usize, usize>,
    /// Pods that ask for SR-IOV VFs.
    #[serde(default)]
    pub vf_pods: usize,
    /// GPU-seconds offered per GPU-second of cluster capacity over the time pods are present
    /// ([`offered_load`]): the share of the cluster's GPUs the stream asks for on average while it
    /// runs, ramp-up and drain included.
    pub offered_load: f64,
    /// The same over the arrival window (first to last arrival) instead: the rate a generated stream
    /// is drawn for ([`Self::target_load`] in expectation, before the drain after the last arrival).
    /// Meaningless for a few pods arriving close together (six pods arriving within 5 s and running
    /// an hour offer 720 times what they hold).
    #[serde(default)]
    pub arrival_window_load: f64,
    /// The load a generated stream was drawn for, when the caller knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_load: Option<f64>,
}

/// The whole report of `weft simulate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimReport {
    /// The cluster.
    pub cluster: ClusterSummary,
    /// The workload.
    pub workload: WorkloadSummary,
    /// One entry per policy, in the order run.
    pub policies: Vec<PolicyReport>,
}

/// Run every policy in `policies` over `pods` on `cluster`. `progress(policy_index, pods_done)`.
pub fn simulate(
    cluster: &Cluster,
    pods: &[SimPod],
    policies: &[PlacementPolicy],
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(usize, Progress),
) -> Result<SimReport, SimError> {
    simulate_with(cluster, pods, policies, score_config, seed, progress, None)
}

/// [`simulate`], handing every pod's [`PodOutcome`] under every policy to `record` as it is decided
/// (policy by policy, each in stream order), for callers that write them out one at a time.
pub fn simulate_recorded(
    cluster: &Cluster,
    pods: &[SimPod],
    policies: &[PlacementPolicy],
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(usize, Progress),
    record: &mut RecordPod<'_>,
) -> Result<SimReport, SimError> {
    simulate_with(cluster, pods, policies, score_config, seed, progress, Some(record))
}

fn simulate_with(
    cluster: &Cluster,
    pods: &[SimPod],
    policies: &[PlacementPolicy],
    score_config: &ScoreConfig,
    seed: u64,
    progress: &mut dyn FnMut(usize, Progress),
    mut record: Option<&mut RecordPod<'_>>,
) -> Result<SimReport, SimError> {
    let mut node_types = BTreeMap::new();
    for n in &cluster.nodes {
        *node_types.entry(cluster.types[n.node_type].name.clone()).or_insert(0) += 1;
    }
    let mut by_size = BTreeMap::new();
    for p in pods {
        *by_size.entry(p.gpus).or_insert(0) += 1;
    }
    let gpus = cluster.total_gpus();
    let window = match (pods.first(), pods.last()) {
        (Some(first), Some(last)) => (last.arrival - first.arrival).max(1e-9),
        _ => 1e-9,
    };
    // A fold from +0.0: an empty float sum is -0.0, which prints as "-0%".
    let gpu_seconds: f64 = pods.iter().fold(0.0, |sum, p| sum + p.gpus as f64 * p.duration);
    let mut reports = Vec::with_capacity(policies.len());
    for (i, &policy) in policies.iter().enumerate() {
        let progress = &mut |p| progress(i, p);
        reports.push(match record.as_deref_mut() {
            Some(record) => run_policy_recorded(cluster, pods, policy, score_config, seed, progress, record)?,
            None => run_policy(cluster, pods, policy, score_config, seed, progress)?,
        });
    }
    Ok(SimReport {
        cluster: ClusterSummary { nodes: cluster.nodes.len(), gpus, vfs: cluster.total_vfs(), node_types },
        workload: WorkloadSummary {
            pods: pods.len(),
            by_size,
            vf_pods: pods.iter().filter(|p| p.vf_count() > 0).count(),
            offered_load: offered_load(pods, gpus),
            arrival_window_load: gpu_seconds / (window * gpus.max(1) as f64),
            target_load: None,
        },
        policies: reports,
    })
}

/// GPU-seconds asked for per GPU-second of the cluster's capacity over the time pods are present
/// (the union of each pod's arrival to arrival + duration): what share of the cluster's GPUs the
/// stream asks for on average while it runs. 0 when no pod is ever present.
pub fn offered_load(pods: &[SimPod], cluster_gpus: usize) -> f64 {
    // A fold from +0.0: an empty float sum is -0.0, which prints as "-0%".
    let gpu_seconds: f64 = pods.iter().fold(0.0, |sum, p| sum + p.gpus as f64 * p.duration);
    let present = present_seconds(pods);
    if present > 0.0 { gpu_seconds / (present * cluster_gpus.max(1) as f64) } else { 0.0 }
}

/// The length of the union of the pods' intervals `[arrival, arrival + duration]`. The readers give
/// pods in arrival order, so no copy is made then.
fn present_seconds(pods: &[SimPod]) -> f64 {
    let span = |p: &SimPod| (p.arrival, p.arrival + p.duration);
    if pods.is_sorted_by(|a, b| a.arrival <= b.arrival) {
        return union_length(pods.iter().map(span));
    }
    let mut spans: Vec<(f64, f64)> = pods.iter().map(span).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    union_length(spans.into_iter())
}

/// The length of the union of intervals given in order of their start.
fn union_length(spans: impl Iterator<Item = (f64, f64)>) -> f64 {
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for (start, end) in spans {
        current = match current {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + current.map_or(0.0, |(s, e)| e - s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six pods arriving within 5 s and running an hour offer their GPUs for that hour, not 720
    /// times over (the arrival window made it 2,000% of a 1-GPU-per-pod cluster).
    #[test]
    fn load_is_over_the_time_pods_are_present_not_the_arrival_window() {
        let pods: Vec<SimPod> = (0..6).map(|i| SimPod::gpus(&format!("p{i}"), 1, i as f64, 3600.0)).collect();
        let load = offered_load(&pods, 6);
        assert!((load - 6.0 * 3600.0 / (3605.0 * 6.0)).abs() < 1e-12, "{load}");
        // A gap with no pod present does not count; pods given out of order are sorted first.
        let mut gap = vec![SimPod::gpus("late", 2, 1000.0, 10.0), SimPod::gpus("early", 2, 0.0, 10.0)];
        assert_eq!(present_seconds(&gap), 20.0);
        assert_eq!(offered_load(&gap, 2), 1.0);
        // Nested and touching intervals are counted once.
        gap.push(SimPod::gpus("inside", 1, 2.0, 3.0));
        gap.push(SimPod::gpus("touching", 1, 10.0, 5.0));
        assert_eq!(present_seconds(&gap), 25.0);
        assert_eq!(offered_load(&[], 8), 0.0);
        assert_eq!(offered_load(&[SimPod::gpus("instant", 1, 5.0, 0.0)], 8), 0.0);
    }
}
