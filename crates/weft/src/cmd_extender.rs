//! `weft scheduler-extender`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use weft_alloc::ScoreConfig;
use weft_k8s::cache::CacheLimits;
use weft_k8s::http::ServeOptions;
use weft_k8s::{ExtenderConfig, ExtenderState, KubeClusterView, serve};

use crate::component::{self, note};
use crate::kube_args::{KubeArgs, OpsArgs};
use crate::output::score_config;

#[derive(Args, Debug)]
pub struct ExtenderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8888", value_name = "ADDR")]
    listen: SocketAddr,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
    /// Extended resource counted as GPUs.
    #[arg(long, default_value = weft_k8s::DEFAULT_GPU_RESOURCE)]
    resource_name: String,
    /// Reject nodes whose `weft.io/gpu-topology` annotation is missing or unreadable (default: they
    /// pass unjudged and score 0).
    #[arg(long)]
    require_topology: bool,
    /// Weight (0–1) of the remainder-quality term of the node score.
    #[arg(long, default_value_t = ScoreConfig::default().remainder_weight)]
    remainder_weight: f64,
    /// Score (0–10) every node gets for pods that request no GPUs.
    #[arg(long, default_value_t = 5)]
    neutral_score: i64,
    /// Path prefix of the verbs (`/weft` serves /weft/filter and /weft/prioritize).
    #[arg(long, default_value = "")]
    path_prefix: String,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
    /// Time to read, decide and answer one request, milliseconds (kube-scheduler waits 5 s by default).
    /// Decisions stop at this deadline too.
    #[arg(long, default_value_t = 3000)]
    request_timeout_ms: u64,
    /// Candidate nodes one request may name; larger requests are refused.
    #[arg(long, default_value_t = weft_k8s::config::DEFAULT_MAX_NODES_PER_REQUEST)]
    max_nodes_per_request: usize,
    /// Requests deciding at once; later ones wait for a slot within their own time (default: the
    /// number of CPUs).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_decisions: Option<u32>,
    /// Node names the topology cache remembers.
    #[arg(long, default_value_t = weft_k8s::cache::DEFAULT_MAX_NODES)]
    cache_max_nodes: usize,
    /// Bytes the topology cache may hold (annotation text and prepared topologies).
    #[arg(long, default_value_t = weft_k8s::cache::DEFAULT_MAX_BYTES)]
    cache_max_bytes: usize,
    /// Honour the `X-Weft-Debug: true` header on prioritize (each node's reason in the answer,
    /// which tells any caller how many GPUs are free on each node). Off by default.
    #[arg(long)]
    debug_reasons: bool,
}

pub fn run(a: ExtenderArgs) -> anyhow::Result<()> {
    if !(0..=10).contains(&a.neutral_score) {
        anyhow::bail!("--neutral-score must be between 0 and 10 (MaxExtenderPriority), got {}", a.neutral_score);
    }
    let defaults = ExtenderConfig::default();
    let cfg = ExtenderConfig {
        resource_name: a.resource_name.clone(),
        require_topology: a.require_topology,
        score_config: score_config(a.remainder_weight)?,
        neutral_score: a.neutral_score,
        path_prefix: a.path_prefix.clone(),
        max_body_bytes: a.max_body_bytes,
        request_timeout: Duration::from_millis(a.request_timeout_ms),
        max_nodes_per_request: a.max_nodes_per_request,
        max_concurrent_decisions: a.max_concurrent_decisions.map_or(defaults.max_concurrent_decisions, |n| n as usize),
        debug_reasons: a.debug_reasons,
        cache_limits: CacheLimits { max_nodes: a.cache_max_nodes, max_bytes: a.cache_max_bytes },
    };
    component::run("scheduler-extender", &a.ops, |c| async move {
        let client = a.kube.client().await?;
        let view = Arc::new(KubeClusterView::spawn(client));
        let state = Arc::new(ExtenderState::new(view, cfg));
        c.ops.register_metrics(|registry| state.register_metrics(registry));
        state.add_readiness_check(&c.ops);
        c.started();
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        let addr = listener.local_addr().unwrap_or(a.listen);
        note(format_args!("weft scheduler-extender listening on {addr} (ready once node and pod caches sync)"));
        let stop = c.shutdown.clone();
        serve(listener, state, ServeOptions::default(), async move { stop.cancelled().await }).await.context("serving")
    })
}
