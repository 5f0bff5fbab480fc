//! Flags shared by the commands that talk to a cluster or run as a long-lived component.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;
use weft_kube::ops::Ops;

/// Which cluster to talk to.
#[derive(Args, Debug, Clone)]
pub struct KubeArgs {
    /// Kubeconfig file (default: in-cluster config, else $KUBECONFIG / ~/.kube/config).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
}

impl KubeArgs {
    /// A client for the chosen cluster.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        weft_kube::client_from(self.kubeconfig.clone(), self.context.clone()).await.context("connecting to Kubernetes")
    }
}

/// The operations endpoint of a long-running component.
#[derive(Args, Debug, Clone)]
pub struct OpsArgs {
    /// Address of the ops endpoint: `/healthz`, `/readyz`, `/metrics`.
    #[arg(long, default_value = "0.0.0.0:9090", value_name = "ADDR")]
    pub ops_listen: SocketAddr,
}

impl OpsArgs {
    /// Bind the ops endpoint and serve `ops` until `shutdown` is cancelled.
    pub async fn serve(
        &self,
        ops: Arc<Ops>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
        let listener = tokio::net::TcpListener::bind(self.ops_listen)
            .await
            .with_context(|| format!("listening on {} (--ops-listen)", self.ops_listen))?;
        let addr = listener.local_addr().unwrap_or(self.ops_listen);
        crate::component::note(format_args!("ops endpoint on http://{addr} (/healthz, /readyz, /metrics)"));
        Ok(tokio::spawn(weft_kube::ops::serve(listener, ops, async move { shutdown.cancelled().await })))
    }
}

/// This replica's name: `$POD_NAME` (set from the downward API), else the host name.
pub fn instance_name() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
}
