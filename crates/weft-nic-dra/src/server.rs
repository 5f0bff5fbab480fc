//! The driver's two gRPC servers on unix sockets, as the kubelet finds them:
//!
//! - `Registration` (pluginregistration) on `<plugins_registry>/nic.weft.io-reg.sock`: the
//!   kubelet's plugin watcher sees the socket, asks `GetInfo` (type `DRAPlugin`, the driver name,
//!   the DRA endpoint, the services served: `v1.DRAPlugin`) and reports the outcome with
//!   `NotifyRegistrationStatus`;
//! - `DRAPlugin` (dra v1) on `<plugins>/nic.weft.io/dra.sock`: NodePrepareResources and
//!   NodeUnprepareResources ([`crate::driver`]).
//!
//! [`start`] removes sockets a previous run left, binds the DRA socket first (so the kubelet
//! never registers an endpoint that does not answer) and then the registration socket, and
//! returns once both listen. On shutdown the servers stop and both sockets are removed (the
//! kubelet deregisters the driver when its registration socket goes). A restarted kubelet finds
//! the registration socket again by itself; nothing has to be redone.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use weft_net::nic_claim::DRIVER;

use crate::api::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::api::dra::{
    NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::api::registration::registration_server::{Registration, RegistrationServer};
use crate::api::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use crate::driver::NicDriver;

/// The kubelet's directory of plugin sockets (`<kubelet root>/plugins`).
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The directory the kubelet's plugin watcher watches (`<kubelet root>/plugins_registry`).
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The plugin type a DRA driver registers as.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA gRPC service this driver serves, as the registration names it (`<version>.<service>`).
pub const DRA_SERVICE: &str = "v1.DRAPlugin";
/// The DRA socket's name in the driver's directory.
pub const DRA_SOCKET: &str = "dra.sock";

/// Where the sockets go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeOptions {
    /// The kubelet's plugins directory ([`DEFAULT_PLUGINS_DIR`]); the DRA socket is
    /// `<plugins_dir>/nic.weft.io/dra.sock`.
    pub plugins_dir: PathBuf,
    /// The kubelet's plugins_registry directory ([`DEFAULT_REGISTRY_DIR`]); the registration socket
    /// is `<registry_dir>/nic.weft.io-reg.sock`.
    pub registry_dir: PathBuf,
}

impl ServeOptions {
    /// The kubelet's default directories.
    pub fn kubelet_defaults() -> ServeOptions {
        ServeOptions { plugins_dir: DEFAULT_PLUGINS_DIR.into(), registry_dir: DEFAULT_REGISTRY_DIR.into() }
    }

    /// The DRA socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join(DRA_SOCKET)
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }

    /// What `GetInfo` answers.
    pub fn plugin_info(&self) -> PluginInfo {
        PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER.to_string(),
            endpoint: self.dra_socket().display().to_string(),
            supported_versions: vec![DRA_SERVICE.to_string()],
        }
    }
}

/// Why the servers could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A directory or socket could not be made.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A gRPC server failed.
    #[error("the {what} server on {path}: {source}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// Its socket.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
}

struct DraService {
    driver: Arc<NicDriver>,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        Ok(Response::new(NodePrepareResourcesResponse { claims: self.driver.prepare(&claims).await }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        Ok(Response::new(NodeUnprepareResourcesResponse { claims: self.driver.unprepare(&claims).await }))
    }
}

struct RegistrationService {
    info: PluginInfo,
    status: watch::Sender<Option<RegistrationStatus>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER, endpoint = %self.info.endpoint, "registered with the kubelet");
        } else {
            tracing::error!(driver = DRIVER, error = %status.error, "the kubelet refused the registration");
        }
        self.status.send_replace(Some(status));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The running servers.
#[derive(Debug)]
pub struct Serving {
    registration: watch::Receiver<Option<RegistrationStatus>>,
    dra: (PathBuf, JoinHandle<Result<(), tonic::transport::Error>>),
    reg: (PathBuf, JoinHandle<Result<(), tonic::transport::Error>>),
}

fn remove_socket(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %path.display(), "removing a socket: {e}"),
    }
}

fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::Io {
            what: "creating the directory",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    // A socket left by an earlier run would make bind fail.
    remove_socket(path);
    UnixListener::bind(path).map_err(|source| ServeError::Io { what: "listening on", path: path.to_path_buf(), source })
}

/// Starts both servers for `driver` (see the module docs); they stop when `shutdown` is
/// cancelled. Must be called within a tokio runtime.
pub fn start(
    driver: Arc<NicDriver>,
    options: &ServeOptions,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    let dra_path = options.dra_socket();
    let reg_path = options.registration_socket();
    let dra_listener = bind(&dra_path)?;
    let reg_listener = match bind(&reg_path) {
        Ok(l) => l,
        Err(e) => {
            remove_socket(&dra_path);
            return Err(e);
        }
    };
    let dra = tokio::spawn(
        Server::builder()
            .add_service(DraPluginServer::new(DraService { driver }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(dra_listener), shutdown.clone().cancelled_owned()),
    );
    let (status, registration) = watch::channel(None);
    let service = RegistrationService { info: options.plugin_info(), status };
    let reg = tokio::spawn(
        Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), shutdown.cancelled_owned()),
    );
    Ok(Serving { registration, dra: (dra_path, dra), reg: (reg_path, reg) })
}

impl Serving {
    /// What the kubelet last said of the registration (`None`: nothing yet).
    pub fn registration(&self) -> watch::Receiver<Option<RegistrationStatus>> {
        self.registration.clone()
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> &Path {
        &self.reg.0
    }

    /// The DRA socket.
    pub fn dra_socket(&self) -> &Path {
        &self.dra.0
    }

    /// Waits until the servers have stopped (after shutdown) and removes the sockets, the
    /// registration socket first.
    pub async fn wait(self) -> Result<(), ServeError> {
        let (reg_path, reg) = self.reg;
        let (dra_path, dra) = self.dra;
        let reg_result = reg.await;
        remove_socket(&reg_path);
        let dra_result = dra.await;
        remove_socket(&dra_path);
        for (what, path, r) in [("registration", reg_path, reg_result), ("DRA", dra_path, dra_result)] {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(source)) => return Err(ServeError::Serve { what, path, source }),
                Err(e) => {
                    return Err(ServeError::Io {
                        what: "the server task of",
                        path,
                        source: io::Error::other(e.to_string()),
                    });
                }
            }
        }
        Ok(())
    }
}
