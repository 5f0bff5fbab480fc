//! Bypass mode end to end against this machine's real cgroup v1 hierarchy (`/sys/fs/cgroup/{cpuset,
//! cpu,memory}`; the tests run as root) and a real HTTP "kubelet" on loopback serving `/pods`.
//!
//! Each test builds a private tree `/sys/fs/cgroup/<controller>/weft-test-<pid>-<n>/…` that stands
//! in for the kubelet's `--cgroup-root`, creates the pod and container cgroups the way the runtime
//! would (a new v1 cpuset starts empty, so every level gets its parent's CPUs and memory nodes; the
//! runtime then writes the container's CFS quota and memory limit), serves a `v1.PodList` that the
//! test changes between passes, runs [`Bypass::pass`] and asserts by reading the kernel's files.
//! The tree is removed deepest first when the test ends, pass or fail. A test skips
//! (`weft_testkit::require`) only when there is no v1 hierarchy or fewer than two online CPUs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{CONTROLLERS, TestTree, read, write};

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use weft_agent::agent::{Manager, PodCatalog};
use weft_agent::bypass::{Bypass, Pass};
use weft_agent::cgroup::{
    CgroupDriver, CgroupHierarchy, CgroupLayout, CgroupVersion, CgroupWriter, ContainerCgroup, ContainerRuntime,
    Controller, DEFAULT_CGROUP_ROOT,
};
use weft_agent::checkpoint::Checkpoint;
use weft_agent::kubelet::{KubeletClient, KubeletConfig, KubeletError};
use weft_agent::orm::{OrmConfig, ResourceManager};
use weft_agent::pod::{DeviceLocator, QosClass};
use weft_topology::CpuSet;
use weft_topology::discover::{SysfsRoot, read_cpu_layout};

/// Bounds every kubelet request, so a broken test fails instead of hanging; never reached when
/// passing.
const HANG_GUARD: Duration = Duration::from_secs(30);
const PERIOD: i64 = 100_000;

/// The Guaranteed pod: one app container with 1 CPU and 300 MB (not a page multiple: the kernel
/// rounds it down), after an init container that has finished.
const G_UID: &str = "0a1b2c3d-1111-4222-8333-444455556666";
const G_ID: &str = "6a0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff";
const G_INIT_ID: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const G_MEMORY: u64 = 300_000_000;
/// The Burstable pod: 250m/500m CPU, 64Mi/128Mi memory.
const B_UID: &str = "9f8e7d6c-aaaa-4bbb-8ccc-ddddeeeeffff";
const B_ID: &str = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf";
const B_MEMORY: u64 = 128 << 20;
/// A Burstable pod whose container cgroup the runtime has not created (yet).
const M_UID: &str = "5e5e5e5e-0000-4000-8000-000000000005";
const M_ID: &str = "deadbeef00000000000000000000000000000000000000000000000000000005";

const G_MAIN: &str = "ml/trainer/main";
const B_APP: &str = "web/api/app";
const M_APP: &str = "web/late/app";

fn page_rounded(bytes: u64) -> String {
    (bytes / 4096 * 4096).to_string()
}

/// The real v1 hierarchy and the online CPUs, or `None` (a skip through `weft_testkit::require`).
fn v1_node() -> Option<(CgroupHierarchy, CpuSet)> {
    let h = match CgroupHierarchy::detect(DEFAULT_CGROUP_ROOT) {
        Err(e) => Err(format!("a cgroup hierarchy at {DEFAULT_CGROUP_ROOT} ({e})")),
        Ok(h) if h.version() != CgroupVersion::V1 => {
            Err(format!("cgroup v1 at {DEFAULT_CGROUP_ROOT} (it is cgroup v2)"))
        }
        Ok(h) => match CONTROLLERS.iter().find(|c| h.controller_root(**c).is_none()) {
            Some(c) => Err(format!("the v1 controller {} mounted", c.name())),
            None => Ok(h),
        },
    };
    let h = weft_testkit::require_ok(h)?;
    let online = read_cpu_layout(&SysfsRoot::new("/")).unwrap().online();
    weft_testkit::require(online.len() >= 2, format!("2 online CPUs (has {online})")).then_some((h, online))
}

/// The container's cgroup as the kubelet and containerd name it, spelled out here rather than
/// taken from [`CgroupLayout`] (which is under test).
fn runtime_path(parent: &ContainerCgroup, driver: CgroupDriver, qos: QosClass, uid: &str, id: &str) -> ContainerCgroup {
    let p = parent.as_str();
    let u = uid.replace('-', "_");
    let path = match (driver, qos) {
        (CgroupDriver::Cgroupfs, QosClass::Guaranteed) => format!("{p}/kubepods/pod{uid}/{id}"),
        (CgroupDriver::Cgroupfs, QosClass::Burstable) => format!("{p}/kubepods/burstable/pod{uid}/{id}"),
        (CgroupDriver::Systemd, QosClass::Guaranteed) => {
            format!("{p}/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{id}.scope")
        }
        (CgroupDriver::Systemd, QosClass::Burstable) => format!(
            "{p}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{id}.scope"
        ),
        (_, QosClass::BestEffort) => unreachable!("no BestEffort pods here"),
    };
    ContainerCgroup::new(&path).unwrap()
}

// ---- the kubelet -------------------------------------------------------------------------------

/// What the loopback kubelet answers (changed by the test between passes), and how often it was
/// asked.
#[derive(Clone)]
struct Kubelet {
    answer: Arc<Mutex<(StatusCode, Vec<Value>)>>,
    requests: Arc<AtomicUsize>,
}

impl Kubelet {
    fn new() -> Kubelet {
        Kubelet { answer: Arc::new(Mutex::new((StatusCode::OK, Vec::new()))), requests: Arc::default() }
    }

    fn serve(&self, pods: Vec<Value>) {
        *self.answer.lock().unwrap() = (StatusCode::OK, pods);
    }

    fn fail(&self, status: StatusCode) {
        self.answer.lock().unwrap().0 = status;
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn router(&self) -> Router {
        let me = self.clone();
        Router::new().route(
            "/pods",
            get(move || {
                let me = me.clone();
                async move {
                    me.requests.fetch_add(1, Ordering::SeqCst);
                    let (status, pods) = me.answer.lock().unwrap().clone();
                    let body = if status.is_success() {
                        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}).to_string()
                    } else {
                        "kubelet is restarting".to_owned()
                    };
                    (status, [("content-type", "application/json")], body).into_response()
                }
            }),
        )
    }
}

/// A server task, aborted on drop.
struct Server(JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn running() -> Value {
    json!({"running": {"startedAt": "2025-01-01T00:00:00Z"}})
}

fn status(name: &str, id: &str, state: Value) -> Value {
    json!({
        "name": name, "image": "img", "imageID": "", "ready": true, "restartCount": 0,
        "containerID": format!("containerd://{id}"), "state": state
    })
}

fn resources(cpu_request: &str, cpu_limit: &str, memory_request: &str, memory_limit: &str) -> Value {
    json!({
        "requests": {"cpu": cpu_request, "memory": memory_request},
        "limits": {"cpu": cpu_limit, "memory": memory_limit}
    })
}

/// `ml/trainer`: Guaranteed, 1 CPU and 300 MB, its init container done.
fn guaranteed_pod() -> Value {
    let r = resources("1", "1", "300M", "300M");
    json!({
        "metadata": {"name": "trainer", "namespace": "ml", "uid": G_UID},
        "spec": {
            "initContainers": [{"name": "setup", "image": "img", "resources": r}],
            "containers": [{"name": "main", "image": "img", "resources": r}]
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "initContainerStatuses": [status(
                "setup", G_INIT_ID, json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
            )],
            "containerStatuses": [status("main", G_ID, running())]
        }
    })
}

/// `web/<name>`: Burstable, 250m/500m CPU, 64Mi/128Mi memory, container `app`.
fn burstable_pod(name: &str, uid: &str, id: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "web", "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "img", "resources": resources("250m", "500m", "64Mi", "128Mi")}]},
        "status": {
            "phase": "Running",
            "qosClass": "Burstable",
            "containerStatuses": [status("app", id, running())]
        }
    })
}

// ---- the node ----------------------------------------------------------------------------------

/// No devices on this node: every lookup misses.
struct NoDevices;

impl DeviceLocator for NoDevices {
    fn gpu_numa(&self, _index: u32) -> Option<u32> {
        None
    }
    fn pci_numa(&self, _address: &str) -> Option<u32> {
        None
    }
    fn pci_rdma_device(&self, _address: &str) -> Option<String> {
        None
    }
}

/// The agent in bypass mode over a private cgroup tree and a loopback kubelet.
struct Node {
    kubelet: Kubelet,
    manager: Arc<Manager>,
    bypass: Bypass,
    checkpoint: PathBuf,
    driver: CgroupDriver,
    online: CpuSet,
    /// The first online CPU, reserved: never exclusive.
    reserved: CpuSet,
    tree: TestTree,
    _server: Server,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(hierarchy: CgroupHierarchy, online: CpuSet, driver: CgroupDriver) -> Node {
        let kubelet = Kubelet::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = kubelet.router();
        let server = Server(tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        }));
        let client = Arc::new(
            KubeletClient::new(&KubeletConfig {
                endpoint: format!("http://{addr}"),
                timeout: HANG_GUARD,
                ..KubeletConfig::default()
            })
            .unwrap(),
        );

        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("orm_state");
        let reserved: CpuSet = online.iter().take(1).collect();
        let cfg = OrmConfig { reserved: reserved.clone(), ..OrmConfig::default() };
        let rm = ResourceManager::new(read_cpu_layout(&SysfsRoot::new("/")).unwrap(), cfg).unwrap();
        let manager = Arc::new(Manager::new(
            rm,
            Arc::new(Checkpoint::new(&checkpoint)),
            Arc::new(PodCatalog::new(Some(client.clone()))),
            Arc::new(NoDevices),
        ));

        let tree = TestTree::new(hierarchy.clone());
        let layout =
            CgroupLayout { parent: tree.parent.clone(), ..CgroupLayout::new(driver, ContainerRuntime::Containerd) };
        let bypass =
            Bypass::new(manager.clone(), client, hierarchy.clone(), layout, Arc::new(CgroupWriter::new(hierarchy)));
        Node { kubelet, manager, bypass, checkpoint, driver, online, reserved, tree, _server: server, _dir: dir }
    }

    fn cgroup(&self, qos: QosClass, uid: &str, id: &str) -> ContainerCgroup {
        runtime_path(&self.tree.parent, self.driver, qos, uid, id)
    }

    /// The kubelet creates the pod's cgroup and the runtime the container's, both writing what the
    /// pod asks for (one container per pod: the same CFS quota = limit × period and memory limit on
    /// both levels); the cpusets are inherited.
    fn runtime_starts(&mut self, qos: QosClass, uid: &str, id: &str, quota: i64, memory: u64) -> ContainerCgroup {
        let cgroup = self.cgroup(qos, uid, id);
        let pod = cgroup.parent().unwrap();
        self.tree.create(&pod);
        write(&self.file(Controller::Cpu, &pod, "cpu.cfs_quota_us"), &quota.to_string());
        write(&self.file(Controller::Memory, &pod, "memory.limit_in_bytes"), &memory.to_string());
        self.tree.create(&cgroup);
        write(&self.file(Controller::Cpu, &cgroup, "cpu.cfs_quota_us"), &quota.to_string());
        write(&self.file(Controller::Memory, &cgroup, "memory.limit_in_bytes"), &memory.to_string());
        cgroup
    }

    fn file(&self, controller: Controller, cgroup: &ContainerCgroup, name: &str) -> PathBuf {
        self.tree.dir(controller, cgroup).join(name)
    }

    fn read(&self, controller: Controller, cgroup: &ContainerCgroup, name: &str) -> String {
        read(&self.file(controller, cgroup, name))
    }

    /// UIDs the checkpoint on disk holds.
    fn checkpointed(&self) -> Vec<String> {
        let state = Checkpoint::new(&self.checkpoint).load().unwrap().expect("a checkpoint was written");
        let mut uids: Vec<String> = state.pods.into_iter().map(|p| p.uid).collect();
        uids.sort();
        uids
    }

    fn admitted(&self) -> Vec<String> {
        self.manager.admitted().into_iter().collect()
    }

    /// The exclusive CPUs pod `uid` holds.
    fn exclusive(&self, uid: &str) -> CpuSet {
        self.manager.state().pods.into_iter().find(|p| p.uid == uid).expect("admitted").exclusive
    }
}

fn sorted(uids: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = uids.iter().map(|s| (*s).to_owned()).collect();
    v.sort();
    v
}

fn pass(admitted: &[&str], released: &[&str], enforced: &[&str]) -> Pass {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    Pass { admitted: own(admitted), released: own(released), enforced: own(enforced), ..Pass::default() }
}

// ---- the tests ---------------------------------------------------------------------------------

/// Admit and enforce, stay idempotent, correct drift, survive a failing kubelet, release a pod that
/// is gone and widen the shared pool back: the whole lifecycle, reading the kernel's files.
async fn lifecycle(driver: CgroupDriver) {
    let Some((h, online)) = v1_node() else { return };
    let mut node = Node::start(h, online, driver).await;
    let g = node.runtime_starts(QosClass::Guaranteed, G_UID, G_ID, PERIOD, G_MEMORY);
    let b = node.runtime_starts(QosClass::Burstable, B_UID, B_ID, PERIOD / 2, B_MEMORY);
    let online_text = node.online.to_string();
    assert_eq!(node.read(Controller::Cpuset, &g, "cpuset.cpus"), online_text, "inherited from the parent");
    node.kubelet.serve(vec![guaranteed_pod(), burstable_pod("api", B_UID, B_ID)]);

    // First pass: both admitted, both enforced.
    let first = node.bypass.pass().await.unwrap();
    assert_eq!(first, pass(&[G_UID, B_UID], &[], &[G_MAIN, B_APP]));
    assert_eq!(node.kubelet.requests(), 1, "one pod list per pass; admission reads the catalog");
    let exclusive = node.exclusive(G_UID);
    assert_eq!(exclusive.len(), 1, "{exclusive}");
    assert!(!exclusive.iter().any(|c| node.reserved.contains(c)), "{exclusive} overlaps the reserved CPU");
    let shared: CpuSet = node.online.iter().filter(|c| !exclusive.contains(*c)).collect();
    assert!(shared.iter().any(|c| node.reserved.contains(c)));

    let check_enforced = |node: &Node| {
        // Guaranteed: its exclusive CPU, no quota, its memory limit (page-rounded by the kernel).
        assert_eq!(node.read(Controller::Cpuset, &g, "cpuset.cpus"), exclusive.to_string());
        assert_eq!(node.read(Controller::Cpuset, &g, "cpuset.effective_cpus"), exclusive.to_string());
        assert_eq!(node.read(Controller::Cpuset, &g, "cpuset.mems"), "0");
        assert_eq!(node.read(Controller::Cpu, &g, "cpu.cfs_quota_us"), "-1");
        assert_eq!(node.read(Controller::Cpu, &g, "cpu.cfs_period_us"), PERIOD.to_string());
        assert_eq!(node.read(Controller::Memory, &g, "memory.limit_in_bytes"), page_rounded(G_MEMORY));
        // Burstable: the shared pool, quota = 500m × period / 1000, its memory limit.
        assert_eq!(node.read(Controller::Cpuset, &b, "cpuset.cpus"), shared.to_string());
        assert_eq!(node.read(Controller::Cpu, &b, "cpu.cfs_quota_us"), (500 * PERIOD / 1000).to_string());
        assert_eq!(node.read(Controller::Cpu, &b, "cpu.cfs_period_us"), PERIOD.to_string());
        assert_eq!(node.read(Controller::Memory, &b, "memory.limit_in_bytes"), page_rounded(B_MEMORY));
    };
    check_enforced(&node);
    // Only the containers were written: their pods keep what the runtime gave them.
    assert_eq!(node.read(Controller::Cpuset, &g.parent().unwrap(), "cpuset.cpus"), online_text);
    assert_eq!(node.checkpointed(), sorted(&[G_UID, B_UID]));

    // Nothing changed: nothing written.
    assert_eq!(node.bypass.pass().await.unwrap(), Pass::default());
    check_enforced(&node);

    // Someone puts the Guaranteed container back on every CPU and lifts the Burstable quota.
    write(&node.file(Controller::Cpuset, &g, "cpuset.cpus"), &online_text);
    write(&node.file(Controller::Cpu, &b, "cpu.cfs_quota_us"), "-1");
    assert_eq!(node.bypass.pass().await.unwrap(), pass(&[], &[], &[G_MAIN, B_APP]));
    check_enforced(&node);
    assert_eq!(node.bypass.pass().await.unwrap(), Pass::default());

    // The kubelet fails: an error, and nothing is released or rewritten.
    node.kubelet.fail(StatusCode::INTERNAL_SERVER_ERROR);
    let err = node.bypass.pass().await.unwrap_err();
    assert!(matches!(err, KubeletError::Status { status: 500, .. }), "{err}");
    assert_eq!(node.admitted(), sorted(&[G_UID, B_UID]));
    assert_eq!(node.checkpointed(), sorted(&[G_UID, B_UID]));
    check_enforced(&node);

    // The Guaranteed pod is gone: released (on disk too), and the shared pool widens back.
    node.kubelet.serve(vec![burstable_pod("api", B_UID, B_ID)]);
    assert_eq!(node.bypass.pass().await.unwrap(), pass(&[], &[G_UID], &[B_APP]));
    assert_eq!(node.admitted(), [B_UID]);
    assert_eq!(node.checkpointed(), [B_UID]);
    assert_eq!(node.read(Controller::Cpuset, &b, "cpuset.cpus"), online_text);
    assert_eq!(node.read(Controller::Cpuset, &b, "cpuset.effective_cpus"), online_text);
    assert_eq!(node.read(Controller::Cpu, &b, "cpu.cfs_quota_us"), (500 * PERIOD / 1000).to_string());
    assert_eq!(node.bypass.pass().await.unwrap(), Pass::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_cgroupfs_driver() {
    lifecycle(CgroupDriver::Cgroupfs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_systemd_driver() {
    lifecycle(CgroupDriver::Systemd).await;
}

/// A running container whose cgroup is not there is reported in `failed`, naming it, while the
/// others are enforced; once the runtime creates it, the next pass enforces it. A pod that
/// finished is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_without_a_cgroup_is_reported_not_fatal() {
    let Some((h, online)) = v1_node() else { return };
    let mut node = Node::start(h, online, CgroupDriver::Cgroupfs).await;
    // Started without a quota, so the pass has something to write.
    let b = node.runtime_starts(QosClass::Burstable, B_UID, B_ID, -1, B_MEMORY);
    node.kubelet.serve(vec![burstable_pod("api", B_UID, B_ID), burstable_pod("late", M_UID, M_ID)]);

    let first = node.bypass.pass().await.unwrap();
    assert_eq!(first.admitted, [B_UID, M_UID]);
    assert_eq!(first.enforced, [B_APP]);
    assert_eq!(first.failed.len(), 1, "{:?}", first.failed);
    let (who, why) = &first.failed[0];
    assert_eq!(who, M_APP);
    assert!(why.contains(M_ID), "the reason names the container: {why}");
    assert!(first.refused.is_empty() && first.released.is_empty(), "{first:?}");
    assert_eq!(node.read(Controller::Cpuset, &b, "cpuset.cpus"), node.online.to_string());
    assert_eq!(node.read(Controller::Cpu, &b, "cpu.cfs_quota_us"), (500 * PERIOD / 1000).to_string());

    // Still missing: reported again, nothing else happens.
    let again = node.bypass.pass().await.unwrap();
    assert_eq!(again.failed.len(), 1, "{again:?}");
    assert!(again.enforced.is_empty(), "{again:?}");

    // The runtime creates it (without a quota): enforced on the next pass.
    let m = node.runtime_starts(QosClass::Burstable, M_UID, M_ID, -1, B_MEMORY);
    assert_eq!(node.bypass.pass().await.unwrap(), pass(&[], &[], &[M_APP]));
    assert_eq!(node.read(Controller::Cpu, &m, "cpu.cfs_quota_us"), (500 * PERIOD / 1000).to_string());

    // The late pod finishes: it is released though the kubelet still lists it.
    let mut done = burstable_pod("late", M_UID, M_ID);
    done["status"]["phase"] = json!("Succeeded");
    done["status"]["containerStatuses"][0] = status("app", M_ID, json!({"terminated": {"exitCode": 0}}));
    node.kubelet.serve(vec![burstable_pod("api", B_UID, B_ID), done]);
    assert_eq!(node.bypass.pass().await.unwrap(), pass(&[], &[M_UID], &[]));
    assert_eq!(node.checkpointed(), [B_UID]);
}

/// A running pod that cannot be admitted (here: a second Guaranteed pod wanting more CPUs than are
/// free) runs unmanaged, but in the shared pool: it must not keep the runtime's all-CPU cpuset,
/// which holds the first pod's exclusive CPU. Once CPUs free up it is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_cannot_be_admitted_stays_off_exclusive_cpus() {
    let Some((h, online)) = v1_node() else { return };
    let mut node = Node::start(h, online, CgroupDriver::Cgroupfs).await;
    let g = node.runtime_starts(QosClass::Guaranteed, G_UID, G_ID, PERIOD, G_MEMORY);
    // Every CPU but the reserved one: refused while the first pod holds one of them.
    let want = node.online.len() - 1;
    let r = resources(&want.to_string(), &want.to_string(), "64Mi", "64Mi");
    let big = json!({
        "metadata": {"name": "big", "namespace": "ml", "uid": M_UID},
        "spec": {"containers": [{"name": "main", "image": "img", "resources": r}]},
        "status": {"phase": "Running", "qosClass": "Guaranteed", "containerStatuses": [status("main", M_ID, running())]}
    });
    let quota = i64::try_from(want).unwrap() * PERIOD;
    let m = node.runtime_starts(QosClass::Guaranteed, M_UID, M_ID, quota, 64 << 20);
    node.kubelet.serve(vec![guaranteed_pod(), big.clone()]);

    let first = node.bypass.pass().await.unwrap();
    assert_eq!(first.admitted, [G_UID]);
    assert_eq!(first.refused.len(), 1, "{first:?}");
    assert_eq!(first.refused[0].0, M_UID);
    let exclusive = node.exclusive(G_UID);
    let shared: CpuSet = node.online.iter().filter(|c| !exclusive.contains(*c)).collect();
    assert_eq!(node.read(Controller::Cpuset, &g, "cpuset.cpus"), exclusive.to_string());
    assert_eq!(
        node.read(Controller::Cpuset, &m, "cpuset.cpus"),
        shared.to_string(),
        "the refused pod still runs on the exclusive CPU {exclusive}"
    );
    // Unmanaged otherwise: its quota and memory limit stay as the runtime set them.
    assert_eq!(node.read(Controller::Cpu, &m, "cpu.cfs_quota_us"), quota.to_string());
    assert_eq!(first.enforced, ["ml/trainer/main", "ml/big/main"]);
    assert!(first.failed.is_empty(), "{first:?}");
    assert_eq!(node.checkpointed(), [G_UID], "a refused pod is not checkpointed");

    // Refused again (nothing changed): nothing to write.
    let again = node.bypass.pass().await.unwrap();
    assert_eq!((again.refused.len(), again.enforced.len()), (1, 0), "{again:?}");

    // The first pod goes: the second is admitted and gets the CPUs, without a quota.
    node.kubelet.serve(vec![big]);
    let third = node.bypass.pass().await.unwrap();
    assert_eq!(third, pass(&[M_UID], &[G_UID], &["ml/big/main"]));
    let exclusive = node.exclusive(M_UID);
    assert_eq!(exclusive.len(), want);
    assert_eq!(node.read(Controller::Cpuset, &m, "cpuset.cpus"), exclusive.to_string());
    assert_eq!(node.read(Controller::Cpu, &m, "cpu.cfs_quota_us"), "-1");
    assert_eq!(node.checkpointed(), [M_UID]);
}
