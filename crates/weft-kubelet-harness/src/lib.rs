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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};
use weft_deviceplugin::api::device_plugin_client::DevicePluginClient;
use weft_deviceplugin::api::registration_server::{Registration, RegistrationServer};
use weft_deviceplugin::api::{Device, Empty, RegisterRequest};
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
    seen: watch::Sender<Seen>,
    endpoints: Arc<Mutex<BTreeMap<String, PathBuf>>>,
    run: Run,
}

struct Run {
    stop: CancellationToken,
    server: JoinHandle<()>,
}

impl TestKubelet {
    /// Starts a kubelet on `<dir>/kubelet.sock`, cleaning `dir` first as the kubelet does.
    pub async fn start(dir: &Path) -> TestKubelet {
        let (seen, _) = watch::channel(Seen::default());
        let endpoints = Arc::new(Mutex::new(BTreeMap::new()));
        let (run, _) = start_run(dir, seen.clone(), endpoints.clone());
        TestKubelet { dir: dir.to_path_buf(), seen, endpoints, run }
    }

    /// Restarts: every connection of this run ends, the directory is cleaned, and a new
    /// `kubelet.sock` serves registrations. Device lists are forgotten until plugins register again.
    /// Returns the names of the files the cleanup removed.
    pub async fn restart(&mut self) -> Vec<String> {
        self.run.stop.cancel();
        let _ = (&mut self.run.server).await;
        self.seen.send_modify(|s| s.devices.clear());
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let (run, removed) = start_run(&self.dir, self.seen.clone(), self.endpoints.clone());
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

fn start_run(
    dir: &Path,
    seen: watch::Sender<Seen>,
    endpoints: Arc<Mutex<BTreeMap<String, PathBuf>>>,
) -> (Run, Vec<String>) {
    let removed = clean_directory(dir);
    let stop = CancellationToken::new();
    let listener = UnixListener::bind(dir.join(KUBELET_SOCKET)).expect("the test kubelet binds kubelet.sock");
    let registration = Registrar { dir: dir.to_path_buf(), seen, endpoints, stop: stop.clone() };
    let server = tokio::spawn({
        let stop = stop.clone();
        async move {
            let _ = Server::builder()
                .add_service(RegistrationServer::new(registration))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
                .await;
        }
    });
    (Run { stop, server }, removed)
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
