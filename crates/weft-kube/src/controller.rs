//! The controller skeleton every weft controller runs on: a kube-runtime [`Controller`] with
//! finalizers, per-object exponential backoff, Events, metrics and graceful shutdown.
//!
//! A controller is a [`Reconciler`]: `apply` brings the world in line with one object, `cleanup`
//! undoes what `apply` made once the object is being deleted (only when the reconciler names a
//! finalizer). The skeleton guarantees:
//!
//! - **State comes from the API server.** The object handed to `apply` is the reflector's latest
//!   copy; nothing survives a restart but what is in the API. Reconcilers must be idempotent and
//!   compare before they write (see [`crate::write`]).
//! - **Finalizers** are added before the first `apply` and removed only after `cleanup` succeeded
//!   (kube-runtime's [`finalizer`] helper, a JSON patch with a `test` op). Cleanup runs again only if
//!   it failed or the finalizer could not be removed, so it runs once per deletion in the normal case.
//! - **Errors** requeue the object after `base · 2^(failures-1)`, capped at `max`; a success resets
//!   the count. Each failure emits a `Warning` Event `ReconcileFailed` on the object.
//! - **Objects deleted mid-reconcile** are not errors: when a reconcile fails with a 404 and a fresh
//!   read shows the object gone, the failure is dropped (no Event, no requeue).
//! - **Shutdown**: when the shutdown future completes, no new reconciles start and running ones
//!   finish before [`run`] returns.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a reconcile failed with: the reconciler's own error, or adding/removing the finalizer.
pub type ReconcileError<E> = finalizer::Error<E>;

/// One controller's logic. See the module docs for what the skeleton adds around it.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// The reconciler's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The finalizer this controller keeps on its objects (e.g. `numanetwork.weft.io/cleanup`), or
    /// `None` when deleting an object needs no cleanup.
    fn finalizer(&self) -> Option<&str> {
        None
    }

    /// Bring the world in line with `obj`.
    fn apply(&self, obj: Arc<K>, ctx: &Context) -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// Undo what `apply` made; called while `obj` is being deleted and still carries the finalizer.
    fn cleanup(&self, obj: Arc<K>, ctx: &Context) -> impl Future<Output = Result<Action, Self::Error>> + Send {
        let _ = (obj, ctx);
        std::future::ready(Ok(Action::await_change()))
    }
}

/// What every reconcile gets: the client, an Event recorder and the field manager for writes.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Events about objects.
    pub recorder: Recorder,
    /// Field manager for server-side apply and other writes.
    pub field_manager: String,
    /// Reconcile metrics.
    pub metrics: ControllerMetrics,
}

impl Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("field_manager", &self.field_manager).finish_non_exhaustive()
    }
}

impl Context {
    /// A context whose Events are reported by `controller` (e.g. `weft-controller`) from `instance`
    /// (the pod name, when known).
    pub fn new(
        client: Client,
        controller: &str,
        instance: Option<String>,
        field_manager: &str,
        metrics: ControllerMetrics,
    ) -> Context {
        let reporter = Reporter { controller: controller.to_string(), instance };
        let recorder = Recorder::new(client.clone(), reporter);
        Context { recorder, client, field_manager: field_manager.to_string(), metrics }
    }

    /// Publish an Event about `obj`; failures are logged, never returned (Events are best effort).
    pub async fn event<K>(&self, obj: &K, type_: EventType, reason: &str, action: &str, note: Option<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        let ev = KubeEvent { type_, reason: reason.to_string(), note, action: action.to_string(), secondary: None };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "publishing an Event failed");
        }
    }
}

/// Tuning of one controller.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name in logs, metrics and Events (e.g. `numanetwork`).
    pub name: &'static str,
    /// Reconciles running at once (0 = unbounded).
    pub concurrency: u16,
    /// Wait for a burst of changes to one object to settle before reconciling it.
    pub debounce: Duration,
    /// Requeue delay after the first failure.
    pub backoff_base: Duration,
    /// Longest requeue delay after failures.
    pub backoff_max: Duration,
}

impl Settings {
    /// Defaults: 4 concurrent reconciles, 100 ms debounce, backoff from 1 s to 5 min.
    pub fn new(name: &'static str) -> Settings {
        Settings {
            name,
            concurrency: 4,
            debounce: Duration::from_millis(100),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }

    /// Requeue delay after `failures` consecutive failures (≥ 1).
    pub fn backoff(&self, failures: u32) -> Duration {
        crate::write::doubling_backoff(self.backoff_base, self.backoff_max, failures)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

/// Reconcile metrics of every controller in the process.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    reconciles: Family<ResultLabels, Counter>,
    duration: Family<ControllerLabels, Histogram>,
    finished: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
            reconciles: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16))),
            finished: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl ControllerMetrics {
    /// Metrics registered in `registry`: `weft_controller_reconciles_total{controller,result}` and
    /// `weft_controller_reconcile_duration_seconds{controller}`.
    pub fn register(registry: &mut Registry) -> ControllerMetrics {
        let m = ControllerMetrics::default();
        let sub = registry.sub_registry_with_prefix("controller");
        sub.register("reconciles", "Reconciles by controller and result (success, error)", m.reconciles.clone());
        sub.register("reconcile_duration_seconds", "Time one reconcile took, by controller", m.duration.clone());
        m
    }

    /// Reconciles of `controller` that ended with `result` (`success` or `error`) so far.
    pub fn reconciles(&self, controller: &str, result: &str) -> u64 {
        self.reconciles.get_or_create(&ResultLabels { controller: controller.into(), result: result.into() }).get()
    }

    /// A receiver whose value counts finished reconciles (of every controller); wait on it instead
    /// of polling the counters.
    pub fn finished(&self) -> tokio::sync::watch::Receiver<u64> {
        self.finished.subscribe()
    }

    fn record(&self, controller: &str, ok: bool, took: Duration) {
        let result = if ok { "success" } else { "error" };
        self.reconciles.get_or_create(&ResultLabels { controller: controller.into(), result: result.into() }).inc();
        self.duration.get_or_create(&ControllerLabels { controller: controller.into() }).observe(took.as_secs_f64());
        self.finished.send_modify(|n| *n += 1);
    }
}

/// Shared state of one running controller.
struct Shared<K, R> {
    reconciler: Arc<R>,
    ctx: Context,
    settings: Settings,
    scope: Scope<K>,
    failures: Mutex<HashMap<(Option<String>, String), u32>>,
}

/// Run `reconciler` over the objects of `api` (filtered by `watch_config`) until `shutdown`
/// completes, then let running reconciles finish and return.
pub async fn run<K, R>(
    api: Api<K>,
    watch_config: watcher::Config,
    scope: Scope<K>,
    reconciler: Arc<R>,
    ctx: Context,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    run_with(api, watch_config, scope, reconciler, ctx, settings, shutdown, |c| c).await;
}

/// [`run`], with `configure` applied to the kube-runtime [`Controller`] before it starts: more
/// triggers, e.g. the objects a reconciler owns (`owns_stream`), so that deleting or changing one
/// reconciles its owner.
#[expect(clippy::too_many_arguments, reason = "run's arguments plus the hook")]
pub async fn run_with<K, R>(
    api: Api<K>,
    watch_config: watcher::Config,
    scope: Scope<K>,
    reconciler: Arc<R>,
    ctx: Context,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    configure: impl FnOnce(Controller<K>) -> Controller<K>,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let name = settings.name;
    let config = controller::Config::default().concurrency(settings.concurrency).debounce(settings.debounce);
    let shared = Arc::new(Shared { reconciler, ctx, settings, scope, failures: Mutex::new(HashMap::new()) });
    tracing::info!(controller = name, kind = %K::kind(&()), "controller starting");
    configure(Controller::new(api, watch_config))
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K, R>, error_policy::<K, R>, shared)
        .for_each(|result| async move {
            match result {
                Ok((obj, action)) => tracing::debug!(controller = name, %obj, ?action, "reconciled"),
                Err(controller::Error::ReconcilerFailed(e, obj)) => {
                    tracing::warn!(controller = name, %obj, error = %ErrorChain(&e), "reconcile failed")
                }
                Err(e) => tracing::warn!(controller = name, error = %ErrorChain(&e), "controller error"),
            }
        })
        .await;
    tracing::info!(controller = name, "controller stopped");
}

fn key_of<K: Resource>(obj: &K) -> (Option<String>, String) {
    (obj.meta().namespace.clone(), obj.name_any())
}

/// How to address one object of `K`: in its namespace, or cluster-wide. kube's `Api` constructors
/// are bound on the resource's scope, which generic code cannot branch on, so the controller is told.
pub struct Scope<K>(fn(&Client, &K) -> Api<K>);

impl<K> Clone for Scope<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Scope<K> {}

impl<K> Scope<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    /// For namespaced kinds.
    pub fn namespaced() -> Scope<K> {
        Scope(|client, obj| Api::namespaced(client.clone(), obj.meta().namespace.as_deref().unwrap_or("default")))
    }
}

impl<K> Scope<K>
where
    K: Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>,
{
    /// For cluster-scoped kinds.
    pub fn cluster() -> Scope<K> {
        Scope(|client, _| Api::all(client.clone()))
    }
}

async fn reconcile<K, R>(obj: Arc<K>, shared: Arc<Shared<K, R>>) -> Result<Action, ReconcileError<R::Error>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let start = Instant::now();
    let api = (shared.scope.0)(&shared.ctx.client, &*obj);
    let key = key_of(&*obj);
    let (reconciler, ctx) = (&shared.reconciler, &shared.ctx);
    let result = match reconciler.finalizer() {
        Some(name) => {
            finalizer(&api, name, obj, |event| async move {
                match event {
                    FinalizerEvent::Apply(o) => reconciler.apply(o, ctx).await,
                    FinalizerEvent::Cleanup(o) => reconciler.cleanup(o, ctx).await,
                }
            })
            .await
        }
        None => reconciler.apply(obj, ctx).await.map_err(finalizer::Error::ApplyFailed),
    };
    let result = match result {
        Err(e) if has_not_found(&e) && is_gone(&api, &key.1).await => {
            tracing::debug!(controller = shared.settings.name, name = %key.1, "object deleted during reconcile");
            Ok(Action::await_change())
        }
        other => other,
    };
    shared.ctx.metrics.record(shared.settings.name, result.is_ok(), start.elapsed());
    if result.is_ok() {
        shared.failures.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
    }
    result
}

fn error_policy<K, R>(obj: Arc<K>, err: &ReconcileError<R::Error>, shared: Arc<Shared<K, R>>) -> Action
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let failures = {
        let mut map = shared.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let n = map.entry(key_of(&*obj)).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let wait = shared.settings.backoff(failures);
    let note = truncate(&ErrorChain(err).to_string(), 1000);
    let (ctx, controller) = (shared.ctx.clone(), shared.settings.name);
    tokio::spawn(async move {
        let note = format!("{controller}: {note} (attempt {failures}, retrying in {wait:?})");
        ctx.event(&*obj, EventType::Warning, "ReconcileFailed", "Reconcile", Some(note)).await;
    });
    Action::requeue(wait)
}

/// Whether the object named `name` is gone from the API server.
async fn is_gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    matches!(api.get_opt(name).await, Ok(None))
}

/// Whether any error in `e`'s chain is an API 404.
fn has_not_found(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(kube::Error::Api(s)) = err.downcast_ref::<kube::Error>()
            && s.code == 404
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Displays an error with its causes joined by `: `, leaving out causes its message already holds.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = self.0.to_string();
        let mut cur = self.0.source();
        while let Some(e) = cur {
            let text = e.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cur = e.source();
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_base_and_is_capped() {
        let s = Settings {
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..Settings::new("t")
        };
        assert_eq!(s.backoff(1), Duration::from_millis(10));
        assert_eq!(s.backoff(2), Duration::from_millis(20));
        assert_eq!(s.backoff(3), Duration::from_millis(40));
        assert_eq!(s.backoff(4), Duration::from_millis(50));
        assert_eq!(s.backoff(u32::MAX), Duration::from_millis(50));
    }

    #[test]
    fn not_found_is_found_anywhere_in_the_chain() {
        let status = kube::core::Status::failure("nodes \"a\" not found", "NotFound").with_code(404);
        let e: ReconcileError<kube::Error> = finalizer::Error::ApplyFailed(kube::Error::Api(Box::new(status)));
        assert!(has_not_found(&e));
        let conflict = kube::core::Status::failure("conflict", "Conflict").with_code(409);
        let e: ReconcileError<kube::Error> = finalizer::Error::ApplyFailed(kube::Error::Api(Box::new(conflict)));
        assert!(!has_not_found(&e));
    }

    #[test]
    fn truncate_keeps_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("ééé", 3), "é…");
    }
}
