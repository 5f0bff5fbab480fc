//! weft's VF device plugins against the test kubelet over real gRPC on unix sockets, on a fake
//! sysfs tree: two PFs under two PCIe switches (on two PCI roots and NUMA nodes), a GPU under each
//! switch, and two physnets sharing the PFs' VFs. The kubelet registers each physnet's plugin,
//! admits pods as its device manager does (preferred allocation, then Allocate) and serves
//! PodResources; the plugins answer each pod's recorded VFs when they fit, else the VFs nearest its
//! GPUs, and the write-back records what each pod really got. Waits are on what the kubelet saw,
//! each under a hang guard; health changes are driven by calling `refresh` on a fresh sysfs read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::handshake::NodePods;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_deviceplugin::{DeviceSource, PluginError, PluginOptions, serve};
use weft_kubelet_harness::TestKubelet;
use weft_net::config::PhysnetConfig;
use weft_sriov_plugin::plugin::{RDMA_CM, env_name, info_env_name};
use weft_sriov_plugin::writeback::{PodAnnotator, reconcile_once};
use weft_sriov_plugin::{SriovPlugin, SriovPlugins, VfInventory, gpu_places};
use weft_topology::discover::{FakeFunction, FakeSriovTree, SriovInventory, read_sriov};
use weft_topology::{PairLink, model::uniform_node};

const HANG_GUARD: Duration = Duration::from_secs(20);
const NODE: &str = "gpu-node-1";
const FABRIC: &str = "sriov.weft.io/gpu-fabric";
const STORAGE: &str = "sriov.weft.io/storage";

async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung waiting for {what}"))
}

/// Switch A (root pci0000:00, NUMA 0): PF ens1f0 at 03:00.0 with four RDMA VFs 03:00.2-5
/// (mlx5_2-5, uverbs2-5), GPU 0 at 04:00.0. Switch B (root pci0000:80, NUMA 1): PF ens2f0 at
/// 83:00.0 with four plain VFs 83:00.2-5, GPU 1 at 84:00.0.
struct Tree {
    tree: FakeSriovTree,
    pf_b: FakeFunction,
}

fn tree(dir: &std::path::Path) -> Tree {
    let tree = FakeSriovTree::new(dir);
    let a = ["0000:00:01.0", "0000:01:00.0"];
    let b = ["0000:80:01.0", "0000:81:00.0"];
    tree.pf("0000:03:00.0", &[a[0], a[1], "0000:02:00.0"], "ens1f0", 0).link("ens1f0", "up", 200_000).rdma("mlx5_0");
    let pf_b = tree.pf("0000:83:00.0", &[b[0], b[1], "0000:82:00.0"], "ens2f0", 1).link("ens2f0", "up", 200_000);
    for i in 0..4 {
        let f = i + 2;
        tree.vf("0000:03:00.0", i, &format!("0000:03:00.{f}"), None)
            .rdma(&format!("mlx5_{f}"))
            .uverbs(&format!("uverbs{f}"));
        tree.vf("0000:83:00.0", i, &format!("0000:83:00.{f}"), None);
    }
    tree.pci_device("0000:04:00.0", &[a[0], a[1], "0000:02:01.0"], 0);
    tree.pci_device("0000:84:00.0", &[b[0], b[1], "0000:82:01.0"], 1);
    Tree { tree, pf_b }
}

fn sriov(tree: &FakeSriovTree) -> SriovInventory {
    let mut notes = Vec::new();
    let inventory = read_sriov(&tree.root(), &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    inventory
}

/// Annotations written, `namespace/name` → value.
#[derive(Default)]
struct Written(Mutex<BTreeMap<String, String>>);

#[async_trait]
impl PodAnnotator for Written {
    async fn annotate(&self, namespace: &str, name: &str, _uid: &str, key: &str, value: &str) -> Result<(), String> {
        assert_eq!(key, "weft.io/vf-ids");
        self.0.lock().unwrap().insert(format!("{namespace}/{name}"), value.to_string());
        Ok(())
    }
}

struct Node {
    dir: tempfile::TempDir,
    tree: Tree,
    kubelet: TestKubelet,
    fabric: Arc<SriovPlugin>,
    storage: Arc<SriovPlugin>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), PluginError>>>,
}

impl Node {
    async fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let tree = tree(&dir.path().join("host"));
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir(&plugins).unwrap();
        let kubelet = TestKubelet::start_with_pod_resources(&plugins, &dir.path().join("pod-resources.sock")).await;
        let [fabric, storage] = new_plugins(&tree.tree, &kubelet, dir.path().join("pod-resources.sock"));
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        for p in [&fabric, &storage] {
            let mut options = PluginOptions::new(&plugins, format!("weft-sriov-{}.sock", p.physnet()));
            options.kubelet_check = Duration::from_millis(20);
            options.register_retry = Duration::from_millis(20);
            tasks.push(tokio::spawn(serve(p.clone(), options, stop.clone())));
        }
        let both = |s: &weft_kubelet_harness::Seen| s.devices.contains_key(FABRIC) && s.devices.contains_key(STORAGE);
        guard("both device lists", kubelet.wait_for(both)).await;
        Node { dir, tree, kubelet, fabric, storage, stop, tasks }
    }

    fn plugins(&self) -> SriovPlugins {
        SriovPlugins::new(vec![self.fabric.clone(), self.storage.clone()]).unwrap()
    }

    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            guard("a plugin to stop", t).await.unwrap().unwrap();
        }
        self.kubelet.stop().await;
    }
}

/// The plugins of `gpu-fabric` (VFs 0-2 of both PFs) and `storage` (VF 3 of both), as the agent
/// builds them: physnets from the seed's mapping, the GPU table from the topology and sysfs.
fn new_plugins(tree: &FakeSriovTree, kubelet: &TestKubelet, pod_resources: PathBuf) -> [Arc<SriovPlugin>; 2] {
    let config = PhysnetConfig::from_seed(
        "gpu-fabric:ens1f0#0-2,gpu-fabric:ens2f0#0-2,storage:ens1f0#3,storage:ens2f0#3",
        "",
        "",
    )
    .unwrap();
    let mut notes = Vec::new();
    let mut per_physnet = VfInventory::per_physnet(&config, &sriov(tree), &mut notes).unwrap();
    let mut topology = uniform_node(NODE, 2, PairLink::default());
    topology.gpus[0].pci_bus_id = Some("0000:04:00.0".into());
    topology.gpus[1].pci_bus_id = Some("00000000:84:00.0".into());
    let gpus = gpu_places(&topology, &tree.root(), &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(pod_resources));
    let list = kubelet.pods();
    let pods: Arc<dyn NodePods> = Arc::new(move || Ok(list.get()));
    ["gpu-fabric", "storage"].map(|physnet| {
        let vfs = per_physnet.remove(physnet).unwrap();
        Arc::new(SriovPlugin::new(physnet, NODE, vfs, gpus.clone(), pods.clone(), assigned.clone()))
    })
}

/// A pod on `NODE` created at second `created`, one container asking for `asks` (resource, count);
/// `gpus` is its `weft.io/gpu-ids`; `decision` the extender's record (node, VFs by physnet).
fn pod(name: &str, created: u32, asks: &[(&str, u32)], gpus: Option<&str>, decision: Option<(&str, Vfs)>) -> Pod {
    let limits: serde_json::Map<String, serde_json::Value> =
        asks.iter().map(|(r, n)| (r.to_string(), n.to_string().into())).collect();
    let mut annotations = serde_json::Map::new();
    if let Some(g) = gpus {
        annotations.insert("weft.io/gpu-ids".into(), g.into());
    }
    if let Some((node, vfs)) = decision {
        let d =
            json!({"node": node, "gpus": [], "vfs": vfs, "decidedAt": "2026-11-25T10:00:00Z", "by": "weft-extender"});
        annotations.insert("weft.io/gpu-decision".into(), d.to_string().into());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": format!("2026-11-25T10:00:{created:02}Z"), "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": limits, "requests": limits}}]}
    }))
    .unwrap()
}

/// VFs by physnet, as a decision records them (`{"gpu-fabric": ["0000:83:00.3"]}`).
type Vfs = serde_json::Value;

/// The VFs the pod's container got of `resource`.
async fn admit(node: &Node, p: &Pod, resource: &str) -> Vec<String> {
    let got = node.kubelet.admit(p).await.unwrap();
    got.into_iter().find(|a| a.resource == resource).map(|a| a.devices).unwrap_or_default()
}

#[tokio::test]
async fn the_kubelet_sees_each_physnets_vfs_by_pci_address_with_their_numa_nodes() {
    let node = Node::start().await;
    let listed = |resource: &str| -> Vec<(String, i64, String)> {
        let devices = node.kubelet.devices(resource).unwrap();
        devices.iter().map(|d| (d.id.clone(), d.topology.as_ref().unwrap().nodes[0].id, d.health.clone())).collect()
    };
    let vf = |a: &str, numa: i64| (a.to_string(), numa, "Healthy".to_string());
    assert_eq!(
        listed(FABRIC),
        [
            vf("0000:03:00.2", 0),
            vf("0000:03:00.3", 0),
            vf("0000:03:00.4", 0),
            vf("0000:83:00.2", 1),
            vf("0000:83:00.3", 1),
            vf("0000:83:00.4", 1)
        ]
    );
    assert_eq!(listed(STORAGE), [vf("0000:03:00.5", 0), vf("0000:83:00.5", 1)]);
    let registrations = node.kubelet.registrations();
    let mut names: Vec<(&str, &str, bool)> = registrations
        .iter()
        .map(|r| {
            let preferred = r.options.as_ref().is_some_and(|o| o.get_preferred_allocation_available);
            (r.resource_name.as_str(), r.endpoint.as_str(), preferred)
        })
        .collect();
    names.sort_unstable();
    assert_eq!(names, [(FABRIC, "weft-sriov-gpu-fabric.sock", true), (STORAGE, "weft-sriov-storage.sock", true)]);
    node.stop().await;
}

#[tokio::test]
async fn a_pod_with_a_recorded_decision_gets_exactly_its_vfs() {
    let node = Node::start().await;
    // The pod's GPU is under switch A, the decision (made knowing the whole cluster) is a VF under
    // switch B: the decision is what the pod gets.
    let decided = json!({"gpu-fabric": ["0000:83:00.3"]});
    let p = pod("decided", 1, &[(FABRIC, 1)], Some("0"), Some((NODE, decided)));
    assert_eq!(admit(&node, &p, FABRIC).await, ["0000:83:00.3"]);
    // Two VFs decided on two PFs: both, though the kubelet's own order would take 03:00.2-3.
    let decided = json!({"gpu-fabric": ["0000:83:00.4", "0000:03:00.4"]});
    let p = pod("pair", 2, &[(FABRIC, 2)], None, Some((NODE, decided)));
    assert_eq!(admit(&node, &p, FABRIC).await, ["0000:03:00.4", "0000:83:00.4"]);
    node.stop().await;
}

#[tokio::test]
async fn a_pod_without_a_decision_gets_the_vf_under_its_gpus_switch() {
    let node = Node::start().await;
    // GPU 1 is under switch B; without weft's preference the kubelet would hand out 03:00.2.
    let on_b = pod("on-b", 1, &[(FABRIC, 1)], Some("1"), None);
    assert_eq!(admit(&node, &on_b, FABRIC).await, ["0000:83:00.2"]);
    let on_a = pod("on-a", 2, &[(FABRIC, 1)], Some("0"), None);
    assert_eq!(admit(&node, &on_a, FABRIC).await, ["0000:03:00.2"]);
    // Both GPUs, two VFs: one under each switch.
    let both = pod("both", 3, &[(FABRIC, 2)], Some("0,1"), None);
    assert_eq!(admit(&node, &both, FABRIC).await, ["0000:03:00.3", "0000:83:00.3"]);
    node.stop().await;
}

#[tokio::test]
async fn a_recorded_decision_that_is_not_available_falls_back_to_the_nearest_free_vf() {
    let node = Node::start().await;
    let first = pod("first", 1, &[(FABRIC, 1)], Some("1"), Some((NODE, json!({"gpu-fabric": ["0000:83:00.2"]}))));
    assert_eq!(admit(&node, &first, FABRIC).await, ["0000:83:00.2"]);
    // The same VF decided again (taken meanwhile): the nearest free VF to the pod's GPU 1.
    let second = pod("second", 2, &[(FABRIC, 1)], Some("1"), Some((NODE, json!({"gpu-fabric": ["0000:83:00.2"]}))));
    assert_eq!(admit(&node, &second, FABRIC).await, ["0000:83:00.3"]);
    // A decision for another node is stale: the VF under the pod's GPU 0 instead.
    let rebound =
        pod("rebound", 3, &[(FABRIC, 1)], Some("0"), Some(("gpu-node-9", json!({"gpu-fabric": ["0000:83:00.4"]}))));
    assert_eq!(admit(&node, &rebound, FABRIC).await, ["0000:03:00.2"]);
    node.stop().await;
}

#[tokio::test]
async fn a_pf_whose_link_goes_down_makes_its_vfs_unhealthy_until_it_comes_back() {
    let node = Node::start().await;
    let unhealthy = |resource: &str, seen: &weft_kubelet_harness::Seen| -> Vec<String> {
        seen.devices[resource].iter().filter(|d| d.health == "Unhealthy").map(|d| d.id.clone()).collect()
    };
    let mut watch = node.fabric.devices();
    watch.borrow_and_update();

    node.tree.pf_b.clone().link("ens2f0", "down", 200_000);
    let now = sriov(&node.tree.tree);
    assert!(node.fabric.refresh(&now) && node.storage.refresh(&now), "a change");
    let updated = |n: usize| move |s: &weft_kubelet_harness::Seen| s.updates.get(FABRIC) == Some(&n);
    let seen = guard("the fabric VFs unhealthy", node.kubelet.wait_for(updated(2))).await;
    assert_eq!(unhealthy(FABRIC, &seen), ["0000:83:00.2", "0000:83:00.3", "0000:83:00.4"]);
    let seen = guard("the storage VF unhealthy", node.kubelet.wait_for(|s| s.updates.get(STORAGE) == Some(&2))).await;
    assert_eq!(unhealthy(STORAGE, &seen), ["0000:83:00.5"]);
    // The same read again changes nothing and sends nothing.
    watch.borrow_and_update();
    assert!(!node.fabric.refresh(&now));
    assert!(!watch.has_changed().unwrap(), "no new device list without a change");
    // The kubelet no longer offers them.
    let err = node.kubelet.admit(&pod("big", 1, &[(FABRIC, 4)], None, None)).await.unwrap_err();
    assert!(err.contains("Requested: 4, Available: 3"), "{err}");

    node.tree.pf_b.clone().link("ens2f0", "up", 200_000);
    assert!(node.fabric.refresh(&sriov(&node.tree.tree)));
    let seen = guard("the fabric VFs healthy again", node.kubelet.wait_for(updated(3))).await;
    assert!(unhealthy(FABRIC, &seen).is_empty());

    // A VF gone from sysfs (its PF's virtfn link removed, as when VFs are disabled).
    std::fs::remove_file(
        std::fs::canonicalize(node.tree.tree.root().join("sys/bus/pci/devices/0000:83:00.0")).unwrap().join("virtfn2"),
    )
    .unwrap();
    assert!(node.fabric.refresh(&sriov(&node.tree.tree)));
    let seen = guard("the vanished VF unhealthy", node.kubelet.wait_for(updated(4))).await;
    assert_eq!(unhealthy(FABRIC, &seen), ["0000:83:00.4"]);
    node.stop().await;
}

#[tokio::test]
async fn allocate_names_the_vfs_as_sriov_network_device_plugin_does_and_gives_rdma_vfs_their_device_nodes() {
    let node = Node::start().await;
    assert_eq!(env_name(FABRIC), "PCIDEVICE_SRIOV_WEFT_IO_GPU_FABRIC");
    let decided = json!({"gpu-fabric": ["0000:03:00.2", "0000:83:00.2"]});
    let got = node.kubelet.admit(&pod("mixed", 1, &[(FABRIC, 2)], None, Some((NODE, decided)))).await.unwrap();
    let r = &got[0].response;
    assert_eq!(r.envs.get("PCIDEVICE_SRIOV_WEFT_IO_GPU_FABRIC").map(String::as_str), Some("0000:03:00.2,0000:83:00.2"));
    let info: serde_json::Value = serde_json::from_str(&r.envs[&info_env_name(FABRIC)]).unwrap();
    assert_eq!(
        info,
        json!({
            "0000:03:00.2": {"generic": {"deviceID": "0000:03:00.2"},
                             "rdma": {"rdma_dev": "mlx5_2", "uverbs": "/dev/infiniband/uverbs2", "rdma_cm": RDMA_CM}},
            "0000:83:00.2": {"generic": {"deviceID": "0000:83:00.2"}}
        })
    );
    let specs: Vec<(&str, &str, &str)> =
        r.devices.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str(), d.permissions.as_str())).collect();
    assert_eq!(
        specs,
        [("/dev/infiniband/uverbs2", "/dev/infiniband/uverbs2", "rw"), (RDMA_CM, RDMA_CM, "rw")],
        "only the RDMA VF brings device nodes"
    );
    assert!(r.mounts.is_empty() && r.cdi_devices.is_empty());

    // A container with only a plain VF gets no device nodes.
    let got = node.kubelet.admit(&pod("plain", 2, &[(FABRIC, 1)], Some("1"), None)).await.unwrap();
    let r = &got[0].response;
    assert_eq!(r.envs.get(&env_name(FABRIC)).map(String::as_str), Some("0000:83:00.3"));
    assert!(r.devices.is_empty(), "{:?}", r.devices);
    node.stop().await;
}

#[tokio::test]
async fn unknown_devices_are_refused_with_their_name() {
    let node = Node::start().await;
    let mut client = node.kubelet.plugin(FABRIC).await.unwrap();
    let request = weft_deviceplugin::api::AllocateRequest {
        container_requests: vec![weft_deviceplugin::api::ContainerAllocateRequest {
            // A storage VF is not the fabric plugin's.
            devices_ids: vec!["0000:03:00.5".into()],
        }],
    };
    let status = client.allocate(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("unknown device '0000:03:00.5'"), "{}", status.message());
    node.stop().await;
}

#[tokio::test]
async fn the_write_back_records_every_physnet_of_a_pod_in_one_annotation() {
    let node = Node::start().await;
    let both = pod("both", 1, &[(FABRIC, 1), (STORAGE, 1)], Some("1"), None);
    let fabric = admit(&node, &both, FABRIC).await;
    // A pod whose record already says what it got (in the extender's order): left alone.
    let decided = json!({"gpu-fabric": ["0000:83:00.4", "0000:03:00.4"]});
    let mut recorded = pod("recorded", 2, &[(FABRIC, 2)], None, Some((NODE, decided)));
    recorded
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("weft.io/vf-ids".into(), r#"{"gpu-fabric":["0000:83:00.4","0000:03:00.4"]}"#.into());
    assert_eq!(admit(&node, &recorded, FABRIC).await, ["0000:03:00.4", "0000:83:00.4"]);

    let written = Written::default();
    let pass = reconcile_once(&node.plugins(), &written).await.unwrap();
    assert_eq!(fabric, ["0000:83:00.2"]);
    let expected = BTreeMap::from([(
        "ml/both".to_string(),
        r#"{"gpu-fabric":["0000:83:00.2"],"storage":["0000:83:00.5"]}"#.to_string(),
    )]);
    assert_eq!(pass.written, expected, "one write with both physnets; the recorded pod was already true");
    assert_eq!(*written.0.lock().unwrap(), expected);
    assert_eq!(pass.unsettled, 0, "every answered container is listed by the kubelet");
    let grants = [&node.fabric, &node.storage].map(|p| p.accounting().grants().len());
    assert_eq!(grants, [0, 0], "settled");

    // Plugins started afresh (the agent restarted) know nothing of their answers; the kubelet's
    // record is enough.
    let [fabric, storage] = new_plugins(&node.tree.tree, &node.kubelet, node.dir.path().join("pod-resources.sock"));
    let fresh = SriovPlugins::new(vec![fabric, storage]).unwrap();
    let pass = reconcile_once(&fresh, &Written::default()).await.unwrap();
    assert_eq!(pass.written, expected);
    node.stop().await;
}

/// The write-back against the (fake) API server: the pod's annotation is patched, and every request
/// is one the agent's RBAC grants.
#[tokio::test]
async fn the_write_back_patches_vf_ids_on_the_api_server_within_the_agents_rbac() {
    use kube::api::{Api, PostParams};
    use weft_sriov_plugin::writeback::KubeAnnotator;

    let api = weft_fakeapi::FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(api.client(), "ml");
    let node = Node::start().await;
    let mut p = pod("p", 1, &[(FABRIC, 1), (STORAGE, 1)], Some("0"), None);
    p.metadata.uid = None;
    p.metadata.creation_timestamp = None;
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    let fabric = admit(&node, &created, FABRIC).await;

    let before = api.requests().len();
    let annotator = KubeAnnotator::new(api.client(), "weft-agent");
    let pass = reconcile_once(&node.plugins(), &annotator).await.unwrap();
    let agent = api.requests().split_off(before);
    let stored = pods.get("p").await.unwrap();
    let value = &stored.metadata.annotations.as_ref().unwrap()["weft.io/vf-ids"];
    assert_eq!(value, &pass.written["ml/p"]);
    let ids = weft_record::vf_usage::parse_vf_ids(value).unwrap();
    assert_eq!(ids["gpu-fabric"], fabric);
    assert_eq!(ids["storage"], ["0000:03:00.5"], "the storage VF under the pod's GPU 0");
    weft_testkit::rbac::assert_granted(&agent, &["base/agent/rbac.yaml", "components/sriov/rbac.yaml"]);
    node.stop().await;
}
