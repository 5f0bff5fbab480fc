//! Writes the GPUs each pod really got to its `weft.io/gpu-ids`, from the kubelet's PodResources
//! `List` (the kubelet's own record, checkpointed across its restarts), so the annotation is true
//! whatever happened between decision and container: a decision honoured, one that could not be,
//! a pod the handshake could not name, a plugin restarted between Allocate and the write.
//!
//! A pass runs after every Allocate (the kubelet records the assignment right after the call
//! returns, so a pass that does not see it yet runs again shortly) and every period.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::podresources::devices_of;
use weft_record::GPU_IDS_ANNOTATION;
use weft_record::usage::format_gpu_ids;

use crate::plugin::GpuPlugin;

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

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Pods whose annotation was written, `namespace/name` → the value.
    pub written: BTreeMap<String, String>,
    /// Answered containers the kubelet does not list yet.
    pub unsettled: usize,
}

/// One pass: every pod the kubelet lists with GPUs of the plugin's resource gets `weft.io/gpu-ids`
/// equal to the union of its containers' GPUs. Errors of single pods are logged and retried on the
/// next pass; the error is for a kubelet that cannot be read.
pub async fn reconcile_once(plugin: &GpuPlugin, annotator: &dyn PodAnnotator) -> Result<Pass, String> {
    let resource = &plugin.config().resource;
    let pods = plugin.node_pods().await?;
    let listed = devices_of(&plugin.assigned().await?, resource);
    let mut per_pod: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (key, ids) in &listed {
        match plugin.inventory().indices(ids) {
            Ok(gpus) => per_pod.entry((key.namespace.as_str(), key.pod.as_str())).or_default().extend(gpus),
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", key.namespace, key.pod), error = %e, "PodResources lists a device this plugin does not serve")
            }
        }
    }
    let mut pass = Pass::default();
    let mut live = Vec::new();
    for pod in &pods {
        let meta = &pod.metadata;
        let (Some(namespace), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else { continue };
        live.push(uid.clone());
        let Some(gpus) = per_pod.get_mut(&(namespace.as_str(), name.as_str())) else { continue };
        gpus.sort_unstable();
        gpus.dedup();
        let value = format_gpu_ids(gpus);
        let current = meta.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION));
        if current == Some(&value) {
            continue;
        }
        match annotator.annotate(namespace, name, uid, GPU_IDS_ANNOTATION, &value).await {
            Ok(()) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), gpus = %value, was = ?current, "wrote the GPUs the pod really got");
                pass.written.insert(format!("{namespace}/{name}"), value);
            }
            Err(e) => tracing::warn!(error = %e, "write-back of {GPU_IDS_ANNOTATION}"),
        }
    }
    let listed: HashMap<_, _> = listed.into_iter().collect();
    plugin.settle(&listed, &live);
    pass.unsettled = plugin.grants().len();
    Ok(pass)
}

/// Runs passes until `shutdown`: one at once (a restarted agent converges without waiting), then
/// after every Allocate, every `period`, and again after a short wait while answered containers
/// are not listed yet (doubling from 50 ms up to `period`).
pub async fn run(
    plugin: Arc<GpuPlugin>,
    annotator: Arc<dyn PodAnnotator>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut retry = Some(Duration::ZERO);
    loop {
        let wait = retry.unwrap_or(period);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = plugin.allocated() => retry = None,
            () = tokio::time::sleep(wait) => {}
        }
        match reconcile_once(&plugin, annotator.as_ref()).await {
            Ok(pass) if pass.unsettled > 0 => {
                retry = Some(next_retry(retry, period));
            }
            Ok(_) => retry = None,
            Err(e) => {
                tracing::warn!(error = %e, "write-back pass");
                retry = Some(next_retry(retry, period));
            }
        }
    }
}

fn next_retry(last: Option<Duration>, period: Duration) -> Duration {
    last.filter(|d| !d.is_zero()).map_or(Duration::from_millis(50), |d| (d * 2).min(period))
}
