//! Publishing a node's topology to its `weft.io/gpu-topology` annotation, and building a client.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{Config, InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Error as KubeError};
use thiserror::Error;
use weft_topology::{NodeTopology, inventory};

use crate::TOPOLOGY_ANNOTATION;

/// Why publishing failed.
#[derive(Debug, Error)]
pub enum PublishError {
    /// The node does not exist.
    #[error("node '{node}' not found; is the agent running with the right NODE_NAME?")]
    NotFound {
        /// Node name.
        node: String,
    },
    /// The API server refused or failed in a way retrying does not fix (e.g. 403: grant the
    /// service account `get` and `patch` on nodes).
    #[error("node '{node}': {source}")]
    Api {
        /// Node name.
        node: String,
        /// The error.
        #[source]
        source: KubeError,
    },
    /// Every attempt failed with a retryable error (409, 429, 5xx, connection).
    #[error("node '{node}': gave up after {attempts} attempts: {source}")]
    RetriesExhausted {
        /// Node name.
        node: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        #[source]
        source: KubeError,
    },
    /// The field manager is empty or longer than the API server allows (128 characters).
    #[error("field manager '{0}' must be 1 to 128 characters")]
    BadFieldManager(String),
}

/// What publishing did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The annotation already held the value; nothing was written.
    Unchanged,
    /// The annotation was written.
    Updated {
        /// Attempts it took (1 = first try).
        attempts: u32,
    },
}

/// Bounded exponential backoff between attempts.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, at least 1.
    pub max_attempts: u32,
    /// Wait after the first failure; doubled after each further one.
    pub initial_backoff: Duration,
    /// Longest wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Wait before attempt `attempt + 1`, after `attempt` failures (`attempt` ≥ 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// Whether an API error is worth retrying: conflicts, throttling, server errors and transport
/// failures.
pub fn is_retryable(e: &KubeError) -> bool {
    match e {
        KubeError::Api(s) => s.code == 409 || s.code == 429 || s.code >= 500,
        KubeError::HyperError(_) | KubeError::Service(_) => true,
        _ => false,
    }
}

/// Write `topology` (as [`inventory::to_json`]) to the node's [`TOPOLOGY_ANNOTATION`] with
/// [`RetryPolicy::default`]. See [`publish_topology_with`].
pub async fn publish_topology(
    client: Client,
    node_name: &str,
    topology: &NodeTopology,
    field_manager: &str,
) -> Result<PublishOutcome, PublishError> {
    publish_topology_with(client, node_name, topology, field_manager, &RetryPolicy::default()).await
}

/// Write `topology` to the node's [`TOPOLOGY_ANNOTATION`].
///
/// Each attempt reads the node and, unless the annotation already holds the value, sends a JSON
/// merge patch (`application/merge-patch+json`) that sets only this annotation. Conflicts (409),
/// throttling (429), server errors (5xx) and transport failures are retried with `retry`'s backoff,
/// re-reading the node each time.
pub async fn publish_topology_with(
    client: Client,
    node_name: &str,
    topology: &NodeTopology,
    field_manager: &str,
    retry: &RetryPolicy,
) -> Result<PublishOutcome, PublishError> {
    if field_manager.is_empty() || field_manager.len() > 128 {
        return Err(PublishError::BadFieldManager(field_manager.to_string()));
    }
    let api: Api<Node> = Api::all(client);
    let value = inventory::to_json(topology);
    let patch = serde_json::json!({ "metadata": { "annotations": { TOPOLOGY_ANNOTATION: value } } });
    let params = PatchParams { field_manager: Some(field_manager.to_string()), ..PatchParams::default() };
    let max_attempts = retry.max_attempts.max(1);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = async {
            let node = api.get(node_name).await?;
            let current = node.metadata.annotations.as_ref().and_then(|a| a.get(TOPOLOGY_ANNOTATION));
            if current == Some(&value) {
                return Ok(PublishOutcome::Unchanged);
            }
            api.patch(node_name, &params, &Patch::Merge(&patch)).await?;
            Ok(PublishOutcome::Updated { attempts: attempt })
        }
        .await;
        match result {
            Ok(outcome) => {
                tracing::info!(node = node_name, ?outcome, "published GPU topology");
                return Ok(outcome);
            }
            Err(KubeError::Api(s)) if s.code == 404 => {
                return Err(PublishError::NotFound { node: node_name.to_string() });
            }
            Err(e) if is_retryable(&e) && attempt < max_attempts => {
                let wait = retry.backoff(attempt);
                tracing::warn!(node = node_name, attempt, ?wait, error = %e, "publishing GPU topology failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) if is_retryable(&e) => {
                return Err(PublishError::RetriesExhausted {
                    node: node_name.to_string(),
                    attempts: attempt,
                    source: e,
                });
            }
            Err(e) => return Err(PublishError::Api { node: node_name.to_string(), source: e }),
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file (or `$KUBECONFIG / ~/.kube/config`).
        path: String,
        /// Why.
        #[source]
        source: KubeconfigError,
    },
    /// Neither an in-cluster service account nor a kubeconfig was found.
    #[error(
        "no cluster configuration: not running in a pod ({in_cluster}) and no usable kubeconfig ({kubeconfig}); pass --kubeconfig"
    )]
    NoConfig {
        /// The in-cluster error.
        in_cluster: InClusterError,
        /// The kubeconfig error.
        kubeconfig: KubeconfigError,
    },
    /// The configuration was read but a client could not be made from it.
    #[error("cannot create a Kubernetes client: {0}")]
    Client(#[source] KubeError),
}

/// A client for the cluster.
///
/// - `kubeconfig` given: that file, with `context` or its current context;
/// - else `context` given: the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`) with that context;
/// - else the in-cluster service account when running in a pod, otherwise the default kubeconfig.
pub async fn client_from(kubeconfig: Option<PathBuf>, context: Option<String>) -> Result<Client, ClientError> {
    let options = KubeConfigOptions { context, ..KubeConfigOptions::default() };
    let default_path = || "$KUBECONFIG or ~/.kube/config".to_string();
    let config = match kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kc = Kubeconfig::read_from(&path)
                .map_err(|source| ClientError::Kubeconfig { path: shown.clone(), source })?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|source| ClientError::Kubeconfig { path: shown, source })?
        }
        None if options.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|source| ClientError::Kubeconfig { path: default_path(), source })?,
        None => match Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => Config::from_kubeconfig(&options)
                .await
                .map_err(|kubeconfig| ClientError::NoConfig { in_cluster, kubeconfig })?,
        },
    };
    Client::try_from(config).map_err(ClientError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let r = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
        };
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(2), Duration::from_millis(200));
        assert_eq!(r.backoff(3), Duration::from_millis(400));
        assert_eq!(r.backoff(4), Duration::from_millis(500));
        assert_eq!(r.backoff(40), Duration::from_millis(500));
    }
}
