//! Writes the devices each pod really got to a pod annotation, from the kubelet's PodResources
//! `List` (the kubelet's own record, checkpointed across its restarts), so the annotation is true
//! whatever happened between decision and container: a decision honoured, one that could not be,
//! a pod the handshake could not name, a plugin restarted between Allocate and the write.
//!
//! What is written is the device kind's own ([`AnnotatedDevices`]: `weft.io/gpu-ids` from the GPU
//! plugin, `weft.io/vf-ids` from every VF plugin of the node together); the pass and the loop are
//! shared. A pass runs after every Allocate (the kubelet records the assignment right after the
//! call returns, so a pass that does not see it yet runs again shortly) and every period.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::podresources::{ContainerKey, api::PodResources, devices_of};

/// Sets one annotation on a pod (the API server in production).
#[async_trait]
pub trait PodAnnotator: Send + Sync + 'static {
    /// Sets `key` to `value` on pod `namespace/name` when its UID is still `uid`.
    async fn annotate(&self, namespace: &str, name: &str, uid: &str, key: &str, value: &str) -> Result<(), String>;
}

/// Writes through the API server: one JSON merge patch of the annotation that carries the pod's
/// UID ([`weft_kube::write::patch_annotations`]), so a pod deleted and recreated under the same name
/// is left alone.
pub struct KubeAnnotator {
    client: kube::Client,
    field_manager: String,
}

impl KubeAnnotator {
    /// Writes as `field_manager`.
    pub fn new(client: kube::Client, field_manager: impl Into<String>) -> KubeAnnotator {
        KubeAnnotator { client, field_manager: field_manager.into() }
    }
}

#[async_trait]
impl PodAnnotator for KubeAnnotator {
    async fn annotate(&self, namespace: &str, name: &str, uid: &str, key: &str, value: &str) -> Result<(), String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let annotations = BTreeMap::from([(key.to_string(), Some(value.to_string()))]);
        weft_kube::write::patch_annotations(&api, name, uid, &annotations, &self.field_manager)
            .await
            .map(|_| ())
            .map_err(|e| format!("annotating pod {namespace}/{name}: {e}"))
    }
}

/// Devices of one or more resources, recorded in one pod annotation: what the write-back needs
/// of the plugins that serve them.
#[async_trait]
pub trait AnnotatedDevices: Send + Sync + 'static {
    /// The annotation.
    fn annotation(&self) -> &str;

    /// The resources whose devices it records.
    fn resources(&self) -> Vec<String>;

    /// The pods the kubelet knows on this node.
    async fn pods(&self) -> Result<Vec<Pod>, String>;

    /// The kubelet's PodResources list.
    async fn assigned(&self) -> Result<Vec<PodResources>, String>;

    /// The annotation's value for pod `pod` (`namespace/name`, for messages) whose containers
    /// hold `held`: device IDs (sorted, each once) by resource, for every resource it holds any of.
    fn value(&self, pod: &str, held: &BTreeMap<String, Vec<String>>) -> String;

    /// Whether the annotation's `current` value already says what `value` says.
    fn says(&self, current: &str, value: &str) -> bool {
        current == value
    }

    /// Forgets the plugins' grants the kubelet now lists (`listed`: by resource, the devices of
    /// each container) and those of pods not in `live_pods` (UIDs); returns how many answered
    /// containers the kubelet does not list yet.
    fn settle(&self, listed: &BTreeMap<String, BTreeMap<ContainerKey, Vec<String>>>, live_pods: &[String]) -> usize;

    /// Resolves once an Allocate was answered since the last call.
    async fn allocated(&self);
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Pods whose annotation was written, `namespace/name` → the value.
    pub written: BTreeMap<String, String>,
    /// Answered containers the kubelet does not list yet.
    pub unsettled: usize,
}

/// One pass: every pod the kubelet lists with devices of the resources gets the annotation its
/// containers' devices make. Errors of single pods are logged and retried on the next pass; the
/// error is for a kubelet that cannot be read.
pub async fn reconcile_once(devices: &dyn AnnotatedDevices, annotator: &dyn PodAnnotator) -> Result<Pass, String> {
    let key = devices.annotation();
    let pods = devices.pods().await?;
    let list = devices.assigned().await?;
    let listed: BTreeMap<String, BTreeMap<ContainerKey, Vec<String>>> =
        devices.resources().into_iter().map(|r| (r.clone(), devices_of(&list, &r))).collect();
    let mut per_pod: HashMap<(&str, &str), BTreeMap<String, Vec<String>>> = HashMap::new();
    for (resource, by_container) in &listed {
        for (c, ids) in by_container {
            let held = per_pod.entry((c.namespace.as_str(), c.pod.as_str())).or_default();
            held.entry(resource.clone()).or_default().extend(ids.iter().cloned());
        }
    }
    let mut pass = Pass::default();
    let mut live = Vec::new();
    for pod in &pods {
        let meta = &pod.metadata;
        let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else { continue };
        live.push(uid.clone());
        let Some(held) = per_pod.get_mut(&(namespace.as_str(), name.as_str())) else { continue };
        for ids in held.values_mut() {
            ids.sort_unstable();
            ids.dedup();
        }
        let label = format!("{namespace}/{name}");
        let value = devices.value(&label, held);
        let current = meta.annotations.as_ref().and_then(|a| a.get(key));
        if current.is_some_and(|c| devices.says(c, &value)) {
            continue;
        }
        match annotator.annotate(namespace, name, uid, key, &value).await {
            Ok(()) => {
                tracing::info!(pod = %label, %key, %value, was = ?current, "wrote the devices the pod really got");
                pass.written.insert(label, value);
            }
            Err(e) => tracing::warn!(error = %e, "write-back of {key}"),
        }
    }
    pass.unsettled = devices.settle(&listed, &live);
    Ok(pass)
}

/// Runs passes until `shutdown`: one at once (a restarted agent converges without waiting), then
/// after every Allocate, every `period`, and again after a short wait while answered containers
/// are not listed yet (doubling from 50 ms up to `period`).
pub async fn run(
    devices: Arc<dyn AnnotatedDevices>,
    annotator: Arc<dyn PodAnnotator>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut retry = Some(Duration::ZERO);
    loop {
        let wait = retry.unwrap_or(period);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = devices.allocated() => retry = None,
            () = tokio::time::sleep(wait) => {}
        }
        match reconcile_once(devices.as_ref(), annotator.as_ref()).await {
            Ok(pass) if pass.unsettled > 0 => {
                retry = Some(next_retry(retry, period));
            }
            Ok(_) => retry = None,
            Err(e) => {
                tracing::warn!(annotation = devices.annotation(), error = %e, "write-back pass");
                retry = Some(next_retry(retry, period));
            }
        }
    }
}

fn next_retry(last: Option<Duration>, period: Duration) -> Duration {
    last.filter(|d| !d.is_zero()).map_or(Duration::from_millis(50), |d| (d * 2).min(period))
}
