//! Writes that survive other writers: bounded retries with backoff, read-modify-write updates
//! that re-read the object after a 409 Conflict instead of overwriting someone else's change, and
//! annotation patches that cannot land on an object recreated under the same name.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Error as KubeError, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    /// For read-modify-write against other writers: many quick attempts (10, from 10 ms to 1 s), as a
    /// conflict is resolved by the next fresh read rather than by waiting.
    pub fn conflicts() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
        }
    }

    /// Wait before attempt `attempt + 1`, after `attempt` failures (`attempt` ≥ 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        doubling_backoff(self.initial_backoff, self.max_backoff, attempt)
    }
}

/// `first · 2^(n-1)`, capped at `max`: the wait after the `n`-th consecutive failure (`n` ≥ 1).
pub fn doubling_backoff(first: Duration, max: Duration, n: u32) -> Duration {
    let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
    first.saturating_mul(factor).min(max)
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

/// Which part of an object an update writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The object (PUT on the resource; a status subresource's `.status` is ignored there).
    Object,
    /// The status subresource (PUT on `…/status`).
    Status,
}

/// Read `name`, let `mutate` change it, and write it back conditioned on the resourceVersion that
/// was read (an `update`, PUT). On 409 Conflict the object is read again and `mutate` runs on the
/// fresh copy, so a concurrent writer's change is kept, never overwritten. Other retryable errors
/// (429, 5xx, transport) are retried too, up to `retry.max_attempts` in all.
///
/// `mutate` returns whether it changed anything; when it returns `false` nothing is written and the
/// object as read is returned. Returns `Ok(None)` when the object does not exist.
pub async fn update_with_retry<K, F>(
    api: &Api<K>,
    name: &str,
    part: Part,
    params: &PostParams,
    retry: &RetryPolicy,
    mut mutate: F,
) -> Result<Option<K>, KubeError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnMut(&mut K) -> bool,
{
    let max_attempts = retry.max_attempts.max(1);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = async {
            let Some(mut obj) = api.get_opt(name).await? else {
                return Ok(None);
            };
            if !mutate(&mut obj) {
                return Ok(Some(obj));
            }
            let written = match part {
                Part::Object => api.replace(name, params, &obj).await?,
                Part::Status => api.replace_status(name, params, &obj).await?,
            };
            Ok(Some(written))
        }
        .await;
        match result {
            Err(e) if is_retryable(&e) && attempt < max_attempts => {
                let wait = retry.backoff(attempt);
                tracing::debug!(name, attempt, ?wait, error = %e, "update failed; re-reading and retrying");
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
    }
}

/// Sets (`Some`) or removes (`None`) annotations of object `name` in one JSON merge patch that also
/// carries `uid`. The API server refuses to change an object's UID (422 Invalid, "field is
/// immutable"), so the patch fails instead of landing on an object deleted and recreated under the
/// same name; other annotations are left as they are.
pub async fn patch_annotations<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    annotations: &BTreeMap<String, Option<String>>,
    field_manager: &str,
) -> Result<K, KubeError>
where
    K: Clone + DeserializeOwned + Debug,
{
    patch_annotations_at(api, name, uid, None, annotations, field_manager).await
}

/// [`patch_annotations`] that also carries `resource_version` when given: the API server then
/// refuses the patch with 409 Conflict unless the object is still at that version, so values
/// computed from a copy of the object never overwrite what another writer changed since.
pub async fn patch_annotations_at<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    resource_version: Option<&str>,
    annotations: &BTreeMap<String, Option<String>>,
    field_manager: &str,
) -> Result<K, KubeError>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut patch = serde_json::json!({ "metadata": { "uid": uid, "annotations": annotations } });
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = serde_json::Value::from(rv);
    }
    let params = PatchParams { field_manager: Some(field_manager.to_string()), ..PatchParams::default() };
    api.patch(name, &params, &Patch::Merge(&patch)).await
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
