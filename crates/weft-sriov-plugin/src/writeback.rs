//! Writes the VFs each pod really got to its `weft.io/vf-ids` (`{"<physnet>": ["<pci>", …]}`),
//! from the kubelet's PodResources `List`, with the write-back every weft device plugin shares
//! ([`weft_deviceplugin::writeback`]). The annotation holds every physnet, so one write covers
//! them all: the write-back takes all the node's VF plugins together ([`SriovPlugins`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::accounting::Accounting;
use weft_deviceplugin::podresources::{ContainerKey, api::PodResources};
pub use weft_deviceplugin::writeback::{AnnotatedDevices, KubeAnnotator, Pass, PodAnnotator};
use weft_record::vf_usage::{VF_IDS_ANNOTATION, VfIds, format_vf_ids, parse_vf_ids};

use crate::error::SriovError;
use crate::plugin::SriovPlugin;

/// Every VF plugin of the node, one per physnet.
#[derive(Clone)]
pub struct SriovPlugins(Vec<Arc<SriovPlugin>>);

impl SriovPlugins {
    /// The plugins; none, or two of one physnet, is an error.
    pub fn new(plugins: Vec<Arc<SriovPlugin>>) -> Result<SriovPlugins, SriovError> {
        let mut physnets = BTreeSet::new();
        for p in &plugins {
            if !physnets.insert(p.physnet()) {
                return Err(SriovError::DuplicatePhysnet(p.physnet().to_string()));
            }
        }
        if plugins.is_empty() {
            return Err(SriovError::NoPlugins);
        }
        Ok(SriovPlugins(plugins))
    }

    /// The plugins.
    pub fn plugins(&self) -> &[Arc<SriovPlugin>] {
        &self.0
    }

    fn first(&self) -> Result<&Accounting<Vec<String>, String>, String> {
        self.0.first().map(|p| p.accounting()).ok_or_else(|| SriovError::NoPlugins.to_string())
    }
}

/// `ids` with every physnet's VFs sorted, for comparing.
fn sorted(mut ids: VfIds) -> VfIds {
    for vfs in ids.values_mut() {
        vfs.sort_unstable();
    }
    ids
}

#[async_trait]
impl AnnotatedDevices for SriovPlugins {
    fn annotation(&self) -> &str {
        VF_IDS_ANNOTATION
    }

    fn resources(&self) -> Vec<String> {
        self.0.iter().map(|p| p.resource().to_string()).collect()
    }

    async fn pods(&self) -> Result<Vec<Pod>, String> {
        self.first()?.node_pods().await
    }

    async fn assigned(&self) -> Result<Vec<PodResources>, String> {
        self.first()?.assigned().await
    }

    fn value(&self, pod: &str, held: &BTreeMap<String, Vec<String>>) -> String {
        let mut ids = VfIds::new();
        for p in &self.0 {
            let Some(listed) = held.get(p.resource()) else { continue };
            let (known, unknown): (Vec<String>, Vec<String>) =
                listed.iter().cloned().partition(|id| p.inventory().get(id).is_some());
            if !unknown.is_empty() {
                tracing::warn!(%pod, resource = %p.resource(), ?unknown, "PodResources lists VFs this plugin does not serve");
            }
            if !known.is_empty() {
                ids.insert(p.physnet().to_string(), known);
            }
        }
        format_vf_ids(&sorted(ids))
    }

    fn says(&self, current: &str, value: &str) -> bool {
        match (parse_vf_ids(current), parse_vf_ids(value)) {
            (Ok(current), Ok(value)) => sorted(current) == sorted(value),
            _ => false,
        }
    }

    fn settle(&self, listed: &BTreeMap<String, BTreeMap<ContainerKey, Vec<String>>>, live_pods: &[String]) -> usize {
        let none = BTreeMap::new();
        self.0
            .iter()
            .map(|p| {
                p.accounting().settle(listed.get(p.resource()).unwrap_or(&none), live_pods);
                p.accounting().grants().len()
            })
            .sum()
    }

    async fn allocated(&self) {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(self.0.iter().map(|p| Box::pin(p.accounting().allocated()))).await;
    }
}

/// One pass of the write-back over every VF plugin of the node
/// ([`weft_deviceplugin::writeback::reconcile_once`]).
pub async fn reconcile_once(plugins: &SriovPlugins, annotator: &dyn PodAnnotator) -> Result<Pass, String> {
    weft_deviceplugin::writeback::reconcile_once(plugins, annotator).await
}

/// The write-back loop over every VF plugin of the node
/// ([`weft_deviceplugin::writeback::run`]): a pass at once, after every Allocate of any of them,
/// and every `period`.
pub async fn run(
    plugins: SriovPlugins,
    annotator: Arc<dyn PodAnnotator>,
    period: Duration,
    shutdown: CancellationToken,
) {
    weft_deviceplugin::writeback::run(Arc::new(plugins), annotator, period, shutdown).await;
}
