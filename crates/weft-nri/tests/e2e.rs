//! The plugin runtime against the harness runtime, over a real unix socket. No sleeps and no
//! timed assertions: every wait is on a notification, under a generous hang guard.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use protobuf::MessageField;
use tokio_util::sync::CancellationToken;
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::plugin::{
    self, ContainerCreation, Handler, HandlerError, PluginError, PluginOptions, RuntimeHandle, RuntimeInfo,
    SessionState, SocketSource,
};
use weft_nri_harness::{HarnessEvent, NriVersion, Runtime, RuntimeError, RuntimeOptions};

/// Hang guard: generous, never an assertion on timing.
async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("test hung")
}

type CreateFn = dyn Fn(&api::PodSandbox, &api::Container) -> Result<ContainerCreation, HandlerError> + Send + Sync;

/// A handler that records what it sees.
struct Rec {
    events: EventMask,
    calls: Mutex<Vec<String>>,
    runtime: Mutex<Vec<RuntimeInfo>>,
    syncs: Mutex<Vec<(Vec<String>, Vec<String>)>>,
    create: Box<CreateFn>,
    fail_run_pod: Option<String>,
    block_first_create: AtomicBool,
    order: Option<Arc<Mutex<Vec<String>>>>,
    name: String,
}

impl Rec {
    fn new(events: EventMask) -> Rec {
        Rec {
            events,
            calls: Mutex::new(Vec::new()),
            runtime: Mutex::new(Vec::new()),
            syncs: Mutex::new(Vec::new()),
            create: Box::new(|_, _| Ok(ContainerCreation::default())),
            fail_run_pod: None,
            block_first_create: AtomicBool::new(false),
            order: None,
            name: String::new(),
        }
    }

    fn with_create(
        mut self,
        f: impl Fn(&api::PodSandbox, &api::Container) -> Result<ContainerCreation, HandlerError> + Send + Sync + 'static,
    ) -> Rec {
        self.create = Box::new(f);
        self
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn call(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }
}

#[async_trait]
impl Handler for Rec {
    fn events(&self) -> EventMask {
        self.events
    }

    async fn configure(&self, runtime: &RuntimeInfo) -> Result<(), HandlerError> {
        self.runtime.lock().unwrap().push(runtime.clone());
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        self.syncs
            .lock()
            .unwrap()
            .push((pods.iter().map(|p| p.id.clone()).collect(), containers.iter().map(|c| c.id.clone()).collect()));
        Ok(Vec::new())
    }

    async fn run_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.call(format!("run:{}", pod.id));
        match &self.fail_run_pod {
            Some(m) => Err(HandlerError::new(m.clone())),
            None => Ok(()),
        }
    }

    async fn stop_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.call(format!("stop:{}", pod.id));
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: api::PodSandbox) -> Result<(), HandlerError> {
        self.call(format!("remove:{}", pod.id));
        Ok(())
    }

    async fn create_container(
        &self,
        pod: api::PodSandbox,
        container: api::Container,
    ) -> Result<ContainerCreation, HandlerError> {
        if let Some(o) = &self.order {
            o.lock().unwrap().push(self.name.clone());
        }
        if self.block_first_create.swap(false, Ordering::SeqCst) {
            // Never answers: the runtime's request timeout drops us.
            std::future::pending::<()>().await;
        }
        self.call(format!("create:{}", container.id));
        (self.create)(&pod, &container)
    }

    async fn start_container(&self, _pod: api::PodSandbox, c: api::Container) -> Result<(), HandlerError> {
        self.call(format!("start:{}", c.id));
        Ok(())
    }

    async fn post_start_container(&self, _pod: api::PodSandbox, c: api::Container) -> Result<(), HandlerError> {
        self.call(format!("poststart:{}", c.id));
        Ok(())
    }

    async fn update_container(
        &self,
        _pod: api::PodSandbox,
        c: api::Container,
        resources: Option<api::LinuxResources>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        let cpus = resources.and_then(|r| r.cpu.into_option()).map(|c| c.cpus).unwrap_or_default();
        self.call(format!("update:{}:{cpus}", c.id));
        // Keep memory at 1 GiB whatever the kubelet asks.
        Ok(vec![update_mem(&c.id, 1 << 30)])
    }

    async fn remove_container(&self, _pod: api::PodSandbox, c: api::Container) -> Result<(), HandlerError> {
        self.call(format!("rmctr:{}", c.id));
        Ok(())
    }
}

fn pod(id: &str) -> api::PodSandbox {
    let mut p = api::PodSandbox::new();
    p.id = id.into();
    p.uid = format!("uid-{id}");
    p.name = format!("pod-{id}");
    p.namespace = "default".into();
    p.annotations.insert("weft.io/filler".into(), "x".repeat(40));
    p
}

fn ctr(id: &str) -> api::Container {
    let mut c = api::Container::new();
    c.id = id.into();
    c.name = format!("ctr-{id}");
    c.env = vec!["PATH=/bin".into()];
    c
}

fn cpus_adjust(cpus: &str, env: Option<(&str, &str)>) -> api::ContainerAdjustment {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = cpus.into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut linux = api::LinuxContainerAdjustment::new();
    linux.resources = MessageField::some(res);
    let mut a = api::ContainerAdjustment::new();
    a.linux = MessageField::some(linux);
    if let Some((k, v)) = env {
        let mut kv = api::KeyValue::new();
        kv.key = k.into();
        kv.value = v.into();
        a.env.push(kv);
    }
    a
}

fn mem_adjust(limit: i64) -> api::ContainerAdjustment {
    let mut o = api::OptionalInt64::new();
    o.value = limit;
    let mut mem = api::LinuxMemory::new();
    mem.limit = MessageField::some(o);
    let mut res = api::LinuxResources::new();
    res.memory = MessageField::some(mem);
    let mut linux = api::LinuxContainerAdjustment::new();
    linux.resources = MessageField::some(res);
    let mut a = api::ContainerAdjustment::new();
    a.linux = MessageField::some(linux);
    a
}

fn update_cpus(id: &str, cpus: &str) -> api::ContainerUpdate {
    let mut cpu = api::LinuxCPU::new();
    cpu.cpus = cpus.into();
    let mut res = api::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    let mut l = api::LinuxContainerUpdate::new();
    l.resources = MessageField::some(res);
    let mut u = api::ContainerUpdate::new();
    u.container_id = id.into();
    u.linux = MessageField::some(l);
    u
}

fn update_mem(id: &str, limit: i64) -> api::ContainerUpdate {
    let mut u = api::ContainerUpdate::new();
    u.container_id = id.into();
    let mut l = api::LinuxContainerUpdate::new();
    l.resources = mem_adjust(limit).linux.unwrap().resources;
    u.linux = MessageField::some(l);
    u
}

fn cpus_of(c: &api::Container) -> String {
    c.linux.resources.cpu.cpus.clone()
}

fn mem_of(c: &api::Container) -> Option<i64> {
    c.linux.resources.memory.limit.as_ref().map(|o| o.value)
}

fn all_events() -> EventMask {
    EventMask::ALL
}

struct Plugin {
    handle: RuntimeHandle,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), PluginError>>,
}

impl Plugin {
    async fn stop(self) {
        self.stop.cancel();
        guard(self.task).await.unwrap().unwrap();
    }
}

fn start_plugin(path: &Path, name: &str, idx: &str, legacy: bool, h: Arc<dyn Handler>) -> Plugin {
    let mut opts = PluginOptions::new(name, idx);
    opts.socket = SocketSource::Path(path.to_path_buf());
    opts.legacy_events = legacy;
    opts.backoff_min = Duration::from_millis(10);
    opts.backoff_max = Duration::from_millis(200);
    let handle = RuntimeHandle::new();
    let stop = CancellationToken::new();
    let task = tokio::spawn(plugin::run(opts, h, handle.clone(), stop.clone()));
    Plugin { handle, stop, task }
}

async fn harness(opts: RuntimeOptions) -> (tempfile::TempDir, PathBuf, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = Runtime::start(&path, opts).await.unwrap();
    (dir, path, rt)
}

fn calls_of(rt: &Runtime, plugin: &str) -> Vec<(String, Option<String>)> {
    rt.events()
        .into_iter()
        .filter_map(|e| match e {
            HarnessEvent::Call { plugin: p, method, error } if p == plugin => Some((method, error)),
            _ => None,
        })
        .collect()
}

async fn wait_connected(h: &RuntimeHandle, session: u64) -> RuntimeInfo {
    let mut rx = h.subscribe_sessions();
    let state = guard(rx.wait_for(|s| matches!(s, SessionState::Connected { session: n, .. } if *n >= session)))
        .await
        .unwrap()
        .clone();
    match state {
        SessionState::Connected { runtime, .. } => runtime,
        SessionState::Disconnected => unreachable!(),
    }
}

#[tokio::test]
async fn registers_configures_and_synchronizes() {
    let opts = RuntimeOptions {
        registration_timeout: Duration::from_millis(4321),
        request_timeout: Duration::from_millis(1234),
        configure_before_register_reply: true,
        config: "cfg".into(),
        ..Default::default()
    };
    let (_d, path, rt) = harness(opts).await;
    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    rt.create_container("p1", ctr("c1")).await.unwrap();

    let h = Arc::new(Rec::new(Event::RunPodSandbox | Event::CreateContainer));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;

    let info = wait_connected(&p.handle, 1).await;
    assert_eq!(info.name, "weft-nri-harness");
    assert_eq!(info.nri_version.as_deref(), Some("v0.12.0"));
    assert_eq!(info.registration_timeout, Duration::from_millis(4321));
    assert_eq!(info.request_timeout, Duration::from_millis(1234));
    assert_eq!(info.config, "cfg");
    assert_eq!(h.runtime.lock().unwrap().len(), 1);
    assert_eq!(*h.syncs.lock().unwrap(), vec![(vec!["p1".to_string()], vec!["c1".to_string()])]);

    let plugins = rt.plugins();
    assert_eq!(plugins.len(), 1);
    assert_eq!(plugins[0].name, "10-test");
    assert_eq!(plugins[0].events.bits(), 0x9);
    assert_eq!(plugins[0].nri_version, plugin::NRI_VERSION);
    assert!(
        rt.events()
            .contains(&HarnessEvent::Registered { plugin: "10-test".into(), nri_version: plugin::NRI_VERSION.into() })
    );
    assert!(p.handle.is_connected());
    assert!(plugin::probe(&path).await);
    assert!(!plugin::probe(&path.with_extension("missing")).await);
    p.stop().await;
}

#[tokio::test]
async fn old_runtime_defaults_and_state_change_only() {
    let opts = RuntimeOptions { nri_version: NriVersion::V0_9, send_timeouts: false, ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;
    let info = wait_connected(&p.handle, 1).await;
    assert_eq!(info.nri_version, None);
    assert_eq!(info.registration_timeout, plugin::DEFAULT_REGISTRATION_TIMEOUT);
    assert_eq!(info.request_timeout, plugin::DEFAULT_REQUEST_TIMEOUT);

    guard(rt.run_pod_sandbox(pod("p1"))).await.unwrap();
    guard(rt.create_container("p1", ctr("c1"))).await.unwrap();
    guard(rt.start_container("c1")).await.unwrap();
    guard(rt.remove_container("c1")).await.unwrap();
    guard(rt.remove_pod_sandbox("p1")).await.unwrap();
    assert_eq!(h.calls(), ["run:p1", "create:c1", "start:c1", "poststart:c1", "rmctr:c1", "remove:p1"]);
    let methods: Vec<String> = calls_of(&rt, "10-test")
        .into_iter()
        .map(|(m, e)| {
            assert_eq!(e, None);
            m
        })
        .collect();
    assert!(methods.contains(&"StateChange(RunPodSandbox)".to_string()));
    assert!(!methods.contains(&"RunPodSandbox".to_string()));
    p.stop().await;
}

#[tokio::test]
async fn v012_dedicated_rpcs() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;
    guard(rt.run_pod_sandbox(pod("p1"))).await.unwrap();
    guard(rt.create_container("p1", ctr("c1"))).await.unwrap();
    guard(rt.start_container("c1")).await.unwrap();
    let mut want = api::LinuxResources::new();
    want.cpu = update_cpus("c1", "5").linux.unwrap().resources.unwrap().cpu;
    let c = guard(rt.update_container("c1", want)).await.unwrap();
    assert_eq!(cpus_of(&c), "5");
    assert_eq!(mem_of(&c), Some(1 << 30));
    guard(rt.stop_pod_sandbox("p1")).await.unwrap();
    guard(rt.remove_pod_sandbox("p1")).await.unwrap();
    assert_eq!(h.calls(), ["run:p1", "create:c1", "start:c1", "poststart:c1", "update:c1:5", "stop:p1", "remove:p1"]);
    let calls = calls_of(&rt, "10-test");
    assert!(calls.iter().all(|(m, e)| e.is_none() && !m.starts_with("StateChange")), "{calls:?}");
    assert!(calls.iter().any(|(m, _)| m == "RunPodSandbox"));
    p.stop().await;
}

#[tokio::test]
async fn v012_falls_back_to_state_change_for_legacy_plugins() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "legacy", "10", true, h.clone());
    guard(rt.wait_synchronized("10-legacy")).await;
    guard(rt.run_pod_sandbox(pod("p1"))).await.unwrap();
    guard(rt.remove_pod_sandbox("p1")).await.unwrap();
    assert_eq!(h.calls(), ["run:p1", "remove:p1"]);
    let calls = calls_of(&rt, "10-legacy");
    let run: Vec<_> = calls.iter().filter(|(m, _)| m.contains("RunPodSandbox")).cloned().collect();
    assert_eq!(
        run,
        [
            ("RunPodSandbox".to_string(), Some("UNIMPLEMENTED".to_string())),
            ("StateChange(RunPodSandbox)".to_string(), None)
        ]
    );
    p.stop().await;
}

#[tokio::test]
async fn split_synchronize_is_joined() {
    let opts = RuntimeOptions { max_message_size: 2048, ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    for i in 0..40 {
        rt.run_pod_sandbox(pod(&format!("p{i:02}"))).await.unwrap();
        rt.create_container(&format!("p{i:02}"), ctr(&format!("c{i:02}"))).await.unwrap();
    }
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;
    let chunks = rt
        .events()
        .into_iter()
        .find_map(|e| match e {
            HarnessEvent::Synchronized { chunks, .. } => Some(chunks),
            _ => None,
        })
        .unwrap();
    assert!(chunks > 2, "expected a split sync, got {chunks} message(s)");
    let syncs = h.syncs.lock().unwrap().clone();
    assert_eq!(syncs.len(), 1);
    assert_eq!(syncs[0].0.len(), 40);
    assert_eq!(syncs[0].1.len(), 40);
    p.stop().await;
}

#[tokio::test]
async fn slow_plugin_is_dropped_and_comes_back() {
    let opts = RuntimeOptions { request_timeout: Duration::from_millis(500), ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    let h = Rec::new(all_events())
        .with_create(|_, _| Ok(ContainerCreation { adjust: Some(cpus_adjust("2-3", None)), ..Default::default() }));
    h.block_first_create.store(true, Ordering::SeqCst);
    let h = Arc::new(h);
    let p = start_plugin(&path, "slow", "10", false, h.clone());
    guard(rt.wait_synchronized("10-slow")).await;
    let mark = rt.event_count();

    // The plugin never answers: the runtime drops it and creates the container without it.
    let c = guard(rt.create_container("p1", ctr("c1"))).await.unwrap();
    assert_eq!(cpus_of(&c), "");
    let reason = guard(rt.wait_dropped("10-slow", mark)).await;
    assert!(reason.contains("timed out"), "{reason}");

    // It reconnects, synchronizes again (seeing c1) and is called again.
    guard(rt.wait_synchronized_times("10-slow", 2)).await;
    wait_connected(&p.handle, 2).await;
    let syncs = h.syncs.lock().unwrap().clone();
    assert_eq!(syncs.len(), 2);
    assert_eq!(syncs[1].1, ["c1"]);
    let c = guard(rt.create_container("p1", ctr("c2"))).await.unwrap();
    assert_eq!(cpus_of(&c), "2-3");
    p.stop().await;
}

#[tokio::test]
async fn handler_error_fails_the_cri_call() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let mut h = Rec::new(all_events());
    h.fail_run_pod = Some("no exclusive CPUs left".into());
    let h = Arc::new(h);
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;
    let err = guard(rt.run_pod_sandbox(pod("p1"))).await.unwrap_err();
    match err {
        RuntimeError::Plugin { plugin, message, .. } => {
            assert_eq!(plugin, "10-test");
            assert!(message.contains("no exclusive CPUs left"), "{message}");
        }
        other => panic!("unexpected {other}"),
    }
    assert!(rt.pod("p1").is_none());
    // An error is no reason to drop the plugin.
    assert_eq!(rt.plugins().len(), 1);
    p.stop().await;
}

#[tokio::test]
async fn two_plugins_merge_in_index_order_and_conflict() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let conflict = Arc::new(AtomicBool::new(false));
    let self_update = Arc::new(AtomicBool::new(false));

    let mut a = Rec::new(Event::CreateContainer.into()).with_create(|_, _| {
        Ok(ContainerCreation { adjust: Some(cpus_adjust("0-1", Some(("A", "1")))), ..Default::default() })
    });
    a.order = Some(order.clone());
    a.name = "a".into();
    let (c2, s2) = (conflict.clone(), self_update.clone());
    let mut b = Rec::new(Event::CreateContainer.into()).with_create(move |_, c| {
        let mut adj = mem_adjust(1 << 30);
        adj.env.push({
            let mut kv = api::KeyValue::new();
            kv.key = "B".into();
            kv.value = "2".into();
            kv
        });
        if c2.load(Ordering::SeqCst) {
            adj = cpus_adjust("4-5", None);
        }
        let update = if s2.load(Ordering::SeqCst) { vec![update_cpus(&c.id, "7")] } else { Vec::new() };
        Ok(ContainerCreation { adjust: Some(adj), update, ..Default::default() })
    });
    b.order = Some(order.clone());
    b.name = "b".into();
    // Start the higher index first: the runtime still calls 10-a before 20-b.
    let pb = start_plugin(&path, "b", "20", false, Arc::new(b));
    guard(rt.wait_synchronized("20-b")).await;
    let pa = start_plugin(&path, "a", "10", false, Arc::new(a));
    guard(rt.wait_synchronized("10-a")).await;
    assert_eq!(rt.plugins().iter().map(|p| p.name.clone()).collect::<Vec<_>>(), ["10-a", "20-b"]);

    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    let c = guard(rt.create_container("p1", ctr("c1"))).await.unwrap();
    assert_eq!(cpus_of(&c), "0-1");
    assert_eq!(mem_of(&c), Some(1 << 30));
    assert_eq!(c.env, ["PATH=/bin", "A=1", "B=2"]);
    assert_eq!(rt.container("c1").unwrap(), c);
    assert_eq!(*order.lock().unwrap(), ["a", "b"]);

    conflict.store(true, Ordering::SeqCst);
    let err = guard(rt.create_container("p1", ctr("c2"))).await.unwrap_err().to_string();
    assert_eq!(err, "plugins \"20-b\" and \"10-a\" both tried to set CPUSetCPUs");

    conflict.store(false, Ordering::SeqCst);
    self_update.store(true, Ordering::SeqCst);
    let err = guard(rt.create_container("p1", ctr("c3"))).await.unwrap_err().to_string();
    assert_eq!(err, "plugin \"20-b\" asked update of \"c3\" during creation");
    pa.stop().await;
    pb.stop().await;
}

#[tokio::test]
async fn unsolicited_updates_through_the_handle() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    rt.create_container("p1", ctr("c1")).await.unwrap();

    let idle = RuntimeHandle::new();
    assert!(!idle.is_connected());
    assert!(matches!(idle.update_containers(vec![], vec![]).await, Err(PluginError::NotConnected)));

    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    wait_connected(&p.handle, 1).await;
    let failed = guard(p.handle.update_containers(vec![update_cpus("c1", "3"), update_cpus("nope", "1")], vec![]))
        .await
        .unwrap();
    assert_eq!(failed.iter().map(|u| u.container_id.as_str()).collect::<Vec<_>>(), ["nope"]);
    assert_eq!(cpus_of(&rt.container("c1").unwrap()), "3");
    let un = rt.unsolicited_updates();
    assert_eq!(un.len(), 1);
    assert_eq!(un[0].0, "10-test");
    assert_eq!(un[0].1.len(), 2);
    p.stop().await;
}

#[tokio::test]
async fn trunk_closed_mid_synchronize_reconnects() {
    let opts = RuntimeOptions { max_message_size: 2048, ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    for i in 0..30 {
        rt.run_pod_sandbox(pod(&format!("p{i:02}"))).await.unwrap();
    }
    rt.close_during_sync("10-test", 1);
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    let reason = guard(rt.wait_dropped("10-test", 0)).await;
    assert!(reason.contains("during Synchronize"), "{reason}");
    guard(rt.wait_synchronized("10-test")).await;
    // The first session never finished: the handler saw one complete, unduplicated sync.
    let syncs = h.syncs.lock().unwrap().clone();
    assert_eq!(syncs.len(), 1);
    assert_eq!(syncs[0].0.len(), 30);
    p.stop().await;
}

#[tokio::test]
async fn runtime_restart_resynchronizes() {
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h.clone());
    guard(rt.wait_synchronized("10-test")).await;
    wait_connected(&p.handle, 1).await;
    let mut sessions = p.handle.subscribe_sessions();
    rt.drop_all_connections();
    guard(sessions.wait_for(|s| *s == SessionState::Disconnected)).await.unwrap();
    wait_connected(&p.handle, 2).await;
    guard(rt.wait_synchronized_times("10-test", 2)).await;
    assert_eq!(h.syncs.lock().unwrap().len(), 2);
    assert_eq!(h.runtime.lock().unwrap().len(), 2);
    p.stop().await;
}

#[tokio::test]
async fn unregistered_connection_is_dropped() {
    let opts = RuntimeOptions { registration_timeout: Duration::from_millis(500), ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    let silent = tokio::net::UnixStream::connect(&path).await.unwrap();
    let reason = guard(rt.wait_dropped("??-plugin", 0)).await;
    assert_eq!(reason, "plugin registration timed out");
    drop(silent);
    // A real plugin still gets in afterwards.
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h);
    guard(rt.wait_synchronized("10-test")).await;
    p.stop().await;
}

#[tokio::test]
async fn shutdown_stops_reconnecting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nobody.sock");
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h);
    // Nobody listens; the plugin keeps retrying until stopped.
    p.stop().await;
}

#[test]
fn options_are_validated() {
    let ok = PluginOptions::new("weft", "00");
    ok.validate().unwrap();
    assert_eq!(ok.full_name(), "00-weft");
    assert_eq!(ok.socket, SocketSource::Path(plugin::DEFAULT_SOCKET_PATH.into()));
    for (name, idx, field) in [
        ("", "00", "name"),
        ("we ft", "00", "name"),
        ("weft", "0", "index"),
        ("weft", "0a", "index"),
        ("weft", "000", "index"),
    ] {
        match PluginOptions::new(name, idx).validate() {
            Err(PluginError::InvalidOption { field: f, .. }) => assert_eq!(f, field, "{name:?} {idx:?}"),
            other => panic!("{name:?} {idx:?}: {other:?}"),
        }
    }
}

/// A bare runtime built from the library's pieces: lets a test send raw ttrpc requests. It accepts
/// the plugin's registration and its container updates, and does nothing with them.
struct RawRuntime;

#[async_trait]
impl api::Runtime for RawRuntime {
    async fn register_plugin(
        &self,
        _: &ttrpc::r#async::TtrpcContext,
        _: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _: &ttrpc::r#async::TtrpcContext,
        _: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        Ok(api::UpdateContainersResponse::new())
    }
}

async fn raw_call(client: &ttrpc::r#async::Client, method: &str, payload: Vec<u8>) -> ttrpc::Result<ttrpc::Response> {
    let mut req = ttrpc::Request::new();
    req.service = "nri.pkg.api.v1alpha1.Plugin".into();
    req.method = method.into();
    req.payload = payload;
    req.timeout_nano = 10_000_000_000;
    client.request(req).await
}

fn code_of(r: ttrpc::Result<ttrpc::Response>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(ttrpc::Error::RpcStatus(s)) => protobuf::Enum::value(&s.code()),
        Err(e) => panic!("transport error {e}"),
    }
}

#[tokio::test]
async fn unknown_and_legacy_methods_answer_unimplemented() {
    use protobuf::Message;

    for legacy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let p = start_plugin(&path, "raw", "10", legacy, Arc::new(Rec::new(Event::CreateContainer.into())));
        let (stream, _) = guard(listener.accept()).await.unwrap();
        let (mux, client, server) = runtime_end(stream, Arc::new(RawRuntime)).await;

        let mut pod_req = api::RunPodSandboxRequest::new();
        pod_req.pod = MessageField::some(pod("p1"));
        let pod_bytes = pod_req.write_to_bytes().unwrap();
        // Unknown to us: UNIMPLEMENTED (12), whatever the mode.
        assert_eq!(code_of(guard(raw_call(&client, "ValidateContainerAdjustment", vec![])).await), 12);
        // RunPodSandbox is not subscribed: empty success, unless in legacy mode.
        let want = if legacy { 12 } else { 0 };
        assert_eq!(code_of(guard(raw_call(&client, "RunPodSandbox", pod_bytes)).await), want);
        // StateChange always works.
        let mut sc = api::StateChangeEvent::new();
        sc.event = api::Event::RUN_POD_SANDBOX.into();
        sc.pod = MessageField::some(pod("p1"));
        assert_eq!(code_of(guard(raw_call(&client, "StateChange", sc.write_to_bytes().unwrap())).await), 0);
        mux.close();
        p.stop().await;
        drop(server);
    }
}

#[tokio::test]
async fn create_container_round_trips_in_a_loop() {
    let opts = RuntimeOptions { record_calls: false, ..Default::default() };
    let (_d, path, rt) = harness(opts).await;
    let h = Arc::new(
        Rec::new(Event::CreateContainer.into())
            .with_create(|_, _| Ok(ContainerCreation { adjust: Some(cpus_adjust("1", None)), ..Default::default() })),
    );
    let p = start_plugin(&path, "test", "10", false, h);
    guard(rt.wait_synchronized("10-test")).await;
    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    let before = rt.event_count();
    guard(async {
        for i in 0..200 {
            let id = format!("c{i}");
            let c = rt.create_container("p1", ctr(&id)).await.unwrap();
            assert_eq!(cpus_of(&c), "1");
            rt.remove_container(&id).await.unwrap();
        }
    })
    .await;
    assert_eq!(rt.event_count(), before);
    p.stop().await;
}

#[tokio::test]
async fn given_fd_runs_one_session() {
    use std::os::fd::AsRawFd;
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let sock = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let fd = sock.as_raw_fd();
    // Ownership of the fd moves to the plugin runtime (as with an inherited fd).
    std::mem::forget(sock);
    let mut opts = PluginOptions::new("fd", "30");
    opts.socket = SocketSource::Fd(fd);
    let handle = RuntimeHandle::new();
    let task =
        tokio::spawn(plugin::run(opts, Arc::new(Rec::new(all_events())), handle.clone(), CancellationToken::new()));
    guard(rt.wait_synchronized("30-fd")).await;
    wait_connected(&handle, 1).await;
    rt.drop_all_connections();
    // No reconnect: run returns after the synchronized session ended.
    guard(task).await.unwrap().unwrap();
    assert!(!handle.is_connected());
}

#[tokio::test]
async fn dropping_the_plugin_future_closes_the_connection() {
    // A plugin task that is aborted (its owner crashed or dropped it) must not leave the trunk open
    // behind it: the runtime has to see the plugin go, as it would see a killed process go.
    let (_d, path, rt) = harness(RuntimeOptions::default()).await;
    let h = Arc::new(Rec::new(all_events()));
    let p = start_plugin(&path, "test", "10", false, h);
    guard(rt.wait_synchronized("10-test")).await;
    let from = rt.event_count();
    p.task.abort();
    let _ = p.task.await;
    let reason = guard(rt.wait_dropped("10-test", from)).await;
    assert!(!reason.is_empty());
    assert!(rt.plugins().is_empty(), "{:?}", rt.plugins());
}

// ----- what upstream's runtime side requires (issue 12) -----

/// A handler whose `Synchronize` answers with an update for every container it is told about,
/// and that subscribes to `events`.
struct SyncUpdates {
    events: EventMask,
}

#[async_trait]
impl Handler for SyncUpdates {
    fn events(&self) -> EventMask {
        self.events
    }

    async fn synchronize(
        &self,
        _pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        Ok(containers.iter().map(|c| update_cpus(&c.id, "0-3,8-11,16-19,24-27")).collect())
    }
}

/// A runtime with `n` containers in one pod, none adjusted yet.
async fn harness_with_containers(opts: RuntimeOptions, n: usize) -> (tempfile::TempDir, PathBuf, Runtime) {
    let (d, path, rt) = harness(opts).await;
    rt.run_pod_sandbox(pod("p1")).await.unwrap();
    for i in 0..n {
        rt.create_container("p1", ctr(&format!("c{i:03}"))).await.unwrap();
    }
    (d, path, rt)
}

#[tokio::test]
async fn replies_and_updates_larger_than_go_ttrpcs_read_buffer_keep_the_plugin_connected() {
    // The runtime side reads as Go ttrpc over upstream's mux: any frame over 4,096 bytes is
    // ENOMEM and the plugin is closed. 400 containers make a Synchronize reply and an
    // UpdateContainers request of several times that.
    let updates: Vec<_> = (0..400).map(|i| update_cpus(&format!("c{i:03}"), "4-7,12-15,20-23,28-31")).collect();
    let mut request = api::UpdateContainersRequest::new();
    request.update = updates.clone();
    assert!(protobuf::Message::write_to_bytes(&request).unwrap().len() > 2 * 4096, "large enough to matter");
    let (_d, path, rt) = harness_with_containers(RuntimeOptions::default(), 400).await;
    let p = start_plugin(&path, "big", "10", false, Arc::new(SyncUpdates { events: Event::CreateContainer.into() }));
    wait_connected(&p.handle, 1).await;
    guard(rt.wait_synchronized("10-big")).await;
    assert_eq!(cpus_of(&rt.container("c399").unwrap()), "0-3,8-11,16-19,24-27", "the reply's updates were applied");
    let failed = guard(p.handle.update_containers(updates, vec![])).await.unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(cpus_of(&rt.container("c042").unwrap()), "4-7,12-15,20-23,28-31");
    let dropped: Vec<_> = rt.events().into_iter().filter(|e| matches!(e, HarnessEvent::Dropped { .. })).collect();
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(rt.plugins().len(), 1);
    p.stop().await;
}

#[tokio::test]
async fn the_harness_drops_a_plugin_that_sends_frames_go_ttrpc_cannot_read() {
    // The same rule, seen from the other side: a runtime reading with a smaller buffer than the
    // frames weft writes (4,096) closes it, as upstream does. weft's own frames never exceed it.
    let opts = RuntimeOptions { read_buffer: 1024, ..RuntimeOptions::default() };
    let (_d, path, rt) = harness_with_containers(opts, 150).await;
    let from = rt.event_count();
    let p = start_plugin(&path, "big", "10", false, Arc::new(SyncUpdates { events: Event::CreateContainer.into() }));
    let reason = guard(rt.wait_dropped("10-big", from)).await;
    assert!(reason.contains("ENOMEM") || reason.contains("connection"), "{reason}");
    p.stop.cancel();
}

/// A harness playing `name` `version` at NRI `nri`.
fn runtime_as(name: &str, version: &str, nri: NriVersion) -> RuntimeOptions {
    RuntimeOptions { name: name.into(), version: version.into(), nri_version: nri, ..RuntimeOptions::default() }
}

#[tokio::test]
async fn weft_subscribes_only_to_what_it_dispatches_and_the_runtime_accepts() {
    let pod_update = Event::UpdatePodSandbox | Event::PostUpdatePodSandbox;
    for (opts, want) in [
        // NRI v0.9 runtimes drop a plugin with any bit beyond 0x7FF.
        (runtime_as("containerd", "v1.7.24", NriVersion::V0_9), EventMask::UP_TO_V0_9),
        (runtime_as("cri-o", "1.33.2", NriVersion::V0_9), EventMask::UP_TO_V0_9),
        // containerd 2.2 and CRI-O 1.34 vendor v0.10; v0.12 says so itself.
        (runtime_as("containerd", "2.2.0", NriVersion::V0_10), plugin::DISPATCHED),
        (runtime_as("cri-o", "1.34.0", NriVersion::V0_10), plugin::DISPATCHED),
        (runtime_as("anything", "9.9", NriVersion::V0_12), plugin::DISPATCHED),
    ] {
        let label = format!("{} {}", opts.name, opts.version);
        let (_d, path, rt) = harness_with_containers(opts, 0).await;
        // The handler asks for everything, validation included.
        let p = start_plugin(&path, "all", "10", false, Arc::new(Rec::new(EventMask::ALL)));
        guard(rt.wait_synchronized("10-all")).await;
        let info = rt.plugins().into_iter().find(|i| i.name == "10-all").unwrap();
        assert_eq!(info.events, want, "{label}");
        assert!(!info.events.contains(Event::ValidateContainerAdjustment), "{label}: weft validates nothing");
        assert_eq!(info.events.contains(Event::UpdatePodSandbox), want.contains(Event::UpdatePodSandbox));
        // Not a validator: creating a container works.
        rt.run_pod_sandbox(pod("p2")).await.unwrap();
        guard(rt.create_container("p2", ctr("c1"))).await.unwrap_or_else(|e| panic!("{label}: {e}"));
        p.stop().await;
    }
    // A handler that wants only what an old runtime cannot send is refused at Configure, by name.
    let (_d, path, rt) = harness_with_containers(runtime_as("containerd", "1.7.24", NriVersion::V0_9), 0).await;
    let from = rt.event_count();
    let p = start_plugin(&path, "pods", "10", false, Arc::new(Rec::new(pod_update)));
    let reason = guard(rt.wait_dropped("10-pods", from)).await;
    assert!(reason.contains("nothing to subscribe"), "{reason}");
    p.stop.cancel();
}

#[tokio::test]
async fn the_runtime_does_not_act_on_evictions() {
    let (_d, path, rt) = harness_with_containers(RuntimeOptions::default(), 2).await;
    let p = start_plugin(&path, "ev", "10", false, Arc::new(Rec::new(Event::CreateContainer.into())));
    wait_connected(&p.handle, 1).await;
    let mut ev = api::ContainerEviction::new();
    ev.container_id = "c000".into();
    ev.reason = "test".into();
    let failed = guard(p.handle.update_containers(vec![update_cpus("c001", "1")], vec![ev])).await.unwrap();
    assert!(failed.is_empty());
    assert!(rt.container("c000").is_some(), "containerd ignores evictions");
    assert_eq!(cpus_of(&rt.container("c001").unwrap()), "1", "the updates are applied");
    assert_eq!(rt.unsolicited_updates()[0].2.len(), 1, "the eviction was received");
    p.stop().await;
}

/// One ttrpc message seen on the trunk: connection, stream id, type (1 request, 2 response), and
/// the positions (in trunk frames) of its first and last frame.
#[derive(Debug, Clone, Copy)]
struct WireMessage {
    conn: u32,
    stream: u32,
    kind: u8,
    first_frame: usize,
    last_frame: usize,
}

/// Splits the plugin→runtime frames, in trunk order, into the ttrpc messages they carry.
fn wire_messages(frames: &[(u32, Vec<u8>)]) -> Vec<WireMessage> {
    let mut out = Vec::new();
    let mut partial: std::collections::HashMap<u32, (Vec<u8>, usize)> = std::collections::HashMap::new();
    for (i, (conn, payload)) in frames.iter().enumerate() {
        let (buf, first) = partial.entry(*conn).or_insert_with(|| (Vec::new(), i));
        if buf.is_empty() {
            *first = i;
        }
        buf.extend_from_slice(payload);
        while buf.len() >= 10 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 10 + len {
                break;
            }
            let stream = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
            out.push(WireMessage { conn: *conn, stream, kind: buf[8], first_frame: *first, last_frame: i });
            buf.drain(..10 + len);
            *first = i;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synchronize_reply_is_on_the_wire_before_the_first_update_containers() {
    use protobuf::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weft_nri::mux;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("order.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let p = start_plugin(&path, "order", "10", false, Arc::new(SyncUpdates { events: Event::CreateContainer.into() }));
    // As soon as the session counts as connected, the plugin sends an update (as weft's
    // reconcile loop may).
    let handle = p.handle.clone();
    let sent = tokio::spawn(async move {
        wait_connected(&handle, 1).await;
        handle.update_containers(vec![update_cpus("c000", "1")], vec![]).await
    });
    let (stream, _) = guard(listener.accept()).await.unwrap();
    let (mut from_plugin, mut to_plugin) = stream.into_split();
    // Between the plugin and the runtime's mux: record the plugin's frames in trunk order.
    let (runtime_side, recorder_side) = tokio::io::duplex(1 << 20);
    let (mut rec_read, mut rec_write) = tokio::io::split(recorder_side);
    let frames = Arc::new(Mutex::new(Vec::new()));
    let f = frames.clone();
    tokio::spawn(async move {
        let mut h = [0u8; 8];
        while from_plugin.read_exact(&mut h).await.is_ok() {
            let (id, len) = mux::decode_header(&h);
            let mut payload = vec![0u8; len as usize];
            if from_plugin.read_exact(&mut payload).await.is_err() {
                break;
            }
            f.lock().unwrap().push((id, payload.clone()));
            if rec_write.write_all(&mux::encode_frames(id, &payload)).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move { tokio::io::copy(&mut rec_read, &mut to_plugin).await });
    let (m, client, server) = runtime_end(runtime_side, Arc::new(RawRuntime)).await;
    let mut configure = api::ConfigureRequest::new();
    configure.runtime_name = "containerd".into();
    configure.runtime_version = "2.1.4".into();
    assert_eq!(code_of(guard(raw_call(&client, "Configure", configure.write_to_bytes().unwrap())).await), 0);
    let mut sync = api::SynchronizeRequest::new();
    sync.pods = vec![pod("p1")];
    sync.containers = (0..200).map(|i| ctr(&format!("c{i:03}"))).collect();
    assert_eq!(code_of(guard(raw_call(&client, "Synchronize", sync.write_to_bytes().unwrap())).await), 0);
    guard(sent).await.unwrap().unwrap();

    let messages = wire_messages(&frames.lock().unwrap());
    // Replies on connection 1: Configure (stream 1), Synchronize (stream 3). Requests on
    // connection 2: RegisterPlugin (stream 1), then UpdateContainers (stream 3).
    let reply = messages.iter().find(|w| w.conn == 1 && w.kind == 2 && w.stream == 3).expect("Synchronize reply");
    let update = messages.iter().find(|w| w.conn == 2 && w.kind == 1 && w.stream == 3).expect("UpdateContainers");
    assert!(reply.last_frame > reply.first_frame, "the reply spans several frames: {reply:?}");
    assert!(
        reply.last_frame < update.first_frame,
        "UpdateContainers started on the wire before the Synchronize reply ended: {reply:?} {update:?}"
    );
    m.close();
    p.stop().await;
    drop(server);
}

/// The runtime's end of a plugin connection, played by hand over `trunk`: the mux, `runtime` served
/// on connection 2 (where the plugin calls the runtime), a raw client on connection 1 (where the
/// runtime calls the plugin). The mux is started once the server is.
async fn runtime_end<T>(
    trunk: T,
    runtime: Arc<dyn api::Runtime + Send + Sync>,
) -> (weft_nri::mux::Mux, ttrpc::r#async::Client, ttrpc::r#async::Server)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    use ttrpc::r#async::transport::{Listener, Socket};
    let mux = weft_nri::mux::Mux::new(trunk);
    let (c1, c2) = (mux.open(1).unwrap(), mux.open(2).unwrap());
    let l = Listener::new(futures::stream::once(async move { Ok::<_, std::io::Error>(c2) }));
    let mut server = ttrpc::r#async::Server::new().register_service(api::create_runtime(runtime)).add_listener(l);
    server.start().await.unwrap();
    mux.start();
    (mux, ttrpc::r#async::Client::new(Socket::new(c1)), server)
}
