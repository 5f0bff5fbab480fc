//! The resource manager as an NRI plugin, end to end: weft's handler and plugin runtime against
//! the containerd-like harness runtime over a real unix socket. Faults: a crash between admit and
//! checkpoint, a restart that finds pods changed, the socket dropped mid-Synchronize, a slow
//! handler. No sleeps, no timed assertions: waits are on harness events under a hang guard.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use weft_agent::agent::{Manager, PodCatalog, StateStore};
use weft_agent::checkpoint::{Checkpoint, CheckpointError};
use weft_agent::kubelet::{KubeletError, PodSource};
use weft_agent::nri::{NriHandler, Translation, reconcile_once};
use weft_agent::orm::{OrmConfig, OrmState, ResourceManager};
use weft_agent::pod::DeviceLocator;
use weft_agent::policy::TopologyPolicy;
use weft_nri::api;
use weft_nri::plugin::{self, PluginOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{HarnessEvent, NriVersion, Runtime, RuntimeError, RuntimeOptions};
use weft_topology::{CpuLayout, CpuSet};

async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("test hung")
}

/// The kubelet's pod list, changed by the test; optionally blocking until released (a slow
/// kubelet makes a slow RunPodSandbox).
#[derive(Default)]
struct Kubelet {
    pods: Mutex<Vec<Pod>>,
    block: Mutex<Option<Arc<Notify>>>,
}

impl Kubelet {
    fn add(&self, pod: Pod) {
        self.pods.lock().unwrap().push(pod);
    }

    /// Replace the pod with `pod`'s UID (the kubelet's view after an in-place resize).
    fn set(&self, pod: Pod) {
        let mut pods = self.pods.lock().unwrap();
        pods.retain(|p| p.metadata.uid != pod.metadata.uid);
        pods.push(pod);
    }

    /// The pod is gone from the kubelet (deleted).
    fn remove(&self, uid: &str) {
        self.pods.lock().unwrap().retain(|p| p.metadata.uid.as_deref() != Some(uid));
    }
}

#[async_trait]
impl PodSource for Kubelet {
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError> {
        let block = self.block.lock().unwrap().clone();
        if let Some(n) = block {
            n.notified().await;
        }
        Ok(self.pods.lock().unwrap().clone())
    }
}

/// GPUs 0-3 on NUMA 0, 4-7 on NUMA 1.
struct Gpus;
impl DeviceLocator for Gpus {
    fn gpu_numa(&self, index: u32) -> Option<u32> {
        Some(if index < 4 { 0 } else { 1 })
    }
    fn pci_numa(&self, _address: &str) -> Option<u32> {
        None
    }
    fn pci_rdma_device(&self, _address: &str) -> Option<String> {
        None
    }
}

/// A checkpoint that can "freeze" the process at the next store, before or after writing, as a
/// process stopped there and then killed: the store returns only once the test has killed the
/// agent (`thaw`), and then with an error, so the dead agent writes nothing more.
struct Freezable {
    inner: Checkpoint,
    freeze: Mutex<Option<Freeze>>,
    frozen: Notify,
    thawed: (Mutex<bool>, std::sync::Condvar),
}

impl Freezable {
    fn thaw(&self) {
        *self.thawed.0.lock().unwrap() = true;
        self.thawed.1.notify_all();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Freeze {
    BeforeWrite,
    AfterWrite,
}

impl StateStore for Freezable {
    fn load(&self) -> Result<Option<OrmState>, CheckpointError> {
        self.inner.load()
    }
    fn store(&self, state: &OrmState) -> Result<(), CheckpointError> {
        let f = self.freeze.lock().unwrap().take();
        if f == Some(Freeze::AfterWrite) {
            self.inner.store(state)?;
        }
        if f.is_some() {
            self.frozen.notify_one();
            let mut thawed = self.thawed.0.lock().unwrap();
            while !*thawed {
                thawed = self.thawed.1.wait(thawed).unwrap();
            }
            return Err(CheckpointError::Io {
                path: self.inner.path().to_path_buf(),
                op: "killed",
                source: std::io::Error::other("the agent was killed here"),
            });
        }
        self.inner.store(state)
    }
}

fn layout() -> CpuLayout {
    // 2 sockets × 1 NUMA × 4 cores × 2 threads: NUMA 0 = 0-3,8-11, NUMA 1 = 4-7,12-15.
    CpuLayout::synthetic(2, 1, 4, 2).unwrap()
}

fn orm_config(policy: TopologyPolicy) -> OrmConfig {
    OrmConfig { reserved: "0,8".parse().unwrap(), policy, ..OrmConfig::default() }
}

fn k8s_pod(uid: &str, name: &str, cpu: &str, mem: &str, guaranteed: bool, gpus: Option<&str>) -> Pod {
    let resources = if guaranteed {
        serde_json::json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}})
    } else {
        serde_json::json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}})
    };
    let mut annotations = serde_json::Map::new();
    if let Some(g) = gpus {
        annotations.insert("weft.io/gpu-ids".into(), g.into());
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"uid": uid, "namespace": "ml", "name": name, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn sandbox(uid: &str, name: &str, gpus: Option<&str>) -> api::PodSandbox {
    let mut p = api::PodSandbox::new();
    p.id = format!("sb-{uid}");
    p.uid = uid.to_string();
    p.name = name.to_string();
    p.namespace = "ml".to_string();
    if let Some(g) = gpus {
        p.annotations.insert("weft.io/gpu-ids".into(), g.into());
    }
    p
}

fn container(uid: &str) -> api::Container {
    let mut c = api::Container::new();
    c.id = format!("c-{uid}");
    c.pod_sandbox_id = format!("sb-{uid}");
    c.name = "main".to_string();
    c
}

fn cpus_of(c: &api::Container) -> CpuSet {
    c.linux.resources.cpu.cpus.parse().unwrap()
}

fn env_of(c: &api::Container, key: &str) -> Option<String> {
    c.env.iter().find_map(|e| e.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// One agent: its manager, plugin task and runtime handle.
struct Agent {
    manager: Arc<Manager>,
    handle: RuntimeHandle,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), plugin::PluginError>>,
}

impl Agent {
    fn start(socket: &Path, store: Arc<dyn StateStore>, kubelet: Arc<Kubelet>, policy: TopologyPolicy) -> Agent {
        Agent::start_with_backoff(socket, store, kubelet, policy, Duration::from_millis(10))
    }

    fn start_with_backoff(
        socket: &Path,
        store: Arc<dyn StateStore>,
        kubelet: Arc<Kubelet>,
        policy: TopologyPolicy,
        backoff: Duration,
    ) -> Agent {
        let rm = match store.load().unwrap() {
            Some(state) => ResourceManager::restore(layout(), orm_config(policy), state).unwrap(),
            None => ResourceManager::new(layout(), orm_config(policy)).unwrap(),
        };
        let catalog = Arc::new(PodCatalog::new(Some(kubelet as Arc<dyn PodSource>)));
        let manager = Arc::new(Manager::new(rm, store, catalog, Arc::new(Gpus)));
        let handler = Arc::new(NriHandler::new(manager.clone(), Translation { unified: true }));
        let mut opts = PluginOptions::new("weft", "10");
        opts.socket = SocketSource::Path(socket.to_path_buf());
        opts.backoff_min = backoff;
        opts.backoff_max = backoff.max(Duration::from_millis(50));
        let handle = RuntimeHandle::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(plugin::run(opts, handler, handle.clone(), stop.clone()));
        Agent { manager, handle, stop, task }
    }

    /// Stop it as a crash would: tasks gone, memory gone, only the checkpoint file stays.
    async fn kill(self) {
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    checkpoint: PathBuf,
    runtime: Runtime,
    kubelet: Arc<Kubelet>,
}

async fn setup(opts: RuntimeOptions) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime = Runtime::start(&socket, opts).await.unwrap();
    let checkpoint = dir.path().join("orm.json");
    Setup { socket, checkpoint, runtime, kubelet: Arc::new(Kubelet::default()), _dir: dir }
}

impl Setup {
    fn agent(&self, policy: TopologyPolicy) -> Agent {
        Agent::start(&self.socket, Arc::new(Checkpoint::new(&self.checkpoint)), self.kubelet.clone(), policy)
    }

    async fn run_pod(
        &self,
        uid: &str,
        cpu: &str,
        guaranteed: bool,
        gpus: Option<&str>,
    ) -> Result<api::Container, RuntimeError> {
        self.kubelet.add(k8s_pod(uid, uid, cpu, "1Gi", guaranteed, gpus));
        self.runtime.run_pod_sandbox(sandbox(uid, uid, gpus)).await?;
        self.runtime.create_container(&format!("sb-{uid}"), container(uid)).await
    }
}

impl Setup {
    /// Run pod `uid` (already in the kubelet's list) again, as the kubelet's retry does.
    async fn run_pod_again(&self, uid: &str) -> Result<api::Container, RuntimeError> {
        self.runtime.run_pod_sandbox(sandbox(uid, uid, None)).await?;
        self.runtime.create_container(&format!("sb-{uid}"), container(uid)).await
    }
}

fn exclusive_sets(m: &Manager) -> Vec<(String, CpuSet)> {
    m.state().pods.iter().map(|p| (p.uid.clone(), p.exclusive.clone())).collect()
}

fn assert_disjoint(sets: &[(String, CpuSet)]) {
    let mut seen = BTreeSet::new();
    for (uid, set) in sets {
        for cpu in set.iter() {
            assert!(seen.insert(cpu), "CPU {cpu} given twice (again to {uid}): {sets:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guaranteed_pod_gets_exclusive_cpus_on_its_gpus_numa_node_with_env_and_limits() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::SingleNumaNode);
    guard(s.runtime.wait_synchronized("10-weft")).await;

    // GPUs 4,5 sit on NUMA 1 (CPUs 4-7,12-15).
    let c = guard(s.run_pod("gpu-pod", "4", true, Some("4,5"))).await.unwrap();
    let cpus = cpus_of(&c);
    assert_eq!(cpus.len(), 4, "{cpus}");
    let numa1: CpuSet = "4-7,12-15".parse().unwrap();
    assert!(cpus.iter().all(|x| numa1.contains(x)), "exclusive CPUs {cpus} not on the GPUs' NUMA node 1");
    assert_eq!(c.linux.resources.cpu.mems, "1");
    assert_eq!(c.linux.resources.memory.limit.value, 1 << 30);
    assert_eq!(env_of(&c, "WEFT_CPUS").as_deref(), Some(cpus.to_string().as_str()));
    assert_eq!(env_of(&c, "WEFT_GPU_IDS").as_deref(), Some("4,5"));
    assert_eq!(env_of(&c, "OMP_NUM_THREADS").as_deref(), Some("4"));

    // A Burstable pod runs in the shared pool: everything but the exclusive CPUs.
    let b = guard(s.run_pod("burst", "500m", false, None)).await.unwrap();
    let shared = cpus_of(&b);
    assert_eq!(shared.len(), 12, "{shared}");
    assert!(cpus.iter().all(|x| !shared.contains(x)), "shared pool {shared} overlaps exclusive {cpus}");
    assert_eq!(b.linux.resources.cpu.quota.as_ref().map(|q| q.value), Some(-1), "no CPU limit → unlimited quota");
    assert_eq!(env_of(&b, "WEFT_EXCLUSIVE_CPUS").as_deref(), Some("false"));

    // The checkpoint on disk holds the exclusive pod.
    let stored = Checkpoint::new(&s.checkpoint).load().unwrap().unwrap();
    assert_eq!(stored.pods.iter().find(|p| p.uid == "gpu-pod").unwrap().exclusive, cpus);
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_pod_moves_shared_containers_off_its_cpus_and_removal_gives_them_back() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;

    let b = guard(s.run_pod("burst", "1", false, None)).await.unwrap();
    assert_eq!(cpus_of(&b).len(), 16, "before any exclusive pod the shared pool is every CPU");

    let g = guard(s.run_pod("g", "2", true, None)).await.unwrap();
    let exclusive = cpus_of(&g);
    // The pool shrinks through an UpdateContainers after the start (the service's loop sends it
    // when the container starts; here the test sends it).
    assert_eq!(cpus_of(&s.runtime.container("c-burst").unwrap()).len(), 16, "not in the CreateContainer answer");
    let sent = guard(reconcile_once(&agent.manager, &agent.handle, Translation { unified: true })).await.unwrap();
    assert_eq!(sent, 1);
    let moved = cpus_of(&s.runtime.container("c-burst").unwrap());
    assert_eq!(moved.len(), 14, "{moved}");
    assert!(exclusive.iter().all(|x| !moved.contains(x)));

    // Removing the exclusive pod releases it; the reconcile gives the CPUs back to the shared pool
    // through an unsolicited UpdateContainers.
    guard(s.runtime.remove_pod_sandbox("sb-g")).await.unwrap();
    assert!(!agent.manager.is_admitted("g"));
    let sent = guard(reconcile_once(&agent.manager, &agent.handle, Translation { unified: true })).await.unwrap();
    assert_eq!(sent, 1);
    let unsolicited = s.runtime.unsolicited_updates();
    let (_, update, _) = unsolicited.last().unwrap();
    assert_eq!(update.len(), 1);
    assert_eq!(update[0].container_id, "c-burst");
    assert_eq!(cpus_of(&s.runtime.container("c-burst").unwrap()).len(), 16);
    // Nothing moved since: the next reconcile sends nothing.
    assert_eq!(reconcile_once(&agent.manager, &agent.handle, Translation { unified: true }).await.unwrap(), 0);
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_numa_node_refuses_a_pod_that_cannot_fit_one_node_and_the_sandbox_fails_with_the_reason() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::SingleNumaNode);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    // NUMA 0 has 6 usable CPUs (0 and 8 are reserved); 7 exclusive CPUs next to GPU 0 cannot fit.
    let err = guard(s.run_pod("big", "7", true, Some("0"))).await.unwrap_err().to_string();
    assert!(err.contains("single-numa-node"), "{err}");
    assert!(err.contains("ml/big"), "{err}");
    assert!(!agent.manager.is_admitted("big"));
    assert!(agent.manager.state().pods.is_empty(), "a refused admit leaves nothing behind");
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_v0_12_runtime_drives_the_same_admission_through_state_change() {
    let s = setup(RuntimeOptions { nri_version: NriVersion::V0_9, ..RuntimeOptions::default() }).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let c = guard(s.run_pod("g", "2", true, None)).await.unwrap();
    assert_eq!(cpus_of(&c).len(), 2);
    let methods: Vec<String> = s
        .runtime
        .events()
        .into_iter()
        .filter_map(|e| match e {
            HarnessEvent::Call { method, .. } => Some(method),
            _ => None,
        })
        .collect();
    assert!(methods.iter().any(|m| m == "StateChange(RunPodSandbox)"), "{methods:?}");
    guard(s.runtime.remove_pod_sandbox("sb-g")).await.unwrap();
    assert!(!agent.manager.is_admitted("g"), "RemovePodSandbox via StateChange released the pod");
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_from_checkpoint_and_synchronize_releasing_gone_pods_and_admitting_new_ones() {
    let s = setup(RuntimeOptions::default()).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.run_pod("stays", "2", true, None)).await.unwrap();
    guard(s.run_pod("goes", "2", true, None)).await.unwrap();
    let before = exclusive_sets(&a.manager);
    a.kill().await;
    let dropped_from = s.runtime.event_count();
    let _ = guard(s.runtime.wait_dropped("10-weft", 0)).await;

    // While weft is down: one pod goes away, one starts without weft.
    guard(s.runtime.remove_pod_sandbox("sb-goes")).await.unwrap();
    let unmanaged = guard(s.run_pod("new", "3", true, None)).await.unwrap();
    assert_eq!(cpus_of(&unmanaged).len(), 0, "started without weft: the runtime's defaults");
    let _ = dropped_from;

    let b = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    let after = exclusive_sets(&b.manager);
    let uids: Vec<&str> = after.iter().map(|(u, _)| u.as_str()).collect();
    assert!(uids.contains(&"stays") && uids.contains(&"new") && !uids.contains(&"goes"), "{uids:?}");
    assert_eq!(
        after.iter().find(|(u, _)| u == "stays").unwrap().1,
        before.iter().find(|(u, _)| u == "stays").unwrap().1,
        "a pod that kept running keeps its CPUs across the restart"
    );
    assert_disjoint(&after);
    // The container that started without weft was corrected by the Synchronize reply.
    let fixed = s.runtime.container("c-new").unwrap();
    assert_eq!(cpus_of(&fixed), after.iter().find(|(u, _)| u == "new").unwrap().1);
    b.kill().await;
}

/// Crash between admit and checkpoint (and just after it): the runtime times the call out, drops
/// the plugin and starts the sandbox without weft; the restarted agent finds the pod in
/// Synchronize and admits it exactly once, with no CPU given twice and none leaked.
async fn crash_at_store(freeze: Freeze) {
    let s = setup(RuntimeOptions { request_timeout: Duration::from_millis(300), ..RuntimeOptions::default() }).await;
    let store = Arc::new(Freezable {
        inner: Checkpoint::new(&s.checkpoint),
        freeze: Mutex::new(None),
        frozen: Notify::new(),
        thawed: (Mutex::new(false), std::sync::Condvar::new()),
    });
    // The frozen agent must not reconnect before it is killed (its state lock is held by the
    // frozen store), so its reconnect backoff is long; the killed agent never gets there.
    let a = Agent::start_with_backoff(
        &s.socket,
        store.clone(),
        s.kubelet.clone(),
        TopologyPolicy::BestEffort,
        Duration::from_secs(3600),
    );
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.run_pod("first", "2", true, None)).await.unwrap();

    *store.freeze.lock().unwrap() = Some(freeze);
    let from = s.runtime.event_count();
    s.kubelet.add(k8s_pod("victim", "victim", "3", "1Gi", true, None));
    let r = s.runtime.run_pod_sandbox(sandbox("victim", "victim", None));
    let (r, ()) = tokio::join!(guard(r), guard(store.frozen.notified()));
    r.expect("the runtime goes on without a plugin that timed out");
    let reason = guard(s.runtime.wait_dropped("10-weft", from)).await;
    assert!(reason.contains("timeout") || reason.contains("deadline"), "{reason}");
    guard(s.runtime.create_container("sb-victim", container("victim"))).await.unwrap();
    a.kill().await;
    store.thaw();

    let on_disk = Checkpoint::new(&s.checkpoint).load().unwrap().unwrap();
    let victim_on_disk = on_disk.pods.iter().any(|p| p.uid == "victim");
    assert_eq!(victim_on_disk, freeze == Freeze::AfterWrite);

    let b = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    let sets = exclusive_sets(&b.manager);
    assert_disjoint(&sets);
    let victims: Vec<_> = sets.iter().filter(|(u, _)| u == "victim").collect();
    assert_eq!(victims.len(), 1, "admitted exactly once: {sets:?}");
    assert_eq!(victims[0].1.len(), 3);
    let total: usize = sets.iter().map(|(_, s)| s.len()).sum();
    assert_eq!(total, 5, "no leaked CPUs: {sets:?}");
    assert_eq!(cpus_of(&s.runtime.container("c-victim").unwrap()), victims[0].1);
    // And the state is on disk now.
    let stored = Checkpoint::new(&s.checkpoint).load().unwrap().unwrap();
    assert_eq!(stored.pods.len(), 2);
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_admit_and_checkpoint_loses_nothing_and_gives_nothing_twice() {
    crash_at_store(Freeze::BeforeWrite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_checkpoint_before_the_reply_keeps_the_pod_once() {
    crash_at_store(Freeze::AfterWrite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_sandbox_never_started_is_released_at_the_next_synchronize() {
    let s = setup(RuntimeOptions::default()).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.run_pod("ghost", "4", true, None)).await.unwrap();
    a.kill().await;
    // The runtime lost the sandbox while weft was down (failed start, node reboot...).
    guard(s.runtime.remove_pod_sandbox("sb-ghost")).await.unwrap();
    let b = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    assert!(b.manager.state().pods.is_empty(), "{:?}", b.manager.state());
    assert!(Checkpoint::new(&s.checkpoint).load().unwrap().unwrap().pods.is_empty());
    b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_dropped_mid_synchronize_reconnects_and_ends_consistent() {
    // Small messages force a split Synchronize; the runtime closes the trunk after the first chunk.
    let s = setup(RuntimeOptions { max_message_size: 1024, ..RuntimeOptions::default() }).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    for i in 0..12 {
        guard(s.run_pod(&format!("p{i}"), if i % 3 == 0 { "1" } else { "250m" }, i % 3 == 0, None)).await.unwrap();
    }
    let before = exclusive_sets(&a.manager);
    s.runtime.close_during_sync("10-weft", 1);
    s.runtime.drop_all_connections();
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    let reasons: Vec<String> = s
        .runtime
        .events()
        .into_iter()
        .filter_map(|e| match e {
            HarnessEvent::Dropped { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 2, "the restart, then the trunk closed mid-Synchronize: {reasons:?}");
    let chunks: Vec<usize> = s
        .runtime
        .events()
        .into_iter()
        .filter_map(|e| match e {
            HarnessEvent::Synchronized { chunks, .. } => Some(chunks),
            _ => None,
        })
        .collect();
    assert!(chunks.last().copied().unwrap_or(0) > 1, "the final Synchronize was split: {chunks:?}");
    let after = exclusive_sets(&a.manager);
    assert_eq!(before, after, "an interrupted Synchronize changes no allocation");
    assert_disjoint(&after);
    a.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_kubelet_fails_the_sandbox_inside_the_budget_instead_of_getting_weft_dropped() {
    // Request timeout 300 ms: weft waits for the kubelet at most half of it, then fails the
    // sandbox with the reason; the runtime keeps the plugin, and the kubelet's retry is admitted.
    let s = setup(RuntimeOptions { request_timeout: Duration::from_millis(300), ..RuntimeOptions::default() }).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let gate = Arc::new(Notify::new());
    *s.kubelet.block.lock().unwrap() = Some(gate.clone());
    s.kubelet.add(k8s_pod("slow", "slow", "2", "1Gi", true, None));
    let err = guard(s.runtime.run_pod_sandbox(sandbox("slow", "slow", None))).await.unwrap_err().to_string();
    assert!(err.contains("did not list pods within 150 ms"), "{err}");
    assert!(!a.manager.is_admitted("slow"));
    let dropped = s.runtime.events().into_iter().any(|e| matches!(e, HarnessEvent::Dropped { .. }));
    assert!(!dropped, "the plugin must stay registered");

    // The kubelet answers again; its retry of the sandbox is admitted.
    *s.kubelet.block.lock().unwrap() = None;
    gate.notify_waiters();
    let c = guard(s.run_pod_again("slow")).await.unwrap();
    assert_eq!(cpus_of(&c).len(), 2);
    assert_disjoint(&exclusive_sets(&a.manager));
    a.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_and_another_plugin_adjust_the_same_container() {
    // A second plugin that only adds an environment variable merges with weft's adjustment.
    use weft_nri::event::{Event, EventMask};
    use weft_nri::plugin::{ContainerCreation, Handler, HandlerError};
    struct Env;
    #[async_trait]
    impl Handler for Env {
        fn events(&self) -> EventMask {
            [Event::CreateContainer].into_iter().collect()
        }
        async fn synchronize(
            &self,
            _p: Vec<api::PodSandbox>,
            _c: Vec<api::Container>,
        ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
            Ok(Vec::new())
        }
        async fn create_container(
            &self,
            _p: api::PodSandbox,
            _c: api::Container,
        ) -> Result<ContainerCreation, HandlerError> {
            let mut adj = api::ContainerAdjustment::new();
            let mut kv = api::KeyValue::new();
            kv.key = "OTHER".into();
            kv.value = "1".into();
            adj.env.push(kv);
            Ok(ContainerCreation { adjust: Some(adj), ..ContainerCreation::default() })
        }
    }
    let s = setup(RuntimeOptions::default()).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    let mut opts = PluginOptions::new("env", "20");
    opts.socket = SocketSource::Path(s.socket.clone());
    let stop = CancellationToken::new();
    let other = tokio::spawn(plugin::run(opts, Arc::new(Env), RuntimeHandle::new(), stop.clone()));
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.runtime.wait_synchronized("20-env")).await;
    let c = guard(s.run_pod("g", "2", true, None)).await.unwrap();
    assert_eq!(cpus_of(&c).len(), 2);
    assert_eq!(env_of(&c, "OTHER").as_deref(), Some("1"));
    assert!(env_of(&c, "WEFT_CPUS").is_some());
    stop.cancel();
    let _ = other.await;
    a.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_that_cannot_be_admitted_at_synchronize_is_kept_off_exclusive_cpus() {
    let s = setup(RuntimeOptions::default()).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let g = guard(s.run_pod("g", "4", true, None)).await.unwrap();
    let exclusive = cpus_of(&g);
    a.kill().await;
    guard(s.runtime.wait_dropped("10-weft", 0)).await;
    // Started while weft was down; 12 exclusive CPUs do not fit next to g's 4 (16 CPUs, 2 reserved).
    guard(s.run_pod("big", "12", true, None)).await.unwrap();

    let b = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    assert!(!b.manager.is_admitted("big"));
    let big = s.runtime.container("c-big").unwrap();
    let cpus = cpus_of(&big);
    assert_eq!(cpus.len(), 12, "the shared pool: {cpus}");
    assert!(exclusive.iter().all(|x| !cpus.contains(x)), "unmanaged pod on g's exclusive CPUs: {cpus}");
    assert_eq!(big.linux.resources.cpu.quota.as_ref().map(|q| q.value), None, "only the cpuset is managed");
    b.kill().await;
}

fn service_config(
    socket: &Path,
    checkpoint: &Path,
    kubelet: Arc<Kubelet>,
    mode: weft_agent::service::Mode,
    cgroups: Option<&Path>,
) -> weft_agent::service::ServiceConfig {
    use weft_agent::cgroup::{CgroupDriver, CgroupHierarchy, CgroupLayout, ContainerRuntime};
    let mut nri = PluginOptions::new("weft", "10");
    nri.socket = SocketSource::Path(socket.to_path_buf());
    nri.backoff_min = Duration::from_millis(10);
    nri.backoff_max = Duration::from_millis(50);
    weft_agent::service::ServiceConfig {
        mode,
        layout: layout(),
        orm: orm_config(TopologyPolicy::BestEffort),
        locator: Arc::new(Gpus),
        checkpoint: checkpoint.to_path_buf(),
        nri,
        kubelet: Some(kubelet as Arc<dyn PodSource>),
        cgroups: cgroups.map(CgroupHierarchy::v2),
        cgroup_layout: CgroupLayout::new(CgroupDriver::Cgroupfs, ContainerRuntime::Containerd),
        period: Duration::from_millis(20),
        ready: Arc::new(tokio::sync::watch::Sender::new(false)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reports_ready_while_an_nri_session_is_synchronized() {
    let s = setup(RuntimeOptions::default()).await;
    let cfg = service_config(&s.socket, &s.checkpoint, s.kubelet.clone(), weft_agent::service::Mode::Nri, None);
    let mut ready = cfg.ready.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(weft_agent::service::run(cfg, stop.clone()));
    guard(ready.wait_for(|r| *r)).await.unwrap();
    guard(s.runtime.wait_synchronized("10-weft")).await;
    // A runtime restart: ready again once the new session is synchronized.
    s.runtime.drop_all_connections();
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    guard(ready.wait_for(|r| *r)).await.unwrap();
    // The runtime gone for good: not ready while weft keeps trying to reconnect.
    let Setup { runtime, _dir, .. } = s;
    drop(runtime);
    guard(ready.wait_for(|r| !*r)).await.unwrap();
    stop.cancel();
    guard(task).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_enforces_by_bypass_until_the_nri_socket_appears_then_switches() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    // A cgroup v2 tree on plain files: bypass has somewhere to write, and finds no containers.
    let cgroot = dir.path().join("cgroup");
    std::fs::create_dir(&cgroot).unwrap();
    std::fs::write(cgroot.join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
    let kubelet = Arc::new(Kubelet::default());
    kubelet.add(k8s_pod("early", "early", "2", "1Gi", true, None));
    let checkpoint = dir.path().join("orm.json");
    // Nothing listens on the NRI socket yet.
    let cfg = service_config(&socket, &checkpoint, kubelet, weft_agent::service::Mode::Auto, Some(&cgroot));
    let mut ready = cfg.ready.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(weft_agent::service::run(cfg, stop.clone()));
    // Bypass: the kubelet's pod is admitted (and checkpointed) without any runtime hook.
    guard(ready.wait_for(|r| *r)).await.unwrap();
    let stored = Checkpoint::new(&checkpoint).load().unwrap().unwrap();
    assert_eq!(stored.pods.iter().map(|p| p.uid.as_str()).collect::<Vec<_>>(), ["early"]);

    // containerd gains NRI: the agent registers, and the pod keeps its CPUs.
    let runtime = Runtime::start(&socket, RuntimeOptions::default()).await.unwrap();
    guard(runtime.wait_synchronized("10-weft")).await;
    runtime.run_pod_sandbox(sandbox("early", "early", None)).await.unwrap();
    let c = guard(runtime.create_container("sb-early", container("early"))).await.unwrap();
    assert_eq!(cpus_of(&c), stored.pods[0].exclusive);
    stop.cancel();
    guard(task).await.unwrap().unwrap();
}

/// Sandbox attempt `n` of pod `uid` (the kubelet re-creates a dead sandbox under the same UID).
fn sandbox_attempt(uid: &str, n: u32) -> api::PodSandbox {
    let mut p = sandbox(uid, uid, None);
    p.id = format!("sb-{uid}-{n}");
    p
}

/// The container of sandbox attempt `n` of pod `uid`.
fn container_attempt(uid: &str, n: u32) -> api::Container {
    let mut c = container(uid);
    c.id = format!("c-{uid}-{n}");
    c.pod_sandbox_id = format!("sb-{uid}-{n}");
    c
}

/// Issue #24 item 1, the kubelet's sequence: the sandbox dies, the kubelet stops it and creates
/// attempt 1 under the same UID, and its garbage collector later removes the old container and
/// then the old sandbox (kuberuntime_gc.go `evictSandboxes`: not ready, no containers, not the
/// newest sandbox of the pod; `removeSandbox` stops it first, which containerd does not relay
/// twice). The pod runs on in attempt 1 and keeps its CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_old_sandbox_of_a_recreated_pod_keeps_its_cpus() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let first = guard(s.run_pod("u", "2", true, None)).await.unwrap();
    let cpus = cpus_of(&first);

    s.runtime.sandbox_exited("sb-u").unwrap();
    guard(s.runtime.stop_container("c-u")).await.unwrap();
    guard(s.runtime.stop_pod_sandbox("sb-u")).await.unwrap();
    guard(s.runtime.run_pod_sandbox(sandbox_attempt("u", 1))).await.unwrap();
    let second = guard(s.runtime.create_container("sb-u-1", container_attempt("u", 1))).await.unwrap();
    guard(s.runtime.start_container("c-u-1")).await.unwrap();
    assert_eq!(cpus_of(&second), cpus, "attempt 1 runs on the pod's CPUs");

    // The kubelet's garbage collection of attempt 0.
    guard(s.runtime.remove_container("c-u")).await.unwrap();
    guard(s.runtime.stop_pod_sandbox("sb-u")).await.unwrap();
    guard(s.runtime.remove_pod_sandbox("sb-u")).await.unwrap();
    assert!(agent.manager.is_admitted("u"), "the pod still runs in sandbox attempt 1");

    // The next Guaranteed pod gets other CPUs.
    let next = guard(s.run_pod("w", "2", true, None)).await.unwrap();
    let w = cpus_of(&next);
    assert!(w.iter().all(|x| !cpus.contains(x)), "CPUs {cpus} of running pod u given again to w ({w})");
    assert_disjoint(&exclusive_sets(&agent.manager));

    // Removing the pod's last sandbox releases it.
    guard(s.runtime.remove_pod_sandbox("sb-u-1")).await.unwrap();
    assert!(!agent.manager.is_admitted("u"));
    agent.kill().await;
}

/// Issue #24 item 5: after a restart containerd lists NotReady sandboxes too (pid 0). One whose
/// pod is admitted (its sandbox died; the kubelet will re-create it under the same UID) keeps
/// the pod's CPUs; one of a pod weft never admitted, with nothing running in it, takes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_ready_sandbox_at_synchronize_admits_nothing_and_keeps_what_was_admitted() {
    let s = setup(RuntimeOptions::default()).await;
    let a = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let kept = cpus_of(&guard(s.run_pod("kept", "2", true, None)).await.unwrap());
    a.kill().await;
    guard(s.runtime.wait_dropped("10-weft", 0)).await;

    // While weft is down: kept's sandbox dies and its container exits; another pod's sandbox
    // starts and dies before any container was created.
    s.runtime.sandbox_exited("sb-kept").unwrap();
    guard(s.runtime.stop_container("c-kept")).await.unwrap();
    s.kubelet.add(k8s_pod("dead", "dead", "4", "1Gi", true, None));
    guard(s.runtime.run_pod_sandbox(sandbox("dead", "dead", None))).await.unwrap();
    s.runtime.sandbox_exited("sb-dead").unwrap();

    let b = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    assert!(
        !b.manager.is_admitted("dead"),
        "a NotReady sandbox with nothing running took CPUs: {:?}",
        b.manager.state()
    );
    let sets = exclusive_sets(&b.manager);
    assert_eq!(sets, vec![("kept".to_string(), kept.clone())], "the admitted pod keeps its CPUs");

    // The kubelet re-creates both sandboxes: kept gets its CPUs back, dead is admitted now.
    guard(s.runtime.run_pod_sandbox(sandbox_attempt("kept", 1))).await.unwrap();
    let again = guard(s.runtime.create_container("sb-kept-1", container_attempt("kept", 1))).await.unwrap();
    assert_eq!(cpus_of(&again), kept);
    guard(s.runtime.run_pod_sandbox(sandbox_attempt("dead", 1))).await.unwrap();
    let dead = guard(s.runtime.create_container("sb-dead-1", container_attempt("dead", 1))).await.unwrap();
    assert_eq!(cpus_of(&dead).len(), 4);
    assert_disjoint(&exclusive_sets(&b.manager));
    b.kill().await;
}

fn pod_with(uid: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"uid": uid, "namespace": "ml", "name": uid},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

fn guaranteed(cpu: &str, mem: &str) -> serde_json::Value {
    serde_json::json!({"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}})
}

/// What the kubelet sends in `UpdateContainerResources` for a container with these limits
/// (CFS quota for the CPU limit over a 100 ms period, shares from the request, memory limit).
fn kubelet_resources(cpu_request_milli: u64, cpu_limit_milli: Option<u64>, memory: i64) -> api::LinuxResources {
    let mut cpu = api::LinuxCPU::new();
    let mut shares = api::OptionalUInt64::new();
    shares.value = cpu_request_milli * 1024 / 1000;
    cpu.shares = protobuf::MessageField::some(shares);
    let mut period = api::OptionalUInt64::new();
    period.value = 100_000;
    cpu.period = protobuf::MessageField::some(period);
    if let Some(l) = cpu_limit_milli {
        let mut quota = api::OptionalInt64::new();
        quota.value = (l * 100) as i64;
        cpu.quota = protobuf::MessageField::some(quota);
    }
    let mut mem = api::LinuxMemory::new();
    let mut limit = api::OptionalInt64::new();
    limit.value = memory;
    mem.limit = protobuf::MessageField::some(limit);
    let mut r = api::LinuxResources::new();
    r.cpu = protobuf::MessageField::some(cpu);
    r.memory = protobuf::MessageField::some(mem);
    r
}

const MI: i64 = 1 << 20;

fn memory_of(c: &api::Container) -> i64 {
    c.linux.resources.memory.limit.value
}

/// Issue #24 item 3: an in-place resize reaches weft as UpdateContainer with the kubelet's new
/// resources; weft follows the pod's new spec (fetched again from the kubelet) and keeps only its
/// own rules (the exclusive cpuset, no quota on exclusive CPUs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_resize_follows_the_kubelets_new_memory_and_keeps_the_exclusive_cpus() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    s.kubelet.add(pod_with("r", guaranteed("2", "64Mi")));
    guard(s.runtime.run_pod_sandbox(sandbox("r", "r", None))).await.unwrap();
    let c = guard(s.runtime.create_container("sb-r", container("r"))).await.unwrap();
    let cpus = cpus_of(&c);
    assert_eq!((cpus.len(), memory_of(&c)), (2, 64 * MI));

    for mem in [128, 32] {
        s.kubelet.set(pod_with("r", guaranteed("2", &format!("{mem}Mi"))));
        let c = guard(s.runtime.update_container("c-r", kubelet_resources(2000, Some(2000), mem * MI))).await.unwrap();
        assert_eq!(memory_of(&c), mem * MI, "the resize to {mem} Mi was undone");
        assert_eq!(cpus_of(&c), cpus, "the exclusive CPUs stay");
        assert_eq!(c.linux.resources.cpu.quota.value, -1, "no quota on exclusive CPUs");
    }
    // What weft wants now is the new size: nothing to push back, and the checkpoint holds it.
    assert_eq!(reconcile_once(&agent.manager, &agent.handle, Translation { unified: true }).await.unwrap(), 0);
    assert_eq!(memory_of(&s.runtime.container("c-r").unwrap()), 32 * MI);
    let stored = Checkpoint::new(&s.checkpoint).load().unwrap().unwrap();
    assert_eq!(stored.pods[0].containers[0].spec.memory_limit, Some(32 << 20));
    agent.kill().await;
}

/// A resize weft's rules forbid (a different number of exclusive CPUs) fails the kubelet's
/// UpdateContainerResources with the reason, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_that_changes_the_exclusive_cpu_count_is_refused_with_the_reason() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    s.kubelet.add(pod_with("r", guaranteed("2", "64Mi")));
    guard(s.runtime.run_pod_sandbox(sandbox("r", "r", None))).await.unwrap();
    let before = guard(s.runtime.create_container("sb-r", container("r"))).await.unwrap();

    s.kubelet.set(pod_with("r", guaranteed("3", "128Mi")));
    let err =
        guard(s.runtime.update_container("c-r", kubelet_resources(3000, Some(3000), 128 * MI))).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("ml/r") && msg.contains("exclusive") && msg.contains('2') && msg.contains('3'), "{msg}");
    assert_eq!(agent.manager.state().pods[0].exclusive, cpus_of(&before));
    assert_eq!(agent.manager.state().pods[0].containers[0].spec.memory_limit, Some(64 << 20), "nothing changed");
    agent.kill().await;
}

/// A shared-pool container's CPU limit resize moves its CFS quota as the kubelet asks; the
/// cpuset stays the shared pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_containers_cpu_limit_resize_moves_its_quota() {
    let s = setup(RuntimeOptions::default()).await;
    let agent = s.agent(TopologyPolicy::BestEffort);
    guard(s.runtime.wait_synchronized("10-weft")).await;
    let burstable = |limit: &str| serde_json::json!({"requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": limit, "memory": "64Mi"}});
    s.kubelet.add(pod_with("b", burstable("1")));
    guard(s.runtime.run_pod_sandbox(sandbox("b", "b", None))).await.unwrap();
    let c = guard(s.runtime.create_container("sb-b", container("b"))).await.unwrap();
    assert_eq!(c.linux.resources.cpu.quota.value, 100_000);

    s.kubelet.set(pod_with("b", burstable("2")));
    let c = guard(s.runtime.update_container("c-b", kubelet_resources(500, Some(2000), 64 * MI))).await.unwrap();
    assert_eq!(c.linux.resources.cpu.quota.value, 200_000, "the new CPU limit's quota");
    assert_eq!(cpus_of(&c).len(), 16, "the shared pool");
    assert_eq!(reconcile_once(&agent.manager, &agent.handle, Translation { unified: true }).await.unwrap(), 0);
    agent.kill().await;
}

/// Issue #24 item 2: containerd rebuilds its NRI state only for containers after a restart, so
/// a pod that lived through it is never stopped or removed for any plugin. weft converges anyway:
/// its periodic reconcile releases pods the kubelet no longer has once none of their containers
/// runs, and gives their CPUs back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_after_a_runtime_restart_are_released_without_any_pod_event() {
    let s = setup(RuntimeOptions::default()).await;
    let cfg = service_config(&s.socket, &s.checkpoint, s.kubelet.clone(), weft_agent::service::Mode::Nri, None);
    let stop = CancellationToken::new();
    let task = tokio::spawn(weft_agent::service::run(cfg, stop.clone()));
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.run_pod("a", "6", true, None)).await.unwrap();
    guard(s.run_pod("b", "500m", false, None)).await.unwrap();

    guard(s.runtime.restart()).await;
    guard(s.runtime.wait_synchronized_times("10-weft", 2)).await;
    let from = s.runtime.event_count();
    // The kubelet deletes pod a: its container is stopped and removed (relayed: containerd
    // rebuilt its container state at the Synchronize), its sandbox stopped and removed (not
    // relayed: containerd forgot the pod when it restarted).
    s.kubelet.remove("a");
    guard(s.runtime.stop_container("c-a")).await.unwrap();
    guard(s.runtime.remove_container("c-a")).await.unwrap();
    guard(s.runtime.stop_pod_sandbox("sb-a")).await.unwrap();
    guard(s.runtime.remove_pod_sandbox("sb-a")).await.unwrap();
    let pod_events: Vec<HarnessEvent> = s.runtime.events()[from..]
        .iter()
        .filter(|e| matches!(e, HarnessEvent::Call { method, .. } if method.contains("PodSandbox")))
        .cloned()
        .collect();
    assert!(pod_events.is_empty(), "containerd relays no pod event after its restart: {pod_events:?}");

    // The reconcile releases a and gives its CPUs back to the shared container.
    guard(s.runtime.wait_event(from, |e| {
        matches!(e, HarnessEvent::Unsolicited { update, .. }
            if update.iter().any(|u| u.container_id == "c-b" && u.linux.resources.cpu.cpus == "0-15"))
    }))
    .await;
    // And a new exclusive pod that needs them is admitted.
    let c = guard(s.run_pod("c", "12", true, None)).await.unwrap();
    assert_eq!(cpus_of(&c).len(), 12);
    stop.cancel();
    guard(task).await.unwrap().unwrap();
}

/// Issue #24 item 4: containerd applies the updates of a CreateContainer answer one by one inside
/// that call, so moving every shared container there makes an exclusive pod's start wait for all
/// of them. The pool shrinks instead right after the container started, as an UpdateContainers
/// (here with a reconcile period of an hour, so only the start can have sent it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_pods_create_carries_no_updates_and_the_pool_shrinks_after_its_start() {
    let s = setup(RuntimeOptions::default()).await;
    let mut cfg = service_config(&s.socket, &s.checkpoint, s.kubelet.clone(), weft_agent::service::Mode::Nri, None);
    cfg.period = Duration::from_secs(3600);
    let stop = CancellationToken::new();
    let task = tokio::spawn(weft_agent::service::run(cfg, stop.clone()));
    guard(s.runtime.wait_synchronized("10-weft")).await;
    guard(s.run_pod("b", "500m", false, None)).await.unwrap();
    guard(s.runtime.start_container("c-b")).await.unwrap();
    assert_eq!(cpus_of(&s.runtime.container("c-b").unwrap()).len(), 16);

    let from = s.runtime.event_count();
    let g = guard(s.run_pod("g", "2", true, None)).await.unwrap();
    let exclusive = cpus_of(&g);
    let in_reply: Vec<HarnessEvent> = s.runtime.events()[from..]
        .iter()
        .filter(|e| matches!(e, HarnessEvent::CreateUpdates { .. }))
        .cloned()
        .collect();
    assert!(in_reply.is_empty(), "the CreateContainer answer moved other containers: {in_reply:?}");
    guard(s.runtime.start_container("c-g")).await.unwrap();
    guard(s.runtime.wait_event(
        from,
        |e| matches!(e, HarnessEvent::Unsolicited { update, .. } if update.iter().any(|u| u.container_id == "c-b")),
    ))
    .await;
    let shared = cpus_of(&s.runtime.container("c-b").unwrap());
    assert_eq!(shared.len(), 14, "{shared}");
    assert!(exclusive.iter().all(|x| !shared.contains(x)), "shared {shared} still on exclusive {exclusive}");
    stop.cancel();
    guard(task).await.unwrap().unwrap();
}
