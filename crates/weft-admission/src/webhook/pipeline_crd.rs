//! Which Numaflow Pipeline CRD the cluster serves, so the Pipeline webhook can say which binding
//! form reaches it ([`weft_pipeline::edge_field`]): Numaflow's full CRD (its default install) drops
//! `spec.edges[].numaNetwork`, the minimal one keeps it.
//!
//! [`KubePipelineCrd`] watches the one CRD object `pipelines.numaflow.numaproj.io` (a field
//! selector on its name; RBAC: `apiextensions.k8s.io` `customresourcedefinitions` get, list,
//! watch) and re-reads its schema on every change, so installing or switching Numaflow's CRDs
//! while the webhook runs is seen. Until the watch has listed it, or while the CRD is absent or
//! unreadable, the form is unknown and the webhook says nothing about it.

use std::pin::pin;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use weft_pipeline::{EdgeField, PIPELINE_CRD_NAME, edge_field};

/// Where the Pipeline webhook learns what the served Pipeline CRD does with
/// `spec.edges[].numaNetwork`.
pub trait PipelineCrdSource: Send + Sync + 'static {
    /// The served CRD's treatment of the field, `None` while it is not known.
    fn edge_field(&self) -> Option<EdgeField>;
}

/// A fixed answer (tests, and `weft webhook --jobs-file`, which has no API server).
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedPipelineCrd(pub Option<EdgeField>);

impl PipelineCrdSource for FixedPipelineCrd {
    fn edge_field(&self) -> Option<EdgeField> {
        self.0
    }
}

/// The served CRD, watched through the API server.
pub struct KubePipelineCrd {
    form: tokio::sync::watch::Receiver<Option<EdgeField>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for KubePipelineCrd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePipelineCrd").field("edge_field", &self.edge_field()).finish()
    }
}

/// What the CRD object says, logged when it cannot be read.
fn read(crd: &CustomResourceDefinition) -> Option<EdgeField> {
    let value = serde_json::to_value(crd).ok()?;
    match edge_field(&value) {
        Ok(f) => Some(f),
        Err(why) => {
            tracing::warn!(crd = %crd.name_any(), %why, "the Pipeline CRD's schema cannot be read");
            None
        }
    }
}

impl KubePipelineCrd {
    /// Starts watching `pipelines.numaflow.numaproj.io`.
    pub fn spawn(client: Client) -> KubePipelineCrd {
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={PIPELINE_CRD_NAME}"));
        let stream = watcher::watcher(api, config).default_backoff();
        let (cache, form) = tokio::sync::watch::channel(None);
        let task = tokio::spawn(async move {
            let mut stream = pin!(stream);
            let mut listed = None;
            while let Some(event) = stream.next().await {
                let set = |f: Option<EdgeField>| {
                    if cache.send_replace(f) != f {
                        tracing::info!(edge_field = ?f, "the served Numaflow Pipeline CRD (spec.edges[].numaNetwork)");
                    }
                };
                match event {
                    Ok(Event::Init) => listed = None,
                    Ok(Event::InitApply(crd)) => listed = read(&crd),
                    Ok(Event::InitDone) => set(listed.take()),
                    Ok(Event::Apply(crd)) => set(read(&crd)),
                    Ok(Event::Delete(_)) => set(None),
                    Err(e) => tracing::warn!(error = %e, "Pipeline CRD watch failed; retrying"),
                }
            }
        });
        KubePipelineCrd { form, task }
    }
}

impl KubePipelineCrd {
    /// Waits until the served CRD has been read (or the watch task has ended).
    pub async fn wait_until_known(&self) {
        let mut rx = self.form.clone();
        let _ = rx.wait_for(Option::is_some).await;
    }
}

impl Drop for KubePipelineCrd {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PipelineCrdSource for KubePipelineCrd {
    fn edge_field(&self) -> Option<EdgeField> {
        *self.form.borrow()
    }
}
