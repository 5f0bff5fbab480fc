//! The node's resource state shared by both enforcement modes: the [`ResourceManager`], the
//! checkpoint behind it, the containers weft knows on this node, and where pod specs come from.
//!
//! Invariants (see ARCHITECTURE.md):
//! - Every change to the allocations is checkpointed before it is acted on: an admit is stored
//!   before RunPodSandbox answers (a failed store rolls the admit back and fails the sandbox), a
//!   release is stored before the next admit can reuse its CPUs.
//! - The lock over the state is a plain mutex never held across an `.await`; the slow parts (a
//!   kubelet fetch) happen before it is taken.
//! - At start the state is the checkpoint; the runtime's Synchronize (NRI) or the kubelet's pod
//!   list (bypass) then releases what no longer runs and admits what runs without weft
//!   ([`Manager::resync`]). So a crash between any two steps leaves neither a CPU given twice (the
//!   checkpoint never holds an allocation the disk does not also hold) nor a leak (what the
//!   checkpoint holds for a pod that never started is released at the next resync).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;
use weft_topology::CpuSet;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::kubelet::{KubeletError, PodSource};
use crate::orm::{OrmState, ResourceManager};
use crate::pod::{DeviceLocator, PodSpec, pod_devices};
use crate::sandboxes::Sandboxes;
use crate::settings::ContainerSettings;

/// How long an admission waits for the kubelet before the runtime has said its request timeout:
/// half of NRI's default 2 s.
pub const DEFAULT_KUBELET_BUDGET: Duration = Duration::from_secs(1);

/// Where the allocations are kept across restarts. [`Checkpoint`] is the real one; tests wrap it to
/// stop at a chosen step.
pub trait StateStore: Send + Sync {
    /// The stored state; `Ok(None)` when there is none yet.
    fn load(&self) -> Result<Option<OrmState>, CheckpointError>;
    /// Replace the stored state atomically.
    fn store(&self, state: &OrmState) -> Result<(), CheckpointError>;
}

impl StateStore for Checkpoint {
    fn load(&self) -> Result<Option<OrmState>, CheckpointError> {
        Checkpoint::load(self)
    }
    fn store(&self, state: &OrmState) -> Result<(), CheckpointError> {
        Checkpoint::store(self, state)
    }
}

/// Why the manager could not do what it was asked.
#[derive(Debug, Error)]
pub enum ManagerError {
    /// Admission refused the pod (policy, capacity, bad input).
    #[error("admitting pod {pod}: {reason}")]
    Admit {
        /// `namespace/name (uid)`.
        pod: String,
        /// Why.
        reason: String,
    },
    /// An in-place resize was refused ([`crate::orm::ResizeError`]) or its spec could not be read.
    #[error("{0}")]
    Resize(String),
    /// The checkpoint could not be written; the change was rolled back.
    #[error("pod {pod}: {source}; the allocation was rolled back")]
    Checkpoint {
        /// `namespace/name (uid)`.
        pod: String,
        /// The store error.
        #[source]
        source: CheckpointError,
    },
}

/// A container weft knows on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedContainer {
    /// Its pod's UID.
    pub pod_uid: String,
    /// Container name.
    pub name: String,
    /// Its cgroup, as the runtime reported it (NRI `cgroups_path`), where known.
    pub cgroups_path: Option<String>,
    /// The settings last enforced on it (adjustment, update or cgroup write).
    pub applied: Option<ContainerSettings>,
}

/// Identity of a pod as the runtime reports it, used when the kubelet cannot say more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodMeta {
    /// Kubernetes pod UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

impl PodMeta {
    fn label(&self) -> String {
        format!("{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// Pod specs by UID: the kubelet's pod list, cached, refetched on a miss (a pod the kubelet is
/// about to start is in its list before its sandbox exists, as Katalyst's cache bypass relies on).
pub struct PodCatalog {
    source: Option<Arc<dyn PodSource>>,
    cache: Mutex<HashMap<String, PodSpec>>,
}

impl PodCatalog {
    /// A catalog over `source` (`None`: no kubelet; every pod is treated from the runtime's facts).
    pub fn new(source: Option<Arc<dyn PodSource>>) -> PodCatalog {
        PodCatalog { source, cache: Mutex::new(HashMap::new()) }
    }

    /// Replace the cache with `pods` (a fresh kubelet list); pods whose spec does not parse are
    /// logged and left out.
    pub fn replace(&self, pods: &[Pod]) {
        let mut fresh = HashMap::new();
        for pod in pods {
            match PodSpec::from_pod(pod) {
                Ok(spec) => {
                    fresh.insert(spec.uid.clone(), spec);
                }
                Err(e) => tracing::warn!(error = %e, "kubelet pod list: skipping a pod"),
            }
        }
        *lock(&self.cache) = fresh;
    }

    /// A fresh kubelet pod list, which also refills the cache; `Ok(None)` without a kubelet.
    pub async fn list(&self) -> Result<Option<Vec<Pod>>, KubeletError> {
        let Some(source) = self.source.as_ref() else { return Ok(None) };
        let pods = source.pods().await?;
        self.replace(&pods);
        Ok(Some(pods))
    }

    /// The spec of pod `uid` from the cache.
    pub fn cached(&self, uid: &str) -> Option<PodSpec> {
        lock(&self.cache).get(uid).cloned()
    }

    /// Refill the cache from a fresh kubelet list (nothing to do without a kubelet).
    pub async fn refresh(&self) -> Result<(), KubeletError> {
        let Some(source) = self.source.as_ref() else { return Ok(()) };
        let pods = source.pods().await?;
        self.replace(&pods);
        Ok(())
    }

    /// The spec of pod `uid`: from the cache, else from a fresh kubelet list. `Ok(None)` when the
    /// kubelet does not know the pod, or there is no kubelet to ask.
    pub async fn spec(&self, uid: &str) -> Result<Option<PodSpec>, KubeletError> {
        if let Some(spec) = self.cached(uid) {
            return Ok(Some(spec));
        }
        self.refresh().await?;
        Ok(self.cached(uid))
    }
}

/// The node's resource state.
pub struct Manager {
    state: Mutex<ManagerState>,
    kubelet_budget: Mutex<Duration>,
    store: Arc<dyn StateStore>,
    catalog: Arc<PodCatalog>,
    locator: Arc<dyn DeviceLocator>,
}

struct ManagerState {
    rm: ResourceManager,
    containers: BTreeMap<String, TrackedContainer>,
    /// Each pod's sandboxes as the runtime reported them (NRI mode; empty in bypass).
    sandboxes: Sandboxes,
    /// Bumped by every admit and release: what a container should have can only move then.
    generation: u64,
    /// The generation [`Manager::moved_since_last_scan`] last looked at.
    scanned: u64,
}

/// The admitted pods that are gone: admitted before the kubelet's list was taken
/// (`admitted_before`), not active in that list (`active`: absent, Succeeded or Failed), and with
/// no container the runtime still has (`with_containers`). A pod admitted after the list was
/// taken is never in `admitted_before` (the kubelet lists a pod before it asks for its sandbox),
/// and a pod whose containers still exist is kept even when the kubelet's list lacks it (a
/// kubelet that just restarted may list nothing yet).
pub fn gone_pods(
    admitted_before: &BTreeSet<String>,
    active: &BTreeSet<String>,
    with_containers: &BTreeSet<String>,
) -> Vec<String> {
    admitted_before.iter().filter(|uid| !active.contains(*uid) && !with_containers.contains(*uid)).cloned().collect()
}

/// What a resync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resync {
    /// Pods released because they no longer run.
    pub released: Vec<String>,
    /// Pods admitted because they ran without weft.
    pub admitted: Vec<String>,
    /// Pods that run but could not be admitted (they keep running in the shared pool).
    pub refused: Vec<(String, String)>,
}

/// Run blocking file I/O (the checkpoint's write and fsyncs) from async code: on a multi-threaded
/// runtime the worker hands its other tasks to another thread first, so a slow disk delays only this
/// call, not the NRI session's other tasks.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The settings of a container of a pod weft could not admit: the shared pool, nothing else.
fn unmanaged(shared_pool: CpuSet) -> ContainerSettings {
    ContainerSettings { cpus: shared_pool, ..ContainerSettings::default() }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the state half-changed (every mutation is a
    // single ResourceManager call that rolls back on failure), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Manager {
    /// A manager over `rm` (already restored from the checkpoint by the caller).
    pub fn new(
        rm: ResourceManager,
        store: Arc<dyn StateStore>,
        catalog: Arc<PodCatalog>,
        locator: Arc<dyn DeviceLocator>,
    ) -> Manager {
        let state = ManagerState {
            rm,
            containers: BTreeMap::new(),
            sandboxes: Sandboxes::default(),
            generation: 0,
            scanned: 0,
        };
        Manager {
            state: Mutex::new(state),
            kubelet_budget: Mutex::new(DEFAULT_KUBELET_BUDGET),
            store,
            catalog,
            locator,
        }
    }

    /// The pod-spec catalog.
    pub fn catalog(&self) -> &Arc<PodCatalog> {
        &self.catalog
    }

    /// How long an admission may wait for the kubelet's pod list: half the runtime's request
    /// timeout (NRI Configure), so a slow kubelet fails the call instead of getting weft dropped.
    pub fn set_kubelet_budget(&self, budget: Duration) {
        *lock(&self.kubelet_budget) = budget;
    }

    /// Admit pod `meta.uid` (idempotent) and checkpoint: RunPodSandbox and CreateContainer. The
    /// spec comes from the kubelet; a pod the kubelet does not know (or no kubelet configured) is
    /// admitted into the shared pool from the runtime's facts (its annotations still give its
    /// devices). A kubelet that fails or does not answer within the budget fails the admission, so
    /// the runtime fails the sandbox and the kubelet retries it, rather than a Guaranteed pod being
    /// admitted without its exclusive CPUs.
    pub async fn admit(&self, meta: &PodMeta) -> Result<(), ManagerError> {
        if self.is_admitted(&meta.uid) {
            return Ok(());
        }
        let budget = *lock(&self.kubelet_budget);
        let spec = match tokio::time::timeout(budget, self.catalog.spec(&meta.uid)).await {
            Ok(Ok(Some(spec))) => spec,
            Ok(Ok(None)) => {
                tracing::warn!(pod = %meta.label(), "the kubelet has no spec for this pod: admitting into the shared pool");
                PodSpec::unknown(&meta.uid, &meta.namespace, &meta.name, meta.annotations.clone())
            }
            Ok(Err(e)) => {
                return Err(ManagerError::Admit {
                    pod: meta.label(),
                    reason: format!("pod spec unavailable: {e} (the runtime will retry)"),
                });
            }
            Err(_) => {
                return Err(ManagerError::Admit {
                    pod: meta.label(),
                    reason: format!(
                        "the kubelet did not list pods within {} ms (the runtime will retry)",
                        budget.as_millis()
                    ),
                });
            }
        };
        self.admit_spec(&spec)
    }

    /// Admit a running pod found at a resync from the cached spec (the caller refreshed the cache
    /// once for the whole resync); without one, into the shared pool.
    fn admit_running(&self, meta: &PodMeta) -> Result<(), ManagerError> {
        let spec = self.catalog.cached(&meta.uid).unwrap_or_else(|| {
            tracing::warn!(pod = %meta.label(), "no pod spec from the kubelet: admitting the running pod into the shared pool");
            PodSpec::unknown(&meta.uid, &meta.namespace, &meta.name, meta.annotations.clone())
        });
        self.admit_spec(&spec)
    }

    /// Admit a pod whose spec is known (bypass mode reads it from the pod list) and checkpoint.
    pub fn admit_spec(&self, spec: &PodSpec) -> Result<(), ManagerError> {
        let label = format!("{}/{} ({})", spec.namespace, spec.name, spec.uid);
        let devices = pod_devices(spec, self.locator.as_ref())
            .map_err(|e| ManagerError::Admit { pod: label.clone(), reason: e.to_string() })?;
        let mut st = lock(&self.state);
        if st.rm.allocation(&spec.uid).is_some() {
            return Ok(());
        }
        st.rm.admit(spec, &devices).map_err(|e| ManagerError::Admit { pod: label.clone(), reason: e.to_string() })?;
        if let Err(source) = blocking(|| self.store.store(&st.rm.state())) {
            st.rm.release(&spec.uid);
            return Err(ManagerError::Checkpoint { pod: label, source });
        }
        st.generation += 1;
        tracing::info!(pod = %label, "admitted");
        Ok(())
    }

    /// Sandbox `sandbox_id` of pod `uid` runs (RunPodSandbox; CreateContainer for a pod whose
    /// sandbox weft first meets there).
    pub fn sandbox_started(&self, uid: &str, sandbox_id: &str) {
        lock(&self.state).sandboxes.started(uid, sandbox_id);
    }

    /// The sandboxes of each pod are exactly `pairs` of (pod UID, sandbox id): the runtime's list
    /// at a Synchronize.
    pub fn replace_sandboxes<'a>(&self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        lock(&self.state).sandboxes.replace(pairs);
    }

    /// Sandbox `sandbox_id` of pod `uid` was removed (RemovePodSandbox): the pod is released when
    /// it was its last sandbox, and keeps everything while another one exists (the kubelet removes
    /// a re-created pod's old sandbox while the new one runs). Returns whether the pod was released.
    pub fn remove_sandbox(&self, uid: &str, sandbox_id: &str) -> Result<bool, ManagerError> {
        let last = lock(&self.state).sandboxes.removed(uid, sandbox_id);
        if !last {
            tracing::info!(
                pod_uid = uid,
                sandbox = sandbox_id,
                "an older sandbox of the pod was removed; the pod keeps its resources"
            );
            return Ok(false);
        }
        self.release(uid)
    }

    /// Follow an in-place resize of pod `meta.uid` (NRI UpdateContainer): fetch the pod's spec from
    /// the kubelet again (the cached one is the admission's) within the kubelet budget, apply it
    /// ([`ResourceManager::resize`]) and checkpoint. Returns whether weft's settings of the pod now
    /// follow the kubelet's current spec: `false` for a pod that is not admitted, or that the
    /// kubelet (or the lack of one) does not describe, whose limits weft then leaves as the
    /// kubelet asks. A refusal by weft's rules, a kubelet that fails or does not answer in time, or
    /// a failed checkpoint is an error whose text the kubelet sees; nothing changes then.
    pub async fn resize(&self, meta: &PodMeta) -> Result<bool, ManagerError> {
        if !self.is_admitted(&meta.uid) {
            return Ok(false);
        }
        let budget = *lock(&self.kubelet_budget);
        match tokio::time::timeout(budget, self.catalog.refresh()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(ManagerError::Resize(format!(
                    "resizing pod {}: pod spec unavailable: {e} (the kubelet will retry)",
                    meta.label()
                )));
            }
            Err(_) => {
                return Err(ManagerError::Resize(format!(
                    "resizing pod {}: the kubelet did not list pods within {} ms (the kubelet will retry)",
                    meta.label(),
                    budget.as_millis()
                )));
            }
        }
        let Some(spec) = self.catalog.cached(&meta.uid) else { return Ok(false) };
        let mut st = lock(&self.state);
        let before = st.rm.clone();
        match st.rm.resize(&spec) {
            Err(e) => Err(ManagerError::Resize(e.to_string())),
            Ok(false) => Ok(true),
            Ok(true) => {
                if let Err(source) = blocking(|| self.store.store(&st.rm.state())) {
                    st.rm = before;
                    return Err(ManagerError::Checkpoint { pod: meta.label(), source });
                }
                st.generation += 1;
                tracing::info!(pod = %meta.label(), "resized in place");
                Ok(true)
            }
        }
    }

    /// Release pod `uid` and forget its containers and sandboxes; checkpoint. Returns whether it
    /// was admitted.
    pub fn release(&self, uid: &str) -> Result<bool, ManagerError> {
        let mut st = lock(&self.state);
        st.containers.retain(|_, c| c.pod_uid != uid);
        st.sandboxes.forget(uid);
        if st.rm.release(uid).is_none() {
            return Ok(false);
        }
        st.generation += 1;
        if let Err(source) = blocking(|| self.store.store(&st.rm.state())) {
            // Keep the in-memory release: the CPUs are free in fact; the next successful store
            // records it. Report it, since a crash now would bring the pod back until the resync.
            tracing::error!(pod_uid = uid, error = %source, "checkpoint after release failed");
            return Err(ManagerError::Checkpoint { pod: uid.to_string(), source });
        }
        tracing::info!(pod_uid = uid, "released");
        Ok(true)
    }

    /// Whether pod `uid` is admitted.
    pub fn is_admitted(&self, uid: &str) -> bool {
        lock(&self.state).rm.allocation(uid).is_some()
    }

    /// UIDs of the admitted pods.
    pub fn admitted(&self) -> BTreeSet<String> {
        lock(&self.state).rm.pods().map(|p| p.uid.clone()).collect()
    }

    /// The settings container `name` of pod `uid` should have now; `None` when the pod is not
    /// admitted.
    pub fn settings(&self, uid: &str, name: &str) -> Option<ContainerSettings> {
        lock(&self.state).rm.settings(uid, name)
    }

    /// What weft enforces on container `name` of a running pod `uid`: its settings when the pod is
    /// admitted; otherwise (a running pod whose admission was refused) only the shared pool as its
    /// cpuset, so an unmanaged pod never runs on another pod's exclusive CPUs, while its quota,
    /// memory and memory nodes stay as the runtime set them.
    pub fn wanted(&self, uid: &str, name: &str) -> ContainerSettings {
        let st = lock(&self.state);
        st.rm.settings(uid, name).unwrap_or_else(|| unmanaged(st.rm.shared_pool()))
    }

    /// Bring the state in line with the pods the runtime (or the kubelet) has: release what is
    /// admitted but in neither `live` nor `stopped`, admit what is in `live` but not admitted (a
    /// pod whose admission fails is reported and keeps running unmanaged). `stopped` pods exist
    /// but run nothing (a NotReady sandbox with no container): an admitted one keeps its
    /// allocation (the kubelet re-creates the sandbox under the same UID), one not admitted is not
    /// admitted for it.
    pub async fn resync(&self, live: &[PodMeta], stopped: &[PodMeta]) -> Resync {
        let mut out = Resync::default();
        let live_uids: BTreeSet<&str> = live.iter().chain(stopped).map(|m| m.uid.as_str()).collect();
        for uid in self.admitted() {
            if !live_uids.contains(uid.as_str()) {
                match self.release(&uid) {
                    Ok(_) => out.released.push(uid),
                    Err(e) => tracing::error!(error = %e, "resync release"),
                }
            }
        }
        let missing = live.iter().any(|m| !self.is_admitted(&m.uid) && self.catalog.cached(&m.uid).is_none());
        if missing {
            // One bounded kubelet list for the whole resync (a Synchronize shares one request
            // timeout across every pod).
            let budget = *lock(&self.kubelet_budget);
            match tokio::time::timeout(budget, self.catalog.refresh()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "resync: kubelet pod list unavailable"),
                Err(_) => tracing::warn!(budget_ms = budget.as_millis() as u64, "resync: kubelet pod list too slow"),
            }
        }
        for meta in live {
            if self.is_admitted(&meta.uid) {
                continue;
            }
            match self.admit_running(meta) {
                Ok(()) => out.admitted.push(meta.uid.clone()),
                Err(e) => out.refused.push((meta.uid.clone(), e.to_string())),
            }
        }
        out
    }

    /// Release the admitted pods that are gone by the kubelet's pod list and the runtime's state
    /// ([`gone_pods`]), without any event from the runtime: containerd relays no StopPodSandbox or
    /// RemovePodSandbox for pods that lived through its restart. Returns the released UIDs; nothing
    /// without a kubelet, and nothing when the list fails.
    pub async fn release_gone(&self) -> Result<Vec<String>, KubeletError> {
        let before = self.admitted();
        let Some(pods) = self.catalog.list().await? else { return Ok(Vec::new()) };
        let active: BTreeSet<String> =
            pods.iter().filter(|p| crate::bypass::is_active(p)).filter_map(|p| p.metadata.uid.clone()).collect();
        let with_containers: BTreeSet<String> =
            lock(&self.state).containers.values().map(|c| c.pod_uid.clone()).collect();
        let mut released = Vec::new();
        for uid in gone_pods(&before, &active, &with_containers) {
            match self.release(&uid) {
                Ok(true) => {
                    tracing::info!(pod_uid = %uid, "released: the kubelet no longer has the pod and none of its containers exists");
                    released.push(uid);
                }
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "reconcile release"),
            }
        }
        Ok(released)
    }

    /// Record (or refresh) a container.
    pub fn track(&self, id: &str, pod_uid: &str, name: &str, cgroups_path: Option<String>) {
        let mut st = lock(&self.state);
        let entry = st.containers.entry(id.to_string()).or_insert_with(|| TrackedContainer {
            pod_uid: pod_uid.to_string(),
            name: name.to_string(),
            cgroups_path: None,
            applied: None,
        });
        if cgroups_path.is_some() {
            entry.cgroups_path = cgroups_path;
        }
    }

    /// Record that `settings` were enforced on container `id`.
    pub fn mark_applied(&self, id: &str, settings: &ContainerSettings) {
        if let Some(c) = lock(&self.state).containers.get_mut(id) {
            c.applied = Some(settings.clone());
        }
    }

    /// Forget what was enforced on container `id`, so [`Manager::stale`] reports it again.
    pub fn forget_applied(&self, id: &str) {
        if let Some(c) = lock(&self.state).containers.get_mut(id) {
            c.applied = None;
        }
    }

    /// Forget container `id`.
    pub fn untrack(&self, id: &str) {
        lock(&self.state).containers.remove(id);
    }

    /// Forget every container (a new NRI session reports them all again).
    pub fn untrack_all(&self) {
        lock(&self.state).containers.clear();
    }

    /// The tracked containers.
    pub fn containers(&self) -> BTreeMap<String, TrackedContainer> {
        lock(&self.state).containers.clone()
    }

    /// Containers whose wanted settings ([`Manager::wanted`]) differ from what was last enforced
    /// on them (the shared pool moved, or they were never set), with the wanted settings.
    pub fn stale(&self) -> Vec<(String, ContainerSettings)> {
        let st = lock(&self.state);
        let shared = st.rm.shared_pool();
        st.containers
            .iter()
            .filter_map(|(id, c)| {
                let want = st.rm.settings(&c.pod_uid, &c.name).unwrap_or_else(|| unmanaged(shared.clone()));
                (c.applied.as_ref() != Some(&want)).then(|| (id.clone(), want))
            })
            .collect()
    }

    /// Whether any admit, release or resize happened since the last call (the first call says
    /// `true` only if one happened). While nothing did, no container's wanted settings moved, so a
    /// started container need not wake the push of the shared pool; containers marked stale for
    /// other reasons (drift) are the periodic reconcile's, which always scans.
    pub fn moved_since_last_scan(&self) -> bool {
        let mut st = lock(&self.state);
        let moved = st.generation != st.scanned;
        st.scanned = st.generation;
        moved
    }

    /// A snapshot of the allocations (for status output and tests).
    pub fn state(&self) -> OrmState {
        lock(&self.state).rm.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|u| (*u).to_string()).collect()
    }

    #[test]
    fn gone_pods_are_admitted_before_the_list_inactive_and_without_containers() {
        let before = set(&["running", "deleted", "deleted-with-container", "finished"]);
        let active = set(&["running", "admitted-after-the-list"]);
        let with_containers = set(&["deleted-with-container"]);
        assert_eq!(gone_pods(&before, &active, &with_containers), ["deleted", "finished"]);
        // A pod admitted after the list was taken is never released by it.
        assert!(gone_pods(&set(&[]), &set(&[]), &set(&[])).is_empty());
    }
}
