//! Where the Pipeline and NumaNetwork webhooks find NumaNetworks ([`NumaNetworkSource`]): a
//! metadata watch over every NumaNetwork with a GET fallback and a LIST for the cap
//! ([`KubeNumaNetworks`]), or sets in memory for tests and local runs ([`InMemoryNumaNetworks`]).
//!
//! The webhooks only need names: whether a NumaNetwork exists (a Pipeline may name it) and how
//! many there are (the cap). The watch asks for metadata only (`PartialObjectMetadata`), so the
//! cache holds names, not specs. NumaNetworks are cluster-scoped; weft-admission reads them as
//! dynamic objects so it does not depend on the CRD crate (component crates stay independent).

use std::collections::HashSet;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::task::JoinHandle;

/// API group of NumaNetworks (Numaflow's group, kept by the proposal).
pub const GROUP: &str = "numaflow.numaproj.io";
/// Version of NumaNetworks.
pub const VERSION: &str = "v1alpha1";
/// Kind.
pub const KIND: &str = "NumaNetwork";
/// Resource (plural).
pub const PLURAL: &str = "numanetworks";

/// The NumaNetwork resource, for dynamic API calls.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// Checks a NumaNetwork as the API server's schema and CEL rules would: the object, and on UPDATE
/// the stored object for the transition rules. Every problem, each naming its field (`spec.…: …`);
/// none when it is valid. The binary provides it from `weft_crds::NumaNetwork` (see
/// [`typed_validator`]).
pub type NumaNetworkValidator = Arc<dyn Fn(&Value, Option<&Value>) -> Vec<String> + Send + Sync>;

/// A [`NumaNetworkValidator`] over a typed NumaNetwork `T`: the objects are read as `T` (a problem
/// when they cannot be) and passed to `check(object, old)`.
pub fn typed_validator<T, F>(check: F) -> NumaNetworkValidator
where
    T: DeserializeOwned,
    F: Fn(&T, Option<&T>) -> Vec<String> + Send + Sync + 'static,
{
    Arc::new(move |object: &Value, old: Option<&Value>| {
        let new = match serde_json::from_value::<T>(object.clone()) {
            Ok(n) => n,
            Err(e) => return vec![format!("not a readable NumaNetwork: {e}")],
        };
        match old.map(|o| serde_json::from_value::<T>(o.clone())) {
            None => check(&new, None),
            Some(Ok(old)) => check(&new, Some(&old)),
            // The stored object does not read: only the new one can be checked.
            Some(Err(_)) => check(&new, None),
        }
    })
}

/// Where the webhooks look up NumaNetworks.
pub trait NumaNetworkSource: Send + Sync {
    /// Whether the watch cache holds a NumaNetwork named `name`.
    fn cached(&self, name: &str) -> bool;

    /// Whether the API server has a NumaNetwork named `name` (GET).
    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, String>>;

    /// The names of every NumaNetwork as the API server lists them now (LIST).
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>>;

    /// Whether the cache has listed every NumaNetwork at least once.
    fn is_synced(&self) -> bool;
}

/// A NumaNetwork's metadata (the API answers with `PartialObjectMetadata`).
type Meta = PartialObjectMeta<DynamicObject>;

/// [`NumaNetworkSource`] over the API server: a metadata watch on every NumaNetwork (list, watch),
/// a GET for names the cache does not hold and a LIST for counting. Dropping it stops the watch.
pub struct KubeNumaNetworks {
    api: Api<Meta>,
    names: Arc<RwLock<HashSet<String>>>,
    synced: tokio::sync::watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for KubeNumaNetworks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNumaNetworks")
            .field("cached", &self.names.read().unwrap_or_else(PoisonError::into_inner).len())
            .field("synced", &self.is_synced())
            .finish_non_exhaustive()
    }
}

impl KubeNumaNetworks {
    /// Starts the watch on `client` (needs a Tokio runtime) and returns at once.
    pub fn spawn(client: Client) -> KubeNumaNetworks {
        let api = Api::<Meta>::all_with(client, &api_resource());
        let names = Arc::new(RwLock::new(HashSet::new()));
        let (flag, synced) = tokio::sync::watch::channel(false);
        let stream = watcher::watcher(api.clone(), watcher::Config::default()).default_backoff();
        let cache = names.clone();
        let task = tokio::spawn(async move {
            let mut stream = pin!(stream);
            let mut listing: HashSet<String> = HashSet::new();
            while let Some(event) = stream.next().await {
                let name = |m: &Meta| m.metadata.name.clone().unwrap_or_default();
                match event {
                    Ok(Event::Init) => listing.clear(),
                    Ok(Event::InitApply(m)) => {
                        listing.insert(name(&m));
                    }
                    Ok(Event::InitDone) => {
                        *cache.write().unwrap_or_else(PoisonError::into_inner) = std::mem::take(&mut listing);
                        if !flag.send_replace(true) {
                            tracing::info!("NumaNetwork cache synced");
                        }
                    }
                    Ok(Event::Apply(m)) => {
                        cache.write().unwrap_or_else(PoisonError::into_inner).insert(name(&m));
                    }
                    Ok(Event::Delete(m)) => {
                        cache.write().unwrap_or_else(PoisonError::into_inner).remove(&name(&m));
                    }
                    Err(e) => tracing::warn!(error = %e, "NumaNetwork watch failed; retrying"),
                }
            }
        });
        KubeNumaNetworks { api, names, synced, task }
    }

    /// Waits until the cache has listed every NumaNetwork once (or the watch task has ended).
    pub async fn wait_until_synced(&self) {
        // Errs only when the watch task has ended; then there is nothing to wait for.
        let _ = self.synced.clone().wait_for(|synced| *synced).await;
    }

    /// Number of NumaNetworks in the cache.
    pub fn len(&self) -> usize {
        self.names.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether the cache holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for KubeNumaNetworks {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NumaNetworkSource for KubeNumaNetworks {
    fn cached(&self, name: &str) -> bool {
        self.names.read().unwrap_or_else(PoisonError::into_inner).contains(name)
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move { self.api.get_opt(name).await.map(|m| m.is_some()).map_err(|e| e.to_string()) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let list = self.api.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            Ok(list.items.into_iter().filter_map(|m| m.metadata.name).collect())
        })
    }

    fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }
}

/// [`NumaNetworkSource`] over two sets, for tests and `weft webhook --numa-networks-file`: what the
/// cache holds and what the API server holds.
#[derive(Debug, Default)]
pub struct InMemoryNumaNetworks {
    cache: RwLock<HashSet<String>>,
    api: RwLock<HashSet<String>>,
    fetches: AtomicUsize,
    lists: AtomicUsize,
    unsynced: AtomicBool,
    failing: AtomicBool,
}

impl InMemoryNumaNetworks {
    /// Empty and synced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `name` into both the cache and the API server.
    pub fn insert(&self, name: &str) {
        self.api.write().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned());
        self.cache.write().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned());
    }

    /// Puts `name` into the API server only: the watch has not delivered it yet.
    pub fn insert_api_only(&self, name: &str) {
        self.api.write().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned());
    }

    /// Removes `name` from both.
    pub fn remove(&self, name: &str) {
        self.api.write().unwrap_or_else(PoisonError::into_inner).remove(name);
        self.cache.write().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    /// Marks the cache synced or not.
    pub fn set_synced(&self, synced: bool) {
        self.unsynced.store(!synced, Ordering::Release);
    }

    /// Makes every GET and LIST fail (the API server is unreachable) or succeed again.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Release);
    }

    /// How many times [`NumaNetworkSource::fetch`] was called.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::Acquire)
    }

    /// How many times [`NumaNetworkSource::list`] was called.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::Acquire)
    }
}

impl NumaNetworkSource for InMemoryNumaNetworks {
    fn cached(&self, name: &str) -> bool {
        self.cache.read().unwrap_or_else(PoisonError::into_inner).contains(name)
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, String>> {
        self.fetches.fetch_add(1, Ordering::AcqRel);
        let answer = if self.failing.load(Ordering::Acquire) {
            Err("the API server is unreachable (test)".to_owned())
        } else {
            Ok(self.api.read().unwrap_or_else(PoisonError::into_inner).contains(name))
        };
        Box::pin(async move { answer })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        self.lists.fetch_add(1, Ordering::AcqRel);
        let answer = if self.failing.load(Ordering::Acquire) {
            Err("the API server is unreachable (test)".to_owned())
        } else {
            let mut names: Vec<String> =
                self.api.read().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
            names.sort_unstable();
            Ok(names)
        };
        Box::pin(async move { answer })
    }

    fn is_synced(&self) -> bool {
        !self.unsynced.load(Ordering::Acquire)
    }
}
