//! The NRI plugin runtime: connects to the container runtime, registers, serves the `Plugin`
//! service and hands every request to a [`Handler`]; reconnects when the runtime drops it.
//!
//! Session order (as the Go stub): connect → serve `Plugin` on mux connection 1 → call
//! `RegisterPlugin` on connection 2 → the runtime calls `Configure` (possibly before our
//! `RegisterPlugin` call returns, so nothing waits for that reply) → `Synchronize` (maybe in
//! `more` chunks) → events. A session ends when the trunk closes: the runtime closed us after a
//! timeout or an error, it restarted, or it shut us down. [`run`] then reconnects with exponential
//! backoff and synchronizes again.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::TtrpcContext;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::{Code, get_status};

use crate::api;
use crate::event::{Event, EventMask};
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// Where external plugins connect to the runtime.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// The NRI protocol version we implement, sent in `RegisterPlugin`.
pub const NRI_VERSION: &str = "v0.12.0";
/// The runtime's registration timeout when it does not tell (pre-v0.7 runtimes).
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The runtime's request timeout when it does not tell (pre-v0.7 runtimes).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an `UpdateContainers` call may take.
pub const UPDATE_CONTAINERS_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variable holding the inherited socket's fd (runtime-launched plugins).
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// Environment variable holding the plugin name (runtime-launched plugins).
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
/// Environment variable holding the plugin index (runtime-launched plugins).
pub const PLUGIN_IDX_ENV: &str = "NRI_PLUGIN_IDX";

/// What the runtime told us in `Configure`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Runtime name, e.g. `containerd`.
    pub name: String,
    /// Runtime version.
    pub version: String,
    /// The runtime's NRI version (v0.12+ runtimes send it).
    pub nri_version: Option<String>,
    /// How long the runtime waits for registration (default 5 s when not sent).
    pub registration_timeout: Duration,
    /// How long the runtime waits for each request (default 2 s when not sent); the runtime
    /// drops a plugin that exceeds it.
    pub request_timeout: Duration,
    /// Plugin configuration (only for plugins the runtime launched).
    pub config: String,
}

/// The events `runtime` accepts in a subscription (upstream's `ValidEvents` of its NRI version):
/// a runtime that sends its NRI version (v0.12+) accepts every event, and so do containerd 2.2+
/// and CRI-O 1.34+ (NRI v0.10); any other runtime, or one whose version cannot be read, is taken
/// to vendor NRI v0.9 or older and gets at most [`EventMask::UP_TO_V0_9`], which every NRI
/// runtime accepts.
pub fn accepted_events(runtime: &RuntimeInfo) -> EventMask {
    let at_least = |version: &str, want: (u64, u64)| major_minor(version).is_some_and(|v| v >= want);
    let v0_10 = match &runtime.nri_version {
        Some(v) => at_least(v, (0, 10)),
        None => match runtime.name.to_ascii_lowercase().as_str() {
            "containerd" => at_least(&runtime.version, (2, 2)),
            "cri-o" | "crio" => at_least(&runtime.version, (1, 34)),
            _ => false,
        },
    };
    if v0_10 { EventMask::ALL } else { EventMask::UP_TO_V0_9 }
}

/// `(major, minor)` of a version such as `v2.2.0`, `1.34.1` or `2.2.0-rc.1`. Hand-written: a
/// runtime's version string is not always semver (`v` prefixes, build suffixes), and only these
/// two numbers matter here.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The subscription to send: what `wanted` asks that this plugin runtime dispatches and the
/// runtime accepts, or why there is none.
pub fn subscription(wanted: EventMask, runtime: &RuntimeInfo) -> Result<EventMask, HandlerError> {
    let accepted = accepted_events(runtime);
    let sent = wanted.intersection(DISPATCHED).intersection(accepted);
    if sent.is_empty() {
        return Err(HandlerError::new(format!(
            "nothing to subscribe to: the plugin handles {wanted}, runtime {} {} accepts {accepted}",
            runtime.name, runtime.version
        )));
    }
    Ok(sent)
}

impl RuntimeInfo {
    /// Reads a `ConfigureRequest`, applying the defaults for absent (0) timeouts.
    pub fn from_request(req: &api::ConfigureRequest) -> RuntimeInfo {
        let ms = |v: i64, default: Duration| if v > 0 { Duration::from_millis(v as u64) } else { default };
        RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            nri_version: Some(req.NRI_version.clone()).filter(|v| !v.is_empty()),
            registration_timeout: ms(req.registration_timeout, DEFAULT_REGISTRATION_TIMEOUT),
            request_timeout: ms(req.request_timeout, DEFAULT_REQUEST_TIMEOUT),
            config: req.config.clone(),
        }
    }
}

/// A handler failure; the runtime fails the CRI call with this message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
}

impl HandlerError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> HandlerError {
        HandlerError { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> HandlerError {
        HandlerError { message }
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> HandlerError {
        HandlerError::new(message)
    }
}

/// The answer to `CreateContainer`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerCreation {
    /// Changes to the container being created.
    pub adjust: Option<api::ContainerAdjustment>,
    /// Updates of other (existing) containers; the container being created may not be here.
    pub update: Vec<api::ContainerUpdate>,
    /// Containers to evict.
    pub evict: Vec<api::ContainerEviction>,
}

/// Events this plugin runtime dispatches to a [`Handler`]: all but `ValidateContainerAdjustment`
/// (a runtime treats a plugin subscribed to it as a validator of every container's adjustments).
pub const DISPATCHED: EventMask = EventMask::ALL.difference(EventMask::from_bits(1 << 13));

/// What a plugin does. Every event method defaults to success with no changes; the runtime only
/// sends the events in the subscription (see [`Handler::events`]).
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The events the handler wants. The subscription sent in `ConfigureResponse` is this, less
    /// what the plugin runtime does not dispatch ([`DISPATCHED`]) and what the runtime does not
    /// accept ([`accepted_events`]); never the empty mask, which a runtime reads as every event.
    fn events(&self) -> EventMask;

    /// The runtime configured us (once per session, before `synchronize`).
    async fn configure(&self, _runtime: &RuntimeInfo) -> Result<(), HandlerError> {
        Ok(())
    }

    /// The runtime's current pods and containers, once per session with every chunk joined.
    /// Returns updates for existing containers.
    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError>;

    /// A pod sandbox was started. An error fails the sandbox's creation.
    async fn run_pod_sandbox(&self, _pod: api::PodSandbox) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A pod sandbox is stopping.
    async fn stop_pod_sandbox(&self, _pod: api::PodSandbox) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A pod sandbox was removed.
    async fn remove_pod_sandbox(&self, _pod: api::PodSandbox) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A pod sandbox's resources are being updated (NRI v0.10+).
    async fn update_pod_sandbox(
        &self,
        _pod: api::PodSandbox,
        _overhead: Option<api::LinuxResources>,
        _resources: Option<api::LinuxResources>,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A pod sandbox's resources were updated (NRI v0.10+).
    async fn post_update_pod_sandbox(&self, _pod: api::PodSandbox) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A container is being created. An error fails the creation.
    async fn create_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<ContainerCreation, HandlerError> {
        Ok(ContainerCreation::default())
    }

    /// A container was created.
    async fn post_create_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A container is starting.
    async fn start_container(&self, _pod: api::PodSandbox, _container: api::Container) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A container started.
    async fn post_start_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A container's resources are being updated to `resources` (what the kubelet asked for).
    /// Returns updates (for this or other containers).
    async fn update_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
        _resources: Option<api::LinuxResources>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }

    /// A container's resources were updated.
    async fn post_update_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<(), HandlerError> {
        Ok(())
    }

    /// A container is stopping. Returns updates of other containers.
    async fn stop_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }

    /// A container was removed.
    async fn remove_container(&self, _pod: api::PodSandbox, _container: api::Container) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Errors of the plugin runtime.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// A plugin option is invalid.
    #[error("invalid plugin option {field}: {reason}")]
    InvalidOption {
        /// The option.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// No session with the runtime right now.
    #[error("not connected to the NRI runtime")]
    NotConnected,
    /// Connecting to the runtime failed.
    #[error("cannot connect to the NRI runtime at {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The inherited socket (`NRI_PLUGIN_SOCKET`, or a given fd) is unusable.
    #[error("inherited NRI socket: {0}")]
    Inherited(String),
    /// The runtime refused or did not answer the registration.
    #[error("NRI registration failed: {0}")]
    Registration(String),
    /// A call to the runtime failed.
    #[error("NRI call {method} failed: {message}")]
    Call {
        /// The method.
        method: &'static str,
        /// Why.
        message: String,
    },
    /// The session ended before it was synchronized (inherited socket: no reconnect).
    #[error("NRI session ended: {0}")]
    SessionEnded(String),
    /// Local I/O failed (setting up the mux or the ttrpc server).
    #[error("NRI transport: {0}")]
    Transport(String),
}

/// Where the plugin's connection comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketSource {
    /// Connect to the runtime's socket (external plugin, e.g. `/var/run/nri/nri.sock`).
    Path(PathBuf),
    /// Use the connected socket the runtime passed us (fd in `NRI_PLUGIN_SOCKET`); the runtime
    /// relaunches us instead of us reconnecting.
    Inherited,
    /// Use this already-connected socket fd, which this process owns and hands over (it is
    /// closed when the session ends); no reconnect.
    Fd(i32),
}

/// How the plugin connects and presents itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginOptions {
    /// Plugin name, `[a-zA-Z0-9_.+-]+`.
    pub name: String,
    /// Plugin index, exactly two digits; the runtime calls plugins in ascending index order.
    pub index: String,
    /// Where to connect.
    pub socket: SocketSource,
    /// Answer the v0.12 per-event RPCs with UNIMPLEMENTED, as a pre-v0.12 plugin does, so the
    /// runtime falls back to `StateChange`.
    pub legacy_events: bool,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
}

impl PluginOptions {
    /// Options for plugin `index-name` on the default socket.
    pub fn new(name: impl Into<String>, index: impl Into<String>) -> PluginOptions {
        PluginOptions {
            name: name.into(),
            index: index.into(),
            socket: SocketSource::Path(PathBuf::from(DEFAULT_SOCKET_PATH)),
            legacy_events: false,
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
        }
    }

    /// Options from the environment a runtime-launched plugin gets (`NRI_PLUGIN_SOCKET`,
    /// `NRI_PLUGIN_NAME`, `NRI_PLUGIN_IDX`), else external-plugin options with `name`, `index`
    /// and `socket`. Validated.
    pub fn from_env_or(name: &str, index: &str, socket: &Path) -> Result<PluginOptions, PluginError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut opts = PluginOptions::new(name, index);
        opts.socket = SocketSource::Path(socket.to_path_buf());
        if env(PLUGIN_SOCKET_ENV).is_some() {
            opts.socket = SocketSource::Inherited;
            if let Some(n) = env(PLUGIN_NAME_ENV) {
                opts.name = n;
            }
            if let Some(i) = env(PLUGIN_IDX_ENV) {
                opts.index = i;
            }
        }
        opts.validate()?;
        Ok(opts)
    }

    /// Checks name, index and backoff.
    pub fn validate(&self) -> Result<(), PluginError> {
        let bad = |field, reason: String| Err(PluginError::InvalidOption { field, reason });
        if self.name.is_empty() {
            return bad("name", "must not be empty".into());
        }
        if let Some(c) = self.name.chars().find(|c| !(c.is_ascii_alphanumeric() || "_.+-".contains(*c))) {
            return bad("name", format!("{:?} has invalid character {c:?} (allowed: a-z A-Z 0-9 _ . + -)", self.name));
        }
        if self.index.len() != 2 || !self.index.bytes().all(|b| b.is_ascii_digit()) {
            return bad("index", format!("{:?} must be exactly two digits", self.index));
        }
        if let SocketSource::Fd(fd) = self.socket
            && fd < 0
        {
            return bad("socket", format!("fd {fd} is negative"));
        }
        if self.backoff_min.is_zero() || self.backoff_max < self.backoff_min {
            return bad("backoff", "need 0 < backoff_min <= backoff_max".into());
        }
        Ok(())
    }

    /// `index-name`, e.g. `00-weft`.
    pub fn full_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

/// The state of the plugin's session with the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// No synchronized session.
    Disconnected,
    /// Session number `session` (counting from 1 per [`run`]) is synchronized.
    Connected {
        /// Session number.
        session: u64,
        /// What the runtime told us.
        runtime: RuntimeInfo,
    },
}

struct HandleInner {
    /// The session being run (0: none) and its client once synchronized.
    client: Mutex<(u64, Option<api::RuntimeClient>)>,
    state: watch::Sender<SessionState>,
}

/// Calls into the runtime while a session is up, and tells when sessions start and end.
#[derive(Clone)]
pub struct RuntimeHandle {
    inner: Arc<HandleInner>,
}

impl Default for RuntimeHandle {
    fn default() -> RuntimeHandle {
        RuntimeHandle {
            inner: Arc::new(HandleInner {
                client: Mutex::new((0, None)),
                state: watch::channel(SessionState::Disconnected).0,
            }),
        }
    }
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle").field("state", &*self.inner.state.borrow()).finish()
    }
}

impl RuntimeHandle {
    /// A handle with no session; pass it to [`run`].
    pub fn new() -> RuntimeHandle {
        RuntimeHandle::default()
    }

    /// Whether a synchronized session is up.
    pub fn is_connected(&self) -> bool {
        matches!(*self.inner.state.borrow(), SessionState::Connected { .. })
    }

    /// The current session state.
    pub fn session(&self) -> SessionState {
        self.inner.state.borrow().clone()
    }

    /// Watches the session state: it changes to `Connected` after each successful
    /// `Synchronize` and to `Disconnected` when the session ends.
    pub fn subscribe_sessions(&self) -> watch::Receiver<SessionState> {
        self.inner.state.subscribe()
    }

    /// Asks the runtime to update and evict containers (unsolicited). Returns the updates that
    /// failed.
    pub async fn update_containers(
        &self,
        update: Vec<api::ContainerUpdate>,
        evict: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let client = lock(&self.inner.client).1.clone().ok_or(PluginError::NotConnected)?;
        let mut req = api::UpdateContainersRequest::new();
        req.update = update;
        req.evict = evict;
        let rpl = client
            .update_containers(ctx(UPDATE_CONTAINERS_TIMEOUT), &req)
            .await
            .map_err(|e| PluginError::Call { method: "UpdateContainers", message: rpc_message(&e) })?;
        Ok(rpl.failed)
    }

    fn begin(&self, session: u64) {
        *lock(&self.inner.client) = (session, None);
    }

    /// Marks `session` synchronized, unless it already ended.
    fn set_connected(&self, session: u64, client: api::RuntimeClient, runtime: RuntimeInfo) {
        let mut c = lock(&self.inner.client);
        if c.0 != session {
            return;
        }
        c.1 = Some(client);
        self.inner.state.send_replace(SessionState::Connected { session, runtime });
    }

    fn set_disconnected(&self) {
        let mut c = lock(&self.inner.client);
        *c = (0, None);
        self.inner.state.send_if_modified(|s| {
            let changed = *s != SessionState::Disconnected;
            *s = SessionState::Disconnected;
            changed
        });
        drop(c);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn ctx(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX))
}

fn rpc_message(e: &ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }
}

/// Whether something accepts connections on the NRI socket at `path`.
pub async fn probe(path: &Path) -> bool {
    match tokio::time::timeout(Duration::from_secs(2), tokio::net::UnixStream::connect(path)).await {
        Ok(Ok(s)) => {
            drop(s);
            true
        }
        _ => false,
    }
}

/// Runs the plugin until `shutdown`: connects, registers, serves `handler`, and reconnects with
/// exponential backoff (`backoff_min`..`backoff_max`, reset after a synchronized session) when
/// the runtime drops the connection. With an inherited socket or a given fd there is no
/// reconnect: returns when the session ends (`Ok` after a synchronized session).
pub async fn run(
    opts: PluginOptions,
    handler: Arc<dyn Handler>,
    handle: RuntimeHandle,
    shutdown: CancellationToken,
) -> Result<(), PluginError> {
    opts.validate()?;
    let reconnects = matches!(opts.socket, SocketSource::Path(_));
    let mut backoff = opts.backoff_min;
    let mut session = 0u64;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let trunk = match connect(&opts.socket).await {
            Ok(t) => Some(t),
            Err(e) if !reconnects => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "NRI runtime not reachable");
                None
            }
        };
        if let Some(trunk) = trunk {
            session += 1;
            handle.begin(session);
            let outcome = run_session(trunk, &opts, handler.clone(), &handle, session, &shutdown).await;
            handle.set_disconnected();
            match outcome {
                Outcome::Shutdown => return Ok(()),
                Outcome::Ended { synchronized, reason } => {
                    tracing::warn!(session, synchronized, %reason, "NRI session ended");
                    if !reconnects {
                        return if synchronized { Ok(()) } else { Err(PluginError::SessionEnded(reason)) };
                    }
                    if synchronized {
                        backoff = opts.backoff_min;
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(opts.backoff_max);
    }
}

async fn connect(source: &SocketSource) -> Result<tokio::net::UnixStream, PluginError> {
    match source {
        SocketSource::Path(p) => tokio::net::UnixStream::connect(p)
            .await
            .map_err(|source| PluginError::Connect { path: p.display().to_string(), source }),
        SocketSource::Inherited => {
            let raw = std::env::var(PLUGIN_SOCKET_ENV)
                .map_err(|_| PluginError::Inherited(format!("{PLUGIN_SOCKET_ENV} is not set")))?;
            let fd: i32 = raw
                .trim()
                .parse()
                .ok()
                .filter(|fd| *fd > 2)
                .ok_or_else(|| PluginError::Inherited(format!("{PLUGIN_SOCKET_ENV}={raw:?} is no fd number")))?;
            let std = adopt_fd(fd).map_err(|e| PluginError::Inherited(format!("fd {fd}: {e}")))?;
            tokio::net::UnixStream::from_std(std).map_err(|e| PluginError::Inherited(format!("fd {fd}: {e}")))
        }
        SocketSource::Fd(fd) => {
            let std = adopt_fd(*fd).map_err(|e| PluginError::Inherited(format!("fd {fd}: {e}")))?;
            tokio::net::UnixStream::from_std(std).map_err(|e| PluginError::Inherited(format!("fd {fd}: {e}")))
        }
    }
}

/// Takes ownership of inherited fd `fd` without `unsafe`: a fresh socket we own is replaced by a
/// duplicate of `fd` (`dup2`), then `fd` is closed. The NRI contract makes us the only owner of
/// `fd`.
fn adopt_fd(fd: i32) -> std::io::Result<std::os::unix::net::UnixStream> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    // Fails with EBADF if fd is not open (so the pair below cannot take its number).
    fcntl(fd, FcntlArg::F_GETFD)?;
    let (ours, other) = std::os::unix::net::UnixStream::pair()?;
    drop(other);
    nix::unistd::dup2(fd, ours.as_raw_fd())?;
    nix::unistd::close(fd)?;
    fcntl(ours.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    ours.set_nonblocking(true)?;
    Ok(ours)
}

enum Outcome {
    Shutdown,
    Ended { synchronized: bool, reason: String },
}

async fn run_session(
    trunk: tokio::net::UnixStream,
    opts: &PluginOptions,
    handler: Arc<dyn Handler>,
    handle: &RuntimeHandle,
    session: u64,
    shutdown: &CancellationToken,
) -> Outcome {
    let mux = Mux::new(trunk);
    // Closes the trunk however this session ends, the future being dropped included (an aborted
    // plugin task must not leave the runtime's connection open behind it).
    let _close = CloseOnDrop(mux.clone());
    let ended = |reason: String| Outcome::Ended { synchronized: false, reason };
    let (conn1, conn2) = match (mux.open(PLUGIN_SERVICE_CONN), mux.open(RUNTIME_SERVICE_CONN)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return ended(format!("mux: {e}")),
    };
    mux.start();
    let client = api::RuntimeClient::new(ttrpc::r#async::Client::new(Socket::new(conn2)));
    let written = watch::Sender::new(Written::default());
    let conn1 =
        Outbound { inner: conn1, progress: written.clone(), header: [0; TTRPC_HEADER_LEN], have: 0, body_left: 0 };
    let state = Arc::new(Session {
        handler,
        subscription: Mutex::new(EventMask::EMPTY),
        legacy_events: opts.legacy_events,
        runtime: Mutex::new(None),
        chunks: Mutex::new((Vec::new(), Vec::new())),
        synchronized: Mutex::new(false),
        handle: handle.clone(),
        client: client.clone(),
        session,
        mux: mux.clone(),
        written: written.subscribe(),
    });
    let service = api::create_plugin(Arc::new(PluginService { s: state.clone() }));
    let listener = Listener::new(futures::stream::once(async move { Ok::<_, std::io::Error>(conn1) }));
    let mut server = ttrpc::r#async::Server::new().register_service(service).add_listener(listener);
    if let Err(e) = server.start().await {
        mux.close();
        return ended(format!("ttrpc server: {e}"));
    }

    let mut req = api::RegisterPluginRequest::new();
    req.plugin_name = opts.name.clone();
    req.plugin_idx = opts.index.clone();
    req.NRI_version = NRI_VERSION.to_string();
    tracing::info!(plugin = %opts.full_name(), session, "registering with the NRI runtime");
    let registered = tokio::select! {
        _ = shutdown.cancelled() => {
            mux.close();
            return Outcome::Shutdown;
        }
        r = client.register_plugin(ctx(DEFAULT_REGISTRATION_TIMEOUT), &req) => r,
    };
    if let Err(e) = registered {
        mux.close();
        return ended(format!("RegisterPlugin: {}", rpc_message(&e)));
    }

    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Outcome::Shutdown,
        _ = mux.closed() => Outcome::Ended {
            synchronized: *lock(&state.synchronized),
            reason: mux.close_reason().unwrap_or_default(),
        },
    };
    mux.close();
    drop(server);
    outcome
}

/// Closes a mux when dropped.
struct CloseOnDrop(Mux);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

struct Session {
    handler: Arc<dyn Handler>,
    subscription: Mutex<EventMask>,
    legacy_events: bool,
    runtime: Mutex<Option<RuntimeInfo>>,
    chunks: Mutex<(Vec<api::PodSandbox>, Vec<api::Container>)>,
    synchronized: Mutex<bool>,
    handle: RuntimeHandle,
    client: api::RuntimeClient,
    session: u64,
    mux: Mux,
    /// What the ttrpc server has written on connection 1 (replies to the runtime).
    written: watch::Receiver<Written>,
}

impl Session {
    /// Marks the session connected once the reply being returned now is on the trunk: the
    /// runtime must read the `Synchronize` reply before any `UpdateContainers` the plugin sends
    /// (its synchronization is not over until then). `replies_before` is the count of replies
    /// written before this one; the runtime sends nothing else while it waits for it.
    fn connect_after_reply(&self, replies_before: u64, runtime: RuntimeInfo) {
        let (mut written, mux, handle) = (self.written.clone(), self.mux.clone(), self.handle.clone());
        let (session, client) = (self.session, self.client.clone());
        let Some(mut forwarded) = mux.forwarded(PLUGIN_SERVICE_CONN) else { return };
        tokio::spawn(async move {
            let on_the_wire = async {
                let end = written.wait_for(|w| w.messages > replies_before).await.ok()?.last_end;
                forwarded.wait_for(|n| *n >= end).await.ok()?;
                Some(())
            };
            tokio::select! {
                done = on_the_wire => if done.is_some() {
                    handle.set_connected(session, client, runtime);
                },
                _ = mux.closed() => {}
            }
        });
    }

    fn subscribed(&self, e: Event) -> bool {
        lock(&self.subscription).contains(e)
    }

    /// Dispatches a pod/container lifecycle event (dedicated RPC or `StateChange`).
    async fn on_event(&self, e: Event, pod: api::PodSandbox, ctr: Option<api::Container>) -> Result<(), HandlerError> {
        tracing::debug!(event = %e, pod = %pod.id, container = ctr.as_ref().map(|c| c.id.as_str()).unwrap_or(""), "NRI event");
        let h = &self.handler;
        let ctr = || ctr.clone().unwrap_or_default();
        match e {
            Event::RunPodSandbox => h.run_pod_sandbox(pod).await,
            Event::StopPodSandbox => h.stop_pod_sandbox(pod).await,
            Event::RemovePodSandbox => h.remove_pod_sandbox(pod).await,
            Event::PostUpdatePodSandbox => h.post_update_pod_sandbox(pod).await,
            Event::PostCreateContainer => h.post_create_container(pod, ctr()).await,
            Event::StartContainer => h.start_container(pod, ctr()).await,
            Event::PostStartContainer => h.post_start_container(pod, ctr()).await,
            Event::PostUpdateContainer => h.post_update_container(pod, ctr()).await,
            Event::RemoveContainer => h.remove_container(pod, ctr()).await,
            other => {
                tracing::debug!(event = %other, "event is not a state change; ignored");
                Ok(())
            }
        }
    }

    /// A dedicated (v0.12) event RPC.
    async fn dedicated(&self, e: Event, pod: api::PodSandbox, ctr: Option<api::Container>) -> ttrpc::Result<()> {
        if self.legacy_events {
            return Err(status(Code::UNIMPLEMENTED, format!("{e} is not implemented (legacy event mode)")));
        }
        if !self.subscribed(e) {
            return Ok(());
        }
        self.on_event(e, pod, ctr).await.map_err(|err| failed(e, err))
    }
}

fn status(code: Code, msg: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(get_status(code, msg))
}

fn failed(e: Event, err: HandlerError) -> ttrpc::Error {
    tracing::warn!(event = %e, error = %err, "NRI handler failed");
    status(Code::UNKNOWN, err.message)
}

struct PluginService {
    s: Arc<Session>,
}

#[async_trait]
impl api::Plugin for PluginService {
    async fn configure(&self, _: &TtrpcContext, req: api::ConfigureRequest) -> ttrpc::Result<api::ConfigureResponse> {
        let info = RuntimeInfo::from_request(&req);
        tracing::info!(
            runtime = %info.name, version = %info.version, nri = info.nri_version.as_deref().unwrap_or("unknown"),
            request_timeout = ?info.request_timeout, registration_timeout = ?info.registration_timeout,
            "NRI runtime configures us"
        );
        self.s.handler.configure(&info).await.map_err(|e| status(Code::UNKNOWN, e.message))?;
        let wanted = self.s.handler.events();
        let events = subscription(wanted, &info).map_err(|e| {
            tracing::error!(error = %e, "NRI subscription");
            status(Code::UNKNOWN, e.message)
        })?;
        if events != wanted {
            tracing::info!(
                wanted = %wanted, subscribed = %events, left_out = %wanted.difference(events),
                "NRI subscription narrowed to what weft dispatches and the runtime accepts"
            );
        }
        *lock(&self.s.subscription) = events;
        *lock(&self.s.runtime) = Some(info);
        let mut rpl = api::ConfigureResponse::new();
        rpl.events = events.to_wire();
        Ok(rpl)
    }

    async fn synchronize(
        &self,
        _: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let (pods, containers) = {
            let mut chunks = lock(&self.s.chunks);
            chunks.0.extend(req.pods);
            chunks.1.extend(req.containers);
            if req.more {
                tracing::debug!(pods = chunks.0.len(), containers = chunks.1.len(), "NRI sync chunk buffered");
                let mut rpl = api::SynchronizeResponse::new();
                rpl.more = true;
                return Ok(rpl);
            }
            std::mem::take(&mut *chunks)
        };
        tracing::info!(pods = pods.len(), containers = containers.len(), "NRI synchronize");
        let replies_before = self.s.written.borrow().messages;
        let update = self.s.handler.synchronize(pods, containers).await.map_err(|e| {
            tracing::warn!(error = %e, "NRI synchronize handler failed");
            status(Code::UNKNOWN, e.message)
        })?;
        let info = lock(&self.s.runtime).clone().unwrap_or_else(|| RuntimeInfo::from_request(&Default::default()));
        *lock(&self.s.synchronized) = true;
        self.s.connect_after_reply(replies_before, info);
        let mut rpl = api::SynchronizeResponse::new();
        rpl.update = update;
        Ok(rpl)
    }

    async fn shutdown(&self, _: &TtrpcContext, _: api::Empty) -> ttrpc::Result<api::Empty> {
        tracing::info!("NRI runtime shuts us down");
        Ok(api::Empty::new())
    }

    async fn create_container(
        &self,
        _: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let mut rpl = api::CreateContainerResponse::new();
        if !self.s.subscribed(Event::CreateContainer) {
            return Ok(rpl);
        }
        let pod = req.pod.into_option().unwrap_or_default();
        let ctr = req.container.into_option().unwrap_or_default();
        tracing::debug!(pod = %pod.id, container = %ctr.id, "NRI CreateContainer");
        let c = self.s.handler.create_container(pod, ctr).await.map_err(|e| failed(Event::CreateContainer, e))?;
        rpl.adjust = c.adjust.into();
        rpl.update = c.update;
        rpl.evict = c.evict;
        Ok(rpl)
    }

    async fn update_container(
        &self,
        _: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        let mut rpl = api::UpdateContainerResponse::new();
        if !self.s.subscribed(Event::UpdateContainer) {
            return Ok(rpl);
        }
        let pod = req.pod.into_option().unwrap_or_default();
        let ctr = req.container.into_option().unwrap_or_default();
        rpl.update = self
            .s
            .handler
            .update_container(pod, ctr, req.linux_resources.into_option())
            .await
            .map_err(|e| failed(Event::UpdateContainer, e))?;
        Ok(rpl)
    }

    async fn stop_container(
        &self,
        _: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        let mut rpl = api::StopContainerResponse::new();
        if !self.s.subscribed(Event::StopContainer) {
            return Ok(rpl);
        }
        let pod = req.pod.into_option().unwrap_or_default();
        let ctr = req.container.into_option().unwrap_or_default();
        rpl.update = self.s.handler.stop_container(pod, ctr).await.map_err(|e| failed(Event::StopContainer, e))?;
        Ok(rpl)
    }

    async fn update_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        // A dedicated RPC since v0.10; runtimes never fall back to StateChange for it.
        if self.s.subscribed(Event::UpdatePodSandbox) {
            let pod = req.pod.into_option().unwrap_or_default();
            self.s
                .handler
                .update_pod_sandbox(pod, req.overhead_linux_resources.into_option(), req.linux_resources.into_option())
                .await
                .map_err(|e| failed(Event::UpdatePodSandbox, e))?;
        }
        Ok(api::UpdatePodSandboxResponse::new())
    }

    async fn state_change(&self, _: &TtrpcContext, req: api::StateChangeEvent) -> ttrpc::Result<api::Empty> {
        let number = req.event.value();
        let Some(e) = Event::from_number(number) else {
            tracing::warn!(event = number, "unknown NRI state change event; ignored");
            return Ok(api::Empty::new());
        };
        if self.s.subscribed(e) {
            let pod = req.pod.into_option().unwrap_or_default();
            self.s.on_event(e, pod, req.container.into_option()).await.map_err(|err| failed(e, err))?;
        }
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.s.dedicated(Event::RunPodSandbox, req.pod.unwrap_or_default(), None).await?;
        Ok(Default::default())
    }

    async fn post_update_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        self.s.dedicated(Event::PostUpdatePodSandbox, req.pod.unwrap_or_default(), None).await?;
        Ok(Default::default())
    }

    async fn stop_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.s.dedicated(Event::StopPodSandbox, req.pod.unwrap_or_default(), None).await?;
        Ok(Default::default())
    }

    async fn remove_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.s.dedicated(Event::RemovePodSandbox, req.pod.unwrap_or_default(), None).await?;
        Ok(Default::default())
    }

    async fn post_create_container(
        &self,
        _: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        let (pod, ctr) = (req.pod.unwrap_or_default(), req.container.into_option());
        self.s.dedicated(Event::PostCreateContainer, pod, ctr).await?;
        Ok(Default::default())
    }

    async fn start_container(
        &self,
        _: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        let (pod, ctr) = (req.pod.unwrap_or_default(), req.container.into_option());
        self.s.dedicated(Event::StartContainer, pod, ctr).await?;
        Ok(Default::default())
    }

    async fn post_start_container(
        &self,
        _: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        let (pod, ctr) = (req.pod.unwrap_or_default(), req.container.into_option());
        self.s.dedicated(Event::PostStartContainer, pod, ctr).await?;
        Ok(Default::default())
    }

    async fn post_update_container(
        &self,
        _: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        let (pod, ctr) = (req.pod.unwrap_or_default(), req.container.into_option());
        self.s.dedicated(Event::PostUpdateContainer, pod, ctr).await?;
        Ok(Default::default())
    }

    async fn remove_container(
        &self,
        _: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        let (pod, ctr) = (req.pod.unwrap_or_default(), req.container.into_option());
        self.s.dedicated(Event::RemoveContainer, pod, ctr).await?;
        Ok(Default::default())
    }
}

/// Length of a ttrpc frame header: payload length (u32), stream id (u32), type, flags.
const TTRPC_HEADER_LEN: usize = 10;

/// Progress of the replies written on connection 1.
#[derive(Clone, Copy, Debug, Default)]
struct Written {
    /// Bytes written.
    bytes: u64,
    /// ttrpc messages written whole.
    messages: u64,
    /// Byte count at the end of the last whole message.
    last_end: u64,
}

/// Connection 1 as the ttrpc server writes to it: passes everything through, counting bytes and,
/// from the ttrpc frame headers, the messages written whole.
struct Outbound<S> {
    inner: S,
    progress: watch::Sender<Written>,
    header: [u8; TTRPC_HEADER_LEN],
    have: usize,
    body_left: u64,
}

impl<S> Outbound<S> {
    fn feed(&mut self, data: &[u8]) {
        let (header, have, body_left) = (&mut self.header, &mut self.have, &mut self.body_left);
        self.progress.send_modify(|w| {
            let mut i = 0;
            while i < data.len() {
                if *have < TTRPC_HEADER_LEN {
                    let take = (TTRPC_HEADER_LEN - *have).min(data.len() - i);
                    header[*have..*have + take].copy_from_slice(&data[i..i + take]);
                    *have += take;
                    i += take;
                    if *have < TTRPC_HEADER_LEN {
                        continue;
                    }
                    *body_left = u64::from(u32::from_be_bytes([header[0], header[1], header[2], header[3]]));
                } else {
                    let take = usize::try_from(*body_left).unwrap_or(usize::MAX).min(data.len() - i);
                    *body_left -= take as u64;
                    i += take;
                }
                if *body_left == 0 {
                    w.messages += 1;
                    w.last_end = w.bytes + i as u64;
                    *have = 0;
                }
            }
            w.bytes += data.len() as u64;
        });
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Outbound<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Outbound<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            this.feed(&buf[..*n]);
        }
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body_len: usize) -> Vec<u8> {
        let mut f = (body_len as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 0, 0, 3, 2, 0]);
        f.extend(std::iter::repeat_n(9u8, body_len));
        f
    }

    #[test]
    fn outbound_counts_whole_messages_however_the_bytes_are_cut() {
        let stream: Vec<u8> = [frame(5), frame(0), frame(5000)].concat();
        for cut in [1, 3, 10, 11, 4096, stream.len()] {
            let (tx, rx) = watch::channel(Written::default());
            let mut out = Outbound { inner: (), progress: tx, header: [0; TTRPC_HEADER_LEN], have: 0, body_left: 0 };
            let mut ends = Vec::new();
            for chunk in stream.chunks(cut) {
                let before = rx.borrow().messages;
                out.feed(chunk);
                if rx.borrow().messages > before {
                    ends.push(rx.borrow().last_end);
                }
            }
            let w = *rx.borrow();
            assert_eq!((w.messages, w.bytes), (3, stream.len() as u64), "cut {cut}");
            assert_eq!(w.last_end, stream.len() as u64, "cut {cut}");
            assert!(ends.contains(&15) || cut > 15, "cut {cut}: {ends:?}");
        }
    }

    #[test]
    fn accepted_events_follow_the_runtimes_nri_version() {
        let rt = |name: &str, version: &str, nri: Option<&str>| RuntimeInfo {
            name: name.into(),
            version: version.into(),
            nri_version: nri.map(str::to_string),
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            config: String::new(),
        };
        assert_eq!(accepted_events(&rt("x", "1", Some("v0.12.0"))), EventMask::ALL);
        assert_eq!(accepted_events(&rt("x", "1", Some("v0.9.0"))), EventMask::UP_TO_V0_9);
        assert_eq!(accepted_events(&rt("containerd", "v2.2.0", None)), EventMask::ALL);
        assert_eq!(accepted_events(&rt("containerd", "2.1.4", None)), EventMask::UP_TO_V0_9);
        assert_eq!(accepted_events(&rt("containerd", "1.7.27", None)), EventMask::UP_TO_V0_9);
        assert_eq!(accepted_events(&rt("cri-o", "1.34.1", None)), EventMask::ALL);
        assert_eq!(accepted_events(&rt("cri-o", "1.33.0", None)), EventMask::UP_TO_V0_9);
        assert_eq!(accepted_events(&rt("containerd", "unknown", None)), EventMask::UP_TO_V0_9);
        assert_eq!(accepted_events(&rt("podman", "5.0", None)), EventMask::UP_TO_V0_9);
        assert!(!DISPATCHED.contains(Event::ValidateContainerAdjustment));
        assert_eq!(DISPATCHED.bits(), 0x1FFF);
        let e = subscription(EventMask::EMPTY, &rt("x", "1", Some("v0.12.0"))).unwrap_err();
        assert!(e.to_string().contains("nothing to subscribe"), "{e}");
    }
}
