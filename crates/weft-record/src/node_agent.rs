//! The node agent's topology duty: keep this node's `weft.io/gpu-topology` annotation equal to the
//! discovered topology, for as long as the agent runs.
//!
//! Triggers: start-up, every `interval` (discovery again, since GPUs, drivers and links can change
//! under a running node), and any change to the node that leaves the annotation different from what
//! was last published (someone removed or edited it; it is written back at once from the last
//! discovery). The state that matters lives in the API server: after a restart the first publish
//! compares with the node's annotation and writes nothing when it is current.
//!
//! A discovery that finds no GPUs on a node whose status advertises `nvidia.com/gpu` capacity is
//! not published (it would make the extender reject the node for every GPU pod); it counts as a
//! discovery error and readiness stays false until discovery works.

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use weft_topology::{NodeTopology, inventory};

use crate::TOPOLOGY_ANNOTATION;
use crate::publish::{PublishOutcome, publish_topology_with};
use crate::usage::DEFAULT_GPU_RESOURCE;
use weft_kube::write::RetryPolicy;

/// Where and how often to publish.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// This node's name.
    pub node: String,
    /// Field manager of the writes.
    pub field_manager: String,
    /// Re-discover and re-publish this often.
    pub interval: Duration,
    /// Retries of one publish.
    pub retry: RetryPolicy,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// `weft_agent_topology_publishes_total{outcome}`: `updated`, `unchanged`, `error`, and
/// `discovery_error`.
#[derive(Clone, Debug, Default)]
pub struct PublisherMetrics {
    publishes: Family<OutcomeLabels, Counter>,
}

impl PublisherMetrics {
    /// Metrics registered in `registry`.
    pub fn register(registry: &mut Registry) -> PublisherMetrics {
        let m = PublisherMetrics::default();
        registry.sub_registry_with_prefix("agent").register(
            "topology_publishes",
            "Topology publish attempts by outcome",
            m.publishes.clone(),
        );
        m
    }

    /// Publishes that ended with `outcome` so far.
    pub fn count(&self, outcome: &'static str) -> u64 {
        self.publishes.get_or_create(&OutcomeLabels { outcome }).get()
    }

    fn inc(&self, outcome: &'static str) {
        self.publishes.get_or_create(&OutcomeLabels { outcome }).inc();
    }
}

/// The node's `nvidia.com/gpu` capacity, if the node can be read and advertises it.
async fn advertised_gpus(client: &Client, node: &str) -> Option<i64> {
    let n = Api::<Node>::all(client.clone()).get_opt(node).await.ok()??;
    let q = n.status?.capacity?.remove(DEFAULT_GPU_RESOURCE)?;
    q.0.trim().parse::<i64>().ok()
}

/// Discovers the node's topology (blocking; run on a blocking thread).
pub type Discover = Arc<dyn Fn() -> Result<NodeTopology, String> + Send + Sync>;

/// Keep the node's annotation current until `shutdown` is cancelled. `ready` turns true after the
/// first successful publish (or once the annotation was found current).
pub async fn keep_topology_published(
    client: Client,
    cfg: PublisherConfig,
    discover: Discover,
    metrics: PublisherMetrics,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", cfg.node));
    let mut node_events = pin!(watcher::watcher(nodes, wc).default_backoff());
    let mut ticker = tokio::time::interval(cfg.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The value last written or found current; `None` until the first success.
    let mut published: Option<String> = None;
    let mut topology: Option<NodeTopology> = None;
    loop {
        let rediscover = tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => true,
            event = node_events.next() => {
                match event {
                    Some(Ok(Event::Apply(node) | Event::InitApply(node))) => {
                        let current = node.metadata.annotations.as_ref().and_then(|a| a.get(TOPOLOGY_ANNOTATION));
                        match (&published, current) {
                            (Some(p), Some(c)) if p == c => continue,
                            (None, _) => continue, // the first tick publishes
                            _ => {
                                tracing::info!(node = %cfg.node, "topology annotation changed by someone else; writing it back");
                                false
                            }
                        }
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        tracing::warn!(node = %cfg.node, error = %e, "node watch failed; retrying");
                        continue;
                    }
                    None => return,
                }
            }
        };
        if rediscover || topology.is_none() {
            let d = discover.clone();
            match tokio::task::spawn_blocking(move || d()).await {
                Ok(Ok(mut t)) => {
                    t.name = Some(cfg.node.clone());
                    topology = Some(t);
                }
                Ok(Err(e)) => {
                    metrics.inc("discovery_error");
                    tracing::error!(node = %cfg.node, error = %e, "topology discovery failed");
                    continue;
                }
                Err(e) => {
                    metrics.inc("discovery_error");
                    tracing::error!(node = %cfg.node, error = %e, "topology discovery panicked");
                    continue;
                }
            }
        }
        let Some(t) = &topology else { continue };
        if t.gpu_count() == 0
            && let Some(advertised) = advertised_gpus(&client, &cfg.node).await
            && advertised > 0
        {
            // Publishing "0 GPUs" would make the extender reject this node for every GPU pod.
            metrics.inc("discovery_error");
            tracing::error!(
                node = %cfg.node, advertised,
                "discovery found no GPUs but the node advertises {advertised} {DEFAULT_GPU_RESOURCE}; not publishing \
                 (is NVML reachable in the agent container? see docs/deploy.md)"
            );
            topology = None;
            continue;
        }
        match publish_topology_with(client.clone(), &cfg.node, t, &cfg.field_manager, &cfg.retry).await {
            Ok(outcome) => {
                metrics.inc(match outcome {
                    PublishOutcome::Unchanged => "unchanged",
                    PublishOutcome::Updated { .. } => "updated",
                });
                published = Some(inventory::to_json(t));
                ready.store(true, Ordering::Release);
            }
            Err(e) => {
                metrics.inc("error");
                let wait = cfg.retry.max_backoff.max(Duration::from_secs(1));
                tracing::error!(node = %cfg.node, error = %e, ?wait, "publishing the topology failed; will retry");
                ticker.reset_after(wait);
            }
        }
    }
}
