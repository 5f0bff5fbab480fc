//! How much of one whole-count resource (GPUs, VFs) a pod needs, as the kubelet and the scheduler
//! compute it (`resourcehelper.PodRequests`):
//!
//! - per container, the larger of its request and limit (extended resources need both equal when
//!   both are set; the API server copies a lone limit into the request);
//! - app containers are summed;
//! - init containers run one after another, so the pod needs the largest of them, plus every
//!   restartable ("sidecar", `restartPolicy: Always`) init container started before it; sidecars
//!   also keep running beside the app containers, so they add to the app sum;
//! - the result is `max(app sum + sidecars, largest init-time need)`.
//!
//! [`pod_need`] is the rule over amounts already read; [`pod_request`] applies it to a
//! `v1.Pod`, [`container_amount`] reads one container's amount from its spec and
//! [`container_request`] from its quantities.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::{QuantityError, whole};

/// Where a container runs in the pod's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// An app container (`spec.containers`).
    App,
    /// An init container that runs to completion before the next one starts.
    Init,
    /// A restartable init container (`restartPolicy: Always`): starts in init order, then runs
    /// beside the app containers.
    Sidecar,
}

impl Stage {
    /// The stage of an init container with this `restartPolicy`.
    pub fn of_init(restart_policy: Option<&str>) -> Stage {
        if restart_policy == Some("Always") { Stage::Sidecar } else { Stage::Init }
    }
}

/// The pod's need from its containers' amounts, in spec order (init containers in their order;
/// the app containers' order does not matter).
pub fn pod_need(containers: impl IntoIterator<Item = (Stage, u64)>) -> u64 {
    let (mut app, mut sidecars, mut init_peak) = (0u64, 0u64, 0u64);
    for (stage, amount) in containers {
        match stage {
            Stage::App => app = app.saturating_add(amount),
            Stage::Sidecar => {
                sidecars = sidecars.saturating_add(amount);
                app = app.saturating_add(amount);
                init_peak = init_peak.max(sidecars);
            }
            Stage::Init => init_peak = init_peak.max(amount.saturating_add(sidecars)),
        }
    }
    app.max(init_peak)
}

/// Why a pod's request of a resource could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A quantity that is not a whole, non-negative number of devices.
    #[error("container '{container}': {resource} quantity '{value}' is not a whole number of devices")]
    NotWhole {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The quantity as written.
        value: String,
    },
    /// A quantity too large to count.
    #[error("container '{container}': {resource} quantity '{value}' is too large")]
    TooLarge {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// The quantity as written.
        value: String,
    },
}

/// One container's amount of `resource`: the larger of its request and limit, each a whole count.
/// `container` names it in errors.
pub fn container_request<'a>(
    container: &str,
    resource: &str,
    quantities: impl IntoIterator<Item = &'a str>,
) -> Result<u64, RequestError> {
    let mut best = 0;
    for q in quantities {
        let n = whole(q).map_err(|e| {
            let (container, resource, value) = (container.to_owned(), resource.to_owned(), q.to_owned());
            match e {
                QuantityError::TooLarge => RequestError::TooLarge { container, resource, value },
                _ => RequestError::NotWhole { container, resource, value },
            }
        })?;
        best = best.max(n);
    }
    Ok(best)
}

/// One container's amount of `resource` from its spec: [`container_request`] over its requests and
/// limits (0 when it names neither).
pub fn container_amount(c: &Container, resource: &str) -> Result<u64, RequestError> {
    let Some(res) = &c.resources else { return Ok(0) };
    let quantities = [&res.requests, &res.limits].into_iter().flatten().filter_map(|m| m.get(resource));
    container_request(&c.name, resource, quantities.map(|q| q.0.as_str()))
}

/// Number of `resource` devices `pod` needs (see the module docs). A pod without a spec needs none.
pub fn pod_request(pod: &Pod, resource: &str) -> Result<u64, RequestError> {
    let Some(spec) = &pod.spec else { return Ok(0) };
    let init = spec.init_containers.iter().flatten().map(|c| (Stage::of_init(c.restart_policy.as_deref()), c));
    let app = spec.containers.iter().map(|c| (Stage::App, c));
    // The first unreadable quantity stops the count and is the answer.
    let mut failed = None;
    let need = pod_need(init.chain(app).map_while(|(stage, c)| match container_amount(c, resource) {
        Ok(n) => Some((stage, n)),
        Err(e) => {
            failed = Some(e);
            None
        }
    }));
    failed.map_or(Ok(need), Err)
}
