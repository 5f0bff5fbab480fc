//! Writes the GPUs each pod really got to its `weft.io/gpu-ids`, from the kubelet's PodResources
//! `List`, with the write-back every weft device plugin shares ([`weft_deviceplugin::writeback`]):
//! the GPU plugin says which annotation and what value (the GPU indices of the device IDs the
//! kubelet lists, sorted).

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use weft_deviceplugin::podresources::{ContainerKey, api::PodResources};
pub use weft_deviceplugin::writeback::{AnnotatedDevices, KubeAnnotator, Pass, PodAnnotator, run};
use weft_record::GPU_IDS_ANNOTATION;
use weft_record::usage::format_gpu_ids;

use crate::plugin::GpuPlugin;

#[async_trait]
impl AnnotatedDevices for GpuPlugin {
    fn annotation(&self) -> &str {
        GPU_IDS_ANNOTATION
    }

    fn resources(&self) -> Vec<String> {
        vec![self.config().resource.clone()]
    }

    async fn pods(&self) -> Result<Vec<Pod>, String> {
        self.node_pods().await
    }

    async fn assigned(&self) -> Result<Vec<PodResources>, String> {
        GpuPlugin::assigned(self).await
    }

    fn value(&self, pod: &str, held: &BTreeMap<String, Vec<String>>) -> String {
        let mut gpus = Vec::new();
        for id in held.values().flatten() {
            match self.inventory().indices(std::slice::from_ref(id)) {
                Ok(i) => gpus.extend(i),
                Err(e) => tracing::warn!(%pod, error = %e, "PodResources lists a device this plugin does not serve"),
            }
        }
        gpus.sort_unstable();
        gpus.dedup();
        format_gpu_ids(&gpus)
    }

    fn settle(&self, listed: &BTreeMap<String, BTreeMap<ContainerKey, Vec<String>>>, live_pods: &[String]) -> usize {
        let none = BTreeMap::new();
        GpuPlugin::settle(self, listed.get(&self.config().resource).unwrap_or(&none), live_pods);
        self.grants().len()
    }

    async fn allocated(&self) {
        GpuPlugin::allocated(self).await;
    }
}

/// One pass of the write-back for this plugin ([`weft_deviceplugin::writeback::reconcile_once`]).
pub async fn reconcile_once(plugin: &GpuPlugin, annotator: &dyn PodAnnotator) -> Result<Pass, String> {
    weft_deviceplugin::writeback::reconcile_once(plugin, annotator).await
}
