//! A kubelet's device manager for tests, over the real device plugin API (gRPC on unix sockets),
//! doing what the kubelet's `devicemanager` does (k8s.io/kubernetes
//! `pkg/kubelet/cm/devicemanager/plugin/v1beta1`):
//!
//! - at start, every file in the device-plugin directory but the kubelet's checkpoint is removed,
//!   then `kubelet.sock` serves `Registration`;
//! - a registration is refused unless its version is `v1beta1` and its resource name is an extended
//!   resource name (a domain prefix, not `kubernetes.io/`); an accepted one makes the kubelet dial the
//!   plugin's socket and follow its ListAndWatch stream;
//! - [`TestKubelet::restart`] ends the process's connections and starts again, socket cleanup
//!   included, as a kubelet restart does.
//!
//! Tests read what the kubelet saw ([`TestKubelet::registrations`], [`TestKubelet::devices`]) and
//! call the plugin as the kubelet would ([`TestKubelet::plugin`]).
//!
//! Admission ([`TestKubelet::admit`]) follows the device manager's `Allocate` and
//! `devicesToAllocate`: init containers first, then app containers; an init container's devices
//! are reused by the containers after it; new devices come from the healthy ones not in use, the
//! plugin's preferred allocation first (when it offers one), then the rest; one Allocate call per
//! container and resource. This kubelet has no Topology Manager hint, so every device is in the
//! "no affinity" group, and the plugin is asked with every available device (the kubelet's
//! `needed < aligned.Len()` branch never applies). Where Go iterates a set in random order this
//! kubelet takes sorted order. The assignments survive [`TestKubelet::restart`], as the kubelet's
//! checkpoint makes them, and are served by the PodResources API (`List`) when the kubelet is
//! started with a PodResources socket ([`TestKubelet::start_with_pod_resources`]).
//!
//! `dra` (feature `dra`) plays the kubelet's DRA side: plugin registration,
//! NodePrepareResources and NodeUnprepareResources as the DRA manager calls them.

#[cfg(feature = "dra")]
pub mod dra;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Container, Pod};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};
use weft_deviceplugin::api::device_plugin_client::DevicePluginClient;
use weft_deviceplugin::api::registration_server::{Registration, RegistrationServer};
use weft_deviceplugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest, Device,
    Empty, PreferredAllocationRequest, RegisterRequest,
};
use weft_deviceplugin::podresources::api as pr;
use weft_deviceplugin::podresources::api::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use weft_deviceplugin::server::unix_channel;
use weft_deviceplugin::{API_VERSION, KUBELET_SOCKET};

/// The kubelet's device-manager checkpoint, the one file its start-up cleanup keeps.
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// What the kubelet knows of its plugins.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Every accepted registration, in order, across restarts.
    pub registrations: Vec<RegisterRequest>,
    /// Every refused registration with the kubelet's reason.
    pub refused: Vec<(RegisterRequest, String)>,
    /// The last device list each resource's ListAndWatch stream sent (this kubelet run only).
    pub devices: BTreeMap<String, Vec<Device>>,
    /// Device-list updates received in all, per resource.
    pub updates: BTreeMap<String, usize>,
}

/// A running test kubelet.
pub struct TestKubelet {
    dir: PathBuf,
    pod_resources: Option<PathBuf>,
    seen: watch::Sender<Seen>,
    endpoints: Arc<Mutex<BTreeMap<String, PathBuf>>>,
    manager: Arc<Mutex<DeviceManager>>,
    pods: PodList,
    run: Run,
}

/// The pods this kubelet knows (its pod manager): a pod is added before it is admitted, as the
/// kubelet's `HandlePodAdditions` does. Clones share the list.
#[derive(Clone, Debug, Default)]
pub struct PodList(Arc<Mutex<Vec<Pod>>>);

impl PodList {
    /// The pods, in the order they were added.
    pub fn get(&self) -> Vec<Pod> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// One container's devices of one resource, as admission gave them.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// Container name.
    pub container: String,
    /// Resource name.
    pub resource: String,
    /// Device IDs, sorted.
    pub devices: Vec<String>,
    /// The plugin's Allocate answer for the container.
    pub response: ContainerAllocateResponse,
}

/// The device manager's state (checkpointed by the real kubelet, so it survives restarts).
#[derive(Default)]
struct DeviceManager {
    /// Registration options per resource.
    options: BTreeMap<String, weft_deviceplugin::api::DevicePluginOptions>,
    /// Pod UID → (namespace, name, container → resource → devices).
    pods: BTreeMap<String, AdmittedPod>,
}

#[derive(Clone, Default)]
struct AdmittedPod {
    namespace: String,
    name: String,
    /// Containers PodResources lists (app containers and restartable init containers).
    listed: Vec<String>,
    devices: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl DeviceManager {
    fn in_use(&self, resource: &str) -> BTreeSet<String> {
        self.pods
            .values()
            .flat_map(|p| p.devices.values())
            .filter_map(|by_resource| by_resource.get(resource))
            .flatten()
            .cloned()
            .collect()
    }
}

struct Run {
    stop: CancellationToken,
    server: JoinHandle<()>,
}

impl TestKubelet {
    /// Starts a kubelet on `<dir>/kubelet.sock`, cleaning `dir` first as the kubelet does.
    pub async fn start(dir: &Path) -> TestKubelet {
        Self::start_inner(dir, None)
    }

    /// Starts a kubelet that also serves the PodResources API on `socket` (outside `dir`, as the
    /// kubelet's `pod-resources/kubelet.sock` is).
    pub async fn start_with_pod_resources(dir: &Path, socket: &Path) -> TestKubelet {
        Self::start_inner(dir, Some(socket.to_path_buf()))
    }

    fn start_inner(dir: &Path, pod_resources: Option<PathBuf>) -> TestKubelet {
        let (seen, _) = watch::channel(Seen::default());
        let endpoints = Arc::new(Mutex::new(BTreeMap::new()));
        let manager = Arc::new(Mutex::new(DeviceManager::default()));
        let pods = PodList::default();
        let shared =
            Shared { seen: seen.clone(), endpoints: endpoints.clone(), manager: manager.clone(), pods: pods.clone() };
        let (run, _) = start_run(dir, pod_resources.as_deref(), &shared);
        TestKubelet { dir: dir.to_path_buf(), pod_resources, seen, endpoints, manager, pods, run }
    }

    fn shared(&self) -> Shared {
        Shared {
            seen: self.seen.clone(),
            endpoints: self.endpoints.clone(),
            manager: self.manager.clone(),
            pods: self.pods.clone(),
        }
    }

    /// The pods this kubelet knows.
    pub fn pods(&self) -> PodList {
        self.pods.clone()
    }

    /// Adds `pod` to the kubelet's pods (it arrived from the API server) without admitting it.
    pub fn add_pod(&self, pod: Pod) {
        let mut pods = self.pods.0.lock().unwrap_or_else(PoisonError::into_inner);
        pods.retain(|p| p.metadata.uid != pod.metadata.uid);
        pods.push(pod);
    }

    /// Removes the pod `uid` (deleted): its devices are free again.
    pub fn remove_pod(&self, uid: &str) {
        self.pods.0.lock().unwrap_or_else(PoisonError::into_inner).retain(|p| p.metadata.uid.as_deref() != Some(uid));
        self.manager.lock().unwrap_or_else(PoisonError::into_inner).pods.remove(uid);
    }

    /// Admits `pod` (adding it first if new): allocates every container's device-plugin resources
    /// as the kubelet's device manager does (see the crate docs) and returns what each container
    /// got. An error is the kubelet's admission failure message; devices given to the failed
    /// container are released, those of the pod's earlier containers stay, as in the kubelet.
    pub async fn admit(&self, pod: &Pod) -> Result<Vec<Allocation>, String> {
        self.admit_only(pod, None).await
    }

    /// Admits only the app container `container` of `pod`, as [`TestKubelet::admit`] would (for
    /// tests that act between two containers' allocations).
    pub async fn admit_container(&self, pod: &Pod, container: &str) -> Result<Vec<Allocation>, String> {
        self.admit_only(pod, Some(container)).await
    }

    async fn admit_only(&self, pod: &Pod, only: Option<&str>) -> Result<Vec<Allocation>, String> {
        if !self.pods.get().iter().any(|p| p.metadata.uid == pod.metadata.uid) {
            self.add_pod(pod.clone());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        {
            let mut m = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = m.pods.entry(uid.clone()).or_default();
            entry.namespace = pod.metadata.namespace.clone().unwrap_or_default();
            entry.name = pod.metadata.name.clone().unwrap_or_default();
            entry.listed = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .chain(&spec.containers)
                .map(|c| c.name.clone())
                .collect();
        }
        let mut reuse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut out = Vec::new();
        let init = spec.init_containers.iter().flatten().map(|c| (c, c.restart_policy.as_deref() != Some("Always")));
        for (container, reusable_after) in init.chain(spec.containers.iter().map(|c| (c, false))) {
            if only.is_some_and(|name| name != container.name) {
                continue;
            }
            let got = self.allocate_container(&uid, container, &reuse).await?;
            for a in &got {
                let pool = reuse.entry(a.resource.clone()).or_default();
                if reusable_after {
                    pool.extend(a.devices.iter().cloned());
                } else {
                    for d in &a.devices {
                        pool.remove(d);
                    }
                }
            }
            out.extend(got);
        }
        Ok(out)
    }

    async fn allocate_container(
        &self,
        uid: &str,
        container: &Container,
        reuse: &BTreeMap<String, BTreeSet<String>>,
    ) -> Result<Vec<Allocation>, String> {
        let limits = container.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
        let mut out = Vec::new();
        for (resource, quantity) in limits {
            let Some(options) =
                self.manager.lock().unwrap_or_else(PoisonError::into_inner).options.get(&resource).cloned()
            else {
                continue;
            };
            let required: usize =
                quantity.0.parse().map_err(|_| format!("{resource}: quantity {} is not a count", quantity.0))?;
            if required == 0 {
                continue;
            }
            let healthy: BTreeSet<String> = self
                .devices(&resource)
                .unwrap_or_default()
                .into_iter()
                .filter(|d| d.health == weft_deviceplugin::HEALTHY)
                .map(|d| d.id)
                .collect();
            let (mut allocated, available) = {
                let m = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
                if m.pods
                    .get(uid)
                    .and_then(|p| p.devices.get(&container.name))
                    .is_some_and(|r| r.contains_key(&resource))
                {
                    continue;
                }
                let reusable = reuse.get(&resource).cloned().unwrap_or_default();
                let allocated: BTreeSet<String> = reusable.into_iter().take(required).collect();
                let in_use = m.in_use(&resource);
                let available: BTreeSet<String> = healthy.difference(&in_use).cloned().collect();
                (allocated, available)
            };
            let needed = required - allocated.len();
            if needed > 0 {
                if available.len() < needed {
                    return Err(format!(
                        "requested number of devices unavailable for {resource}. Requested: {needed}, Available: {}",
                        available.len()
                    ));
                }
                let mut plugin = self.plugin(&resource).await?;
                if options.get_preferred_allocation_available {
                    let request = ContainerPreferredAllocationRequest {
                        available_device_i_ds: available.union(&allocated).cloned().collect(),
                        must_include_device_i_ds: allocated.iter().cloned().collect(),
                        allocation_size: i32::try_from(required).map_err(|_| "size too large".to_string())?,
                    };
                    let preferred = plugin
                        .get_preferred_allocation(PreferredAllocationRequest { container_requests: vec![request] })
                        .await
                        .map_err(|s| {
                            format!("device plugin GetPreferredAllocation rpc failed with err: {}", s.message())
                        })?
                        .into_inner();
                    let ids =
                        preferred.container_responses.into_iter().next().map(|r| r.device_i_ds).unwrap_or_default();
                    for id in ids.into_iter().filter(|id| available.contains(id)) {
                        if allocated.len() < required {
                            allocated.insert(id);
                        }
                    }
                }
                for id in &available {
                    if allocated.len() < required {
                        allocated.insert(id.clone());
                    }
                }
            }
            let mut plugin = self.plugin(&resource).await?;
            let devices: Vec<String> = allocated.iter().cloned().collect();
            let request =
                AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids: devices.clone() }] };
            let response = plugin.allocate(request).await.map_err(|s| s.message().to_string())?.into_inner();
            let response = response
                .container_responses
                .into_iter()
                .next()
                .ok_or_else(|| format!("no containers return in allocation response for {resource}"))?;
            self.manager
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pods
                .entry(uid.to_string())
                .or_default()
                .devices
                .entry(container.name.clone())
                .or_default()
                .insert(resource.clone(), allocated);
            out.push(Allocation { container: container.name.clone(), resource, devices, response });
        }
        Ok(out)
    }

    /// Restarts: every connection of this run ends, the directory is cleaned, and a new
    /// `kubelet.sock` serves registrations. Device lists are forgotten until plugins register again.
    /// Returns the names of the files the cleanup removed.
    pub async fn restart(&mut self) -> Vec<String> {
        self.run.stop.cancel();
        let _ = (&mut self.run.server).await;
        self.seen.send_modify(|s| s.devices.clear());
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let (run, removed) = start_run(&self.dir, self.pod_resources.as_deref(), &self.shared());
        self.run = run;
        removed
    }

    /// What the kubelet has seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.borrow().clone()
    }

    /// Waits until what the kubelet has seen satisfies `until`, and returns it.
    pub async fn wait_for(&self, mut until: impl FnMut(&Seen) -> bool) -> Seen {
        let mut rx = self.seen.subscribe();
        let seen = rx.wait_for(|s| until(s)).await.map(|s| s.clone());
        seen.unwrap_or_else(|_| self.seen())
    }

    /// Accepted registrations so far.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.seen().registrations
    }

    /// The last device list of `resource`.
    pub fn devices(&self, resource: &str) -> Option<Vec<Device>> {
        self.seen().devices.get(resource).cloned()
    }

    /// A client to the plugin registered for `resource`, as the kubelet calls it.
    pub async fn plugin(&self, resource: &str) -> Result<DevicePluginClient<Channel>, String> {
        let path = self
            .endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .cloned()
            .ok_or_else(|| format!("no plugin registered for {resource}"))?;
        let channel = unix_channel(&path).await.map_err(|e| format!("dialling {}: {e}", path.display()))?;
        Ok(DevicePluginClient::new(channel))
    }

    /// Stops the kubelet (its socket stays, as after a crash).
    pub async fn stop(self) {
        self.run.stop.cancel();
        let _ = self.run.server.await;
    }
}

/// What a kubelet run shares with the kubelet across restarts.
#[derive(Clone)]
struct Shared {
    seen: watch::Sender<Seen>,
    endpoints: Arc<Mutex<BTreeMap<String, PathBuf>>>,
    manager: Arc<Mutex<DeviceManager>>,
    pods: PodList,
}

fn start_run(dir: &Path, pod_resources: Option<&Path>, shared: &Shared) -> (Run, Vec<String>) {
    let removed = clean_directory(dir);
    let stop = CancellationToken::new();
    let listener = UnixListener::bind(dir.join(KUBELET_SOCKET)).expect("the test kubelet binds kubelet.sock");
    let registration = Registrar {
        dir: dir.to_path_buf(),
        seen: shared.seen.clone(),
        endpoints: shared.endpoints.clone(),
        manager: shared.manager.clone(),
        stop: stop.clone(),
    };
    let lister = pod_resources.map(|socket| {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("the test kubelet binds its PodResources socket");
        (listener, Lister { manager: shared.manager.clone(), pods: shared.pods.clone() })
    });
    let server = tokio::spawn({
        let stop = stop.clone();
        async move {
            let registration = Server::builder()
                .add_service(RegistrationServer::new(registration))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.clone().cancelled_owned());
            match lister {
                Some((listener, lister)) => {
                    let listing = Server::builder()
                        .add_service(PodResourcesListerServer::new(lister))
                        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned());
                    let _ = tokio::join!(registration, listing);
                }
                None => {
                    let _ = registration.await;
                }
            }
        }
    });
    (Run { stop, server }, removed)
}

/// The PodResources API over the device manager's assignments, for the pods the kubelet knows.
struct Lister {
    manager: Arc<Mutex<DeviceManager>>,
    pods: PodList,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let known: BTreeSet<String> = self.pods.get().iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let m = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
        let pod_resources = m
            .pods
            .iter()
            .filter(|(uid, _)| known.contains(*uid))
            .map(|(_, p)| pr::PodResources {
                name: p.name.clone(),
                namespace: p.namespace.clone(),
                containers: p
                    .listed
                    .iter()
                    .map(|c| pr::ContainerResources {
                        name: c.clone(),
                        devices: p
                            .devices
                            .get(c)
                            .into_iter()
                            .flatten()
                            .map(|(resource, ids)| pr::ContainerDevices {
                                resource_name: resource.clone(),
                                device_ids: ids.iter().cloned().collect(),
                                topology: None,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(pr::ListPodResourcesResponse { pod_resources }))
    }
}

/// The kubelet's start-up cleanup: everything in the directory but the checkpoint goes.
fn clean_directory(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).expect("the device-plugin directory exists");
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        if entry.file_name() != CHECKPOINT && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    removed.sort();
    removed
}

struct Registrar {
    dir: PathBuf,
    seen: watch::Sender<Seen>,
    endpoints: Arc<Mutex<BTreeMap<String, PathBuf>>>,
    manager: Arc<Mutex<DeviceManager>>,
    stop: CancellationToken,
}

/// The kubelet's checks of a registration (version, then resource name), with its messages.
fn validate(r: &RegisterRequest) -> Result<(), String> {
    if r.version != API_VERSION {
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported version is {:?}",
            r.version, API_VERSION
        ));
    }
    let extended = r
        .resource_name
        .split_once('/')
        .is_some_and(|(domain, name)| !domain.is_empty() && !name.is_empty() && !domain.ends_with("kubernetes.io"));
    if !extended {
        return Err(format!("invalid name of device plugin socket: {}", r.resource_name));
    }
    Ok(())
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        if let Err(reason) = validate(&r) {
            self.seen.send_modify(|s| s.refused.push((r, reason.clone())));
            return Err(Status::invalid_argument(reason));
        }
        let path = self.dir.join(&r.endpoint);
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).insert(r.resource_name.clone(), path.clone());
        self.manager
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .options
            .insert(r.resource_name.clone(), r.options.unwrap_or_default());
        self.seen.send_modify(|s| s.registrations.push(r.clone()));
        // As the kubelet: dial the plugin and follow its device list until this run ends.
        let (seen, stop, resource) = (self.seen.clone(), self.stop.clone(), r.resource_name);
        tokio::spawn(async move {
            let Ok(channel) = unix_channel(&path).await else { return };
            let Ok(stream) = DevicePluginClient::new(channel).list_and_watch(Empty {}).await else { return };
            let mut stream = stream.into_inner();
            loop {
                let next = tokio::select! {
                    m = stream.message() => m,
                    () = stop.cancelled() => return,
                };
                match next {
                    Ok(Some(update)) => seen.send_modify(|s| {
                        s.devices.insert(resource.clone(), update.devices);
                        *s.updates.entry(resource.clone()).or_default() += 1;
                    }),
                    _ => return,
                }
            }
        });
        Ok(Response::new(Empty {}))
    }
}
