//! The multi-VIF record on the pod: weft-cni keeps each attachment it made on this node
//! (interface, VF, MAC, IPs, VLAN: `weft_cni::state::Attachment`) under its `cacheDir`; the agent
//! publishes them on the pod as `weft.io/vifs` (interface name → VIF, all of the pod's
//! attachments) and in Multus' `k8s.v1.cni.cncf.io/network-status` shape, replacing only the
//! entries of weft's interfaces (the cluster network's entry and other plugins' stay).
//!
//! The values are computed from the kubelet's copy of the pod and written in one JSON merge patch
//! that carries the pod's UID and that copy's `resourceVersion`: the API server refuses it (409)
//! when the pod changed meanwhile (Multus writing its own network-status, say), so nothing another
//! writer put there is lost; the next pass computes again from a fresher copy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use weft_cni::state::{Attachment, StateDir};
use weft_deviceplugin::handshake::NodePods;
use weft_net::vif::{NETWORK_STATUS_ANNOTATION, VIFS_ANNOTATION, VifRecord};

/// Writes a pod's annotations (the API server in production).
#[async_trait]
pub trait VifWriter: Send + Sync + 'static {
    /// Sets `annotations` on pod `namespace/name` if its UID is still `uid` and its
    /// resourceVersion still `resource_version`.
    async fn write(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), String>;
}

/// Writes through the API server: one JSON merge patch with the UID and resourceVersion
/// ([`weft_kube::write::patch_annotations_at`]).
pub struct KubeVifWriter {
    client: kube::Client,
    field_manager: String,
}

impl KubeVifWriter {
    /// Writes as `field_manager`.
    pub fn new(client: kube::Client, field_manager: impl Into<String>) -> KubeVifWriter {
        KubeVifWriter { client, field_manager: field_manager.into() }
    }
}

#[async_trait]
impl VifWriter for KubeVifWriter {
    async fn write(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let annotations = annotations.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
        weft_kube::write::patch_annotations_at(
            &api,
            name,
            uid,
            Some(resource_version),
            &annotations,
            &self.field_manager,
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("publishing the VIFs of pod {namespace}/{name}: {e}"))
    }
}

/// The VIF record of each pod with attachments, by pod UID (attachments without a pod UID, which
/// a runtime that passes no `K8S_POD_UID` makes, are left out: they cannot be told from a pod
/// recreated under the same name).
pub fn records(attachments: &[Attachment]) -> BTreeMap<String, VifRecord> {
    let mut out: BTreeMap<String, VifRecord> = BTreeMap::new();
    for a in attachments {
        let Some(uid) = a.pod.uid.clone() else { continue };
        out.entry(uid).or_default().vifs.extend(a.vif_record().vifs);
    }
    out
}

/// The annotations `pod` should get for `record`, or `None` when it already has them.
pub fn wanted(pod: &Pod, record: &VifRecord) -> Option<BTreeMap<String, String>> {
    let current = pod.metadata.annotations.as_ref();
    let get = |k: &str| current.and_then(|a| a.get(k)).map(String::as_str);
    let vifs = record.to_annotation();
    let status = record.merge_network_status(get(NETWORK_STATUS_ANNOTATION));
    let same_vifs = get(VIFS_ANNOTATION).and_then(|v| VifRecord::parse(v).ok()).as_ref() == Some(record);
    let same_status = get(NETWORK_STATUS_ANNOTATION).is_some_and(|s| {
        serde_json::from_str::<serde_json::Value>(s).ok() == serde_json::from_str::<serde_json::Value>(&status).ok()
    });
    (!same_vifs || !same_status)
        .then(|| BTreeMap::from([(VIFS_ANNOTATION.to_string(), vifs), (NETWORK_STATUS_ANNOTATION.to_string(), status)]))
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Pods written, `namespace/name`.
    pub written: Vec<String>,
    /// Pods whose write failed (a conflict is retried on the next pass), with why.
    pub failed: Vec<(String, String)>,
}

/// One pass: every pod the kubelet lists with attachments in `state` gets its record. The error
/// is for a kubelet that cannot be read.
pub async fn publish_once(state: &StateDir, pods: &dyn NodePods, writer: &dyn VifWriter) -> Result<Published, String> {
    let (attachments, unreadable) = state.list();
    for path in unreadable {
        tracing::warn!(%path, "weft-cni attachment file unreadable: left out of the VIF records");
    }
    let by_uid = records(&attachments);
    let mut out = Published::default();
    if by_uid.is_empty() {
        return Ok(out);
    }
    for pod in pods.pods().await? {
        let meta = &pod.metadata;
        let Some(record) = meta.uid.as_ref().and_then(|u| by_uid.get(u)) else { continue };
        let Some(annotations) = wanted(&pod, record) else { continue };
        let (namespace, name) =
            (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        let (uid, rv) = (meta.uid.as_deref().unwrap_or_default(), meta.resource_version.as_deref().unwrap_or_default());
        match writer.write(namespace, name, uid, rv, &annotations).await {
            Ok(()) => out.written.push(format!("{namespace}/{name}")),
            Err(e) => out.failed.push((format!("{namespace}/{name}"), e)),
        }
    }
    Ok(out)
}

/// Publishes every `period` until `shutdown`.
pub async fn run(
    state: StateDir,
    pods: Arc<dyn NodePods>,
    writer: Arc<dyn VifWriter>,
    period: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match publish_once(&state, pods.as_ref(), writer.as_ref()).await {
            Ok(p) => {
                for pod in &p.written {
                    tracing::info!(%pod, "VIF record published");
                }
                for (pod, why) in &p.failed {
                    tracing::info!(%pod, %why, "VIF record not published; next pass retries");
                }
            }
            Err(e) => tracing::warn!(error = %e, "VIF records: the kubelet's pod list cannot be read"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
