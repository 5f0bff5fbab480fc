//! weft-sim: an embedded cluster model that drives weft's placement code (the same `weft-alloc`
//! functions and `weft-net` joint GPU + VF decision the scheduler extender calls) over a stream of
//! GPU pods, some asking for SR-IOV VFs, side by side with topology-blind baselines; and
//! ([`pipeline`]) Numaflow pipelines on NumaNetworks: each vertex pod's node, GPUs, NIC, address and
//! DNS name. It is the engine of `weft simulate`.

pub mod cluster;
pub mod engine;
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
    NotPlaced, PlacementPolicy, PodOutcome, PodPlacement, PolicyReport, Progress, RecordPod, run_policy,
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
    /// GPU-seconds offered per GPU-second of cluster capacity over the arrival window (what the drawn
    /// stream really offers; a generated one scatters around its target).
    pub offered_load: f64,
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
    let window = pods.last().map_or(0.0, |p| p.arrival).max(1e-9);
    // A fold from +0.0: an empty float sum is -0.0, which prints as "-0%".
    let gpu_seconds: f64 = pods.iter().fold(0.0, |sum, p| sum + p.gpus as f64 * p.duration);
    let gpus = cluster.total_gpus();
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
            offered_load: gpu_seconds / (window * gpus.max(1) as f64),
            target_load: None,
        },
        policies: reports,
    })
}
