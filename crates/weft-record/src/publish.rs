//! Publishing a node's topology to its `weft.io/gpu-topology` annotation.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Error as KubeError};
use thiserror::Error;
use weft_topology::{NodeTopology, inventory};

use crate::TOPOLOGY_ANNOTATION;
use weft_kube::write::{RetryPolicy, is_retryable};

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
