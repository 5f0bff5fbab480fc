//! The server handle: lifecycle, clients, and the test-control API.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::controls::{Fault, RecordedRequest, RequestMatcher};
use crate::error::FakeError;
use crate::ops;
use crate::registry::ResourceSpec;
use crate::store::State;

/// Response body type of the server.
pub(crate) type BoxBody = http_body_util::combinators::BoxBody<Bytes, io::Error>;

/// Tunables of a [`FakeApiServer`].
#[derive(Debug, Clone)]
pub struct FakeApiConfig {
    /// How often open watches with `allowWatchBookmarks=true` get a BOOKMARK (default 3 s).
    pub bookmark_interval: Duration,
    /// How many events the watch history keeps (default 10 000). A watch from a resourceVersion
    /// older than the retained history gets a 410 `ERROR` event.
    pub history_limit: usize,
}

impl Default for FakeApiConfig {
    fn default() -> Self {
        Self { bookmark_interval: Duration::from_secs(3), history_limit: 10_000 }
    }
}

/// State shared by the handle, the connection tasks and the watch tasks.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The global resourceVersion, published after every write (watches wait on it).
    rv_tx: watch::Sender<u64>,
    /// Bumped on every change of any kind (objects, request log, open watches): `wait_for`.
    changes_tx: watch::Sender<u64>,
    /// Bumped by `drop_watches`.
    drops_tx: watch::Sender<u64>,
    /// Bumped by `send_bookmarks`.
    bookmarks_tx: watch::Sender<u64>,
    pub(crate) config: FakeApiConfig,
    pub(crate) address: String,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock, then tells watches and waiters about the change.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (out, rv) = {
            let mut st = self.lock();
            let out = f(&mut st);
            (out, st.rv())
        };
        self.rv_tx.send_if_modified(|cur| {
            let changed = *cur != rv;
            *cur = rv;
            changed
        });
        self.changes_tx.send_modify(|c| *c = c.wrapping_add(1));
        out
    }

    pub(crate) fn subscribe_rv(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }

    pub(crate) fn subscribe_drops(&self) -> watch::Receiver<u64> {
        self.drops_tx.subscribe()
    }

    pub(crate) fn subscribe_bookmarks(&self) -> watch::Receiver<u64> {
        self.bookmarks_tx.subscribe()
    }
}

/// A fake Kubernetes API server on `127.0.0.1`, for tests. See the crate documentation.
///
/// Dropping the handle stops the server (as does [`FakeApiServer::shutdown`]).
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn resource_name<K: kube::Resource<DynamicType = ()>>() -> String {
    let group = K::group(&());
    let plural = K::plural(&());
    if group.is_empty() { plural.into_owned() } else { format!("{plural}.{group}") }
}

impl FakeApiServer {
    /// Starts a server with the default configuration on an ephemeral loopback port.
    ///
    /// # Panics
    /// If no loopback port can be bound (use [`FakeApiServer::start_with`] to handle that).
    pub async fn start() -> Self {
        match Self::start_with(FakeApiConfig::default()).await {
            Ok(server) => server,
            Err(e) => panic!("weft-fakeapi: {e}"),
        }
    }

    /// Starts a server with the given configuration on an ephemeral loopback port.
    /// Must be called inside a Tokio runtime.
    pub async fn start_with(config: FakeApiConfig) -> Result<Self, FakeError> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(FakeError::Bind)?;
        let addr = listener.local_addr().map_err(FakeError::Bind)?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default()
            ^ u64::from(addr.port()).rotate_left(40);
        let state = State::new(config.history_limit, seed);
        let rv = state.rv();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            rv_tx: watch::Sender::new(rv),
            changes_tx: watch::Sender::new(0),
            drops_tx: watch::Sender::new(0),
            bookmarks_tx: watch::Sender::new(0),
            config,
            address: addr.to_string(),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self { shared, addr, task })
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube `Config` for the server (default namespace `default`, no auth).
    pub fn kube_config(&self) -> Result<kube::Config, FakeError> {
        Ok(kube::Config::new(self.url().parse::<http::Uri>()?))
    }

    /// A kube `Client` for the server. Must be called inside a Tokio runtime.
    ///
    /// # Panics
    /// If kube cannot build a client (see [`FakeApiServer::try_client`]).
    pub fn client(&self) -> kube::Client {
        match self.try_client() {
            Ok(c) => c,
            Err(e) => panic!("weft-fakeapi: {e}"),
        }
    }

    /// A kube `Client` for the server, or why it could not be built.
    pub fn try_client(&self) -> Result<kube::Client, FakeError> {
        Ok(kube::Client::try_from(self.kube_config()?)?)
    }

    /// A kubeconfig document whose cluster, user and context are all named `fake`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\npreferences: {{}}\n",
            self.url()
        )
    }

    /// Writes [`FakeApiServer::kubeconfig_yaml`] to a file (for a spawned binary's `--kubeconfig`).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), FakeError> {
        std::fs::write(path, self.kubeconfig_yaml())
            .map_err(|source| FakeError::Io { path: path.to_path_buf(), source })
    }

    /// Stops the server: closes the listener and every connection (open watches end abruptly).
    /// Idempotent; also done on drop.
    pub fn shutdown(&self) {
        self.task.abort();
    }

    // ----- registry and objects -----

    /// Serves another resource (or replaces one), e.g. a custom resource without creating its CRD.
    pub fn register(&self, spec: ResourceSpec) {
        self.shared.write(|st| st.registry.register(spec));
    }

    /// Stores an object as given, creating or replacing it, and returns the stored form.
    ///
    /// The resource comes from `apiVersion` and `kind`. Unlike a POST, `.status` is kept as
    /// given and no field ownership is recorded; missing `uid`, `creationTimestamp` and
    /// `generation` are filled in, namespaced objects without a namespace go to `default`, and
    /// the write bumps the resourceVersion and emits ADDED (or MODIFIED) to watches.
    pub fn insert(&self, obj: Value) -> Result<Value, FakeError> {
        self.shared.write(|st| ops::insert(st, obj))
    }

    /// [`FakeApiServer::insert`] for a typed object; returns the stored object.
    pub fn insert_typed<K>(&self, obj: &K) -> Result<K, FakeError>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let mut value = serde_json::to_value(obj)?;
        if let Some(map) = value.as_object_mut() {
            map.entry("apiVersion").or_insert_with(|| Value::String(K::api_version(&()).into_owned()));
            map.entry("kind").or_insert_with(|| Value::String(K::kind(&()).into_owned()));
        }
        Ok(serde_json::from_value(self.insert(value)?)?)
    }

    /// An object by resource (`pods`, `nodes`, `leases.coordination.k8s.io`, `events.events.k8s.io`),
    /// namespace (ignored for cluster-scoped resources) and name. `None` if the resource is unknown
    /// or the object absent.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.shared.lock();
        let spec = st.registry.by_name(resource)?.clone();
        let ns = if spec.namespaced { namespace } else { None };
        ops::get(&st, &spec, ns, name).ok()
    }

    /// [`FakeApiServer::get`] for a typed object.
    pub fn get_typed<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<K>, FakeError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.get(&resource_name::<K>(), namespace, name).map(serde_json::from_value).transpose().map_err(Into::into)
    }

    /// Every object of a resource, in one namespace or (with `None`) all, ordered by namespace and name.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let st = self.shared.lock();
        let Some(spec) = st.registry.by_name(resource).cloned() else { return Vec::new() };
        let filter = crate::selectors::Filter {
            namespace: if spec.namespaced { namespace.map(str::to_owned) } else { None },
            ..Default::default()
        };
        st.list(&spec.group_resource(), &filter, None).into_iter().map(|o| ops::present(&spec, o)).collect()
    }

    /// [`FakeApiServer::list`] for a typed resource.
    pub fn list_typed<K>(&self, namespace: Option<&str>) -> Result<Vec<K>, FakeError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.list(&resource_name::<K>(), namespace)
            .into_iter()
            .map(|v| serde_json::from_value(v).map_err(Into::into))
            .collect()
    }

    /// A write by a "second writer" behind the clients' backs: runs `f` on the stored object and
    /// commits the result with a new resourceVersion (MODIFIED event), even if `f` changed nothing,
    /// so a client holding the old resourceVersion now gets 409 Conflict. `generation` is bumped if
    /// the spec changed; an object being deleted whose finalizers `f` empties is removed.
    pub fn modify(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, FakeError> {
        self.shared.write(|st| {
            let spec = ops::resolve(st, resource)?;
            ops::modify(st, &spec, namespace, name, f)
        })
    }

    /// Bumps an object's resourceVersion without changing it ([`FakeApiServer::modify`] with a no-op).
    pub fn touch(&self, resource: &str, namespace: Option<&str>, name: &str) -> Result<Value, FakeError> {
        self.modify(resource, namespace, name, |_| {})
    }

    /// Deletes an object at once, ignoring finalizers (DELETED event). Returns its last state.
    pub fn remove(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.shared.write(|st| {
            let spec = st.registry.by_name(resource)?.clone();
            ops::remove(st, &spec, namespace, name)
        })
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv()
    }

    // ----- watches -----

    /// Ends every open watch now, abruptly (the connection is aborted mid-stream, as when a
    /// load balancer drops it). kube's watcher sees the stream end and re-watches from the last
    /// resourceVersion it saw.
    pub fn drop_watches(&self) {
        self.shared.drops_tx.send_modify(|c| *c = c.wrapping_add(1));
    }

    /// The next `n` watch requests are answered with a single `ERROR` event carrying a 410
    /// `Expired` Status (then the stream ends), which makes kube's watcher relist.
    pub fn expire_next_watches(&self, n: usize) {
        self.shared.write(|st| st.expire_watches = n);
    }

    /// Forgets the retained event history, as etcd compaction does: any watch (new or open and
    /// behind) from a resourceVersion older than now gets a 410 `ERROR` event.
    pub fn compact_history(&self) {
        self.shared.write(State::compact);
    }

    /// Sends a BOOKMARK now on every open watch that allows bookmarks.
    pub fn send_bookmarks(&self) {
        self.shared.bookmarks_tx.send_modify(|c| *c = c.wrapping_add(1));
    }

    /// How many watch streams are open.
    pub fn open_watches(&self) -> usize {
        self.shared.lock().open_watches
    }

    // ----- faults -----

    /// The next `times` requests matching `matcher` fail with `code` and the usual reason for it
    /// (409 Conflict, 500 InternalError, 404 NotFound, 429 TooManyRequests, …), without touching
    /// any object. Earlier rules are consulted first. Note that kube's client retries 429, 503 and
    /// 504 by itself.
    pub fn fail_next(&self, matcher: RequestMatcher, code: u16, times: usize) {
        self.shared.write(|st| st.faults.push(Fault { matcher, code, remaining: times }));
    }

    /// Drops every pending injected failure.
    pub fn clear_faults(&self) {
        self.shared.write(|st| st.faults.clear());
    }

    // ----- request log -----

    /// Every resource request received so far, in order. A request is logged before its effect
    /// can be seen (a waiter woken by a stored object finds the request that stored it); its
    /// `code` is 0 until it has been answered.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        self.shared.write(|st| {
            st.requests.clear();
            st.requests_epoch += 1;
        });
    }

    // ----- waiting -----

    /// Waits until `pred` holds, re-checking after every change (object write, request logged,
    /// watch opened or closed); no polling. Wrap it in `tokio::time::timeout` as a hang guard.
    pub async fn wait_for(&self, mut pred: impl FnMut(&Self) -> bool) {
        let mut rx = self.shared.changes_tx.subscribe();
        loop {
            rx.borrow_and_update();
            if pred(self) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until the object exists and `pred` holds for it; returns it.
    pub async fn wait_for_object(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let mut found = None;
        self.wait_for(|s| {
            found = s.get(resource, namespace, name).filter(|v| pred(v));
            found.is_some()
        })
        .await;
        found.unwrap_or(Value::Null)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Owning the connections here means aborting this task (shutdown/drop) closes them all.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |req| crate::http::serve(Arc::clone(&shared), req));
                        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "fake apiserver connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fake apiserver accept failed");
                    tokio::task::yield_now().await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
