//! Settings of the scheduler extender.

use std::time::Duration;

use weft_alloc::ScoreConfig;

use crate::usage::DEFAULT_GPU_RESOURCE;

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
    /// Largest request body accepted (default 64 MiB; a 5,000-node `Nodes` list is ~25–50 MiB).
    pub max_body_bytes: usize,
    /// Time allowed to read a request and decide (default 3 s, inside kube-scheduler's default
    /// `httpTimeout` of 5 s).
    pub request_timeout: Duration,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        ExtenderConfig {
            resource_name: DEFAULT_GPU_RESOURCE.to_string(),
            require_topology: false,
            score_config: ScoreConfig::default(),
            neutral_score: 5,
            path_prefix: String::new(),
            max_body_bytes: 64 << 20,
            request_timeout: Duration::from_secs(3),
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
