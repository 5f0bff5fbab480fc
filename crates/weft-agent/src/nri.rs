//! NRI mode: the resource manager as an NRI plugin. The runtime calls it synchronously in each
//! pod's and container's life, so settings are in place before the container's process starts.
//!
//! | NRI call | What weft does |
//! |---|---|
//! | Synchronize | release pods that no longer exist, admit pods that run without weft ([`classify_pods`]: not those whose sandboxes are all NotReady with nothing running), record every pod's sandboxes, track every container and answer updates for those whose settings differ |
//! | RunPodSandbox | admit (allocate + checkpoint); an error fails the sandbox with the reason |
//! | CreateContainer | adjustment: cpuset cpus/mems, CFS quota/period, memory limit, `memory.high` (cgroup v2 only, through `unified`), env; no updates of other containers (containerd would apply them one by one inside this call) |
//! | PostStartContainer | when an admit or release moved the shared pool: wake the push ([`NriHandler::push_signal`]) that moves shared containers off CPUs that just became exclusive, right after the start |
//! | UpdateContainer | follow an in-place resize (the pod's spec fetched again, [`Manager::resize`]) keeping weft's cpuset and exclusivity; refuse with the reason what weft's rules forbid |
//! | RemovePodSandbox | release + checkpoint when it was the pod's last sandbox (the kubelet removes a re-created pod's old sandbox while the new one runs) |
//! | RemoveContainer | forget the container |
//!
//! The reconcile loop ([`reconcile_once`]) sends `UpdateContainers` for every tracked container whose
//! wanted settings moved (the shared pool grows and shrinks as exclusive pods come and go), in
//! batches of [`UPDATE_BATCH`], every period and whenever a started container wakes it.

use std::sync::Arc;

use async_trait::async_trait;
use protobuf::MessageField;
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::plugin::{ContainerCreation, Handler, HandlerError, RuntimeHandle, RuntimeInfo};

use crate::agent::{Manager, PodMeta};
use crate::settings::ContainerSettings;

/// The events weft subscribes to.
pub fn subscription() -> EventMask {
    [
        Event::RunPodSandbox,
        Event::StopPodSandbox,
        Event::RemovePodSandbox,
        Event::CreateContainer,
        Event::PostStartContainer,
        Event::UpdateContainer,
        Event::RemoveContainer,
    ]
    .into_iter()
    .collect()
}

/// How settings are turned into NRI messages on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The node runs cgroup v2, so `memory.high` can travel in `unified` (runc rejects unified
    /// keys on cgroup v1).
    pub unified: bool,
}

/// The adjustment that gives a container `s`.
pub fn adjustment(s: &ContainerSettings, t: Translation) -> api::ContainerAdjustment {
    let mut linux = api::LinuxContainerAdjustment::new();
    linux.resources = MessageField::some(resources(s, t));
    let mut adj = api::ContainerAdjustment::new();
    adj.linux = MessageField::some(linux);
    adj.env = s
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = api::KeyValue::new();
            kv.key = k.clone();
            kv.value = v.clone();
            kv
        })
        .collect();
    adj
}

/// The update that gives running container `id` the resources of `s` (env cannot change after
/// start).
pub fn update(id: &str, s: &ContainerSettings, t: Translation) -> api::ContainerUpdate {
    let mut linux = api::LinuxContainerUpdate::new();
    linux.resources = MessageField::some(resources(s, t));
    let mut u = api::ContainerUpdate::new();
    u.container_id = id.to_string();
    u.linux = MessageField::some(linux);
    u
}

fn resources(s: &ContainerSettings, t: Translation) -> api::LinuxResources {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = s.cpus.to_string();
    cpu.mems = s.mems.to_string();
    if let Some(q) = s.cpu_quota {
        cpu.quota = MessageField::some(opt_i64(q));
    }
    if let Some(p) = s.cpu_period {
        let mut v = api::OptionalUInt64::new();
        v.value = p;
        cpu.period = MessageField::some(v);
    }
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    if let Some(limit) = s.memory_limit {
        let mut mem = api::LinuxMemory::new();
        mem.limit = MessageField::some(opt_i64(limit));
        res.memory = MessageField::some(mem);
    }
    if let (Some(high), true) = (s.memory_high, t.unified) {
        res.unified.insert("memory.high".to_string(), high.to_string());
    }
    res
}

fn opt_i64(v: i64) -> api::OptionalInt64 {
    let mut o = api::OptionalInt64::new();
    o.value = v;
    o
}

/// What of `want` container `c` already has, by the runtime's report (cpuset, quota, period,
/// memory limit). Used at Synchronize to update only containers that differ.
pub fn matches(c: &api::Container, want: &ContainerSettings) -> bool {
    let Some(res) = c.linux.as_ref().and_then(|l| l.resources.as_ref()) else { return false };
    let Some(cpu) = res.cpu.as_ref() else { return false };
    // An empty wanted set means "leave as the runtime set it".
    let same_set = |have: &str, want: &weft_topology::CpuSet| {
        want.is_empty() || have.parse::<weft_topology::CpuSet>().map(|h| &h == want).unwrap_or(false)
    };
    if !same_set(&cpu.cpus, &want.cpus) || !same_set(&cpu.mems, &want.mems) {
        return false;
    }
    if let Some(q) = want.cpu_quota
        && cpu.quota.as_ref().map(|o| o.value) != Some(q)
    {
        return false;
    }
    if let Some(p) = want.cpu_period
        && cpu.period.as_ref().map(|o| o.value) != Some(p)
    {
        return false;
    }
    if let Some(l) = want.memory_limit {
        let have = res.memory.as_ref().and_then(|m| m.limit.as_ref()).map(|o| o.value);
        if have != Some(l) {
            return false;
        }
    }
    true
}

/// The pods of a Synchronize, one entry per UID: those that run (a ready sandbox, which NRI shows
/// with its pid, or a container that is not stopped) and those that only exist (every sandbox
/// NotReady, pid 0, and nothing running in them: a sandbox that died, found after a restart).
pub fn classify_pods(pods: &[api::PodSandbox], containers: &[api::Container]) -> (Vec<PodMeta>, Vec<PodMeta>) {
    let active_sandboxes: std::collections::BTreeSet<&str> = containers
        .iter()
        .filter(|c| {
            matches!(
                c.state.enum_value_or_default(),
                api::ContainerState::CONTAINER_CREATED
                    | api::ContainerState::CONTAINER_RUNNING
                    | api::ContainerState::CONTAINER_PAUSED
            )
        })
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let running: std::collections::BTreeSet<&str> = pods
        .iter()
        .filter(|p| p.pid != 0 || active_sandboxes.contains(p.id.as_str()))
        .map(|p| p.uid.as_str())
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let (mut live, mut stopped) = (Vec::new(), Vec::new());
    for p in pods {
        if !seen.insert(p.uid.as_str()) {
            continue;
        }
        if running.contains(p.uid.as_str()) {
            live.push(meta(p));
        } else {
            stopped.push(meta(p));
        }
    }
    (live, stopped)
}

fn meta(pod: &api::PodSandbox) -> PodMeta {
    PodMeta {
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        annotations: pod.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

fn cgroups_path(c: &api::Container) -> Option<String> {
    c.linux.as_ref().map(|l| l.cgroups_path.clone()).filter(|p| !p.is_empty())
}

/// The NRI handler over a [`Manager`].
pub struct NriHandler {
    manager: Arc<Manager>,
    translation: Translation,
    push: Arc<tokio::sync::Notify>,
}

impl NriHandler {
    /// A handler enforcing `manager`'s decisions.
    pub fn new(manager: Arc<Manager>, translation: Translation) -> NriHandler {
        NriHandler { manager, translation, push: Arc::new(tokio::sync::Notify::new()) }
    }

    /// Notified (one stored permit) when a container started after an admit, release or resize
    /// moved the shared pool: whoever runs [`reconcile_once`] (the service's reconcile loop)
    /// should push the stale containers now rather than at the next period.
    pub fn push_signal(&self) -> Arc<tokio::sync::Notify> {
        self.push.clone()
    }
}

fn handler_error(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(e.to_string())
}

#[async_trait]
impl Handler for NriHandler {
    fn events(&self) -> EventMask {
        subscription()
    }

    async fn configure(&self, runtime: &RuntimeInfo) -> Result<(), HandlerError> {
        tracing::info!(
            runtime = %runtime.name,
            version = %runtime.version,
            request_timeout_ms = runtime.request_timeout.as_millis() as u64,
            "NRI runtime configured us"
        );
        self.manager.set_kubelet_budget(runtime.request_timeout / 2);
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        let (live, stopped) = classify_pods(&pods, &containers);
        let outcome = self.manager.resync(&live, &stopped).await;
        self.manager.replace_sandboxes(pods.iter().map(|p| (p.uid.as_str(), p.id.as_str())));
        for (uid, why) in &outcome.refused {
            tracing::warn!(pod_uid = %uid, reason = %why, "running pod could not be admitted; it stays in the shared pool");
        }
        tracing::info!(
            pods = pods.len(),
            containers = containers.len(),
            released = outcome.released.len(),
            admitted = outcome.admitted.len(),
            "synchronized"
        );
        self.manager.untrack_all();
        let uid_of: std::collections::HashMap<&str, &str> =
            pods.iter().map(|p| (p.id.as_str(), p.uid.as_str())).collect();
        let mut updates = Vec::new();
        for c in &containers {
            let Some(uid) = uid_of.get(c.pod_sandbox_id.as_str()) else { continue };
            self.manager.track(&c.id, uid, &c.name, cgroups_path(c));
            let want = self.manager.wanted(uid, &c.name);
            if !matches(c, &want) {
                updates.push(update(&c.id, &want, self.translation));
            }
            self.manager.mark_applied(&c.id, &want);
        }
        Ok(updates)
    }

    async fn run_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.manager.admit(&meta(&pod)).await.map_err(handler_error)?;
        self.manager.sandbox_started(&pod.uid, &pod.id);
        Ok(())
    }

    async fn stop_pod_sandbox(&self, _pod: api::PodSandbox) -> Result<(), HandlerError> {
        // The CPUs stay the pod's until RemovePodSandbox: a stopped sandbox can still be restarted
        // by the kubelet with the same UID.
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        // Released only with the pod's last sandbox: the kubelet removes the old sandbox of a
        // re-created pod (same UID) while the new one runs.
        self.manager.remove_sandbox(&pod.uid, &pod.id).map(|_| ()).map_err(handler_error)
    }

    async fn create_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> Result<ContainerCreation, HandlerError> {
        let m = meta(&pod);
        // A pod whose sandbox started before weft connected: admit it now.
        self.manager.admit(&m).await.map_err(handler_error)?;
        self.manager.sandbox_started(&m.uid, &pod.id);
        let Some(want) = self.manager.settings(&m.uid, &container.name) else {
            return Ok(ContainerCreation::default());
        };
        self.manager.track(&container.id, &m.uid, &container.name, cgroups_path(&container));
        self.manager.mark_applied(&container.id, &want);
        // No updates of other containers here: containerd applies them inside this call, one
        // UpdateContainerResources each, so moving N shared containers would delay this pod's
        // start by N of them. The pool moves right after the start (post_start_container).
        Ok(ContainerCreation {
            adjust: Some(adjustment(&want, self.translation)),
            update: Vec::new(),
            evict: Vec::new(),
        })
    }

    async fn post_start_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<(), HandlerError> {
        // The container runs: now move the shared containers whose pool changed. The push is
        // applied by containerd under its NRI lock once this call has returned.
        if self.manager.moved_since_last_scan() {
            self.push.notify_one();
        }
        Ok(())
    }

    async fn update_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
        _resources: Option<api::LinuxResources>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        // An in-place resize (or any kubelet update): follow the pod's new spec where weft's rules
        // allow, refuse with the reason where they do not. The runtime merges our update over the
        // kubelet's request field by field, so what we leave unset stays as the kubelet asked.
        let current = self.manager.resize(&meta(&pod)).await.map_err(handler_error)?;
        let mut want = self.manager.wanted(&pod.uid, &container.name);
        if !current {
            // No spec to follow: enforce the cpuset only, leave quota and memory to the kubelet.
            want = ContainerSettings { cpus: want.cpus, mems: want.mems, ..ContainerSettings::default() };
        }
        self.manager.track(&container.id, &pod.uid, &container.name, cgroups_path(&container));
        self.manager.mark_applied(&container.id, &want);
        Ok(vec![update(&container.id, &want, self.translation)])
    }

    async fn remove_container(&self, _pod: api::PodSandbox, container: api::Container) -> Result<(), HandlerError> {
        self.manager.untrack(&container.id);
        Ok(())
    }
}

/// How many container updates one `UpdateContainers` carries. containerd applies each as one
/// `UpdateContainerResources` (tens of ms on a busy node) while holding its NRI lock, so every
/// other pod's NRI call waits for the whole request: batches let them in between.
pub const UPDATE_BATCH: usize = 8;

/// One reconcile pass in NRI mode: send `UpdateContainers` (in batches of [`UPDATE_BATCH`]) for
/// every container whose wanted settings moved. Containers the runtime reports as failed are no
/// longer tracked. Returns how many updates were applied.
pub async fn reconcile_once(manager: &Manager, runtime: &RuntimeHandle, t: Translation) -> Result<usize, String> {
    let mut applied = 0;
    for batch in manager.stale().chunks(UPDATE_BATCH) {
        let updates: Vec<api::ContainerUpdate> = batch.iter().map(|(id, s)| update(id, s, t)).collect();
        let failed = runtime.update_containers(updates, Vec::new()).await.map_err(|e| e.to_string())?;
        let failed_ids: std::collections::BTreeSet<String> = failed.iter().map(|u| u.container_id.clone()).collect();
        for (id, s) in batch {
            if failed_ids.contains(id) {
                // Gone, or not the runtime's any more: the next Synchronize tracks it again if it
                // runs.
                tracing::warn!(container = %id, "runtime could not update container; no longer tracked");
                manager.untrack(id);
            } else {
                manager.mark_applied(id, s);
                applied += 1;
            }
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, uid: &str, pid: u32) -> api::PodSandbox {
        let mut p = api::PodSandbox::new();
        p.id = id.into();
        p.uid = uid.into();
        p.pid = pid;
        p
    }

    fn ctr(sandbox: &str, state: api::ContainerState) -> api::Container {
        let mut c = api::Container::new();
        c.pod_sandbox_id = sandbox.into();
        c.state = state.into();
        c
    }

    #[test]
    fn a_pod_runs_with_a_ready_sandbox_or_a_container_that_is_not_stopped() {
        let pods =
            [pod("a-0", "a", 0), pod("a-1", "a", 42), pod("b-0", "b", 0), pod("c-0", "c", 0), pod("d-0", "d", 0)];
        let containers =
            [ctr("b-0", api::ContainerState::CONTAINER_RUNNING), ctr("c-0", api::ContainerState::CONTAINER_STOPPED)];
        let (live, stopped) = classify_pods(&pods, &containers);
        let uids = |m: &[PodMeta]| m.iter().map(|m| m.uid.clone()).collect::<Vec<_>>();
        assert_eq!(uids(&live), ["a", "b"], "a: attempt 1 is ready; b: its container runs");
        assert_eq!(uids(&stopped), ["c", "d"], "NotReady sandboxes with nothing running");
    }
}
