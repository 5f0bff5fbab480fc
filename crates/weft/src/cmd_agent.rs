//! `weft agent`: the node agent (DaemonSet). Today it keeps the node's GPU topology annotation
//! current; the NRI resource manager joins it later.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use weft_k8s::node_agent::{Discover, PublisherConfig, PublisherMetrics, keep_topology_published};
use weft_k8s::ops::{self, Ops};
use weft_k8s::write::RetryPolicy;
use weft_topology::read_node_file;

use crate::cmd_topo::{DiscoverArgs, discover_node};
use crate::kube_args::{KubeArgs, OpsArgs};

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// This node's name (the DaemonSet sets NODE_NAME from `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// Publish this topology file instead of discovering (for nodes NVML cannot describe).
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// Re-discover and re-publish this often, seconds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    interval: u64,
    /// Field manager recorded on the writes.
    #[arg(long, default_value = "weft-agent")]
    field_manager: String,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    ops: OpsArgs,
    #[command(flatten)]
    discover: DiscoverArgs,
}

pub fn run(a: AgentArgs) -> anyhow::Result<()> {
    if a.interval == 0 {
        anyhow::bail!("--interval must be at least 1 second");
    }
    let discover: Discover = match a.topology.clone() {
        Some(path) => Arc::new(move || read_node_file(&path).map_err(|e| e.to_string())),
        None => {
            let args = a.discover.clone();
            Arc::new(move || {
                let found = discover_node(&args).map_err(|e| format!("{e:#}"))?;
                for note in &found.notes {
                    tracing::info!(note = %note, "discovery");
                }
                Ok(found.node)
            })
        }
    };
    let cfg = PublisherConfig {
        node: a.node.clone(),
        field_manager: a.field_manager.clone(),
        interval: Duration::from_secs(a.interval),
        retry: RetryPolicy::default(),
    };
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = ops::shutdown_on_signals();
        let client = a.kube.client().await?;
        let mut registry = ops::registry();
        let metrics = PublisherMetrics::register(&mut registry);
        let ops = Ops::new(registry);
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        ops.add_readiness_check("topology published", move || r.load(Ordering::Acquire));
        let ops_task = a.ops.serve(ops, shutdown.clone()).await?;
        eprintln!("weft agent on node {}: publishing {} every {} s", a.node, weft_k8s::TOPOLOGY_ANNOTATION, a.interval);
        keep_topology_published(client, cfg, discover, metrics, ready, shutdown.clone()).await;
        shutdown.cancel();
        ops_task.await.context("ops endpoint task")?.context("serving the ops endpoint")?;
        eprintln!("weft agent stopped");
        Ok(())
    })
}
