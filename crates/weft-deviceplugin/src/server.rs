//! A plugin's life: serve its socket, register with the kubelet, start over when the kubelet
//! restarts, stop in order.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Server};

use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::plugin::{DeviceSource, Service};
use crate::{API_VERSION, KUBELET_SOCKET, api};

/// Where and how a plugin runs.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// The kubelet's device-plugin directory ([`crate::DEFAULT_DIR`]).
    pub dir: PathBuf,
    /// The plugin's socket file name in `dir`, e.g. `weft-gpu.sock`.
    pub endpoint: String,
    /// How often the plugin checks that the kubelet has not restarted (its socket replaced, or the
    /// plugin's own socket deleted).
    pub kubelet_check: Duration,
    /// Wait between registration attempts while the kubelet is away or refuses.
    pub register_retry: Duration,
}

impl PluginOptions {
    /// Options for `endpoint` in `dir`, checking for a kubelet restart every second and retrying
    /// registration every 2 s (a kubelet restart is noticed within about a second).
    pub fn new(dir: impl Into<PathBuf>, endpoint: impl Into<String>) -> PluginOptions {
        PluginOptions {
            dir: dir.into(),
            endpoint: endpoint.into(),
            kubelet_check: Duration::from_secs(1),
            register_retry: Duration::from_secs(2),
        }
    }
}

/// Why a plugin stopped other than by being asked to.
#[derive(Debug, Error)]
pub enum PluginError {
    /// The endpoint is not a plain file name.
    #[error("plugin endpoint '{0}' must be a file name in the device-plugin directory")]
    Endpoint(String),
    /// The plugin socket could not be created.
    #[error("serving {path}: {source}")]
    Bind {
        /// Socket path.
        path: String,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("device plugin server on {path}: {source}")]
    Serve {
        /// Socket path.
        path: String,
        /// Transport error.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Runs the plugin until `shutdown`: serves `source` on `<dir>/<endpoint>`, registers it with
/// the kubelet, and starts over (fresh socket, new registration) whenever the kubelet restarts.
/// On shutdown the ListAndWatch streams end, open calls finish and the socket is removed.
pub async fn serve<S: DeviceSource>(
    source: Arc<S>,
    options: PluginOptions,
    shutdown: CancellationToken,
) -> Result<(), PluginError> {
    if options.endpoint.is_empty() || options.endpoint.contains('/') || options.endpoint == KUBELET_SOCKET {
        return Err(PluginError::Endpoint(options.endpoint));
    }
    let socket = options.dir.join(&options.endpoint);
    let kubelet = options.dir.join(KUBELET_SOCKET);
    while !shutdown.is_cancelled() {
        let session = shutdown.child_token();
        let server = start_server(source.clone(), &socket, session.clone())?;
        let registered = tokio::select! {
            r = register_until_accepted(source.as_ref(), &options, &kubelet) => Some(r),
            () = shutdown.cancelled() => None,
        };
        if let Some(kubelet_identity) = registered {
            tracing::info!(resource = %source.resource_name(), socket = %socket.display(), "registered with the kubelet");
            tokio::select! {
                () = kubelet_restarted(&socket, &kubelet, kubelet_identity, options.kubelet_check) => {
                    tracing::info!(resource = %source.resource_name(), "the kubelet restarted: serving a new socket and registering again");
                }
                () = shutdown.cancelled() => {}
            }
        }
        session.cancel();
        let outcome = server.await;
        if let Ok(Err(source)) = outcome {
            return Err(PluginError::Serve { path: socket.display().to_string(), source });
        }
    }
    remove_socket(&socket);
    Ok(())
}

fn start_server<S: DeviceSource>(
    source: Arc<S>,
    socket: &Path,
    session: CancellationToken,
) -> Result<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>, PluginError> {
    remove_socket(socket);
    let listener = UnixListener::bind(socket)
        .map_err(|source| PluginError::Bind { path: socket.display().to_string(), source })?;
    let service = DevicePluginServer::from_arc(Arc::new(Service { source, stop: session.clone() }));
    Ok(tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), session.cancelled_owned()),
    ))
}

fn remove_socket(socket: &Path) {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %socket.display(), "removing the plugin socket: {e}"),
    }
}

/// Which kubelet socket a registration went to: a restarted kubelet makes a new file.
type SocketIdentity = (u64, u64);

fn identity(path: &Path) -> Option<SocketIdentity> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Registers until the kubelet accepts; returns the identity of the socket that accepted.
async fn register_until_accepted<S: DeviceSource>(
    source: &S,
    options: &PluginOptions,
    kubelet: &Path,
) -> SocketIdentity {
    loop {
        // The identity first: if the kubelet restarts right after accepting, the check sees a
        // different socket and registers again.
        let before = identity(kubelet);
        match register(source, options, kubelet).await {
            Ok(()) => {
                if let Some(id) = before {
                    return id;
                }
            }
            Err(e) => {
                tracing::warn!(resource = %source.resource_name(), kubelet = %kubelet.display(), "registration: {e}");
            }
        }
        tokio::time::sleep(options.register_retry).await;
    }
}

async fn register<S: DeviceSource>(source: &S, options: &PluginOptions, kubelet: &Path) -> Result<(), String> {
    let channel = unix_channel(kubelet).await.map_err(|e| format!("connecting: {e}"))?;
    let request = api::RegisterRequest {
        version: API_VERSION.to_string(),
        endpoint: options.endpoint.clone(),
        resource_name: source.resource_name(),
        options: Some(source.options()),
    };
    RegistrationClient::new(channel).register(request).await.map_err(|s| format!("refused: {}", s.message()))?;
    Ok(())
}

/// A gRPC channel over the unix socket at `path` (the URI is required by tonic and not used).
pub async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Returns once the kubelet socket is no longer the one registered with, or the plugin's own
/// socket is gone (the kubelet removes plugin sockets when it starts).
async fn kubelet_restarted(socket: &Path, kubelet: &Path, registered_with: SocketIdentity, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let own_socket_gone = !socket.exists();
        let kubelet_replaced = identity(kubelet).is_some_and(|id| id != registered_with);
        if own_socket_gone || kubelet_replaced {
            return;
        }
    }
}
