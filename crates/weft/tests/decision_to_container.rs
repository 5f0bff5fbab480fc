//! The whole loop from decision to container with no cluster, every hop over a real socket: the
//! fake API server; the scheduler extender's HTTP verbs as kube-scheduler calls them (filter,
//! prioritize, bind); the test kubelet admitting the pod through weft's GPU device plugin (gRPC on
//! unix sockets) and serving PodResources; the write-back patching the pod on the API server; the
//! agent's resource manager as an NRI plugin under the NRI harness runtime. Then the same with the
//! kubelet restarted mid-way, and with the agent restarted between Allocate and the write-back.
//! Waits are on observable state under a hang guard; nothing sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use weft_agent::agent::{Manager, PodCatalog};
use weft_agent::checkpoint::Checkpoint;
use weft_agent::kubelet::{KubeletError, PodSource};
use weft_agent::nri::{NriHandler, Translation};
use weft_agent::orm::{OrmConfig, ResourceManager};
use weft_agent::pod::DeviceLocator;
use weft_agent::policy::TopologyPolicy;
use weft_deviceplugin::PluginOptions;
use weft_deviceplugin::handshake::NodePods;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_extender::{ExtenderConfig, ExtenderState, KubeClusterView, KubePodBinder};
use weft_fakeapi::FakeApiServer;
use weft_gpu_plugin::writeback::KubeAnnotator;
use weft_gpu_plugin::{DeviceListStrategy, GpuInventory, GpuPlugin, GpuPluginConfig};
use weft_kubelet_harness::{PodList, TestKubelet};
use weft_net::choice::shares_switch;
use weft_net::config::PhysnetConfig;
use weft_nri::api;
use weft_nri::plugin::{self, PluginOptions as NriOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{Runtime, RuntimeOptions};
use weft_record::usage::parse_gpu_ids;
use weft_record::vf_usage::{VF_IDS_ANNOTATION, parse_vf_ids};
use weft_record::{GPU_DECISION_ANNOTATION, GPU_IDS_ANNOTATION, GpuDecision, TOPOLOGY_ANNOTATION};
use weft_sriov_plugin::{GpuPlace, SriovPlugin, SriovPlugins, VfInventory, gpu_places};
use weft_topology::discover::{FakeSriovTree, read_sriov};
use weft_topology::{CpuLayout, CpuSet, NodeTopology};

const HANG_GUARD: Duration = Duration::from_secs(60);
const NODE: &str = "gpu-node-1";
const GPU: &str = "nvidia.com/gpu";

async fn guard<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

/// A DGX-1 V100 (NVLink hybrid cube mesh) with UUIDs; GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1.
fn topology() -> NodeTopology {
    let mut t = weft_topology::reference::dgx1_volta();
    t.name = Some(NODE.to_string());
    for g in &mut t.gpus {
        g.uuid = Some(format!("GPU-00000000-0000-0000-0000-00000000000{}", g.index));
        g.numa_node = Some(g.index / 4);
    }
    t
}

fn numa_of_gpu(index: usize) -> u32 {
    u32::try_from(index / 4).unwrap()
}

/// 2 sockets × 1 NUMA node × 4 cores × 2 threads: NUMA 0 = CPUs 0-3,8-11, NUMA 1 = 4-7,12-15.
fn layout() -> CpuLayout {
    CpuLayout::synthetic(2, 1, 4, 2).unwrap()
}

fn numa_cpus(numa: u32) -> CpuSet {
    (if numa == 0 { "0-3,8-11" } else { "4-7,12-15" }).parse().unwrap()
}

struct Locator;
impl DeviceLocator for Locator {
    fn gpu_numa(&self, index: u32) -> Option<u32> {
        Some(index / 4)
    }
    fn pci_numa(&self, _: &str) -> Option<u32> {
        None
    }
    fn pci_rdma_device(&self, _: &str) -> Option<String> {
        None
    }
}

/// The test kubelet's pods, as the GPU plugin and the resource manager read the kubelet's list.
#[derive(Clone)]
struct KubeletPods(PodList);

#[async_trait]
impl NodePods for KubeletPods {
    async fn pods(&self) -> Result<Vec<Pod>, String> {
        Ok(self.0.get())
    }
}

#[async_trait]
impl PodSource for KubeletPods {
    async fn pods(&self) -> Result<Vec<Pod>, KubeletError> {
        Ok(self.0.get())
    }
}

/// The agent's GPU half: the device plugin served to the kubelet, and (optionally) its write-back.
struct GpuAgent {
    plugin: Arc<GpuPlugin>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl GpuAgent {
    fn start(kubelet: &TestKubelet, dirs: &Dirs, api: &FakeApiServer, write_back: bool) -> GpuAgent {
        let cfg = GpuPluginConfig { resource: GPU.into(), node: NODE.into(), strategy: DeviceListStrategy::Envvar };
        let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(dirs.pod_resources.clone()));
        let plugin = Arc::new(GpuPlugin::new(
            cfg,
            GpuInventory::new(&topology()).unwrap(),
            Arc::new(KubeletPods(kubelet.pods())),
            assigned,
        ));
        let mut options = PluginOptions::new(&dirs.device_plugins, "weft-gpu.sock");
        options.kubelet_check = Duration::from_millis(20);
        options.register_retry = Duration::from_millis(20);
        let stop = CancellationToken::new();
        let mut tasks = vec![tokio::spawn({
            let (plugin, stop) = (plugin.clone(), stop.clone());
            async move { weft_deviceplugin::serve(plugin, options, stop).await.unwrap() }
        })];
        if write_back {
            let annotator = Arc::new(KubeAnnotator::new(api.client(), "weft-agent"));
            tasks.push(tokio::spawn(weft_gpu_plugin::writeback::run(
                plugin.clone(),
                annotator,
                Duration::from_secs(30),
                stop.clone(),
            )));
        }
        GpuAgent { plugin, stop, tasks }
    }

    /// Stops it as a crash would: tasks gone, memory gone.
    async fn kill(self) {
        self.stop.cancel();
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

struct Dirs {
    _root: tempfile::TempDir,
    device_plugins: PathBuf,
    pod_resources: PathBuf,
    nri: PathBuf,
    checkpoint: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let device_plugins = root.path().join("device-plugins");
    std::fs::create_dir(&device_plugins).unwrap();
    Dirs {
        pod_resources: root.path().join("pod-resources.sock"),
        nri: root.path().join("nri.sock"),
        checkpoint: root.path().join("orm.json"),
        device_plugins,
        _root: root,
    }
}

/// The control plane: the fake API server with one DGX-1 node, the extender over it on HTTP.
struct ControlPlane {
    api: FakeApiServer,
    base: String,
    http: reqwest::Client,
}

async fn control_plane() -> ControlPlane {
    control_plane_for(&topology()).await
}

async fn control_plane_for(topology: &NodeTopology) -> ControlPlane {
    let api = FakeApiServer::start().await;
    let topo = weft_topology::inventory::to_json(topology);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "annotations": {TOPOLOGY_ANNOTATION: topo}},
        "status": {"capacity": {GPU: "8", "cpu": "16", "memory": "64Gi", "pods": "110"},
                   "allocatable": {GPU: "8", "cpu": "16", "memory": "64Gi", "pods": "110"}}
    }))
    .unwrap();
    Api::<Node>::all(api.client()).create(&PostParams::default(), &node).await.unwrap();
    let view = KubeClusterView::spawn(api.client());
    guard("the extender's view", view.wait_until_ready()).await;
    let state = Arc::new(
        ExtenderState::new(Arc::new(view), ExtenderConfig::default())
            .with_binder(Arc::new(KubePodBinder::new(api.client()))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(weft_extender::serve(listener, state, Default::default(), std::future::pending()));
    ControlPlane { api, base, http: reqwest::Client::new() }
}

impl ControlPlane {
    /// Creates a Guaranteed pod asking for `gpus` GPUs and 4 CPUs.
    async fn create_pod(&self, name: &str, gpus: u32) -> Pod {
        self.create_pod_with(name, json!({"cpu": "4", "memory": "1Gi", GPU: gpus.to_string()})).await
    }

    /// Creates a Guaranteed pod whose one container asks for `resources`.
    async fn create_pod_with(&self, name: &str, resources: Value) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"schedulerName": "default-scheduler",
                     "containers": [{"name": "main", "image": "trainer",
                                     "resources": {"requests": resources, "limits": resources}}]}
        }))
        .unwrap();
        Api::<Pod>::namespaced(self.api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap()
    }

    async fn post(&self, verb: &str, body: &Value) -> Value {
        let r = self.http.post(format!("{}/{verb}", self.base)).json(body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{verb}");
        r.json().await.unwrap()
    }

    /// kube-scheduler with weft as its extender: filter, prioritize, bind.
    async fn schedule(&self, pod: &Pod) -> Pod {
        let filtered = self.post("filter", &json!({"Pod": pod, "NodeNames": [NODE]})).await;
        assert_eq!(filtered["NodeNames"], json!([NODE]), "{filtered}");
        let scores = self.post("prioritize", &json!({"Pod": pod, "NodeNames": [NODE]})).await;
        assert_eq!(scores[0]["Host"], NODE);
        let args =
            json!({"PodName": pod.metadata.name, "PodNamespace": "ml", "PodUID": pod.metadata.uid, "Node": NODE});
        let bound = self.post("bind", &args).await;
        assert_eq!(bound["Error"], "", "{bound}");
        self.get(pod.metadata.name.as_deref().unwrap()).await
    }

    async fn get(&self, name: &str) -> Pod {
        Api::<Pod>::namespaced(self.api.client(), "ml").get(name).await.unwrap()
    }

    /// Waits until the pod's `weft.io/gpu-ids` on the API server is `want`.
    async fn wait_gpu_ids(&self, name: &str, want: &[usize]) -> Pod {
        guard("the write-back", async {
            loop {
                let pod = self.get(name).await;
                if gpu_ids(&pod) == want {
                    return pod;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
    }
}

fn gpu_ids(pod: &Pod) -> Vec<usize> {
    parse_gpu_ids(pod.metadata.annotations.as_ref().unwrap().get(GPU_IDS_ANNOTATION).unwrap()).unwrap()
}

fn decision(pod: &Pod) -> GpuDecision {
    GpuDecision::from_annotation(pod.metadata.annotations.as_ref().unwrap().get(GPU_DECISION_ANNOTATION).unwrap())
        .unwrap()
}

fn index_of(uuid: &str) -> usize {
    uuid.chars().last().unwrap().to_digit(10).unwrap() as usize
}

/// The resource manager as an NRI plugin under the harness runtime, with the kubelet's pod list.
async fn run_under_nri(dirs: &Dirs, kubelet: &TestKubelet, pod: &Pod) -> api::Container {
    let runtime = Runtime::start(&dirs.nri, RuntimeOptions::default()).await.unwrap();
    let orm =
        OrmConfig { reserved: "0,8".parse().unwrap(), policy: TopologyPolicy::SingleNumaNode, ..OrmConfig::default() };
    let rm = ResourceManager::new(layout(), orm).unwrap();
    let catalog = Arc::new(PodCatalog::new(Some(Arc::new(KubeletPods(kubelet.pods())) as Arc<dyn PodSource>)));
    let manager = Arc::new(Manager::new(rm, Arc::new(Checkpoint::new(&dirs.checkpoint)), catalog, Arc::new(Locator)));
    let handler = Arc::new(NriHandler::new(manager, Translation { unified: true }));
    let mut opts = NriOptions::new("weft", "10");
    opts.socket = SocketSource::Path(dirs.nri.clone());
    let stop = CancellationToken::new();
    tokio::spawn(plugin::run(opts, handler, RuntimeHandle::new(), stop.clone()));
    guard("the NRI plugin to synchronize", runtime.wait_synchronized("10-weft")).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let mut sandbox = api::PodSandbox::new();
    sandbox.id = format!("sb-{uid}");
    sandbox.uid = uid.clone();
    sandbox.name = pod.metadata.name.clone().unwrap();
    sandbox.namespace = "ml".into();
    sandbox.annotations = pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect();
    runtime.run_pod_sandbox(sandbox).await.unwrap();
    let mut container = api::Container::new();
    container.id = format!("c-{uid}");
    container.pod_sandbox_id = format!("sb-{uid}");
    container.name = "main".into();
    let created = runtime.create_container(&format!("sb-{uid}"), container).await.unwrap();
    stop.cancel();
    created
}

fn assert_cpus_on_numa_of(container: &api::Container, gpus: &[usize]) {
    let numa = numa_of_gpu(gpus[0]);
    assert!(gpus.iter().all(|&g| numa_of_gpu(g) == numa), "the GPUs {gpus:?} share a NUMA node");
    let cpus: CpuSet = container.linux.resources.cpu.cpus.parse().unwrap();
    assert_eq!(cpus.len(), 4, "{cpus}");
    let local = numa_cpus(numa);
    assert!(
        cpus.iter().all(|c| local.contains(c)),
        "exclusive CPUs {cpus} are not on NUMA node {numa} of GPUs {gpus:?}"
    );
}

async fn admitted_gpus(kubelet: &TestKubelet, pod: &Pod) -> Vec<usize> {
    let got = kubelet.admit(pod).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    let mut gpus: Vec<usize> = got[0].devices.iter().map(|d| index_of(d)).collect();
    gpus.sort_unstable();
    gpus
}

async fn start_kubelet(dirs: &Dirs) -> TestKubelet {
    TestKubelet::start_with_pod_resources(&dirs.device_plugins, &dirs.pod_resources).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_placed_by_the_extender_gets_the_decided_gpus_and_cpus_on_their_numa_node() {
    let cp = control_plane().await;
    let dirs = dirs();
    let kubelet = start_kubelet(&dirs).await;
    let agent = GpuAgent::start(&kubelet, &dirs, &cp.api, true);
    guard("registration", kubelet.wait_for(|s| s.devices.contains_key(GPU))).await;

    let pod = cp.schedule(&cp.create_pod("trainer", 2).await).await;
    let decided = decision(&pod);
    assert_eq!((decided.node.as_str(), decided.gpus.len()), (NODE, 2));
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));

    let got = admitted_gpus(&kubelet, &pod).await;
    assert_eq!(got, decided.gpus, "the kubelet's Allocate carried exactly the decided GPUs");
    let pod = cp.wait_gpu_ids("trainer", &got).await;
    let container = run_under_nri(&dirs, &kubelet, &pod).await;
    assert_cpus_on_numa_of(&container, &got);
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_kubelet_restarted_between_bind_and_admission() {
    let cp = control_plane().await;
    let dirs = dirs();
    let mut kubelet = start_kubelet(&dirs).await;
    let agent = GpuAgent::start(&kubelet, &dirs, &cp.api, true);
    guard("registration", kubelet.wait_for(|s| s.devices.contains_key(GPU))).await;
    let pod = cp.schedule(&cp.create_pod("trainer", 2).await).await;

    let removed = kubelet.restart().await;
    assert!(removed.contains(&"weft-gpu.sock".to_string()), "{removed:?}");
    guard(
        "registration with the new kubelet",
        kubelet.wait_for(|s| s.registrations.len() == 2 && s.devices.contains_key(GPU)),
    )
    .await;
    let got = admitted_gpus(&kubelet, &pod).await;
    assert_eq!(got, decision(&pod).gpus);
    let pod = cp.wait_gpu_ids("trainer", &got).await;
    assert_cpus_on_numa_of(&run_under_nri(&dirs, &kubelet, &pod).await, &got);
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_agent_restarted_between_allocate_and_the_write_back() {
    let cp = control_plane().await;
    let dirs = dirs();
    let kubelet = start_kubelet(&dirs).await;
    // This agent dies before its write-back runs.
    let agent = GpuAgent::start(&kubelet, &dirs, &cp.api, false);
    guard("registration", kubelet.wait_for(|s| s.devices.contains_key(GPU))).await;
    let pod = cp.schedule(&cp.create_pod("trainer", 2).await).await;
    let decided = decision(&pod).gpus;

    // Meanwhile the decided GPUs' NUMA node fails: the decision cannot be honoured, and the pod
    // gets the best pair on the other NUMA node.
    let failed_numa = numa_of_gpu(decided[0]);
    for g in 0..8 {
        if numa_of_gpu(g) == failed_numa {
            agent.plugin.set_health(g, false);
        }
    }
    guard(
        "the kubelet to see the failed GPUs",
        kubelet.wait_for(|s| {
            s.devices.get(GPU).is_some_and(|d| d.iter().filter(|d| d.health == "Unhealthy").count() == 4)
        }),
    )
    .await;
    let got = admitted_gpus(&kubelet, &pod).await;
    assert!(got.iter().all(|&g| numa_of_gpu(g) != failed_numa), "{got:?} on the failed NUMA node {failed_numa}");
    assert_eq!(gpu_ids(&cp.get("trainer").await), decided, "nothing has written back yet");

    agent.kill().await;
    let agent = GpuAgent::start(&kubelet, &dirs, &cp.api, true);
    guard("re-registration", kubelet.wait_for(|s| s.registrations.len() == 2)).await;
    let pod = cp.wait_gpu_ids("trainer", &got).await;
    assert_eq!(decision(&pod).gpus, decided, "the decision stays as made");
    // The kubelet's copy of the pod follows the API server; the resource manager aligns with
    // what the container really got.
    kubelet.add_pod(pod.clone());
    assert_cpus_on_numa_of(&run_under_nri(&dirs, &kubelet, &pod).await, &got);
    agent.kill().await;
}

/// The node of the VF loop, in sysfs and as its agent publishes it: four GPUs on two PCIe switches
/// (GPU0–1 on switch A of root 00, NUMA 0; GPU2–3 on switch B of root 80, NUMA 1), the PF ens1f0
/// under switch A and ens2f0 under switch B, each with two VFs of physnet `fabric`.
fn vf_node(root: &std::path::Path) -> (FakeSriovTree, NodeTopology) {
    let tree = FakeSriovTree::new(root);
    let a = ["0000:00:01.0", "0000:01:00.0"];
    let b = ["0000:80:01.0", "0000:81:00.0"];
    tree.pf("0000:03:00.0", &[a[0], a[1], "0000:02:00.0"], "ens1f0", 0).link("ens1f0", "up", 200_000);
    tree.pf("0000:83:00.0", &[b[0], b[1], "0000:82:00.0"], "ens2f0", 1).link("ens2f0", "up", 200_000);
    for i in 0..2 {
        tree.vf("0000:03:00.0", i, &format!("0000:03:00.{}", i + 2), None);
        tree.vf("0000:83:00.0", i, &format!("0000:83:00.{}", i + 2), None);
    }
    let gpus = [("0000:04:00.0", a, "0000:02:01.0", 0), ("0000:05:00.0", a, "0000:02:02.0", 0)];
    let more = [("0000:84:00.0", b, "0000:82:01.0", 1), ("0000:85:00.0", b, "0000:82:02.0", 1)];
    for (bus, [r, s], port, numa) in gpus.into_iter().chain(more) {
        tree.pci_device(bus, &[r, s, port], numa);
    }
    let mut node = weft_testkit::two_switches(NODE, weft_topology::PcieRelation::Pix, 0);
    for (g, bus) in node.gpus.iter_mut().zip(["0000:04:00.0", "0000:05:00.0", "0000:84:00.0", "0000:85:00.0"]) {
        g.uuid = Some(format!("GPU-00000000-0000-0000-0000-00000000000{}", g.index));
        g.pci_bus_id = Some(bus.to_string());
        g.numa_node = Some(g.index / 2);
    }
    for (n, (bus, netdev)) in node.nics.iter_mut().zip([("0000:03:00.0", "ens1f0"), ("0000:83:00.0", "ens2f0")]) {
        n.pci_bus_id = Some(bus.to_string());
        n.netdev = Some(netdev.to_string());
    }
    // What `weft agent --physical-device-mappings fabric:ens1f0,fabric:ens2f0` publishes.
    let mut notes = Vec::new();
    let inventory = read_sriov(&tree.root(), &mut notes);
    let vfs = physnets().topology_vfs(&node, &inventory, &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    node.set_vfs(vfs).unwrap();
    (tree, node)
}

fn physnets() -> PhysnetConfig {
    PhysnetConfig::from_seed("fabric:ens1f0,fabric:ens2f0", "", "").unwrap()
}

/// The agent's VF half for physnet `fabric`: its device plugin served to the kubelet.
fn start_vf_plugin(
    kubelet: &TestKubelet,
    dirs: &Dirs,
    tree: &FakeSriovTree,
    node: &NodeTopology,
    stop: &CancellationToken,
) -> Arc<SriovPlugin> {
    let mut notes = Vec::new();
    let inventory = read_sriov(&tree.root(), &mut notes);
    let mut per_physnet = VfInventory::per_physnet(&physnets(), &inventory, &mut notes).unwrap();
    let gpus = gpu_places(node, &tree.root(), &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(dirs.pod_resources.clone()));
    let vfs = per_physnet.remove("fabric").unwrap();
    let plugin = Arc::new(SriovPlugin::new("fabric", NODE, vfs, gpus, Arc::new(KubeletPods(kubelet.pods())), assigned));
    let mut options = PluginOptions::new(&dirs.device_plugins, "weft-sriov-fabric.sock");
    options.kubelet_check = Duration::from_millis(20);
    options.register_retry = Duration::from_millis(20);
    tokio::spawn({
        let (plugin, stop) = (plugin.clone(), stop.clone());
        async move { weft_deviceplugin::serve(plugin, options, stop).await.unwrap() }
    });
    plugin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_asking_for_two_gpus_and_a_vf_gets_the_vf_under_its_gpus_pcie_switch() {
    const FABRIC: &str = "sriov.weft.io/fabric";
    let dirs = dirs();
    let (tree, node) = vf_node(&dirs._root.path().join("host"));
    let cp = control_plane_for(&node).await;
    let kubelet = start_kubelet(&dirs).await;
    let stop = CancellationToken::new();
    let cfg = GpuPluginConfig { resource: GPU.into(), node: NODE.into(), strategy: DeviceListStrategy::Envvar };
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(dirs.pod_resources.clone()));
    let gpu_plugin = Arc::new(GpuPlugin::new(
        cfg,
        GpuInventory::new(&node).unwrap(),
        Arc::new(KubeletPods(kubelet.pods())),
        assigned,
    ));
    let mut options = PluginOptions::new(&dirs.device_plugins, "weft-gpu.sock");
    options.kubelet_check = Duration::from_millis(20);
    options.register_retry = Duration::from_millis(20);
    tokio::spawn({
        let stop = stop.clone();
        async move { weft_deviceplugin::serve(gpu_plugin, options, stop).await.unwrap() }
    });
    let vf_plugin = start_vf_plugin(&kubelet, &dirs, &tree, &node, &stop);
    guard(
        "registration",
        kubelet.wait_for(|s| s.devices.contains_key(GPU) && s.devices.get(FABRIC).is_some_and(|d| d.len() == 4)),
    )
    .await;

    // A first pod takes switch A's GPU pair; the trainer's GPUs are then switch B's, and its VF
    // must follow them there.
    let first = cp.schedule(&cp.create_pod("first", 2).await).await;
    assert_eq!(admitted_gpus(&kubelet, &first).await, [0, 1]);
    let resources = json!({"cpu": "4", "memory": "1Gi", GPU: "2", FABRIC: "1"});
    let pod = cp.schedule(&cp.create_pod_with("trainer", resources).await).await;
    let decided = decision(&pod);
    assert_eq!(decided.gpus, [2, 3]);
    assert_eq!(decided.vfs["fabric"], ["0000:83:00.2"], "the VF of ens2f0, under GPU2-3's switch");

    let got = kubelet.admit(&pod).await.unwrap();
    let of = |resource: &str| got.iter().find(|a| a.resource == resource).unwrap();
    let gpus: Vec<usize> = of(GPU).devices.iter().map(|d| index_of(d)).collect();
    assert_eq!(gpus, [2, 3], "the kubelet's Allocate carried the decided GPUs");
    let vf = of(FABRIC);
    assert_eq!(vf.devices, decided.vfs["fabric"], "and the decided VF");
    assert_eq!(vf.response.envs["PCIDEVICE_SRIOV_WEFT_IO_FABRIC"], "0000:83:00.2");
    // The VF really shares a PCIe switch with the pod's GPUs, judged from sysfs (not from the
    // published relations the decision used).
    let mut notes = Vec::new();
    let places = gpu_places(&node, &tree.root(), &mut notes);
    let pod_gpus: Vec<_> = places.iter().filter(|p| gpus.contains(&p.index)).map(GpuPlace::place).collect();
    let given = vf_plugin.inventory().get("0000:83:00.2").unwrap();
    assert!(shares_switch(&given.place(), &pod_gpus));
    let other_gpus: Vec<_> = places.iter().filter(|p| !gpus.contains(&p.index)).map(GpuPlace::place).collect();
    assert!(!shares_switch(&given.place(), &other_gpus));

    // The write-back says what the container really got.
    let annotator = Arc::new(KubeAnnotator::new(cp.api.client(), "weft-agent"));
    let plugins = SriovPlugins::new(vec![vf_plugin]).unwrap();
    weft_sriov_plugin::writeback::reconcile_once(&plugins, annotator.as_ref()).await.unwrap();
    let stored = cp.get("trainer").await;
    let vf_ids = stored.metadata.annotations.as_ref().unwrap().get(VF_IDS_ANNOTATION).unwrap();
    assert_eq!(parse_vf_ids(vf_ids).unwrap(), decided.vfs);
    stop.cancel();
}
