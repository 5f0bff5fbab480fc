//! weft's GPU device plugin: the [`DeviceSource`] the framework serves.
//!
//! - Devices: the node's GPUs ([`GpuInventory`]), with the health [`GpuPlugin::set_health`] is
//!   told (NVML events in production, see [`crate::health`]).
//! - GetPreferredAllocation: finds the pod the call belongs to ([`crate::handshake`]) and answers
//!   its recorded decision when it fits, else weft's best-effort set ([`crate::choice`]).
//! - Allocate: what the NVIDIA container toolkit reads (`NVIDIA_VISIBLE_DEVICES`, or CDI names),
//!   plus the container annotation `weft.io/gpu-ids`; records which container got which GPUs, so
//!   the write-back ([`crate::writeback`]) can be told at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tonic::Status;
use weft_deviceplugin::accounting::{Accounting, Attributed};
use weft_deviceplugin::handshake::{NodePods, PendingPod, Recorded};
use weft_deviceplugin::podresources::{self, AssignedDevices, ContainerKey};
use weft_deviceplugin::{DeviceSource, api};
use weft_record::decision::{GPU_DECISION_ANNOTATION, GpuDecision};
use weft_record::usage::format_gpu_ids;

use crate::choice::{Basis, choose};
use crate::inventory::GpuInventory;

/// A pending pod with its recorded GPU set.
pub type GpuPod = PendingPod<Vec<usize>>;

/// What `weft.io/gpu-decision` says for `node`.
pub fn recorded_gpus(pod: &Pod, node: &str) -> Recorded<Vec<usize>> {
    let annotation = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_DECISION_ANNOTATION));
    match annotation.map(|v| GpuDecision::from_annotation(v)) {
        None => Recorded::None,
        Some(Err(e)) => Recorded::Unreadable(e),
        Some(Ok(d)) if d.node == node => Recorded::ForThisNode(d.gpus),
        Some(Ok(d)) => Recorded::OtherNode(d.node),
    }
}

/// How a container is told its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES=<id>,<id>` (the NVIDIA container runtime reads it).
    Envvar,
    /// CDI device names `nvidia.com/gpu=<id>` in the response's `cdi_devices` (the container
    /// runtime injects them from the CDI spec the NVIDIA container toolkit generates).
    Cdi,
}

impl std::str::FromStr for DeviceListStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "envvar" => Ok(DeviceListStrategy::Envvar),
            "cdi" | "cdi-cri" => Ok(DeviceListStrategy::Cdi),
            other => Err(format!("unknown device list strategy '{other}' (envvar or cdi)")),
        }
    }
}

/// The environment variable the NVIDIA container runtime reads.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// The CDI kind of NVIDIA's GPUs.
pub const CDI_KIND: &str = "nvidia.com/gpu";

/// Settings.
#[derive(Clone, Debug)]
pub struct GpuPluginConfig {
    /// The extended resource, `nvidia.com/gpu` by default.
    pub resource: String,
    /// This node's name (decisions for other nodes are stale).
    pub node: String,
    /// How containers are told their GPUs.
    pub strategy: DeviceListStrategy,
}

/// One container's GPUs (indices) as this plugin handed them out.
pub type Grant = weft_deviceplugin::accounting::Grant<usize>;

/// The GPU plugin.
pub struct GpuPlugin {
    cfg: GpuPluginConfig,
    inventory: GpuInventory,
    accounting: Accounting<Vec<usize>, usize>,
    devices: watch::Sender<Vec<api::Device>>,
    unhealthy: Mutex<Vec<usize>>,
}

impl GpuPlugin {
    /// A plugin for `inventory`, finding pods through `pods` and served containers through
    /// `assigned`. Every GPU starts healthy.
    pub fn new(
        cfg: GpuPluginConfig,
        inventory: GpuInventory,
        pods: Arc<dyn NodePods>,
        assigned: Arc<dyn AssignedDevices>,
    ) -> GpuPlugin {
        let devices = watch::Sender::new(inventory.api_devices(|_| true));
        let accounting = Accounting::new(cfg.resource.clone(), pods, assigned);
        GpuPlugin { cfg, inventory, accounting, devices, unhealthy: Mutex::default() }
    }

    /// Settings.
    pub fn config(&self) -> &GpuPluginConfig {
        &self.cfg
    }

    /// The GPUs.
    pub fn inventory(&self) -> &GpuInventory {
        &self.inventory
    }

    /// Marks GPU `index` healthy or not; a change goes to every ListAndWatch stream.
    pub fn set_health(&self, index: usize, healthy: bool) {
        let unhealthy = {
            let mut unhealthy = self.unhealthy.lock().unwrap_or_else(PoisonError::into_inner);
            let unchanged = unhealthy.contains(&index) != healthy;
            if unchanged {
                return;
            }
            if healthy {
                unhealthy.retain(|&g| g != index);
            } else {
                unhealthy.push(index);
            }
            unhealthy.clone()
        };
        tracing::info!(gpu = index, healthy, "GPU health changed");
        self.devices.send_replace(self.inventory.api_devices(|g| !unhealthy.contains(&g)));
    }

    /// The pods the kubelet knows on this node.
    pub async fn node_pods(&self) -> Result<Vec<Pod>, String> {
        self.accounting.node_pods().await
    }

    /// What the kubelet says each container holds.
    pub async fn assigned(&self) -> Result<Vec<podresources::api::PodResources>, String> {
        self.accounting.assigned().await
    }

    /// Resolves once an Allocate was answered since the last call (the write-back's cue).
    pub async fn allocated(&self) {
        self.accounting.allocated().await;
    }

    /// Containers answered and not yet known to be listed by the kubelet.
    pub fn grants(&self) -> Vec<Grant> {
        self.accounting.grants()
    }

    /// Forgets grants the kubelet now lists (its word supersedes the plugin's), and grants of pods
    /// no longer on the node.
    pub fn settle(&self, listed: &BTreeMap<ContainerKey, Vec<String>>, live_pods: &[String]) {
        self.accounting.settle(listed, live_pods);
    }

    fn decision(&self) -> impl Fn(&Pod) -> Recorded<Vec<usize>> + '_ {
        |p| recorded_gpus(p, &self.cfg.node)
    }

    fn gpus(&self) -> impl Fn(&[String]) -> Vec<usize> + '_ {
        |ids| self.inventory.indices(ids).unwrap_or_default()
    }

    fn response(&self, ids: &[String], gpus: &[usize]) -> api::ContainerAllocateResponse {
        let mut response = api::ContainerAllocateResponse::default();
        match self.cfg.strategy {
            DeviceListStrategy::Envvar => {
                response.envs.insert(VISIBLE_DEVICES_ENV.to_string(), ids.join(","));
            }
            DeviceListStrategy::Cdi => {
                response.cdi_devices =
                    ids.iter().map(|id| api::CdiDevice { name: format!("{CDI_KIND}={id}") }).collect();
            }
        }
        let mut sorted = gpus.to_vec();
        sorted.sort_unstable();
        response.annotations.insert(weft_record::GPU_IDS_ANNOTATION.to_string(), format_gpu_ids(&sorted));
        response
    }
}

fn invalid(resource: &str, e: String) -> Status {
    Status::invalid_argument(format!("{resource}: {e}"))
}

#[async_trait]
impl DeviceSource for GpuPlugin {
    fn resource_name(&self) -> String {
        self.cfg.resource.clone()
    }

    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
    }

    fn devices(&self) -> watch::Receiver<Vec<api::Device>> {
        self.devices.subscribe()
    }

    async fn preferred_allocation(
        &self,
        request: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        let resource = &self.cfg.resource;
        let available = self.inventory.indices(&request.available_device_i_ds).map_err(|e| invalid(resource, e))?;
        let required = self.inventory.indices(&request.must_include_device_i_ds).map_err(|e| invalid(resource, e))?;
        let size = usize::try_from(request.allocation_size)
            .map_err(|_| invalid(resource, format!("allocation size {} is negative", request.allocation_size)))?;
        let candidates = self.accounting.candidates(self.decision(), self.gpus()).await;
        let found = self.accounting.attribute(&candidates, size);
        let held = found.as_ref().map(|a| a.held.as_slice()).unwrap_or_default();
        let decided = found.as_ref().and_then(|a| a.pod.decision.for_this_node(&a.pod.label())).map(Vec::as_slice);
        let (gpus, basis) = choose(self.inventory.prepared(), &available, &required, size, decided, held)
            .map_err(|e| invalid(resource, e.to_string()))?;
        let pod = found.as_ref().map(Attributed::label);
        match &basis {
            Basis::Decision => tracing::info!(pod = ?pod, ?gpus, "preferred allocation: the recorded decision"),
            Basis::BestEffort(why) => tracing::info!(pod = ?pod, ?gpus, %why, "preferred allocation: best-effort"),
        }
        self.accounting.expect(found.as_ref(), size);
        Ok(self.inventory.ids(&gpus))
    }

    async fn allocate(
        &self,
        request: &api::ContainerAllocateRequest,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let gpus = self.inventory.indices(&request.devices_ids).map_err(|e| invalid(&self.cfg.resource, e))?;
        let size = gpus.len();
        let found = self.accounting.allocating(size, self.decision(), self.gpus()).await;
        let response = self.response(&request.devices_ids, &gpus);
        if let Some((pod, c)) = &found {
            tracing::info!(pod = %pod.label(), container = %pod.containers[*c].name, ?gpus, "allocated");
        } else {
            tracing::info!(?gpus, "allocated to a container no pending pod matches; the write-back will name it");
        }
        self.accounting.record(found, gpus);
        Ok(response)
    }
}
