//! Where the pod webhook finds the Volcano Job that owns a pod ([`JobSource`]): a reflector over
//! every Volcano Job with a GET fallback ([`KubeJobSource`]), or a map in tests
//! ([`InMemoryJobs`]); and the [`PodMutator`]s built from those Jobs ([`MutatorCache`]).
//!
//! The watch can lag: Volcano's controller creates a job's first pods right after it sees the Job,
//! and the pod's admission request can reach the webhook before the Job's watch event does. The
//! webhook therefore reads the Job from the API server when the cache has no Job of that name, a
//! Job with another uid (deleted and created again), or an older one than the pod was made from
//! (see [`super::JOB_VERSION_ANNOTATION`]).

use std::collections::{HashMap, VecDeque};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use weft_jobs::Job;
use weft_jobs::admission::{AdmissionOptions, PodMutator};

/// Where the pod webhook looks up Volcano Jobs.
pub trait JobSource: Send + Sync {
    /// The Job `namespace/name` as the watch cache holds it, if it does.
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Job>>;

    /// The Job `namespace/name` read from the API server; `Ok(None)` when it does not exist.
    fn fetch<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<Option<Arc<Job>>, String>>;

    /// Whether the cache has listed every Job at least once.
    fn is_synced(&self) -> bool;
}

/// [`JobSource`] over the API server: a reflector on `batch.volcano.sh/v1alpha1` Jobs in every
/// namespace (list, watch) and a GET for the fallback. Dropping it stops the watch.
pub struct KubeJobSource {
    client: Client,
    store: Store<Job>,
    synced: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for KubeJobSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeJobSource")
            .field("jobs", &self.store.len())
            .field("synced", &self.is_synced())
            .finish_non_exhaustive()
    }
}

impl KubeJobSource {
    /// Starts the watch on `client` (needs a Tokio runtime) and returns at once.
    pub fn spawn(client: Client) -> KubeJobSource {
        let (store, mut writer) = reflector::store::<Job>();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = watcher::watcher(Api::<Job>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(slim_job);
        let flag = synced.clone();
        let task = tokio::spawn(async move {
            let mut stream = pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        writer.apply_watcher_event(&event);
                        if matches!(event, Event::InitDone) && !flag.swap(true, Ordering::AcqRel) {
                            tracing::info!("Volcano Job cache synced");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "Volcano Job watch failed; retrying"),
                }
            }
        });
        KubeJobSource { client, store, synced, task }
    }

    /// Waits until the cache has listed every Job once.
    pub async fn wait_until_synced(&self) {
        // Errs only when the watch task has ended; then there is nothing to wait for.
        let _ = self.store.wait_until_ready().await;
    }

    /// Number of Jobs in the cache.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the cache holds no Job.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}

impl Drop for KubeJobSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Drops what the webhook never reads and can be large: managed fields and kubectl's copy of the
/// whole object.
fn slim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    if let Some(a) = job.metadata.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

impl JobSource for KubeJobSource {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Job>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    fn fetch<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<Option<Arc<Job>>, String>> {
        Box::pin(async move {
            let api = Api::<Job>::namespaced(self.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(job) => Ok(job.map(|mut j| {
                    slim_job(&mut j);
                    Arc::new(j)
                })),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

/// [`JobSource`] over two maps, for tests: what the cache holds and what the API server holds.
#[derive(Debug, Default)]
pub struct InMemoryJobs {
    cache: RwLock<HashMap<(String, String), Arc<Job>>>,
    api: RwLock<HashMap<(String, String), Arc<Job>>>,
    fetches: AtomicUsize,
    unsynced: AtomicBool,
}

fn key(job: &Job) -> (String, String) {
    (job.job_namespace().to_owned(), job.job_name().to_owned())
}

impl InMemoryJobs {
    /// Empty and synced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `job` into both the cache and the API server.
    pub fn insert(&self, job: Job) {
        let job = Arc::new(job);
        self.api.write().unwrap_or_else(PoisonError::into_inner).insert(key(&job), job.clone());
        self.cache.write().unwrap_or_else(PoisonError::into_inner).insert(key(&job), job);
    }

    /// Puts `job` into the API server only: the watch has not delivered it yet.
    pub fn insert_api_only(&self, job: Job) {
        self.api.write().unwrap_or_else(PoisonError::into_inner).insert(key(&job), Arc::new(job));
    }

    /// Puts `job` into the cache only: the API server no longer has it.
    pub fn insert_cache_only(&self, job: Job) {
        self.cache.write().unwrap_or_else(PoisonError::into_inner).insert(key(&job), Arc::new(job));
    }

    /// Marks the cache synced or not.
    pub fn set_synced(&self, synced: bool) {
        self.unsynced.store(!synced, Ordering::Release);
    }

    /// How many times [`JobSource::fetch`] was called.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::Acquire)
    }
}

impl JobSource for InMemoryJobs {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Job>> {
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        cache.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    fn fetch<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<Option<Arc<Job>>, String>> {
        self.fetches.fetch_add(1, Ordering::AcqRel);
        let api = self.api.read().unwrap_or_else(PoisonError::into_inner);
        let found = api.get(&(namespace.to_owned(), name.to_owned())).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn is_synced(&self) -> bool {
        !self.unsynced.load(Ordering::Acquire)
    }
}

/// A job's mutator, or why weft's plugins do not build for it.
pub type Built = Result<PodMutator, String>;

/// [`PodMutator`]s by Job, so a job's plugins are built once per Job version and reused for all its
/// pods. Holds at most `capacity` Jobs (the oldest inserted goes first) and one version per Job:
/// an entry is used only when namespace, name, uid and resourceVersion all match.
#[derive(Debug)]
pub struct MutatorCache {
    inner: Mutex<CacheInner>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct CacheInner {
    entries: HashMap<JobKey, (String, Arc<Built>)>,
    order: VecDeque<JobKey>,
}

/// namespace, name, uid.
type JobKey = (String, String, String);

/// Default number of Jobs whose mutators are kept.
pub const DEFAULT_MUTATOR_CACHE_CAPACITY: usize = 1024;

impl Default for MutatorCache {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_MUTATOR_CACHE_CAPACITY)
    }
}

impl MutatorCache {
    /// A cache of at most `capacity` Jobs (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self { inner: Mutex::new(CacheInner::default()), capacity: capacity.max(1) }
    }

    /// The mutator for `job` at its resourceVersion, built with `opts` if the cache has none; the
    /// flag says whether it was built now.
    pub fn get_or_build(&self, job: &Job, opts: &AdmissionOptions) -> (Arc<Built>, bool) {
        let key: JobKey = (job.job_namespace().to_owned(), job.job_name().to_owned(), job.job_uid().to_owned());
        let version = job.metadata.resource_version.clone().unwrap_or_default();
        {
            let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((v, built)) = inner.entries.get(&key)
                && *v == version
            {
                return (built.clone(), false);
            }
        }
        // Built outside the lock: two pods of a new job version may both build; both results are
        // the same and the second replaces the first.
        let built = Arc::new(
            PodMutator::new(job, opts)
                .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
        );
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.entries.insert(key.clone(), (version, built.clone())).is_none() {
            inner.order.push_back(key);
            while inner.order.len() > self.capacity {
                if let Some(oldest) = inner.order.pop_front() {
                    inner.entries.remove(&oldest);
                }
            }
        }
        (built, true)
    }

    /// Number of Jobs held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).entries.len()
    }

    /// Whether no Job is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use weft_jobs::JobSpec;

    fn job(name: &str, uid: &str, rv: &str) -> Job {
        let mut j = Job::new(name, JobSpec::default());
        j.metadata.namespace = Some("ml".into());
        j.metadata.uid = Some(uid.into());
        j.metadata.resource_version = Some(rv.into());
        j
    }

    #[test]
    fn mutators_are_reused_per_version_and_bounded() {
        let cache = MutatorCache::with_capacity(2);
        let opts = AdmissionOptions::default();
        let (a, built) = cache.get_or_build(&job("a", "u1", "1"), &opts);
        assert!(built);
        let (again, built) = cache.get_or_build(&job("a", "u1", "1"), &opts);
        assert!(!built && Arc::ptr_eq(&a, &again), "same version: reused");
        assert!(cache.get_or_build(&job("a", "u1", "2"), &opts).1, "new resourceVersion: rebuilt");
        assert!(cache.get_or_build(&job("a", "u2", "2"), &opts).1, "new uid: rebuilt");
        assert_eq!(cache.len(), 2, "one entry per job and uid");
        cache.get_or_build(&job("b", "u3", "1"), &opts);
        assert_eq!(cache.len(), 2, "capacity 2: the oldest job went");
        assert!(cache.get_or_build(&job("a", "u1", "2"), &opts).1, "evicted, so rebuilt");
    }
}
