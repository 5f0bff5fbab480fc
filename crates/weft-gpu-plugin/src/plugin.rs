//! weft's GPU device plugin: the [`DeviceSource`] the framework serves.
//!
//! - Devices: the node's GPUs ([`GpuInventory`]), with the health [`GpuPlugin::set_health`] is
//!   told (NVML events in production, see [`crate::health`]).
//! - GetPreferredAllocation: finds the pod the call belongs to ([`crate::handshake`]) and answers
//!   its recorded decision when it fits, else weft's best-effort set ([`crate::choice`]).
//! - Allocate: what the NVIDIA container toolkit reads (`NVIDIA_VISIBLE_DEVICES`, or CDI names),
//!   plus the container annotation `weft.io/gpu-ids`; records which container got which GPUs, so
//!   the write-back ([`crate::writeback`]) can be told at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};
use tonic::Status;
use weft_deviceplugin::podresources::{self, AssignedDevices, ContainerKey};
use weft_deviceplugin::{DeviceSource, api};
use weft_record::decision::{GPU_DECISION_ANNOTATION, GpuDecision};
use weft_record::usage::format_gpu_ids;

use crate::choice::{Basis, choose};
use crate::inventory::GpuInventory;
use weft_deviceplugin::handshake::{NodePods, PendingPod, Recorded, Served, admission_order, attribute};

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

/// One container's GPUs as this plugin handed them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Pod UID, when the handshake found the pod.
    pub pod_uid: Option<String>,
    /// Pod and container, when found.
    pub container: Option<ContainerKey>,
    /// Whether the container keeps running beside the app containers (app or sidecar) or runs
    /// before them (init: its GPUs are reused by the next containers).
    pub long_running: bool,
    /// GPU indices.
    pub gpus: Vec<usize>,
}

#[derive(Default)]
struct State {
    /// The pod the last call belonged to.
    current: Option<String>,
    /// The container the last GetPreferredAllocation was for, and its size.
    pending: Option<(GpuPod, usize, usize)>,
    /// Containers answered, by (pod UID, container name), until PodResources lists them.
    ledger: BTreeMap<(String, String), Grant>,
    /// Allocations the handshake could not place on a pod, oldest first (for the write-back).
    unplaced: Vec<Grant>,
    unhealthy: Vec<usize>,
}

/// The GPU plugin.
pub struct GpuPlugin {
    cfg: GpuPluginConfig,
    inventory: GpuInventory,
    pods: Arc<dyn NodePods>,
    assigned: Arc<dyn AssignedDevices>,
    devices: watch::Sender<Vec<api::Device>>,
    state: Mutex<State>,
    allocated: Notify,
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
        GpuPlugin { cfg, inventory, pods, assigned, devices, state: Mutex::default(), allocated: Notify::new() }
    }

    /// Settings.
    pub fn config(&self) -> &GpuPluginConfig {
        &self.cfg
    }

    /// The GPUs.
    pub fn inventory(&self) -> &GpuInventory {
        &self.inventory
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks GPU `index` healthy or not; a change goes to every ListAndWatch stream.
    pub fn set_health(&self, index: usize, healthy: bool) {
        let unhealthy = {
            let mut state = self.state();
            let unchanged = state.unhealthy.contains(&index) != healthy;
            if unchanged {
                return;
            }
            if healthy {
                state.unhealthy.retain(|&g| g != index);
            } else {
                state.unhealthy.push(index);
            }
            state.unhealthy.clone()
        };
        tracing::info!(gpu = index, healthy, "GPU health changed");
        self.devices.send_replace(self.inventory.api_devices(|g| !unhealthy.contains(&g)));
    }

    /// The pods the kubelet knows on this node.
    pub async fn node_pods(&self) -> Result<Vec<Pod>, String> {
        self.pods.pods().await
    }

    /// What the kubelet says each container holds.
    pub async fn assigned(&self) -> Result<Vec<podresources::api::PodResources>, String> {
        self.assigned.list().await
    }

    /// Resolves once an Allocate was answered since the last call (the write-back's cue).
    pub async fn allocated(&self) {
        self.allocated.notified().await;
    }

    /// Containers answered and not yet known to be listed by the kubelet.
    pub fn grants(&self) -> Vec<Grant> {
        let state = self.state();
        state.ledger.values().chain(&state.unplaced).cloned().collect()
    }

    /// Forgets grants the kubelet now lists (its word supersedes the plugin's), and grants of pods
    /// no longer on the node.
    pub fn settle(&self, listed: &HashMap<ContainerKey, Vec<String>>, live_pods: &[String]) {
        let mut state = self.state();
        state.ledger.retain(|(uid, _), g| {
            live_pods.contains(uid) && !g.container.as_ref().is_some_and(|k| listed.contains_key(k))
        });
        state.unplaced.clear();
    }

    /// The pods in admission order, the containers already served, and the GPUs the kubelet lists
    /// for each pod's running containers (by pod UID); read before the lock.
    async fn candidates(&self) -> (Vec<GpuPod>, Served, HashMap<String, Vec<usize>>) {
        let pods = match self.pods.pods().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "the kubelet's pod list: calls are answered without a pod");
                Vec::new()
            }
        };
        let mut pending: Vec<GpuPod> = pods
            .iter()
            .filter_map(|p| match PendingPod::of(p, &self.cfg.resource, |p| recorded_gpus(p, &self.cfg.node)) {
                Ok(seen) => seen,
                Err(e) => {
                    tracing::warn!(error = %e, "pod left out of the handshake");
                    None
                }
            })
            .collect();
        admission_order(&mut pending);
        let mut served = Served::new();
        let mut listed = HashMap::<String, Vec<usize>>::new();
        match self.assigned.list().await {
            Ok(list) => {
                let by_name: HashMap<(&str, &str), &str> =
                    pending.iter().map(|p| ((p.namespace.as_str(), p.name.as_str()), p.uid.as_str())).collect();
                for (key, ids) in podresources::devices_of(&list, &self.cfg.resource) {
                    if let Some(uid) = by_name.get(&(key.namespace.as_str(), key.pod.as_str())) {
                        let gpus = self.inventory.indices(&ids).unwrap_or_default();
                        listed.entry(uid.to_string()).or_default().extend(gpus);
                        served.insert((uid.to_string(), key.container));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "PodResources: served containers known from this plugin's own answers only")
            }
        }
        (pending, served, listed)
    }

    fn attribute_locked(state: &State, pods: &[GpuPod], served: &Served, size: usize) -> Option<(GpuPod, usize)> {
        let mut served = served.clone();
        served.extend(state.ledger.keys().cloned());
        attribute(pods, &served, state.current.as_deref(), size).map(|(p, c)| (pods[p].clone(), c))
    }

    fn record(&self, found: Option<(GpuPod, usize)>, gpus: Vec<usize>) {
        let mut state = self.state();
        state.pending = None;
        match found {
            Some((pod, c)) => {
                let container = &pod.containers[c];
                let grant = Grant {
                    pod_uid: Some(pod.uid.clone()),
                    container: Some(ContainerKey {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    }),
                    long_running: container.stage != weft_resources::Stage::Init,
                    gpus,
                };
                state.current = Some(pod.uid.clone());
                state.ledger.insert((pod.uid.clone(), container.name.clone()), grant);
            }
            None => state.unplaced.push(Grant { pod_uid: None, container: None, long_running: true, gpus }),
        }
        drop(state);
        self.allocated.notify_one();
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
        let (pods, served, mut listed) = self.candidates().await;
        let (found, held) = {
            let state = self.state();
            let found = Self::attribute_locked(&state, &pods, &served, size);
            // What the pod's running containers hold: the kubelet's list, and this plugin's answers
            // it does not list yet.
            let held: Vec<usize> = found
                .as_ref()
                .map(|(pod, _)| {
                    let mut held = listed.remove(&pod.uid).unwrap_or_default();
                    held.extend(
                        state
                            .ledger
                            .iter()
                            .filter(|((uid, _), g)| *uid == pod.uid && g.long_running)
                            .flat_map(|(_, g)| g.gpus.iter().copied()),
                    );
                    held
                })
                .unwrap_or_default();
            (found, held)
        };
        let decided = match found.as_ref().map(|(p, _)| &p.decision) {
            Some(Recorded::ForThisNode(gpus)) => Some(gpus.as_slice()),
            Some(Recorded::OtherNode(node)) => {
                tracing::info!(%node, "the pod's decision is for another node: ignored");
                None
            }
            Some(Recorded::Unreadable(e)) => {
                tracing::warn!(error = %e, "the pod's decision is unreadable: ignored");
                None
            }
            _ => None,
        };
        let (gpus, basis) = choose(self.inventory.prepared(), &available, &required, size, decided, &held)
            .map_err(|e| invalid(resource, e.to_string()))?;
        let pod = found.as_ref().map(|(p, c)| format!("{} container {}", p.label(), p.containers[*c].name));
        match &basis {
            Basis::Decision => tracing::info!(pod = ?pod, ?gpus, "preferred allocation: the recorded decision"),
            Basis::BestEffort(why) => tracing::info!(pod = ?pod, ?gpus, %why, "preferred allocation: best-effort"),
        }
        self.state().pending = found.map(|(p, c)| (p, c, size));
        Ok(self.inventory.ids(&gpus))
    }

    async fn allocate(
        &self,
        request: &api::ContainerAllocateRequest,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let gpus = self.inventory.indices(&request.devices_ids).map_err(|e| invalid(&self.cfg.resource, e))?;
        let size = gpus.len();
        // The container the preferred allocation was for, when the sizes agree; otherwise (no
        // preferred call: the kubelet reused an init container's devices, or had no choice) the
        // handshake runs for this call.
        let pending = self.state().pending.take().filter(|(_, _, s)| *s == size);
        let found = match pending {
            Some((pod, c, _)) => Some((pod, c)),
            None => {
                let (pods, served, _) = self.candidates().await;
                Self::attribute_locked(&self.state(), &pods, &served, size)
            }
        };
        let response = self.response(&request.devices_ids, &gpus);
        if let Some((pod, c)) = &found {
            tracing::info!(pod = %pod.label(), container = %pod.containers[*c].name, ?gpus, "allocated");
        } else {
            tracing::info!(?gpus, "allocated to a container no pending pod matches; the write-back will name it");
        }
        self.record(found, gpus);
        Ok(response)
    }
}
