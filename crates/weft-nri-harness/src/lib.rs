//! A test-only NRI runtime that speaks the real wire protocol (one unix socket, the trunk
//! multiplexer, ttrpc both ways) and behaves like containerd's `pkg/adaptation`:
//!
//! - plugins connect to a unix socket; each is accepted in turn, must call `RegisterPlugin`
//!   within the registration timeout, is then configured (timeouts in ms, runtime name and
//!   version, NRI version) and synchronized with the current pods and containers, and only then
//!   receives events;
//! - every runtime→plugin call runs under the request timeout; a timeout or a broken
//!   connection closes the plugin and it is forgotten (later requests proceed without it); any
//!   other error fails the request ("CRI call");
//! - plugins are called in ascending index order;
//! - `CreateContainer` answers are merged with containerd's conflict rule, and a plugin may not
//!   update the container being created;
//! - [`NriVersion::V0_12`] calls the dedicated event RPCs first and falls back to `StateChange`
//!   only when the plugin answers UNIMPLEMENTED; [`NriVersion::V0_9`] and [`NriVersion::V0_10`]
//!   use `StateChange`;
//! - a plugin's subscription is checked against the version's valid events (0x7FF up to v0.9,
//!   0x3FFF from v0.10); an empty subscription means every valid event, and a plugin subscribed
//!   to `ValidateContainerAdjustment` is called as a validator of every `CreateContainer`, whose
//!   error fails the container;
//! - plugin connections are read as Go ttrpc over upstream's mux reads them: a frame larger than
//!   Go ttrpc's 4,096-byte read buffer ([`RuntimeOptions::read_buffer`]) fails the read (`ENOMEM`)
//!   and the plugin is closed;
//! - `UpdateContainers` applies the updates and, as containerd, does nothing with evictions;
//!   like containerd's `updateFromPlugin` it holds the lifecycle lock while it does;
//! - every update the runtime applies (from a `CreateContainer`, `UpdateContainer` or
//!   `StopContainer` answer, a `Synchronize` reply or an `UpdateContainers`) is applied one at a
//!   time and costs [`RuntimeOptions::update_cost`], under the lifecycle lock: containerd applies
//!   each as one synchronous `UpdateContainerResources` (the container's spec written to its
//!   metadata store, then the task updated through the shim and runc) inside the request
//!   (`internal/nri/nri.go` `applyUpdates`, `internal/cri/nri/nri_api_linux.go` `UpdateContainer`);
//! - pod and container events are relayed only as containerd's NRI bookkeeping allows
//!   (`internal/nri/nri.go`, `needsStopping`/`needsRemoval` over its in-memory `state`):
//!   StopPodSandbox/StopContainer once, for what was created or running; RemovePodSandbox/
//!   RemoveContainer for what was created, running or stopped. [`Runtime::restart`] plays a
//!   runtime restart: that bookkeeping is lost, and at the next `Synchronize` it is rebuilt for
//!   the containers only, so pods that lived through the restart never produce StopPodSandbox or
//!   RemovePodSandbox again;
//! - a sandbox has a pid while it is ready; a stopped or exited sandbox is NotReady, which NRI
//!   shows as pid 0 (containerd's `handleSandboxExit`), and is still listed at `Synchronize`;
//! - `Synchronize` is split into `more` chunks when the message is larger than
//!   [`RuntimeOptions::max_message_size`] (upstream gets that signal from its ttrpc client's
//!   size check; here the size is computed before sending). The batch shrinks by the factor
//!   `min(limit / size, 0.9)` per retry, at least 8 objects, as upstream; a plugin that does not
//!   answer a `more` chunk with `more=true` and no updates is closed.
//!
//! The harness keeps the pods and containers with every adjustment and update applied, so tests
//! can read the resulting cpuset, memory or env, records unsolicited `UpdateContainers`, and logs
//! what happened as [`HarnessEvent`]s that tests can wait on.

mod merge;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use protobuf::{Message, MessageField};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use ttrpc::r#async::TtrpcContext;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::{Code, get_status};
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// The NRI protocol generation the harness plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NriVersion {
    /// v0.2 … v0.9 (containerd 1.7 to 2.1, CRI-O up to 1.33): pod events and most container
    /// events travel in `StateChange`; valid events are 1..=11 (mask 0x7FF);
    /// `ConfigureRequest.NRI_version` is empty.
    V0_9,
    /// v0.10, v0.11 (containerd 2.2, CRI-O 1.34, 1.35): as v0.9, plus `UpdatePodSandbox`,
    /// `PostUpdatePodSandbox` and `ValidateContainerAdjustment` (mask 0x3FFF).
    V0_10,
    /// v0.12: dedicated event RPCs, `StateChange` only as fallback on UNIMPLEMENTED; sends its
    /// NRI version in `Configure`.
    V0_12,
}

impl NriVersion {
    /// The events a plugin may subscribe to (upstream's `ValidEvents`).
    pub fn valid_events(self) -> EventMask {
        match self {
            NriVersion::V0_9 => EventMask::from_bits(0x7FF),
            NriVersion::V0_10 | NriVersion::V0_12 => EventMask::ALL,
        }
    }
}

/// Go ttrpc's read buffer on each mux connection (`bufio.NewReader`'s default size).
pub const GO_TTRPC_READ_BUFFER: usize = 4096;

/// How the harness runtime behaves.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Runtime name sent in `Configure`.
    pub name: String,
    /// Runtime version sent in `Configure`.
    pub version: String,
    /// Protocol generation.
    pub nri_version: NriVersion,
    /// A plugin that has not registered by then is dropped.
    pub registration_timeout: Duration,
    /// Every call to a plugin must be answered by then, or the plugin is dropped.
    pub request_timeout: Duration,
    /// Send the timeouts in `Configure` (v0.7+); `false` plays an older runtime (fields 0).
    pub send_timeouts: bool,
    /// Largest `Synchronize` message before it is split (ttrpc's 4 MiB by default).
    pub max_message_size: usize,
    /// Plugin configuration text sent in `Configure`.
    pub config: String,
    /// Hold each `RegisterPlugin` reply until that plugin's `Configure` has been answered, so
    /// `Configure` surely arrives before the reply (a plugin must not wait for it).
    pub configure_before_register_reply: bool,
    /// Log every plugin call as [`HarnessEvent::Call`] (turn off for tight loops).
    pub record_calls: bool,
    /// Largest mux frame a plugin connection may send ([`GO_TTRPC_READ_BUFFER`]); larger ones
    /// close the plugin, as `ENOMEM` does between upstream's mux and Go ttrpc.
    pub read_buffer: usize,
    /// What applying one container update costs the runtime (containerd: one
    /// `UpdateContainerResources`, a metadata write and a runc update, tens of ms on a busy
    /// node); zero by default.
    pub update_cost: Duration,
}

impl Default for RuntimeOptions {
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            name: "weft-nri-harness".into(),
            version: "0.12.0-harness".into(),
            nri_version: NriVersion::V0_12,
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            send_timeouts: true,
            max_message_size: 4 << 20,
            config: String::new(),
            configure_before_register_reply: false,
            record_calls: true,
            read_buffer: GO_TTRPC_READ_BUFFER,
            update_cost: Duration::ZERO,
        }
    }
}

/// Something that happened, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum HarnessEvent {
    /// A plugin registered.
    Registered {
        /// Full name, `idx-name`.
        plugin: String,
        /// The NRI version it announced (empty for pre-v0.12 plugins).
        nri_version: String,
    },
    /// A plugin answered `Configure`.
    Configured {
        /// Full name.
        plugin: String,
        /// Its subscription.
        events: EventMask,
    },
    /// A plugin was synchronized and now gets events.
    Synchronized {
        /// Full name.
        plugin: String,
        /// How many `Synchronize` messages it took.
        chunks: usize,
        /// How many updates it returned.
        updates: usize,
    },
    /// A plugin connection was closed and the plugin forgotten.
    Dropped {
        /// Full name (`??-plugin` before registration).
        plugin: String,
        /// Why.
        reason: String,
    },
    /// A call to a plugin (only with [`RuntimeOptions::record_calls`]).
    Call {
        /// Full name.
        plugin: String,
        /// Method, e.g. `RunPodSandbox` or `StateChange(RunPodSandbox)`.
        method: String,
        /// The error status code name, `None` when it succeeded.
        error: Option<String>,
    },
    /// A `CreateContainer` answer carried updates of other containers, which the runtime applied
    /// inside that request.
    CreateUpdates {
        /// How many (merged over every plugin).
        updates: usize,
    },
    /// A plugin sent `UpdateContainers` on its own.
    Unsolicited {
        /// Full name.
        plugin: String,
        /// The updates.
        update: Vec<api::ContainerUpdate>,
        /// The evictions.
        evict: Vec<api::ContainerEviction>,
        /// Updates that failed (unknown containers).
        failed: Vec<String>,
    },
}

/// Why a request ("CRI call") failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A plugin answered with an error.
    #[error("plugin {plugin} failed {method}: {message}")]
    Plugin {
        /// Full name.
        plugin: String,
        /// Method.
        method: String,
        /// The status message.
        message: String,
    },
    /// Plugin answers could not be merged (conflict, or an update of the container being
    /// created).
    #[error("{0}")]
    Merge(String),
    /// No such pod or container.
    #[error("not found: {0}")]
    NotFound(String),
    /// Socket setup failed.
    #[error("harness I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// An active (synchronized) plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    /// Full name, `idx-name`.
    pub name: String,
    /// Index.
    pub index: String,
    /// Subscription.
    pub events: EventMask,
    /// Announced NRI version.
    pub nri_version: String,
}

/// What containerd's NRI layer last told plugins about a pod or container (`internal/nri`'s
/// `State`); absent means removed, or never told since the runtime (re)started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Told {
    Created,
    Running,
    Stopped,
}

#[derive(Default)]
struct Data {
    pods: BTreeMap<String, api::PodSandbox>,
    containers: BTreeMap<String, api::Container>,
    /// containerd's in-memory NRI `state`, by pod or container id.
    told: BTreeMap<String, Told>,
    /// The last sandbox pid handed out.
    last_pid: u32,
}

impl Data {
    fn needs_stopping(&self, id: &str) -> bool {
        matches!(self.told.get(id), Some(Told::Created | Told::Running))
    }

    fn needs_removal(&self, id: &str) -> bool {
        self.told.contains_key(id)
    }

    fn tell(&mut self, id: &str, state: Option<Told>) {
        match state {
            Some(s) => {
                self.told.insert(id.to_string(), s);
            }
            None => {
                self.told.remove(id);
            }
        }
    }
}

struct SyncFault {
    plugin: String,
    after_chunks: usize,
}

struct Inner {
    opts: RuntimeOptions,
    path: PathBuf,
    /// containerd's lifecycle lock: held through every request and every synchronization.
    lifecycle: tokio::sync::Mutex<()>,
    data: Mutex<Data>,
    plugins: Mutex<Vec<Arc<PluginConn>>>,
    connections: Mutex<Vec<Mux>>,
    log: Mutex<Vec<HarnessEvent>>,
    log_len: watch::Sender<usize>,
    sync_fault: Mutex<Option<SyncFault>>,
    stop: CancellationToken,
}

struct PluginConn {
    name: String,
    index: String,
    nri_version: String,
    events: EventMask,
    client: api::PluginClient,
    /// The same client, for methods weft's proto does not define (`ValidateContainerAdjustment`).
    raw: ttrpc::r#async::Client,
    mux: Mux,
    reason: Mutex<Option<String>>,
}

impl PluginConn {
    fn close(&self, reason: String) {
        lock(&self.reason).get_or_insert(reason);
        self.mux.close();
    }

    fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running harness runtime. Dropping it stops listening and closes every plugin connection.
pub struct Runtime {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("path", &self.inner.path).finish()
    }
}

/// How a plugin call failed.
enum CallError {
    /// Timeout or broken connection: the plugin is closed and skipped.
    Fatal(String),
    /// The plugin answered with this status.
    Status(Code, String),
}

fn classify(e: ttrpc::Error) -> CallError {
    match e {
        ttrpc::Error::RpcStatus(s) if s.code() == Code::DEADLINE_EXCEEDED => {
            CallError::Fatal(format!("request timed out ({})", s.message()))
        }
        ttrpc::Error::RpcStatus(s) => CallError::Status(s.code(), s.message().to_string()),
        ttrpc::Error::Others(m) if m.contains("timeout") => CallError::Fatal(format!("request timed out ({m})")),
        other => CallError::Fatal(format!("connection failed: {other}")),
    }
}

fn ctx(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX))
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
}

fn valid_index(i: &str) -> bool {
    i.len() == 2 && i.bytes().all(|b| b.is_ascii_digit())
}

impl Runtime {
    /// Listens on `path` (removing a stale socket) and accepts plugins.
    pub async fn start(path: impl AsRef<Path>, opts: RuntimeOptions) -> Result<Runtime, RuntimeError> {
        let path = path.as_ref().to_path_buf();
        let _ = std::fs::remove_file(&path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = tokio::net::UnixListener::bind(&path)?;
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            opts,
            path,
            lifecycle: tokio::sync::Mutex::new(()),
            data: Mutex::new(Data::default()),
            plugins: Mutex::new(Vec::new()),
            connections: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            log_len: watch::channel(0).0,
            sync_fault: Mutex::new(None),
            stop: stop.clone(),
        });
        tokio::spawn(accept_loop(inner.clone(), listener));
        Ok(Runtime { inner, _stop: stop.drop_guard() })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The active (synchronized, not closed) plugins in call order.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        lock(&self.inner.plugins)
            .iter()
            .filter(|p| !p.is_closed())
            .map(|p| PluginInfo {
                name: p.name.clone(),
                index: p.index.clone(),
                events: p.events,
                nri_version: p.nri_version.clone(),
            })
            .collect()
    }

    /// Everything logged so far.
    pub fn events(&self) -> Vec<HarnessEvent> {
        lock(&self.inner.log).clone()
    }

    /// Waits until an event at log position `from` or later satisfies `pred`; returns its
    /// position and the event. Never times out (wrap it in a hang guard).
    pub async fn wait_event(&self, from: usize, pred: impl Fn(&HarnessEvent) -> bool) -> (usize, HarnessEvent) {
        let mut rx = self.inner.log_len.subscribe();
        let mut next = from;
        loop {
            {
                let log = lock(&self.inner.log);
                if let Some((i, e)) = log.iter().enumerate().skip(next).find(|(_, e)| pred(e)) {
                    return (i, e.clone());
                }
                next = next.max(log.len());
            }
            if rx.changed().await.is_err() {
                // The sender lives in `inner`, which we hold: unreachable.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The number of events logged so far (a position for [`Runtime::wait_event`]).
    pub fn event_count(&self) -> usize {
        lock(&self.inner.log).len()
    }

    /// Waits until plugin `name` (`idx-name`) has been synchronized at least `times` times in
    /// total.
    pub async fn wait_synchronized_times(&self, name: &str, times: usize) {
        let mut from = 0;
        for _ in 0..times {
            let (i, _) = self
                .wait_event(from, |e| matches!(e, HarnessEvent::Synchronized { plugin, .. } if plugin == name))
                .await;
            from = i + 1;
        }
    }

    /// Waits until plugin `name` (`idx-name`) has been synchronized (at least once).
    pub async fn wait_synchronized(&self, name: &str) {
        self.wait_synchronized_times(name, 1).await
    }

    /// Waits for a drop of plugin `name` logged at position `from` or later; returns the reason.
    pub async fn wait_dropped(&self, name: &str, from: usize) -> String {
        match self.wait_event(from, |e| matches!(e, HarnessEvent::Dropped { plugin, .. } if plugin == name)).await {
            (_, HarnessEvent::Dropped { reason, .. }) => reason,
            _ => String::new(),
        }
    }

    /// Every unsolicited `UpdateContainers` so far as (plugin, updates, evictions).
    pub fn unsolicited_updates(&self) -> Vec<(String, Vec<api::ContainerUpdate>, Vec<api::ContainerEviction>)> {
        lock(&self.inner.log)
            .iter()
            .filter_map(|e| match e {
                HarnessEvent::Unsolicited { plugin, update, evict, .. } => {
                    Some((plugin.clone(), update.clone(), evict.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// A container as the runtime has it now (adjustments and updates applied).
    pub fn container(&self, id: &str) -> Option<api::Container> {
        lock(&self.inner.data).containers.get(id).cloned()
    }

    /// A pod as the runtime has it now.
    pub fn pod(&self, id: &str) -> Option<api::PodSandbox> {
        lock(&self.inner.data).pods.get(id).cloned()
    }

    /// Closes every plugin connection (plugins reconnect and are synchronized again); pods and
    /// containers stay, the socket keeps accepting, and the runtime remembers what it told
    /// plugins. [`Runtime::restart`] is a runtime restart.
    pub fn drop_all_connections(&self) {
        for m in lock(&self.inner.connections).drain(..) {
            m.close();
        }
    }

    /// Restarts the runtime as containerd restarts: every plugin connection closes, pods and
    /// containers survive, and the NRI layer's memory of what it told plugins is gone. The next
    /// `Synchronize` rebuilds it for containers only (upstream `syncPlugin`), so a pod that lived
    /// through the restart is never again stopped or removed for any plugin.
    pub async fn restart(&self) {
        let _l = self.inner.lifecycle.lock().await;
        lock(&self.inner.data).told.clear();
        self.drop_all_connections();
    }

    /// The sandbox of pod `pod_id` exited on its own (its pause process died): it turns NotReady
    /// (pid 0) without any NRI event, as containerd's `handleSandboxExit` does.
    pub fn sandbox_exited(&self, pod_id: &str) -> Result<(), RuntimeError> {
        let mut d = lock(&self.inner.data);
        let pod = d.pods.get_mut(pod_id).ok_or_else(|| RuntimeError::NotFound(format!("pod {pod_id}")))?;
        pod.pid = 0;
        Ok(())
    }

    /// Closes plugin `name`'s trunk while it is being synchronized, after `after_chunks`
    /// `Synchronize` messages were answered (0: before the first). One-shot.
    pub fn close_during_sync(&self, name: &str, after_chunks: usize) {
        *lock(&self.inner.sync_fault) = Some(SyncFault { plugin: name.into(), after_chunks });
    }

    /// Adds pod `pod` and sends `RunPodSandbox`. A pod without a pid gets one (containerd's
    /// sandbox task has one by then). On a plugin error the pod is removed again (the CRI call
    /// fails).
    pub async fn run_pod_sandbox(&self, mut pod: api::PodSandbox) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        {
            let mut d = lock(&self.inner.data);
            if pod.pid == 0 {
                d.last_pid += 1;
                pod.pid = 1000 + d.last_pid;
            }
            d.pods.insert(pod.id.clone(), pod.clone());
        }
        let r = self.inner.broadcast(Event::RunPodSandbox, &pod, None).await;
        {
            let mut d = lock(&self.inner.data);
            d.tell(&pod.id, Some(Told::Running));
            if r.is_err() {
                d.pods.remove(&pod.id);
            }
        }
        self.inner.remove_closed();
        r
    }

    /// Stops pod `pod_id`'s sandbox: it turns NotReady (pid 0); `StopPodSandbox` is sent when
    /// the NRI layer has not yet reported it stopped (so at most once, and never for a pod that
    /// lived through a [`Runtime::restart`]).
    pub async fn stop_pod_sandbox(&self, pod_id: &str) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let pod = self.inner.pod(pod_id)?;
        let tell = lock(&self.inner.data).needs_stopping(pod_id);
        let r = if tell { self.inner.broadcast(Event::StopPodSandbox, &pod, None).await } else { Ok(()) };
        {
            let mut d = lock(&self.inner.data);
            if tell {
                d.tell(pod_id, Some(Told::Stopped));
            }
            if let Some(p) = d.pods.get_mut(pod_id) {
                p.pid = 0;
            }
        }
        self.inner.remove_closed();
        r
    }

    /// Removes pod `pod_id` and its containers; `RemovePodSandbox` is sent when the NRI layer
    /// knows the pod (not after a [`Runtime::restart`]).
    pub async fn remove_pod_sandbox(&self, pod_id: &str) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let pod = self.inner.pod(pod_id)?;
        let tell = lock(&self.inner.data).needs_removal(pod_id);
        let r = if tell { self.inner.broadcast(Event::RemovePodSandbox, &pod, None).await } else { Ok(()) };
        {
            let mut d = lock(&self.inner.data);
            d.tell(pod_id, None);
            d.pods.remove(pod_id);
            let gone: Vec<String> =
                d.containers.values().filter(|c| c.pod_sandbox_id == pod_id).map(|c| c.id.clone()).collect();
            for id in gone {
                d.containers.remove(&id);
                d.tell(&id, None);
            }
        }
        self.inner.remove_closed();
        r
    }

    /// Creates container `ctr` in pod `pod_id`: `CreateContainer` to every subscribed plugin,
    /// answers merged, the adjustment applied to the container and the updates to the others,
    /// then `PostCreateContainer`. Returns the resulting container.
    pub async fn create_container(
        &self,
        pod_id: &str,
        mut ctr: api::Container,
    ) -> Result<api::Container, RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let r = self.inner.create_container(pod_id, &mut ctr).await;
        self.inner.remove_closed();
        r.map(|()| ctr)
    }

    /// Sends `StartContainer` and `PostStartContainer`; the container is then running.
    pub async fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let (pod, ctr) = self.inner.pod_and_container(id)?;
        let mut r = self.inner.broadcast(Event::StartContainer, &pod, Some(&ctr)).await;
        if r.is_ok() {
            {
                let mut d = lock(&self.inner.data);
                if let Some(c) = d.containers.get_mut(id) {
                    c.state = api::ContainerState::CONTAINER_RUNNING.into();
                }
                d.tell(id, Some(Told::Running));
            }
            let (pod, ctr) = self.inner.pod_and_container(id)?;
            r = self.inner.broadcast(Event::PostStartContainer, &pod, Some(&ctr)).await;
        }
        self.inner.remove_closed();
        r
    }

    /// Updates container `id` to `resources` (as the kubelet's `UpdateContainerResources`):
    /// `UpdateContainer` to every subscribed plugin, their updates merged and applied on top,
    /// then `PostUpdateContainer`. Returns the resulting container.
    pub async fn update_container(
        &self,
        id: &str,
        resources: api::LinuxResources,
    ) -> Result<api::Container, RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let r = self.inner.update_container(id, resources).await;
        self.inner.remove_closed();
        r?;
        self.inner.pod_and_container(id).map(|(_, c)| c)
    }

    /// Stops container `id`: `StopContainer` (applying the updates of other containers plugins
    /// return) when the NRI layer has not yet reported it stopped; the container is then stopped.
    pub async fn stop_container(&self, id: &str) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let r = self.inner.stop_container(id).await;
        self.inner.remove_closed();
        r
    }

    /// Removes container `id`: stopped first if need be, then `RemoveContainer` when the NRI
    /// layer knows it; then forgotten.
    pub async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let _l = self.inner.lifecycle.lock().await;
        let tell = lock(&self.inner.data).needs_removal(id);
        let mut r = Ok(());
        if tell {
            r = self.inner.stop_container(id).await;
            let (pod, ctr) = self.inner.pod_and_container(id)?;
            let removed = self.inner.broadcast(Event::RemoveContainer, &pod, Some(&ctr)).await;
            r = r.and(removed);
        }
        {
            let mut d = lock(&self.inner.data);
            d.containers.remove(id);
            d.tell(id, None);
        }
        self.inner.remove_closed();
        r
    }
}

impl Inner {
    fn record(&self, e: HarnessEvent) {
        let n = {
            let mut log = lock(&self.log);
            log.push(e);
            log.len()
        };
        self.log_len.send_replace(n);
    }

    fn record_call(&self, plugin: &str, method: String, error: Option<String>) {
        if self.opts.record_calls {
            self.record(HarnessEvent::Call { plugin: plugin.to_string(), method, error });
        }
    }

    fn active(&self) -> Vec<Arc<PluginConn>> {
        lock(&self.plugins).iter().filter(|p| !p.is_closed()).cloned().collect()
    }

    fn remove_closed(&self) {
        lock(&self.plugins).retain(|p| !p.is_closed());
    }

    fn pod(&self, id: &str) -> Result<api::PodSandbox, RuntimeError> {
        lock(&self.data).pods.get(id).cloned().ok_or_else(|| RuntimeError::NotFound(format!("pod {id}")))
    }

    fn pod_and_container(&self, id: &str) -> Result<(api::PodSandbox, api::Container), RuntimeError> {
        let d = lock(&self.data);
        let c = d.containers.get(id).ok_or_else(|| RuntimeError::NotFound(format!("container {id}")))?;
        let p =
            d.pods.get(&c.pod_sandbox_id).ok_or_else(|| RuntimeError::NotFound(format!("pod {}", c.pod_sandbox_id)))?;
        Ok((p.clone(), c.clone()))
    }

    /// Turns a call result into the request's outcome: fatal errors close the plugin and are
    /// skipped, other errors fail the request.
    fn outcome<T>(&self, p: &PluginConn, method: &str, r: Result<T, CallError>) -> Result<Option<T>, RuntimeError> {
        match r {
            Ok(v) => {
                self.record_call(&p.name, method.to_string(), None);
                Ok(Some(v))
            }
            Err(CallError::Fatal(why)) => {
                self.record_call(&p.name, method.to_string(), Some("FATAL".into()));
                tracing::warn!(plugin = %p.name, method, %why, "closing plugin");
                p.close(format!("{method}: {why}"));
                Ok(None)
            }
            Err(CallError::Status(code, message)) => {
                self.record_call(&p.name, method.to_string(), Some(format!("{code:?}")));
                Err(RuntimeError::Plugin { plugin: p.name.clone(), method: method.to_string(), message })
            }
        }
    }

    /// Sends a lifecycle event to every subscribed plugin, in order.
    async fn broadcast(
        &self,
        e: Event,
        pod: &api::PodSandbox,
        ctr: Option<&api::Container>,
    ) -> Result<(), RuntimeError> {
        for p in self.active() {
            if !p.events.contains(e) {
                continue;
            }
            self.deliver(&p, e, pod, ctr).await?;
        }
        Ok(())
    }

    /// One lifecycle event to one plugin: dedicated RPC (v0.12) with `StateChange` fallback on
    /// UNIMPLEMENTED, or `StateChange` (pre-v0.12).
    async fn deliver(
        &self,
        p: &PluginConn,
        e: Event,
        pod: &api::PodSandbox,
        ctr: Option<&api::Container>,
    ) -> Result<(), RuntimeError> {
        let t = self.opts.request_timeout;
        if self.opts.nri_version == NriVersion::V0_12 {
            let r = dedicated(&p.client, t, e, pod, ctr).await;
            match r {
                Err(CallError::Status(Code::UNIMPLEMENTED, _)) => {
                    self.record_call(&p.name, e.name().to_string(), Some("UNIMPLEMENTED".into()));
                    tracing::info!(plugin = %p.name, event = %e, "plugin does not implement the dedicated RPC; falling back to StateChange");
                }
                r => return self.outcome(p, e.name(), r).map(|_| ()),
            }
        }
        let mut req = api::StateChangeEvent::new();
        req.event = protobuf::EnumOrUnknown::from_i32(e.number());
        req.pod = MessageField::some(pod.clone());
        req.container = ctr.cloned().into();
        let r = p.client.state_change(ctx(t), &req).await.map(|_| ()).map_err(classify);
        self.outcome(p, &format!("StateChange({e})"), r).map(|_| ())
    }

    async fn create_container(&self, pod_id: &str, ctr: &mut api::Container) -> Result<(), RuntimeError> {
        let pod = self.pod(pod_id)?;
        ctr.pod_sandbox_id = pod_id.to_string();
        ctr.state = api::ContainerState::CONTAINER_CREATED.into();
        let mut owners = merge::Owners::default();
        let mut adjust = api::ContainerAdjustment::new();
        let mut updates = merge::Updates::default();
        for p in self.active() {
            if !p.events.contains(Event::CreateContainer) {
                continue;
            }
            let mut req = api::CreateContainerRequest::new();
            req.pod = MessageField::some(pod.clone());
            req.container = MessageField::some(ctr.clone());
            let r = p.client.create_container(ctx(self.opts.request_timeout), &req).await.map_err(classify);
            let Some(rpl) = self.outcome(&p, "CreateContainer", r)? else { continue };
            if let Some(adj) = rpl.adjust.as_ref() {
                merge::adjust(&mut owners, &ctr.id, &mut adjust, adj, &p.name).map_err(RuntimeError::Merge)?;
            }
            for u in &rpl.update {
                if u.container_id == ctr.id {
                    return Err(RuntimeError::Merge(format!(
                        "plugin {:?} asked update of {:?} during creation",
                        p.name, ctr.id
                    )));
                }
                updates.add(&mut owners, u, &p.name).map_err(RuntimeError::Merge)?;
            }
        }
        self.validate_adjustment(&pod, ctr).await?;
        merge::apply_adjustment(ctr, &adjust);
        {
            let mut d = lock(&self.data);
            d.containers.insert(ctr.id.clone(), ctr.clone());
            d.tell(&ctr.id, Some(Told::Created));
        }
        let updates = updates.into_vec();
        self.record_create_updates(updates.len());
        self.apply_updates(&updates).await;
        self.broadcast(Event::PostCreateContainer, &pod, Some(ctr)).await
    }

    /// Calls every plugin subscribed to `ValidateContainerAdjustment` (v0.10+) as a validator:
    /// any error fails the container, as upstream's `validateContainerAdjustment` does. The
    /// request body is left empty: weft's proto does not define it, and the point is the answer.
    async fn validate_adjustment(&self, _pod: &api::PodSandbox, ctr: &api::Container) -> Result<(), RuntimeError> {
        for p in self.active() {
            if !p.events.contains(Event::ValidateContainerAdjustment) {
                continue;
            }
            let mut req = ttrpc::Request::new();
            req.service = "nri.pkg.api.v1alpha1.Plugin".into();
            req.method = "ValidateContainerAdjustment".into();
            req.timeout_nano = i64::try_from(self.opts.request_timeout.as_nanos()).unwrap_or(i64::MAX);
            let r = match p.raw.request(req).await {
                Ok(rpl) => match rpl.status.as_ref() {
                    Some(st) if st.code() != Code::OK => Err(CallError::Status(st.code(), st.message.clone())),
                    _ => Ok(()),
                },
                Err(e) => Err(classify(e)),
            };
            if let Err(e) = self.outcome(&p, "ValidateContainerAdjustment", r) {
                return Err(RuntimeError::Merge(format!("validation of container {:?} failed: {e}", ctr.id)));
            }
        }
        Ok(())
    }

    async fn update_container(&self, id: &str, resources: api::LinuxResources) -> Result<(), RuntimeError> {
        let (pod, ctr) = self.pod_and_container(id)?;
        let mut owners = merge::Owners::default();
        let mut updates = merge::Updates::default();
        for p in self.active() {
            if !p.events.contains(Event::UpdateContainer) {
                continue;
            }
            let mut req = api::UpdateContainerRequest::new();
            req.pod = MessageField::some(pod.clone());
            req.container = MessageField::some(ctr.clone());
            req.linux_resources = MessageField::some(resources.clone());
            let r = p.client.update_container(ctx(self.opts.request_timeout), &req).await.map_err(classify);
            let Some(rpl) = self.outcome(&p, "UpdateContainer", r)? else { continue };
            for u in &rpl.update {
                updates.add(&mut owners, u, &p.name).map_err(RuntimeError::Merge)?;
            }
        }
        if let Some(c) = lock(&self.data).containers.get_mut(id) {
            merge::apply_resources(merge::container_resources(c), &resources);
        }
        self.apply_updates(&updates.into_vec()).await;
        let (pod, ctr) = self.pod_and_container(id)?;
        self.broadcast(Event::PostUpdateContainer, &pod, Some(&ctr)).await
    }

    /// Stops container `id`, telling plugins when the NRI layer has not yet (`stopContainer`).
    async fn stop_container(&self, id: &str) -> Result<(), RuntimeError> {
        let (pod, ctr) = self.pod_and_container(id)?;
        if !lock(&self.data).needs_stopping(id) {
            if let Some(c) = lock(&self.data).containers.get_mut(id) {
                c.state = api::ContainerState::CONTAINER_STOPPED.into();
            }
            return Ok(());
        }
        lock(&self.data).tell(id, Some(Told::Stopped));
        let mut owners = merge::Owners::default();
        let mut updates = merge::Updates::default();
        for p in self.active() {
            if !p.events.contains(Event::StopContainer) {
                continue;
            }
            let mut req = api::StopContainerRequest::new();
            req.pod = MessageField::some(pod.clone());
            req.container = MessageField::some(ctr.clone());
            let r = p.client.stop_container(ctx(self.opts.request_timeout), &req).await.map_err(classify);
            let Some(rpl) = self.outcome(&p, "StopContainer", r)? else { continue };
            for u in &rpl.update {
                updates.add(&mut owners, u, &p.name).map_err(RuntimeError::Merge)?;
            }
        }
        if let Some(c) = lock(&self.data).containers.get_mut(id) {
            c.state = api::ContainerState::CONTAINER_STOPPED.into();
        }
        self.apply_updates(&updates.into_vec()).await;
        Ok(())
    }

    /// Synchronizes a configured plugin (lifecycle lock held by the caller). Returns the
    /// number of messages sent and the updates, or why the plugin must be closed.
    async fn synchronize(&self, p: &PluginConn) -> Result<(usize, Vec<api::ContainerUpdate>), String> {
        let (pods, ctrs): (Vec<_>, Vec<_>) = {
            let mut d = lock(&self.data);
            // Upstream's syncPlugin: the NRI layer's state is rebuilt for containers (pods are
            // left as they are: after a restart, unknown).
            let states: Vec<(String, Option<Told>)> = d
                .containers
                .values()
                .map(|c| {
                    let told = match c.state.enum_value_or_default() {
                        api::ContainerState::CONTAINER_CREATED => Some(Told::Created),
                        api::ContainerState::CONTAINER_RUNNING | api::ContainerState::CONTAINER_PAUSED => {
                            Some(Told::Running)
                        }
                        api::ContainerState::CONTAINER_STOPPED => Some(Told::Stopped),
                        _ => None,
                    };
                    (c.id.clone(), told)
                })
                .collect();
            for (id, told) in states {
                d.tell(&id, told);
            }
            (d.pods.values().cloned().collect(), d.containers.values().cloned().collect())
        };
        let fault = {
            let mut f = lock(&self.sync_fault);
            match f.as_ref() {
                Some(x) if x.plugin == p.name => f.take().map(|x| x.after_chunks),
                _ => None,
            }
        };
        let deadline = tokio::time::Instant::now() + self.opts.request_timeout;
        let (mut pods_left, mut ctrs_left) = (&pods[..], &ctrs[..]);
        let (mut pods_per, mut ctrs_per) = (pods.len(), ctrs.len());
        let mut sent = 0usize;
        loop {
            if fault == Some(sent) {
                p.close("closed by the harness during Synchronize".into());
                return Err("closed by the harness during Synchronize".into());
            }
            let mut req = api::SynchronizeRequest::new();
            req.pods = pods_left[..pods_per].to_vec();
            req.containers = ctrs_left[..ctrs_per].to_vec();
            req.more = pods_left.len() > pods_per || ctrs_left.len() > ctrs_per;
            let size = req.compute_size() as usize;
            if size > self.opts.max_message_size {
                // Upstream's recalcObjsPerSyncMsg, on the size its ttrpc client refuses.
                const MIN_OBJS: usize = 8;
                if pods_per + ctrs_per <= MIN_OBJS {
                    return Err("failed to synchronize plugin with split messages".into());
                }
                let factor = (self.opts.max_message_size as f64 / size as f64).min(0.9);
                pods_per = (pods_per as f64 * factor) as usize;
                ctrs_per = (ctrs_per as f64 * factor) as usize;
                if pods_per + ctrs_per < MIN_OBJS {
                    pods_per = (MIN_OBJS / 2).min(pods_left.len());
                    ctrs_per = (MIN_OBJS / 2).min(ctrs_left.len());
                }
                continue;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let rpl = match p.client.synchronize(ctx(left), &req).await.map_err(classify) {
                Ok(r) => r,
                Err(CallError::Fatal(why)) => return Err(format!("Synchronize: {why}")),
                Err(CallError::Status(code, m)) => return Err(format!("Synchronize failed: {code:?}: {m}")),
            };
            sent += 1;
            self.record_call(&p.name, format!("Synchronize(more={})", req.more), None);
            if !req.more {
                return Ok((sent, rpl.update));
            }
            if !rpl.update.is_empty() || !rpl.more {
                return Err("plugin does not handle split sync requests".into());
            }
            pods_left = &pods_left[pods_per..];
            ctrs_left = &ctrs_left[ctrs_per..];
            pods_per = pods_per.min(pods_left.len());
            ctrs_per = ctrs_per.min(ctrs_left.len());
        }
    }
}

impl Inner {
    /// Applies updates to the stored containers one at a time, each costing
    /// [`RuntimeOptions::update_cost`] (the caller holds the lifecycle lock, as containerd holds
    /// its NRI lock through `applyUpdates`); returns the ids not found.
    async fn apply_updates(&self, updates: &[api::ContainerUpdate]) -> Vec<String> {
        let mut failed = Vec::new();
        for u in updates {
            {
                let mut d = lock(&self.data);
                match d.containers.get_mut(&u.container_id) {
                    Some(c) => {
                        if let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                            merge::apply_resources(merge::container_resources(c), res);
                        }
                    }
                    None => {
                        failed.push(u.container_id.clone());
                        continue;
                    }
                }
            }
            if !self.opts.update_cost.is_zero() {
                tokio::time::sleep(self.opts.update_cost).await;
            }
        }
        failed
    }

    fn record_create_updates(&self, n: usize) {
        if n > 0 {
            self.record(HarnessEvent::CreateUpdates { updates: n });
        }
    }
}

async fn dedicated(
    c: &api::PluginClient,
    t: Duration,
    e: Event,
    pod: &api::PodSandbox,
    ctr: Option<&api::Container>,
) -> Result<(), CallError> {
    let pod = MessageField::some(pod.clone());
    let ctr: MessageField<api::Container> = ctr.cloned().into();
    macro_rules! pod_call {
        ($req:ident, $m:ident) => {{
            let mut r = api::$req::new();
            r.pod = pod;
            c.$m(ctx(t), &r).await.map(|_| ())
        }};
    }
    macro_rules! ctr_call {
        ($req:ident, $m:ident) => {{
            let mut r = api::$req::new();
            r.pod = pod;
            r.container = ctr;
            c.$m(ctx(t), &r).await.map(|_| ())
        }};
    }
    let r = match e {
        Event::RunPodSandbox => pod_call!(RunPodSandboxRequest, run_pod_sandbox),
        Event::StopPodSandbox => pod_call!(StopPodSandboxRequest, stop_pod_sandbox),
        Event::RemovePodSandbox => pod_call!(RemovePodSandboxRequest, remove_pod_sandbox),
        Event::PostUpdatePodSandbox => pod_call!(PostUpdatePodSandboxRequest, post_update_pod_sandbox),
        Event::PostCreateContainer => ctr_call!(PostCreateContainerRequest, post_create_container),
        Event::StartContainer => ctr_call!(StartContainerRequest, start_container),
        Event::PostStartContainer => ctr_call!(PostStartContainerRequest, post_start_container),
        Event::PostUpdateContainer => ctr_call!(PostUpdateContainerRequest, post_update_container),
        Event::RemoveContainer => ctr_call!(RemoveContainerRequest, remove_container),
        other => return Err(CallError::Status(Code::INTERNAL, format!("{other} is no lifecycle event"))),
    };
    r.map_err(classify)
}

async fn accept_loop(inner: Arc<Inner>, listener: tokio::net::UnixListener) {
    loop {
        let stream = tokio::select! {
            _ = inner.stop.cancelled() => break,
            s = listener.accept() => match s {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "harness accept failed");
                    continue;
                }
            },
        };
        // Plugins are set up one at a time, as upstream's accept loop does.
        tokio::select! {
            _ = inner.stop.cancelled() => break,
            _ = setup_plugin(&inner, stream) => {}
        }
    }
    for m in lock(&inner.connections).drain(..) {
        m.close();
    }
    let _ = std::fs::remove_file(&inner.path);
}

/// Registration as the `Runtime` service sees it.
struct Registration {
    name: String,
    index: String,
    nri_version: String,
}

struct RuntimeService {
    inner: std::sync::Weak<Inner>,
    registered: Mutex<Option<tokio::sync::oneshot::Sender<Registration>>>,
    name: Mutex<String>,
    configured: tokio::sync::Notify,
    hold_reply: bool,
}

#[async_trait]
impl api::Runtime for RuntimeService {
    async fn register_plugin(&self, _: &TtrpcContext, req: api::RegisterPluginRequest) -> ttrpc::Result<api::Empty> {
        if !valid_name(&req.plugin_name) {
            return Err(ttrpc::Error::RpcStatus(get_status(
                Code::INVALID_ARGUMENT,
                format!("invalid plugin name {:?}", req.plugin_name),
            )));
        }
        if !valid_index(&req.plugin_idx) {
            return Err(ttrpc::Error::RpcStatus(get_status(
                Code::INVALID_ARGUMENT,
                format!("invalid plugin index {:?}", req.plugin_idx),
            )));
        }
        *lock(&self.name) = format!("{}-{}", req.plugin_idx, req.plugin_name);
        let configured = self.configured.notified();
        if let Some(tx) = lock(&self.registered).take() {
            let _ = tx.send(Registration {
                name: req.plugin_name.clone(),
                index: req.plugin_idx.clone(),
                nri_version: req.NRI_version.clone(),
            });
        }
        if self.hold_reply {
            configured.await;
        }
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let Some(inner) = self.inner.upgrade() else {
            return Err(ttrpc::Error::RpcStatus(get_status(Code::UNAVAILABLE, "runtime stopped")));
        };
        // containerd applies the updates under its NRI lock (`updateFromPlugin`) and ignores the
        // evictions (upstream's adaptation passes only `req.Update` on).
        let failed_ids = {
            let _l = inner.lifecycle.lock().await;
            inner.apply_updates(&req.update).await
        };
        let mut rpl = api::UpdateContainersResponse::new();
        rpl.failed =
            req.update.iter().filter(|u| failed_ids.contains(&u.container_id) && !u.ignore_failure).cloned().collect();
        inner.record(HarnessEvent::Unsolicited {
            plugin: lock(&self.name).clone(),
            update: req.update,
            evict: req.evict,
            failed: failed_ids,
        });
        Ok(rpl)
    }
}

async fn setup_plugin(inner: &Arc<Inner>, stream: tokio::net::UnixStream) {
    let mux = Mux::with_read_limit(stream, inner.opts.read_buffer);
    let (conn1, conn2) = match (mux.open(PLUGIN_SERVICE_CONN), mux.open(RUNTIME_SERVICE_CONN)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return,
    };
    lock(&inner.connections).retain(|m| !m.is_closed());
    lock(&inner.connections).push(mux.clone());
    let (reg_tx, reg_rx) = tokio::sync::oneshot::channel();
    let svc = Arc::new(RuntimeService {
        inner: Arc::downgrade(inner),
        registered: Mutex::new(Some(reg_tx)),
        name: Mutex::new("??-plugin".into()),
        configured: tokio::sync::Notify::new(),
        hold_reply: inner.opts.configure_before_register_reply,
    });
    let listener = Listener::new(futures::stream::once(async move { Ok::<_, std::io::Error>(conn2) }));
    let mut server =
        ttrpc::r#async::Server::new().register_service(api::create_runtime(svc.clone())).add_listener(listener);
    if server.start().await.is_err() {
        mux.close();
        return;
    }
    // Read only once the Runtime service is served (upstream's blocked read).
    mux.start();
    let raw = ttrpc::r#async::Client::new(Socket::new(conn1));
    let client = api::PluginClient::new(raw.clone());

    let drop_with = |reason: String| {
        mux.close();
        inner.record(HarnessEvent::Dropped { plugin: lock(&svc.name).clone(), reason });
    };

    let reg = tokio::select! {
        r = reg_rx => r.ok(),
        _ = mux.closed() => None,
        _ = tokio::time::sleep(inner.opts.registration_timeout) => {
            drop_with("plugin registration timed out".into());
            return;
        }
    };
    let Some(reg) = reg else {
        drop_with("failed to register plugin, connection closed".into());
        return;
    };
    let name = format!("{}-{}", reg.index, reg.name);
    inner.record(HarnessEvent::Registered { plugin: name.clone(), nri_version: reg.nri_version.clone() });

    let mut req = api::ConfigureRequest::new();
    req.config = inner.opts.config.clone();
    req.runtime_name = inner.opts.name.clone();
    req.runtime_version = inner.opts.version.clone();
    if inner.opts.send_timeouts {
        req.registration_timeout = inner.opts.registration_timeout.as_millis() as i64;
        req.request_timeout = inner.opts.request_timeout.as_millis() as i64;
    }
    if inner.opts.nri_version == NriVersion::V0_12 {
        req.NRI_version = "v0.12.0".into();
    }
    let configured = client.configure(ctx(inner.opts.request_timeout), &req).await;
    svc.configured.notify_waiters();
    let valid = inner.opts.nri_version.valid_events();
    let events = match configured {
        // An empty subscription is every valid event (upstream's `configure`).
        Ok(rpl) if rpl.events == 0 => valid,
        Ok(rpl) => EventMask::from_bits(rpl.events as u32),
        Err(e) => {
            drop_with(format!("failed to configure plugin: {}", describe(e)));
            return;
        }
    };
    let extra = events.bits() & !valid.bits();
    if extra != 0 {
        drop_with(format!("invalid plugin events: 0x{extra:x}"));
        return;
    }
    inner.record(HarnessEvent::Configured { plugin: name.clone(), events });

    let conn = Arc::new(PluginConn {
        name: name.clone(),
        index: reg.index,
        nri_version: reg.nri_version,
        events,
        client,
        raw,
        mux: mux.clone(),
        reason: Mutex::new(None),
    });
    // Synchronize under the lifecycle lock, then join the plugin list.
    {
        let _l = inner.lifecycle.lock().await;
        match inner.synchronize(&conn).await {
            Ok((chunks, updates)) => {
                inner.apply_updates(&updates).await;
                let mut plugins = lock(&inner.plugins);
                plugins.push(conn.clone());
                plugins.sort_by(|a, b| (&a.index, &a.name).cmp(&(&b.index, &b.name)));
                drop(plugins);
                inner.record(HarnessEvent::Synchronized { plugin: name.clone(), chunks, updates: updates.len() });
            }
            Err(why) => {
                let reason = lock(&conn.reason).clone().unwrap_or(why);
                drop_with(reason);
                return;
            }
        }
    }

    // Watch the connection: when it closes, log why, keep the server until then.
    let watcher = inner.clone();
    tokio::spawn(async move {
        conn.mux.closed().await;
        drop(server);
        let reason = lock(&conn.reason).clone().or_else(|| conn.mux.close_reason()).unwrap_or_default();
        watcher.record(HarnessEvent::Dropped { plugin: conn.name.clone(), reason });
        lock(&watcher.plugins).retain(|p| !Arc::ptr_eq(p, &conn));
    });
}

fn describe(e: ttrpc::Error) -> String {
    match classify(e) {
        CallError::Fatal(m) => m,
        CallError::Status(c, m) => format!("{c:?}: {m}"),
    }
}
