//! The Volcano Job controller: the job-level objects of weft's plugins.
//!
//! A Volcano Job (`batch.volcano.sh/v1alpha1`) lists weft's plugins in the annotation
//! `weft.io/job-plugins` ([`weft_jobs::PLUGINS_ANNOTATION`]). The webhook changes the job's pods;
//! this controller creates and keeps the objects those pods use: the `svc` plugin's hosts
//! ConfigMap `<job>-svc`, headless Service and NetworkPolicy, the `ssh` plugin's Secret
//! `<job>-ssh`, the `mpi` plugin's hostfile ConfigMap, ray's head Service. Shapes come from
//! [`JobPlugins::job_objects`]; this module decides when they exist:
//!
//! - **Desired objects** are rebuilt from the job on every reconcile (Volcano's `OnJobAdd` and
//!   `OnJobUpdate` at once), so a change of replicas regenerates the host lists, the hostfile and
//!   the ssh config. The ssh keys are the exception: the keys already in `<job>-ssh` are kept (a
//!   job's keys never change); only a job without them gets fresh ones.
//! - Every object carries `app.kubernetes.io/managed-by: weft`, `weft.io/job: <job>`, a controller
//!   owner reference to the job and the annotation [`APPLIED_HASH_ANNOTATION`] (a hash of what was
//!   applied). It is written by server-side apply (the context's field manager, forced) only when
//!   what is stored is not already what would be applied: some applied field differs (someone
//!   edited it) or the hash does (this controller's output changed, e.g. a field it stopped
//!   setting, which only an apply can remove). A re-reconcile of an unchanged job writes nothing.
//! - **Pruning**: objects labelled with the job's name, in its namespace and owned by its UID,
//!   that are no longer desired (a plugin removed from the annotation, `--disable-network-policy`
//!   added) are deleted, with the UID as a precondition.
//! - **End of a job** (`Completed`, `Failed`, `Terminated`; [`Job::has_ended`]): every object is
//!   deleted, as Volcano's `OnJobDelete` does. A job that runs again gets them back (with new ssh
//!   keys) on its next reconcile. A job without the annotation, or whose annotation lost every
//!   plugin, is treated the same: nothing is desired.
//! - **Invalid plugins** ([`JobPlugins::weft`] refuses the annotation): a Warning Event
//!   `InvalidJobPlugins` naming every error (once per distinct message), nothing created, nothing
//!   pruned (a typo in the annotation of a running job does not take its keys and hosts away),
//!   and no requeue: the next change to the job is reconciled.
//! - **Deleting the job**: the owner references let Kubernetes' garbage collector delete the
//!   objects. There is no finalizer: nothing outside the cluster needs cleaning up, and a
//!   finalizer would keep jobs from being deleted while weft's controller is down.
//! - **Watches**: the objects (by the labels above, every namespace) feed caches this controller
//!   compares with and prunes from, and trigger a reconcile of their owner, so a deleted or
//!   edited object is put back.
//! - **Volcano not installed**: until the API server serves `jobs.batch.volcano.sh/v1alpha1` the
//!   controller logs that it waits and checks again every [`JobControllerConfig::api_poll`];
//!   `weft controller` keeps running its other controllers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use weft_jobs::plugin::{BuildOptions, ObjectContext, SshKeyPair, SshKeySource};
use weft_jobs::plugins::ssh;
use weft_jobs::{Job, JobObject, JobPlugins, PluginError};

use weft_kube::controller::{Context, ErrorChain, Reconciler, Scope, Settings};

/// The controller's name in logs, metrics and Events.
pub const NAME: &str = "jobs";
/// Label on every object this controller makes: the job's name.
pub const JOB_LABEL: &str = "weft.io/job";
/// Label on every object this controller makes, with value [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "weft";
/// Annotation on every object this controller makes: a hash of the applied manifest.
pub const APPLIED_HASH_ANNOTATION: &str = "weft.io/applied-hash";
/// Reason of the Warning Event about a job whose plugins do not build.
pub const INVALID_REASON: &str = "InvalidJobPlugins";

/// The label selector of the objects this controller makes (every job's).
pub fn owned_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY},{JOB_LABEL}")
}

/// Settings of the job controller beyond [`Settings`].
#[derive(Clone, Debug)]
pub struct JobControllerConfig {
    /// Deployment settings handed to the plugins.
    pub build: BuildOptions,
    /// How often to check whether Volcano's Job API is served, while it is not.
    pub api_poll: Duration,
    /// Longest a reconcile waits for the caches of owned objects to fill before it fails (and is
    /// retried with backoff).
    pub cache_timeout: Duration,
}

impl Default for JobControllerConfig {
    fn default() -> Self {
        JobControllerConfig {
            build: BuildOptions::default(),
            api_poll: Duration::from_secs(30),
            cache_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// An API write or read failed.
    #[error("{action} {kind} {namespace}/{name}")]
    Api {
        /// `applying`, `deleting` or `reading`.
        action: &'static str,
        /// The object's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A plugin could not build its objects.
    #[error("building the job's objects")]
    Objects(#[source] PluginError),
    /// Generating ssh keys failed.
    #[error("generating the job's ssh keys: {0}")]
    Keys(String),
    /// The caches of owned objects are not filled (their watches fail: RBAC, API down).
    #[error(
        "the caches of ConfigMaps, Secrets, Services and NetworkPolicies labelled {selector} did not fill within {waited:?}"
    )]
    CacheNotReady {
        /// The label selector watched.
        selector: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// The caches of the objects this controller makes (filled by the watches that also trigger it).
#[derive(Clone)]
pub struct OwnedCaches {
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    services: Store<Service>,
    network_policies: Store<NetworkPolicy>,
}

impl Debug for OwnedCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedCaches").finish_non_exhaustive()
    }
}

/// One existing object of a job: kind, name, UID.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Existing {
    kind: &'static str,
    name: String,
    uid: String,
}

fn find<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Value>
where
    K: Resource<DynamicType = ()> + Clone + Serialize,
{
    let obj = store.get(&ObjectRef::new(name).within(namespace))?;
    serde_json::to_value(&*obj).ok()
}

fn owned_by<K>(store: &Store<K>, kind: &'static str, namespace: &str, job: &str, uid: &str) -> Vec<Existing>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store
        .state_filter(|o| {
            let meta = o.meta();
            meta.namespace.as_deref() == Some(namespace)
                && meta.labels.as_ref().and_then(|l| l.get(JOB_LABEL)).map(String::as_str) == Some(job)
                && meta.owner_references.iter().flatten().any(|r| r.uid == uid)
        })
        .into_iter()
        .map(|o| Existing {
            kind,
            name: o.meta().name.clone().unwrap_or_default(),
            uid: o.meta().uid.clone().unwrap_or_default(),
        })
        .collect()
}

impl OwnedCaches {
    async fn ready(&self, timeout: Duration) -> Result<(), JobError> {
        let all = async {
            // `Err` only when the writer is dropped, i.e. the controller is stopping.
            let _ = self.config_maps.wait_until_ready().await;
            let _ = self.secrets.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
            let _ = self.network_policies.wait_until_ready().await;
        };
        tokio::time::timeout(timeout, all)
            .await
            .map_err(|_| JobError::CacheNotReady { selector: owned_selector(), waited: timeout })
    }

    /// The stored object of `kind` named `name` in `namespace`, as JSON.
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        match kind {
            "ConfigMap" => find(&self.config_maps, namespace, name),
            "Secret" => find(&self.secrets, namespace, name),
            "Service" => find(&self.services, namespace, name),
            "NetworkPolicy" => find(&self.network_policies, namespace, name),
            _ => None,
        }
    }

    /// The objects of job `job` (UID `uid`) in `namespace`.
    fn of_job(&self, namespace: &str, job: &str, uid: &str) -> Vec<Existing> {
        let mut out = owned_by(&self.config_maps, "ConfigMap", namespace, job, uid);
        out.extend(owned_by(&self.secrets, "Secret", namespace, job, uid));
        out.extend(owned_by(&self.services, "Service", namespace, job, uid));
        out.extend(owned_by(&self.network_policies, "NetworkPolicy", namespace, job, uid));
        out.sort();
        out
    }

    fn ssh_keys(&self, namespace: &str, job: &str) -> Option<SshKeyPair> {
        let secret = self.secrets.get(&ObjectRef::new(&ssh::secret_name(job)).within(namespace))?;
        ssh::keys_from_secret(&secret)
    }
}

/// A key source that has no keys and remembers being asked: tells whether a job's plugins need
/// ssh keys without generating any.
#[derive(Default)]
struct AskOnly(AtomicBool);

impl SshKeySource for AskOnly {
    fn key_pair(&self) -> Result<SshKeyPair, String> {
        self.0.store(true, Ordering::Relaxed);
        Err("keys not looked up yet".to_owned())
    }
}

/// What a job should have.
enum Plan {
    /// Exactly these objects (none for an ended job or one without weft plugins).
    Objects(Vec<JobObject>),
    /// The annotation does not build: these errors.
    Invalid(Vec<PluginError>),
}

impl Plan {
    fn from_flavored(objects: Vec<(weft_jobs::Flavor, JobObject)>) -> Plan {
        Plan::Objects(objects.into_iter().map(|(_, o)| o).collect())
    }
}

/// The reconciler. Build it with [`JobReconciler::new`] and run it with [`run`].
pub struct JobReconciler {
    config: JobControllerConfig,
    caches: OwnedCaches,
    /// The last InvalidJobPlugins message sent per job UID, so that a job whose status Volcano
    /// keeps updating does not get the same Event on each reconcile.
    warned: Mutex<HashMap<String, String>>,
}

impl Debug for JobReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobReconciler").field("config", &self.config).finish_non_exhaustive()
    }
}

/// FNV-1a, 64 bits: a hash that stays the same across builds and Rust versions (unlike std's
/// `DefaultHasher`), as a hash stored in an annotation must.
fn fnv1a(bytes: &[u8]) -> u64 {
    use std::hash::Hasher as _;
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// Whether every leaf of `want` is in `have` with the same value. Objects may have more keys in
/// `have` (server defaults, other managers' fields); lists must have the same length, element by
/// element (the server may default fields inside elements). An empty map or list in `want` matches
/// a missing one (the server drops them).
pub fn is_subset(want: &Value, have: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            w.iter().all(|(k, v)| h.get(k).map_or_else(|| empty(v), |hv| is_subset(v, hv)))
        }
        (Value::Array(w), Value::Array(h)) => w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b)),
        _ => want == have,
    }
}

/// The object with weft's labels, the owner reference to `job`, the job's namespace and (for a
/// Secret) `stringData` folded into `data`, as the API server would store it; returned as the
/// manifest to apply, annotated with its hash.
pub fn prepare(job: &Job, mut obj: JobObject) -> Value {
    if let JobObject::Secret(s) = &mut obj
        && let Some(strings) = s.string_data.take()
    {
        let data = s.data.get_or_insert_with(BTreeMap::new);
        for (k, v) in strings {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
    let meta: &mut ObjectMeta = obj.metadata_mut();
    meta.namespace = Some(job.job_namespace().to_owned());
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    labels.insert(JOB_LABEL.to_owned(), job.job_name().to_owned());
    let owner = weft_jobs::naming::owner_reference(job);
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    if !refs.iter().any(|r| r.uid == owner.uid) {
        refs.push(owner);
    }
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(APPLIED_HASH_ANNOTATION);
    }
    let mut manifest = obj.to_manifest();
    if let Some(m) = manifest.as_object_mut() {
        m.remove("status");
    }
    let hash = format!("{:016x}", fnv1a(manifest.to_string().as_bytes()));
    if let Some(meta) = manifest.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(APPLIED_HASH_ANNOTATION.to_owned(), Value::String(hash));
        }
    }
    manifest
}

async fn apply_one<K>(client: &Client, namespace: &str, name: &str, manifest: &Value, manager: &str) -> kube::Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.patch(name, &PatchParams::apply(manager).force(), &Patch::Apply(manifest)).await.map(|_| ())
}

async fn delete_one<K>(client: &Client, namespace: &str, name: &str, uid: &str) -> kube::Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid.to_owned()), resource_version: None }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or replaced by an object with another UID: nothing of ours to delete.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

impl JobReconciler {
    /// A reconciler that compares with and prunes from `caches`.
    pub fn new(config: JobControllerConfig, caches: OwnedCaches) -> JobReconciler {
        JobReconciler { config, caches, warned: Mutex::new(HashMap::new()) }
    }

    /// The objects `job` should have.
    async fn plan(&self, job: &Job, client: &Client) -> Result<Plan, JobError> {
        if job.has_ended() {
            return Ok(Plan::Objects(Vec::new()));
        }
        let plugins = match JobPlugins::weft(job, &self.config.build) {
            Ok(p) => p,
            Err(errors) => return Ok(Plan::Invalid(errors)),
        };
        if plugins.is_empty() {
            return Ok(Plan::Objects(Vec::new()));
        }
        let (ns, name) = (job.job_namespace(), job.job_name());
        if let Some(keys) = self.caches.ssh_keys(ns, name) {
            return plugins
                .job_objects(&ObjectContext { ssh_keys: &keys })
                .map(Plan::from_flavored)
                .map_err(JobError::Objects);
        }
        // No keys in the cache: find out whether any plugin wants keys before looking them up.
        let ask = AskOnly::default();
        let first = plugins.job_objects(&ObjectContext { ssh_keys: &ask });
        if !ask.0.load(Ordering::Relaxed) {
            return first.map(Plan::from_flavored).map_err(JobError::Objects);
        }
        // The cache may not have a Secret written moments ago yet: ask the API server before
        // generating keys, or a job could get two key pairs.
        let secret_name = ssh::secret_name(name);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let stored = secrets.get_opt(&secret_name).await.map_err(|source| JobError::Api {
            action: "reading",
            kind: "Secret",
            namespace: ns.to_owned(),
            name: secret_name.clone(),
            source,
        })?;
        let keys = match stored.as_ref().and_then(ssh::keys_from_secret) {
            Some(keys) => keys,
            // RSA key generation takes a while: off the async threads.
            None => tokio::task::spawn_blocking(|| ssh::RandomKeys.key_pair())
                .await
                .map_err(|e| JobError::Keys(e.to_string()))?
                .map_err(JobError::Keys)?,
        };
        plugins.job_objects(&ObjectContext { ssh_keys: &keys }).map(Plan::from_flavored).map_err(JobError::Objects)
    }

    /// Publish the InvalidJobPlugins Event unless this job already got this message.
    async fn warn_invalid(&self, job: &Job, ctx: &Context, errors: &[PluginError]) {
        let message = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        let uid = job.job_uid().to_owned();
        {
            let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
            if warned.get(&uid) == Some(&message) {
                return;
            }
            warned.insert(uid, message.clone());
        }
        tracing::warn!(
            controller = NAME,
            namespace = job.job_namespace(),
            job = job.job_name(),
            %message,
            "the job's weft plugins do not build; its objects are left as they are"
        );
        let note = format!("annotation {}: {message}", weft_jobs::PLUGINS_ANNOTATION);
        ctx.event(job, EventType::Warning, INVALID_REASON, "BuildPlugins", Some(note)).await;
    }

    async fn apply_object(
        &self,
        client: &Client,
        manager: &str,
        ns: &str,
        obj: &JobObject,
        manifest: &Value,
    ) -> Result<(), JobError> {
        let (kind, name) = (obj.kind(), obj.name());
        let result = match obj {
            JobObject::ConfigMap(_) => apply_one::<ConfigMap>(client, ns, name, manifest, manager).await,
            JobObject::Secret(_) => apply_one::<Secret>(client, ns, name, manifest, manager).await,
            JobObject::Service(_) => apply_one::<Service>(client, ns, name, manifest, manager).await,
            JobObject::NetworkPolicy(_) => apply_one::<NetworkPolicy>(client, ns, name, manifest, manager).await,
        };
        result.map_err(|source| JobError::Api {
            action: "applying",
            kind,
            namespace: ns.to_owned(),
            name: name.to_owned(),
            source,
        })
    }

    async fn delete_object(&self, client: &Client, ns: &str, e: &Existing) -> Result<(), JobError> {
        let result = match e.kind {
            "ConfigMap" => delete_one::<ConfigMap>(client, ns, &e.name, &e.uid).await,
            "Secret" => delete_one::<Secret>(client, ns, &e.name, &e.uid).await,
            "Service" => delete_one::<Service>(client, ns, &e.name, &e.uid).await,
            "NetworkPolicy" => delete_one::<NetworkPolicy>(client, ns, &e.name, &e.uid).await,
            _ => Ok(()),
        };
        result.map_err(|source| JobError::Api {
            action: "deleting",
            kind: e.kind,
            namespace: ns.to_owned(),
            name: e.name.clone(),
            source,
        })
    }
}

impl Reconciler<Job> for JobReconciler {
    type Error = JobError;

    async fn apply(&self, job: Arc<Job>, ctx: &Context) -> Result<Action, JobError> {
        if job.metadata.deletion_timestamp.is_some() {
            // Being deleted: the garbage collector removes what it owns.
            return Ok(Action::await_change());
        }
        let (ns, name, uid) = (job.job_namespace(), job.job_name(), job.job_uid());
        self.caches.ready(self.config.cache_timeout).await?;
        let desired = match self.plan(&job, &ctx.client).await? {
            Plan::Objects(objects) => objects,
            Plan::Invalid(errors) => {
                self.warn_invalid(&job, ctx, &errors).await;
                return Ok(Action::await_change());
            }
        };
        self.warned.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);

        let mut keep = BTreeSet::new();
        for obj in desired {
            let manifest = prepare(&job, obj.clone());
            keep.insert((obj.kind(), obj.name().to_owned()));
            let stored = self.caches.get(obj.kind(), ns, obj.name());
            if stored.as_ref().is_some_and(|have| is_subset(&manifest, have)) {
                continue;
            }
            tracing::info!(
                controller = NAME,
                namespace = ns,
                job = name,
                kind = obj.kind(),
                object = obj.name(),
                created = stored.is_none(),
                "applying"
            );
            self.apply_object(&ctx.client, &ctx.field_manager, ns, &obj, &manifest).await?;
        }
        for existing in self.caches.of_job(ns, name, uid) {
            if keep.contains(&(existing.kind, existing.name.clone())) {
                continue;
            }
            tracing::info!(
                controller = NAME,
                namespace = ns,
                job = name,
                kind = existing.kind,
                object = %existing.name,
                ended = job.has_ended(),
                "deleting"
            );
            self.delete_object(&ctx.client, ns, &existing).await?;
        }
        Ok(Action::await_change())
    }
}

/// Whether the API server serves Volcano's Job (`jobs` in `batch.volcano.sh/v1alpha1`).
pub async fn jobs_api_served(client: &Client) -> kube::Result<bool> {
    match client.list_api_group_resources(weft_jobs::job::API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "jobs")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Wait until Volcano's Job API is served; `false` when `shutdown` came first.
async fn wait_for_jobs_api(client: &Client, poll: Duration, shutdown: impl Future<Output = ()>) -> bool {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut checks: u64 = 0;
    loop {
        match jobs_api_served(client).await {
            Ok(true) => {
                if checks > 0 {
                    tracing::info!(controller = NAME, "Volcano's Job API is served now; starting");
                }
                return true;
            }
            // First time, then every 20th check, so that the log says why nothing happens.
            Ok(false) if checks.is_multiple_of(20) => tracing::warn!(
                controller = NAME,
                "Volcano's Job API ({}, resource jobs) is not served: is Volcano installed? \
                 The job controller waits for it, checking every {poll:?}",
                weft_jobs::job::API_VERSION
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                controller = NAME,
                error = %ErrorChain(&e),
                "checking whether Volcano's Job API is served failed; checking again in {poll:?}"
            ),
        }
        checks += 1;
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = &mut shutdown => return false,
        }
    }
}

fn owned_stream<K>(
    client: &Client,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    watcher(api, watcher::Config::default().labels(&owned_selector())).reflect(writer).touched_objects()
}

/// Run the controller over every Volcano Job until `shutdown` completes. Waits (logging why)
/// while Volcano's Job API is not served.
pub async fn run(
    ctx: Context,
    settings: Settings,
    config: JobControllerConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = Box::pin(shutdown).shared();
    if !wait_for_jobs_api(&ctx.client, config.api_poll, shutdown.clone()).await {
        return;
    }
    let client = ctx.client.clone();
    let (config_maps, cm_writer) = reflector::store();
    let (secrets, secret_writer) = reflector::store();
    let (services, service_writer) = reflector::store();
    let (network_policies, np_writer) = reflector::store();
    let caches = OwnedCaches { config_maps, secrets, services, network_policies };
    let reconciler = Arc::new(JobReconciler::new(config, caches));
    let configure = |c: Controller<Job>| {
        c.owns_stream(owned_stream::<ConfigMap>(&client, cm_writer))
            .owns_stream(owned_stream::<Secret>(&client, secret_writer))
            .owns_stream(owned_stream::<Service>(&client, service_writer))
            .owns_stream(owned_stream::<NetworkPolicy>(&client, np_writer))
    };
    let api: Api<Job> = Api::all(client.clone());
    weft_kube::controller::run_with(
        api,
        watcher::Config::default(),
        Scope::namespaced(),
        reconciler,
        ctx,
        settings,
        shutdown,
        configure,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn subset_ignores_extra_fields_but_not_changed_or_missing_ones() {
        let want = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 22}]}});
        let have = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "uid": "u"},
            "spec": {"ports": [{"port": 22, "protocol": "TCP"}], "clusterIP": "None"}});
        assert!(is_subset(&want, &have));
        assert!(!is_subset(&json!({"metadata": {"labels": {"a": "2"}}}), &have));
        assert!(!is_subset(&json!({"data": {"k": "v"}}), &have));
        assert!(!is_subset(&json!({"spec": {"ports": [{"port": 22}, {"port": 23}]}}), &have));
        assert!(is_subset(&json!({"data": {}, "spec": {"ports": [{"port": 22, "x": []}]}}), &have), "empty = missing");
    }

    fn job() -> Job {
        let mut job = Job::new("j", weft_jobs::JobSpec::default());
        job.metadata.namespace = Some("ns".into());
        job.metadata.uid = Some("u1".into());
        job
    }

    #[test]
    fn prepared_objects_carry_labels_owner_and_a_hash_of_their_content() {
        let job = job();
        let cm = |v: &str| {
            JobObject::ConfigMap(ConfigMap {
                metadata: ObjectMeta { name: Some("j-svc".into()), ..Default::default() },
                data: Some([("k".to_owned(), v.to_owned())].into()),
                ..Default::default()
            })
        };
        let a = prepare(&job, cm("1"));
        assert_eq!(a["metadata"]["labels"][JOB_LABEL], "j");
        assert_eq!(a["metadata"]["labels"][MANAGED_BY_LABEL], "weft");
        assert_eq!(a["metadata"]["namespace"], "ns");
        assert_eq!(a["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(a["kind"], "ConfigMap");
        let hash = |v: &Value| v["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].as_str().map(str::to_owned);
        assert_eq!(hash(&a), hash(&prepare(&job, cm("1"))), "same content, same hash");
        assert_ne!(hash(&a), hash(&prepare(&job, cm("2"))));
    }

    #[test]
    fn the_applied_hash_is_fnv1a_64() {
        // Published FNV-1a 64 test vectors: a hash stored in objects must never change.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn secret_string_data_is_folded_into_data() {
        let secret = JobObject::Secret(Secret {
            metadata: ObjectMeta { name: Some("j-ssh".into()), ..Default::default() },
            string_data: Some([("config".to_owned(), "Host x".to_owned())].into()),
            ..Default::default()
        });
        let m = prepare(&job(), secret);
        assert!(m.get("stringData").is_none());
        assert_eq!(m["data"]["config"], "SG9zdCB4", "base64 of `Host x`");
    }
}
