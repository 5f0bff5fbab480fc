//! Settings of the scheduler extender.

use std::time::Duration;

use weft_alloc::ScoreConfig;

use crate::cache::CacheLimits;
use weft_record::usage::DEFAULT_GPU_RESOURCE;

/// Default of [`ExtenderConfig::max_nodes_per_request`]: twice the 5,000 nodes Kubernetes
/// supports in one cluster.
pub const DEFAULT_MAX_NODES_PER_REQUEST: usize = 10_000;

/// Default of [`ExtenderConfig::max_body_bytes`]: 1 GiB, above vc-scheduler's BatchNodeOrderFn
/// body for 5,000 nodes × 30 pods (641 MiB; BENCHMARKS.md, "Extender request sizes").
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 30;

/// Default of [`ExtenderConfig::max_decoded_bytes`]: 64 MiB, above a 5,000-node `Nodes` list
/// (~25–50 MiB).
pub const DEFAULT_MAX_DECODED_BYTES: usize = 64 << 20;

/// Settings of the scheduler extender (decisions and HTTP server).
#[derive(Clone, Debug)]
pub struct ExtenderConfig {
    /// Extended resource counted as GPUs (`nvidia.com/gpu`).
    pub resource_name: String,
    /// When true, the filter rejects nodes whose topology annotation is missing or unreadable
    /// (as unresolvable). When false (default) they pass unjudged and score 0.
    pub require_topology: bool,
    /// Knobs of `weft_alloc::score_node`.
    pub score_config: ScoreConfig,
    /// Score every node gets when the pod requests no GPUs (0..=10; default 5). The same for all
    /// nodes, so it does not change the ranking.
    pub neutral_score: i64,
    /// Path prefix of the verbs: `""` serves `/filter` and `/prioritize`; `"/weft"` serves
    /// `/weft/filter` and `/weft/prioritize`. `urlPrefix` in the scheduler config must end with it.
    pub path_prefix: String,
    /// Bytes one request body may send in all ([`DEFAULT_MAX_BODY_BYTES`]). Bodies are decoded
    /// as they arrive and what weft does not read is dropped as it goes ([`crate::stream`]), so
    /// this bounds reading time, not memory.
    pub max_body_bytes: usize,
    /// JSON text one request may have decoded and kept (the pod, node objects, node names), and
    /// the largest single value held to decode: one Node, one Volcano `NodeInfo` with its tasks, a
    /// bind body ([`DEFAULT_MAX_DECODED_BYTES`]). This bounds a request's memory.
    pub max_decoded_bytes: usize,
    /// Time allowed to read a request and decide (default 3 s, inside kube-scheduler's default
    /// `httpTimeout` of 5 s). Decisions stop at this deadline too, so a request given up on does
    /// not keep a worker busy.
    pub request_timeout: Duration,
    /// Candidate nodes one request may name; a larger request is refused (filter: `Error`;
    /// prioritize: 400).
    pub max_nodes_per_request: usize,
    /// Requests deciding at once (each decides on one blocking thread); later ones wait for a
    /// slot within their own deadline. Default: the number of CPUs.
    pub max_concurrent_decisions: usize,
    /// Honour the `X-Weft-Debug` header (prioritize answers carry each node's reason, which tells
    /// the caller how many GPUs are free on it). Off by default.
    pub debug_reasons: bool,
    /// Rank nodes with an SR-IOV VF free below those without for pods that ask no VFs (the rule
    /// `weft simulate` measured, docs/gpu-placement.md "GPUs and VFs packed together"). Off by
    /// default: the extender cannot tell whether the cluster's pods ask VFs, and where none do the
    /// rule only costs GPU-only pods the better-connected NIC nodes.
    pub spare_vfs: bool,
    /// Bounds of the topology cache.
    pub cache_limits: CacheLimits,
    /// How long a GPU decision made by bind counts as used while the watch has not shown the pod
    /// on its node yet ([`crate::reservations`]).
    pub reservation_ttl: Duration,
    /// How long a gang's plan is held after its last member's activity (default 5 min;
    /// `crate::gang`).
    pub gang_plan_ttl: Duration,
    /// Where gang plans read the cluster's network (default: HyperNodes, else Topograph's labels
    /// and the GPU clique).
    pub network_levels: crate::gang::NetworkLevels,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        ExtenderConfig {
            resource_name: DEFAULT_GPU_RESOURCE.to_string(),
            require_topology: false,
            score_config: ScoreConfig::default(),
            neutral_score: 5,
            path_prefix: String::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_decoded_bytes: DEFAULT_MAX_DECODED_BYTES,
            request_timeout: Duration::from_secs(3),
            max_nodes_per_request: DEFAULT_MAX_NODES_PER_REQUEST,
            max_concurrent_decisions: std::thread::available_parallelism().map_or(2, usize::from),
            debug_reasons: false,
            spare_vfs: false,
            cache_limits: CacheLimits::default(),
            reservation_ttl: Duration::from_secs(60),
            gang_plan_ttl: Duration::from_secs(300),
            network_levels: crate::gang::NetworkLevels::default(),
        }
    }
}

impl ExtenderConfig {
    /// The path prefix normalised: empty, or starting with `/` and not ending with one.
    pub fn normalized_prefix(&self) -> String {
        let p = self.path_prefix.trim().trim_end_matches('/');
        if p.is_empty() {
            String::new()
        } else if p.starts_with('/') {
            p.to_string()
        } else {
            format!("/{p}")
        }
    }
}
