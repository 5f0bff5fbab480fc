//! `weft webhook`: admission for Volcano Jobs (`batch.volcano.sh/v1alpha1`) and their pods, over
//! HTTPS, speaking AdmissionReview v1. The decisions are pure ([`weft_jobs::admission`]); this
//! module reads requests, looks up Jobs, and writes answers.
//!
//! Routes (Volcano's own admission paths):
//! - `POST /jobs/mutate`: on CREATE, Volcano's job defaults and the plugin dependencies
//!   ([`weft_jobs::admission::mutate_job`]). Other operations are allowed unchanged.
//! - `POST /jobs/validate`: on CREATE and UPDATE, [`weft_jobs::admission::validate_job`]: denied
//!   with 422 `Invalid` and the verdict's message; warnings go back either way. On UPDATE a problem
//!   the stored Job already had is a warning, not a denial (so a Job admitted before weft's
//!   webhook was installed can still be updated, e.g. to remove a finalizer).
//! - `POST /pods/mutate`: on CREATE of a pod whose controller is a Volcano Job, weft's plugins
//!   applied to the pod ([`PodMutator`], built once per Job version). The Job comes from a
//!   [`JobSource`] (a watch cache with a GET fallback). A pod whose Job cannot be found is denied
//!   (404; Volcano's controller retries creating it); a plugin error denies with its message. Pods
//!   without a Volcano Job controller are allowed unchanged.
//!
//! - `POST /pipelines/mutate`, `POST /pipelines/validate`, `POST /numanetworks/validate`: Numaflow
//!   Pipelines wired to their NumaNetworks and NumaNetworks checked and capped ([`pipelines`];
//!   `docs/pipelines.md`). They need a NumaNetwork source ([`WebhookState::with_numa_networks`]).
//!
//! Status codes: 200 with an AdmissionReview for every request that can be read, including
//! denials; 400 with a plain-text reason for a body that is not an AdmissionReview or has no
//! request. Metrics: [`WebhookState::register_metrics`]; TLS: [`tls::TlsFiles`]. Operator
//! documentation: `docs/webhook.md`.

pub mod jobs;
pub mod networks;
pub mod pipeline_crd;
pub mod pipelines;
pub mod review;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::net::TcpListener;
use weft_jobs::Job;

use weft_jobs::admission::{self, AdmissionOptions, PodMutator, Verdict};
use weft_kube::http::ServeOptions;

pub use jobs::{InMemoryJobs, JobSource, KubeJobSource, MutatorCache};
pub use networks::{InMemoryNumaNetworks, KubeNumaNetworks, NumaNetworkSource, NumaNetworkValidator, typed_validator};
pub use pipeline_crd::{FixedPipelineCrd, KubePipelineCrd, PipelineCrdSource};
pub use pipelines::{MAX_NETWORKS_PER_PIPELINE, NetworkOptions};
pub use review::{AdmissionRequest, Decision, Denial, Operation, ReviewResponse};
pub use weft_kube::tls::{TlsError, TlsFiles};
pub use weft_pipeline::domain::check_zone;
pub use weft_pipeline::{DEFAULT_ZONE, WiringOptions};

/// Pod annotation Volcano sets to the Job's `status.version` when it creates the pod. A cached Job
/// with a lower version is older than the pod and is read again from the API server.
pub const JOB_VERSION_ANNOTATION: &str = "volcano.sh/job-version";

/// Largest request body accepted: an UPDATE review carries the object twice, and the API server
/// accepts no object over 3 MiB (`MaxRequestBodyBytes`), so 2 × 3 MiB plus 1 MiB for the rest of
/// the review.
pub const MAX_BODY_BYTES: usize = 7 << 20;

/// Containers (init containers included) of a pod weft's plugins patch; a pod with more is
/// denied before any work is done. Kubernetes sets no such limit, but every plugin adds to each
/// container, and nothing real comes near it.
pub const MAX_PATCHED_CONTAINERS: usize = 128;

/// Pod mutations computed at once (each on a blocking thread); the rest wait.
pub const MAX_CONCURRENT_MUTATIONS: usize = 4;

/// Time to read and answer one review; the API server gives up at the webhook configurations'
/// `timeoutSeconds` (10), so the work stops just before.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(9);

/// How long the pod webhook waits for a Job read from the API server (the webhook
/// configurations' `timeoutSeconds` is 10).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(4);

/// The admission endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdmissionPath {
    /// `/jobs/mutate`.
    JobsMutate,
    /// `/jobs/validate`.
    JobsValidate,
    /// `/pods/mutate`.
    PodsMutate,
    /// `/pipelines/mutate`.
    PipelinesMutate,
    /// `/pipelines/validate`.
    PipelinesValidate,
    /// `/numanetworks/validate`.
    NumaNetworksValidate,
}

impl AdmissionPath {
    /// Every path.
    pub const ALL: [AdmissionPath; 6] = [
        AdmissionPath::JobsMutate,
        AdmissionPath::JobsValidate,
        AdmissionPath::PodsMutate,
        AdmissionPath::PipelinesMutate,
        AdmissionPath::PipelinesValidate,
        AdmissionPath::NumaNetworksValidate,
    ];

    /// The URL path.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionPath::JobsMutate => "/jobs/mutate",
            AdmissionPath::JobsValidate => "/jobs/validate",
            AdmissionPath::PodsMutate => "/pods/mutate",
            AdmissionPath::PipelinesMutate => "/pipelines/mutate",
            AdmissionPath::PipelinesValidate => "/pipelines/validate",
            AdmissionPath::NumaNetworksValidate => "/numanetworks/validate",
        }
    }

    /// API group and kind of the objects this path admits.
    fn admits(self) -> (&'static str, &'static str) {
        match self {
            AdmissionPath::JobsMutate | AdmissionPath::JobsValidate => (weft_jobs::job::GROUP, "Job"),
            AdmissionPath::PodsMutate => ("", "Pod"),
            AdmissionPath::PipelinesMutate | AdmissionPath::PipelinesValidate => (weft_pipeline::GROUP, "Pipeline"),
            AdmissionPath::NumaNetworksValidate => (networks::GROUP, networks::KIND),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    path: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    source: &'static str,
    result: &'static str,
}

/// Requests, their latency, Job and NumaNetwork lookups and mutator builds.
#[derive(Clone, Debug)]
struct WebhookMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<PathLabel, Histogram>,
    lookups: Family<LookupLabels, Counter>,
    network_lookups: Family<LookupLabels, Counter>,
    builds: Counter,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        WebhookMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0005, 2.0, 14))),
            lookups: Family::default(),
            network_lookups: Family::default(),
            builds: Counter::default(),
        }
    }
}

impl WebhookMetrics {
    fn lookup(&self, source: &'static str, result: &'static str) {
        self.lookups.get_or_create(&LookupLabels { source, result }).inc();
    }

    fn network_lookup(&self, source: &'static str, result: &'static str) {
        self.network_lookups.get_or_create(&LookupLabels { source, result }).inc();
    }
}

/// What the admission handlers share: the options, the Job source and the mutator cache, and
/// (optionally) the NumaNetwork source for the Pipeline and NumaNetwork webhooks.
pub struct WebhookState {
    opts: AdmissionOptions,
    jobs: Arc<dyn JobSource>,
    networks: Option<pipelines::Networks>,
    mutators: MutatorCache,
    lookup_timeout: Duration,
    mutating: Arc<tokio::sync::Semaphore>,
    metrics: WebhookMetrics,
}

impl std::fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookState")
            .field("opts", &self.opts)
            .field("mutators", &self.mutators.len())
            .field("lookup_timeout", &self.lookup_timeout)
            .field("networks", &self.networks.as_ref().map(|n| &n.opts))
            .finish_non_exhaustive()
    }
}

impl WebhookState {
    /// State deciding with `opts` and looking up Jobs in `jobs`.
    pub fn new(jobs: Arc<dyn JobSource>, opts: AdmissionOptions) -> WebhookState {
        WebhookState {
            opts,
            jobs,
            networks: None,
            mutators: MutatorCache::default(),
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            mutating: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_MUTATIONS)),
            metrics: WebhookMetrics::default(),
        }
    }

    /// The same state with another time limit for reading a Job from the API server.
    #[must_use]
    pub fn with_lookup_timeout(mut self, timeout: Duration) -> WebhookState {
        self.lookup_timeout = timeout;
        self
    }

    /// The same state serving the Pipeline and NumaNetwork webhooks too, looking NumaNetworks up in
    /// `source` and deciding with `opts`.
    #[must_use]
    pub fn with_numa_networks(mut self, source: Arc<dyn NumaNetworkSource>, opts: NetworkOptions) -> WebhookState {
        self.networks = Some(pipelines::Networks { source, opts, crd: None });
        self
    }

    /// The same state with a mutator cache of `capacity` Jobs.
    #[must_use]
    pub fn with_mutator_capacity(mut self, capacity: usize) -> WebhookState {
        self.mutators = MutatorCache::with_capacity(capacity);
        self
    }

    /// The options decisions are made with.
    pub fn options(&self) -> &AdmissionOptions {
        &self.opts
    }

    /// Registers, under `weft_webhook_`: `requests_total{path,outcome}` (outcome `allowed`,
    /// `patched`, `denied`, `malformed`), `request_duration_seconds{path}`,
    /// `job_lookups_total{source,result}` (source `cache` or `api`; result `found`, `miss`,
    /// `stale`, `not_found`, `uid_mismatch`, `error`), `pod_mutator_builds_total` and
    /// `numanetwork_lookups_total{source,result}` (source `cache`, `api` or `list`; result
    /// `found`, `miss`, `not_found`, `error`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("webhook");
        sub.register("requests", "Admission requests by path and outcome", self.metrics.requests.clone());
        sub.register(
            "request_duration_seconds",
            "Time to read, decide and answer one admission request",
            self.metrics.duration.clone(),
        );
        sub.register(
            "job_lookups",
            "Lookups of the Volcano Job owning a pod, by source and result",
            self.metrics.lookups.clone(),
        );
        sub.register(
            "pod_mutator_builds",
            "Builds of a Job's weft plugins for its pods (once per Job version)",
            self.metrics.builds.clone(),
        );
        sub.register(
            "numanetwork_lookups",
            "Lookups of NumaNetworks by the Pipeline and NumaNetwork webhooks, by source and result",
            self.metrics.network_lookups.clone(),
        );
    }

    /// Makes `ops` report not ready until the Volcano Job cache (and the NumaNetwork cache, when
    /// there is one) has synced.
    pub fn add_readiness_check(&self, ops: &weft_kube::ops::Ops) {
        let jobs = self.jobs.clone();
        ops.add_readiness_check("volcano-jobs (Job cache synced)", move || jobs.is_synced());
        if let Some(n) = &self.networks {
            let source = n.source.clone();
            ops.add_readiness_check("numanetworks (NumaNetwork cache synced)", move || source.is_synced());
        }
    }

    /// Answers one AdmissionReview `body` sent to `path`: the review to send back, or why the body
    /// cannot be answered (sent as 400).
    pub async fn review(&self, path: AdmissionPath, body: &[u8]) -> Result<ReviewResponse, String> {
        let (api_version, request) = review::parse(body)?;
        let decision = self.decide(path, &request).await;
        match &decision.denial {
            Some(d) => tracing::info!(
                path = path.as_str(), uid = %request.uid, object = %request.object_ref(),
                operation = ?request.operation, code = d.code, "denied: {}", d.message
            ),
            None => tracing::debug!(
                path = path.as_str(), uid = %request.uid, object = %request.object_ref(),
                operation = ?request.operation, patch_ops = decision.patch.len(), "allowed"
            ),
        }
        Ok(decision.into_review(&api_version, &request.uid))
    }

    /// The decision on `request` at `path`.
    pub async fn decide(&self, path: AdmissionPath, request: &AdmissionRequest) -> Decision {
        let (group, kind) = path.admits();
        if !request.kind.kind.is_empty() && (request.kind.group != group || request.kind.kind != kind) {
            return Decision::deny(Denial::bad_request(format!(
                "{} admits {} {kind} objects, not {:?} {:?}: check the rules of the webhook configuration",
                path.as_str(),
                if group.is_empty() { "core" } else { group },
                request.kind.group,
                request.kind.kind,
            )));
        }
        if request.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
            return Decision::allow();
        }
        match path {
            AdmissionPath::JobsMutate => self.mutate_job(request),
            AdmissionPath::JobsValidate => self.validate_job(request),
            AdmissionPath::PodsMutate => self.mutate_pod(request).await,
            AdmissionPath::PipelinesMutate => self.mutate_pipeline(request).await,
            AdmissionPath::PipelinesValidate => self.validate_pipeline(request).await,
            AdmissionPath::NumaNetworksValidate => self.validate_numa_network(request).await,
        }
    }

    fn mutate_job(&self, request: &AdmissionRequest) -> Decision {
        if request.operation != Operation::Create {
            return Decision::allow();
        }
        let Some(job) = &request.object else {
            return Decision::deny(Denial::bad_request("the CREATE request has no object"));
        };
        match admission::mutate_job(job, &self.opts) {
            Ok(ops) => Decision::patch(ops),
            Err(e) => {
                Decision::deny(Denial::invalid(format!("cannot default Volcano Job {}: {e}", request.object_ref())))
            }
        }
    }

    fn validate_job(&self, request: &AdmissionRequest) -> Decision {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Decision::allow();
        }
        let read = |v: &Value| weft_jobs::job::from_value(v.clone());
        let Some(object) = &request.object else {
            return Decision::deny(Denial::bad_request("the request has no object"));
        };
        let job = match read(object) {
            Ok(j) => j,
            Err(e) => return Decision::deny(Denial::invalid(format!("not a readable Volcano Job: {e}"))),
        };
        let old = match (request.operation, &request.old_object) {
            (Operation::Update, Some(old)) => match read(old) {
                Ok(j) => Some(j),
                Err(e) => {
                    return Decision::deny(Denial::invalid(format!("the stored Volcano Job is not readable: {e}")));
                }
            },
            (Operation::Update, None) => {
                return Decision::deny(Denial::bad_request("the UPDATE request has no oldObject"));
            }
            _ => None,
        };
        let verdict = admission::validate_job(&job, old.as_ref(), &self.opts);
        let Verdict { mut errors, mut warnings, .. } = verdict;
        if let Some(old) = &old {
            // Ratchet: what the stored Job already got wrong does not block this update.
            let before = admission::validate_job(old, None, &self.opts).errors;
            let (known, new): (Vec<String>, Vec<String>) = errors.into_iter().partition(|e| before.contains(e));
            warnings.extend(known.into_iter().map(|e| format!("{e} (the stored Job has this problem too)")));
            errors = new;
        }
        let verdict = Verdict { errors, warnings, unchecked: Vec::new() };
        if verdict.allowed() {
            Decision::allow().with_warnings(verdict.warnings)
        } else {
            Decision::deny(Denial::invalid(verdict.message())).with_warnings(verdict.warnings)
        }
    }

    async fn mutate_pod(&self, request: &AdmissionRequest) -> Decision {
        if request.operation != Operation::Create {
            return Decision::allow();
        }
        let Some(pod) = &request.object else {
            return Decision::deny(Denial::bad_request("the CREATE request has no object"));
        };
        let Some((job_name, job_uid)) = admission::owning_job(pod) else {
            return Decision::allow();
        };
        let containers: usize = ["/spec/containers", "/spec/initContainers"]
            .iter()
            .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
            .map(Vec::len)
            .sum();
        if containers > MAX_PATCHED_CONTAINERS {
            return Decision::deny(Denial::invalid(format!(
                "the pod has {containers} containers and init containers; weft's plugins wire at most \
                 {MAX_PATCHED_CONTAINERS} per pod"
            )));
        }
        let pod_namespace = pod.pointer("/metadata/namespace").and_then(Value::as_str).filter(|n| !n.is_empty());
        let Some(namespace) = request.namespace.as_deref().filter(|n| !n.is_empty()).or(pod_namespace) else {
            return Decision::deny(Denial::bad_request("the pod has no namespace"));
        };
        let min_version = pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(JOB_VERSION_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<i64>().ok());
        let job = match self.find_job(namespace, &job_name, &job_uid, min_version).await {
            Ok(job) => job,
            Err(denial) => return Decision::deny(denial),
        };
        let (built, new) = self.mutators.get_or_build(&job, &self.opts);
        if new {
            self.metrics.builds.inc();
        }
        if matches!(&*built, Ok(m) if m.is_empty()) {
            return Decision::allow();
        }
        let mut pod = pod.clone();
        if pod_namespace.is_none()
            && let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.insert("namespace".to_owned(), Value::String(namespace.to_owned()));
        }
        // The plugins' work runs off the async workers, a few at a time, so large pods cannot
        // starve the other requests.
        let Ok(slot) = self.mutating.clone().acquire_owned().await else {
            return Decision::deny(Denial::internal("the webhook is shutting down"));
        };
        let mutated = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let mutator: &PodMutator =
                built.as_ref().as_ref().map_err(|e| format!("weft's plugins cannot be built: {e}"))?;
            mutator.mutate(&pod).map_err(|e| e.to_string())
        })
        .await;
        match mutated {
            Ok(Ok(ops)) => Decision::patch(ops),
            Ok(Err(e)) => Decision::deny(Denial::invalid(format!("Volcano Job {namespace}/{job_name}: {e}"))),
            Err(e) => Decision::deny(Denial::internal(format!("Volcano Job {namespace}/{job_name}: {e}"))),
        }
    }

    /// The Job `namespace/name` with `uid`, from the cache when it holds that Job at least as new
    /// as `min_version`, else from the API server.
    async fn find_job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        min_version: Option<i64>,
    ) -> Result<Arc<Job>, Denial> {
        let m = &self.metrics;
        match self.jobs.cached(namespace, name) {
            Some(job) if job.job_uid() == uid => {
                if min_version.is_none_or(|min| job.status.as_ref().and_then(|s| s.version).is_some_and(|v| v >= min)) {
                    m.lookup("cache", "found");
                    return Ok(job);
                }
                m.lookup("cache", "stale");
            }
            Some(_) => m.lookup("cache", "uid_mismatch"),
            None => m.lookup("cache", "miss"),
        }
        let job_ref = format!("Volcano Job {namespace}/{name}");
        let fetched = match tokio::time::timeout(self.lookup_timeout, self.jobs.fetch(namespace, name)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                m.lookup("api", "error");
                return Err(Denial::internal(format!("reading {job_ref}, which owns this pod: {e}")));
            }
            Err(_) => {
                m.lookup("api", "error");
                return Err(Denial::timeout(format!(
                    "reading {job_ref}, which owns this pod, took longer than {:?}",
                    self.lookup_timeout
                )));
            }
        };
        match fetched {
            Some(job) if job.job_uid() == uid => {
                m.lookup("api", "found");
                Ok(job)
            }
            Some(job) => {
                m.lookup("api", "uid_mismatch");
                Err(Denial::conflict(format!(
                    "the pod belongs to {job_ref} with uid {uid}, but {job_ref} now has uid {}: it was deleted and created again",
                    job.job_uid()
                )))
            }
            None => {
                m.lookup("api", "not_found");
                Err(Denial::not_found(format!(
                    "{job_ref} (uid {uid}), which owns this pod, was not found; the pod cannot be wired without it \
                     (Volcano's job controller creates the pod again)"
                )))
            }
        }
    }
}

/// The admission routes: `POST /jobs/mutate`, `/jobs/validate`, `/pods/mutate`,
/// `/pipelines/mutate`, `/pipelines/validate`, `/numanetworks/validate`.
pub fn router(state: Arc<WebhookState>) -> Router {
    let mut router = Router::new();
    for path in AdmissionPath::ALL {
        router = router.route(
            path.as_str(),
            post(move |State(state): State<Arc<WebhookState>>, body: Bytes| handle(state, path, body)),
        );
    }
    let router = router.layer(DefaultBodyLimit::max(MAX_BODY_BYTES)).with_state(state);
    weft_kube::http::request_timeout(router, REQUEST_TIMEOUT, "admission review")
}

async fn handle(state: Arc<WebhookState>, path: AdmissionPath, body: Bytes) -> Response {
    let start = Instant::now();
    let (response, outcome) = match state.review(path, &body).await {
        Ok(review) => {
            let outcome = match (review.response.allowed, review.response.patch.is_some()) {
                (false, _) => "denied",
                (true, true) => "patched",
                (true, false) => "allowed",
            };
            (axum::Json(review).into_response(), outcome)
        }
        Err(why) => {
            tracing::warn!(path = path.as_str(), "malformed admission request: {why}");
            ((StatusCode::BAD_REQUEST, format!("{why}\n")).into_response(), "malformed")
        }
    };
    let m = &state.metrics;
    m.requests.get_or_create(&RequestLabels { path: path.as_str(), outcome }).inc();
    m.duration.get_or_create(&PathLabel { path: path.as_str() }).observe(start.elapsed().as_secs_f64());
    response
}

/// Serves the admission routes over HTTPS on `listener` with `tls` until `shutdown` completes,
/// then lets open requests finish within the grace of `opts` ([`weft_kube::http`]).
pub async fn serve<F>(
    listener: TcpListener,
    state: Arc<WebhookState>,
    tls: RustlsConfig,
    opts: ServeOptions,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admission webhook listening (HTTPS)");
    }
    weft_kube::http::serve(listener, router(state), Some(tls), opts, shutdown).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;
    use weft_jobs::PLUGINS_ANNOTATION;

    fn job(name: &str, uid: &str, version: i64, plugins: &str) -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "7",
                "annotations": {PLUGINS_ANNOTATION: plugins}},
            "spec": {"tasks": [{"name": "worker", "replicas": 2,
                "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]},
            "status": {"version": version}
        }))
        .unwrap()
    }

    fn pod_request(job: &str, uid: &str, version: i64) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "r1", "operation": "CREATE", "namespace": "ml",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{job}-worker-1"),
                    "annotations": {"volcano.sh/task-spec": "worker", JOB_VERSION_ANNOTATION: version.to_string()},
                    "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": job,
                        "uid": uid, "controller": true}]},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}
        }))
        .unwrap()
    }

    fn state(jobs: Arc<InMemoryJobs>) -> WebhookState {
        WebhookState::new(jobs, AdmissionOptions::default())
    }

    #[tokio::test]
    async fn the_cache_is_trusted_only_for_the_same_uid_and_a_version_not_older_than_the_pod() {
        let jobs = Arc::new(InMemoryJobs::new());
        let s = state(jobs.clone());
        jobs.insert(job("a", "u1", 2, r#"{"env":[]}"#));
        assert_eq!(s.decide(AdmissionPath::PodsMutate, &pod_request("a", "u1", 2)).await.outcome(), "patched");
        assert_eq!(jobs.fetches(), 0, "cache hit");

        // The pod was made from version 3; the cache has 2: read it again.
        jobs.insert_api_only(job("a", "u1", 3, r#"{"env":[]}"#));
        assert_eq!(s.decide(AdmissionPath::PodsMutate, &pod_request("a", "u1", 3)).await.outcome(), "patched");
        assert_eq!(jobs.fetches(), 1);

        // Recreated Job: the cache still has the old uid.
        jobs.insert_api_only(job("a", "u2", 1, r#"{"env":[]}"#));
        assert_eq!(s.decide(AdmissionPath::PodsMutate, &pod_request("a", "u2", 1)).await.outcome(), "patched");
        assert_eq!(jobs.fetches(), 2);

        // A pod of the old Job, which is gone.
        let d = s.decide(AdmissionPath::PodsMutate, &pod_request("a", "u1", 3)).await;
        let denial = d.denial.expect("denied");
        assert_eq!((denial.code, denial.reason), (409, "Conflict"));
        assert!(denial.message.contains("uid u1") && denial.message.contains("uid u2"), "{}", denial.message);

        let d = s.decide(AdmissionPath::PodsMutate, &pod_request("ghost", "u9", 1)).await;
        let denial = d.denial.expect("denied");
        assert_eq!(denial.code, 404);
        assert!(denial.message.contains("Volcano Job ml/ghost (uid u9)"), "{}", denial.message);
    }

    #[tokio::test]
    async fn a_job_without_weft_plugins_leaves_its_pods_alone_and_bad_plugins_deny_them() {
        let jobs = Arc::new(InMemoryJobs::new());
        let s = state(jobs.clone());
        let mut plain = job("plain", "u1", 1, "{}");
        plain.metadata.annotations = None;
        jobs.insert(plain);
        let d = s.decide(AdmissionPath::PodsMutate, &pod_request("plain", "u1", 1)).await;
        assert_eq!(d, Decision::allow());

        jobs.insert(job("bad", "u2", 1, r#"{"horovod":[]}"#));
        let d = s.decide(AdmissionPath::PodsMutate, &pod_request("bad", "u2", 1)).await;
        let denial = d.denial.expect("denied");
        assert!(denial.message.contains("ml/bad") && denial.message.contains("horovod"), "{}", denial.message);
    }

    #[tokio::test]
    async fn a_request_for_the_wrong_kind_is_a_configuration_error() {
        let s = state(Arc::new(InMemoryJobs::new()));
        let mut r = pod_request("a", "u", 1);
        let d = s.decide(AdmissionPath::JobsMutate, &r).await;
        assert!(d.denial.expect("denied").message.contains("/jobs/mutate admits batch.volcano.sh Job"));
        r.operation = Operation::Delete;
        assert_eq!(s.decide(AdmissionPath::PodsMutate, &r).await, Decision::allow(), "only CREATE is mutated");
    }

    #[tokio::test]
    async fn updates_are_not_blocked_by_problems_the_stored_job_already_had() {
        let s = state(Arc::new(InMemoryJobs::new()));
        let bad = serde_json::to_value(job("a", "u", 1, r#"{"horovod":[]}"#)).unwrap();
        let mut relabelled = bad.clone();
        relabelled["metadata"]["labels"] = json!({"team": "x"});
        let request: AdmissionRequest = serde_json::from_value(json!({
            "uid": "r", "operation": "UPDATE", "namespace": "ml", "object": relabelled, "oldObject": bad
        }))
        .unwrap();
        let d = s.decide(AdmissionPath::JobsValidate, &request).await;
        assert!(d.denial.is_none(), "{d:?}");
        assert!(d.warnings.iter().any(|w| w.contains("horovod") && w.contains("stored Job")), "{:?}", d.warnings);
    }
}
