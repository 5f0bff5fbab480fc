//! `weft scheduler-extender`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::output::score_config;
use anyhow::Context;
use clap::Args;
use weft_alloc::ScoreConfig;
use weft_k8s::ops::{self, Ops};
use weft_k8s::{ExtenderConfig, ExtenderState, KubeClusterView, serve};

use crate::kube_args::{KubeArgs, OpsArgs};

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
    #[arg(long, default_value_t = 3000)]
    request_timeout_ms: u64,
}

pub fn run(a: ExtenderArgs) -> anyhow::Result<()> {
    if !(0..=10).contains(&a.neutral_score) {
        anyhow::bail!("--neutral-score must be between 0 and 10 (MaxExtenderPriority), got {}", a.neutral_score);
    }
    let cfg = ExtenderConfig {
        resource_name: a.resource_name.clone(),
        require_topology: a.require_topology,
        score_config: score_config(a.remainder_weight)?,
        neutral_score: a.neutral_score,
        path_prefix: a.path_prefix.clone(),
        max_body_bytes: a.max_body_bytes,
        request_timeout: Duration::from_millis(a.request_timeout_ms),
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = ops::shutdown_on_signals();
        let client = a.kube.client().await?;
        let view = Arc::new(KubeClusterView::spawn(client));
        let state = Arc::new(ExtenderState::new(view, cfg));
        let mut registry = ops::registry();
        state.register_metrics(&mut registry);
        let ops = Ops::new(registry);
        state.add_readiness_check(&ops);
        let ops_task = a.ops.serve(ops, shutdown.clone()).await?;
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("listening on {}", a.listen))?;
        eprintln!("weft scheduler-extender listening on {} (ready once node and pod caches sync)", a.listen);
        let stop = shutdown.clone();
        serve(listener, state, async move { stop.cancelled().await }).await.context("serving")?;
        shutdown.cancel();
        ops_task.await.context("ops endpoint task")?.context("serving the ops endpoint")
    })
}
