//! weft's GPU device plugin against the test kubelet over real gRPC on unix sockets: the kubelet
//! registers it, admits pods as its device manager does (preferred allocation, then Allocate, one
//! container at a time, init containers' devices reused), and serves PodResources; the plugin
//! answers each pod's recorded decision when it fits and writes back what each pod really got.
//! Waits are on what the kubelet saw or on the write-back's result, each under a hang guard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::handshake::NodePods;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_deviceplugin::{PluginOptions, serve};
use weft_gpu_plugin::plugin::{CDI_KIND, VISIBLE_DEVICES_ENV};
use weft_gpu_plugin::writeback::{PodAnnotator, reconcile_once};
use weft_gpu_plugin::{DeviceListStrategy, GpuInventory, GpuPlugin, GpuPluginConfig};
use weft_kubelet_harness::{Allocation, PodList, TestKubelet};
use weft_topology::NodeTopology;

const HANG_GUARD: Duration = Duration::from_secs(20);
const GPU: &str = "nvidia.com/gpu";
const NODE: &str = "gpu-node-1";

async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung waiting for {what}"))
}

/// DGX-1 V100 (hybrid cube mesh: GPUs 0-3 and 4-7 fully linked, i and i+4 linked), with UUIDs and
/// GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1.
fn topology() -> NodeTopology {
    let mut t = weft_testkit::dgx1_v100(NODE);
    for g in &mut t.gpus {
        g.uuid = Some(uuid(g.index as usize));
        g.numa_node = Some(g.index / 4);
    }
    t
}

fn uuid(index: usize) -> String {
    format!("GPU-00000000-0000-0000-0000-00000000000{index}")
}

fn uuids(indices: &[usize]) -> Vec<String> {
    indices.iter().map(|&i| uuid(i)).collect()
}

struct KubeletPods(PodList);

#[async_trait]
impl NodePods for KubeletPods {
    async fn pods(&self) -> Result<Vec<Pod>, String> {
        Ok(self.0.get())
    }
}

/// Annotations written, `namespace/name` → value, applied to nothing else.
#[derive(Default)]
struct Recorder(Mutex<BTreeMap<String, String>>);

#[async_trait]
impl PodAnnotator for Recorder {
    async fn annotate(&self, namespace: &str, name: &str, _uid: &str, key: &str, value: &str) -> Result<(), String> {
        assert_eq!(key, "weft.io/gpu-ids");
        self.0.lock().unwrap().insert(format!("{namespace}/{name}"), value.to_string());
        Ok(())
    }
}

struct Node {
    _dir: tempfile::TempDir,
    kubelet: TestKubelet,
    plugin: Arc<GpuPlugin>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), weft_deviceplugin::PluginError>>,
}

impl Node {
    async fn start(strategy: DeviceListStrategy) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir(&plugins).unwrap();
        let socket = dir.path().join("pod-resources.sock");
        let kubelet = TestKubelet::start_with_pod_resources(&plugins, &socket).await;
        let plugin = Arc::new(new_plugin(&kubelet, &socket, strategy));
        let mut options = PluginOptions::new(&plugins, "weft-gpu.sock");
        options.kubelet_check = Duration::from_millis(20);
        options.register_retry = Duration::from_millis(20);
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(plugin.clone(), options, stop.clone()));
        guard("the device list", kubelet.wait_for(|s| s.devices.contains_key(GPU))).await;
        Node { _dir: dir, kubelet, plugin, stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        guard("the plugin to stop", self.task).await.unwrap().unwrap();
        self.kubelet.stop().await;
    }
}

fn new_plugin(kubelet: &TestKubelet, socket: &std::path::Path, strategy: DeviceListStrategy) -> GpuPlugin {
    let cfg = GpuPluginConfig { resource: GPU.into(), node: NODE.into(), strategy };
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(socket.to_path_buf()));
    GpuPlugin::new(cfg, GpuInventory::new(&topology()).unwrap(), Arc::new(KubeletPods(kubelet.pods())), assigned)
}

/// A pod on `NODE` created at second `created`; `containers` are (name, init?, GPUs); `decision`
/// is the extender's record (node, GPUs).
fn pod(name: &str, created: u32, containers: &[(&str, bool, u32)], decision: Option<(&str, &[usize])>) -> Pod {
    let spec_of = |&(n, _, count): &(&str, bool, u32)| json!({"name": n, "resources": {"limits": {GPU: count.to_string()}, "requests": {GPU: count.to_string()}}});
    let init: Vec<_> = containers.iter().filter(|c| c.1).map(spec_of).collect();
    let app: Vec<_> = containers.iter().filter(|c| !c.1).map(spec_of).collect();
    let mut annotations = serde_json::Map::new();
    if let Some((node, gpus)) = decision {
        let d = json!({"node": node, "gpus": gpus, "decidedAt": "2026-11-25T10:00:00Z", "by": "weft-extender"});
        annotations.insert("weft.io/gpu-decision".into(), d.to_string().into());
        let ids: Vec<String> = gpus.iter().map(ToString::to_string).collect();
        annotations.insert("weft.io/gpu-ids".into(), ids.join(",").into());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": format!("2026-11-25T10:00:{created:02}Z"), "annotations": annotations},
        "spec": {"nodeName": NODE, "initContainers": init, "containers": app}
    }))
    .unwrap()
}

/// The GPU indices of an allocation (the test UUIDs end in the index digit).
fn indices(a: &Allocation) -> Vec<usize> {
    let mut v: Vec<usize> =
        a.devices.iter().map(|id| id.chars().last().unwrap().to_digit(10).unwrap() as usize).collect();
    v.sort_unstable();
    v
}

#[tokio::test]
async fn the_kubelet_sees_every_gpu_by_uuid_with_its_numa_node_and_health_changes() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let devices = node.kubelet.devices(GPU).unwrap();
    let listed: Vec<(String, i64)> =
        devices.iter().map(|d| (d.id.clone(), d.topology.as_ref().unwrap().nodes[0].id)).collect();
    let expected: Vec<(String, i64)> = (0..8).map(|i| (uuid(i), (i / 4) as i64)).collect();
    assert_eq!(listed, expected);
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    let registration = &node.kubelet.registrations()[0];
    assert_eq!((registration.resource_name.as_str(), registration.endpoint.as_str()), (GPU, "weft-gpu.sock"));

    node.plugin.set_health(6, false);
    let seen = guard("the health change", node.kubelet.wait_for(|s| s.updates.get(GPU) == Some(&2))).await;
    let unhealthy: Vec<&str> =
        seen.devices[GPU].iter().filter(|d| d.health == "Unhealthy").map(|d| d.id.as_str()).collect();
    assert_eq!(unhealthy, [uuid(6).as_str()]);
    // The kubelet no longer offers it: a 8-GPU pod cannot be admitted.
    let err = node.kubelet.admit(&pod("big", 1, &[("c", false, 8)], None)).await.unwrap_err();
    assert!(err.contains("Requested: 8, Available: 7"), "{err}");
    node.stop().await;
}

#[tokio::test]
async fn allocate_tells_the_container_its_gpus_by_env_or_by_cdi_name() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let got = node.kubelet.admit(&pod("env", 1, &[("c", false, 2)], Some((NODE, &[1, 2])))).await.unwrap();
    let r = &got[0].response;
    assert_eq!(r.envs.get(VISIBLE_DEVICES_ENV), Some(&uuids(&[1, 2]).join(",")));
    assert!(r.cdi_devices.is_empty());
    assert_eq!(r.annotations.get("weft.io/gpu-ids").map(String::as_str), Some("1,2"));
    node.stop().await;

    let node = Node::start(DeviceListStrategy::Cdi).await;
    let got = node.kubelet.admit(&pod("cdi", 1, &[("c", false, 2)], Some((NODE, &[1, 2])))).await.unwrap();
    let r = &got[0].response;
    let names: Vec<&str> = r.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    let expected: Vec<String> = uuids(&[1, 2]).iter().map(|u| format!("{CDI_KIND}={u}")).collect();
    assert_eq!(names, expected.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!r.envs.contains_key(VISIBLE_DEVICES_ENV));
    node.stop().await;
}

#[tokio::test]
async fn a_recorded_decision_is_honoured_even_where_weft_would_pick_better_now() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    // GPUs 0 and 5 share no NVLink on a DGX-1: best-effort would never pick them; the decision
    // (made with knowledge of the whole cluster) is what the pod gets.
    let got = node.kubelet.admit(&pod("p", 1, &[("c", false, 2)], Some((NODE, &[0, 5])))).await.unwrap();
    assert_eq!(indices(&got[0]), [0, 5]);
    // Without a decision the pick is weft's exact best: a pair with a double NVLink.
    let got = node.kubelet.admit(&pod("q", 2, &[("c", false, 2)], None)).await.unwrap();
    let pair = indices(&got[0]);
    let prepared = GpuInventory::new(&topology()).unwrap();
    let best_free = [1, 2, 3, 4, 6, 7];
    let best = weft_alloc::allocate(
        prepared.prepared(),
        &weft_alloc::Policy::BestEffort,
        &weft_alloc::Request { count: 2, available: &best_free, required: &[] },
    )
    .unwrap();
    assert_eq!(pair, best.gpus, "the best-effort pair over the free GPUs");
    node.stop().await;
}

#[tokio::test]
async fn two_pending_pods_of_one_size_each_get_their_own_decision() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let older = pod("older", 1, &[("c", false, 2)], Some((NODE, &[4, 7])));
    let younger = pod("younger", 2, &[("c", false, 2)], Some((NODE, &[0, 3])));
    // Both reach the kubelet before either is admitted; it admits the older first.
    node.kubelet.add_pod(younger.clone());
    node.kubelet.add_pod(older.clone());
    let a = node.kubelet.admit(&older).await.unwrap();
    let b = node.kubelet.admit(&younger).await.unwrap();
    assert_eq!((indices(&a[0]), indices(&b[0])), (vec![4, 7], vec![0, 3]));
    node.stop().await;
}

#[tokio::test]
async fn a_stale_decision_or_one_whose_gpus_were_taken_gives_way_to_the_best_free_set() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    // A decision for another node: ignored; best-effort instead.
    let got = node.kubelet.admit(&pod("rebound", 1, &[("c", false, 4)], Some(("gpu-node-9", &[0, 1, 6, 7])))).await;
    let first = indices(&got.unwrap()[0]);
    assert!(first == [0, 1, 2, 3] || first == [4, 5, 6, 7], "a whole NVLink quad: {first:?}");
    // GPUs taken meanwhile: this pod's decision overlaps what `rebound` holds.
    let overlapping = if first == [0, 1, 2, 3] { [2usize, 3] } else { [6, 7] };
    let got = node.kubelet.admit(&pod("late", 2, &[("c", false, 2)], Some((NODE, &overlapping)))).await.unwrap();
    let second = indices(&got[0]);
    assert!(second.iter().all(|g| !first.contains(g)), "{second:?} overlaps {first:?}");
    assert_eq!(second.len(), 2);
    node.stop().await;
}

#[tokio::test]
async fn a_pod_with_init_containers_gets_its_decision_in_every_container() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let p =
        pod("staged", 1, &[("fetch", true, 1), ("train", false, 2), ("eval", false, 2)], Some((NODE, &[0, 1, 4, 5])));
    let got = node.kubelet.admit(&p).await.unwrap();
    let by_container: BTreeMap<&str, Vec<usize>> = got.iter().map(|a| (a.container.as_str(), indices(a))).collect();
    let fetch = &by_container["fetch"];
    assert!(fetch.len() == 1 && [0, 1, 4, 5].contains(&fetch[0]), "{fetch:?}");
    let (train, eval) = (&by_container["train"], &by_container["eval"]);
    assert!(train.contains(&fetch[0]), "the kubelet reuses the init container's GPU: {train:?}");
    let mut all: Vec<usize> = train.iter().chain(eval).copied().collect();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 4, 5], "the app containers share out the decided GPUs");
    node.stop().await;
}

#[tokio::test]
async fn the_write_back_records_what_each_pod_really_got_even_after_a_plugin_restart() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let honoured = pod("honoured", 1, &[("c", false, 2)], Some((NODE, &[0, 5])));
    let stale = pod("stale", 2, &[("c", false, 2)], Some(("elsewhere", &[0, 5])));
    let bare = pod("bare", 3, &[("c", false, 1)], None);
    let mut got = BTreeMap::new();
    for p in [&honoured, &stale, &bare] {
        let a = node.kubelet.admit(p).await.unwrap();
        got.insert(format!("ml/{}", p.metadata.name.as_deref().unwrap()), indices(&a[0]));
    }
    let recorder = Recorder::default();
    let pass = reconcile_once(&node.plugin, &recorder).await.unwrap();
    let expected: BTreeMap<String, String> = got
        .iter()
        .filter(|(name, _)| name.as_str() != "ml/honoured")
        .map(|(name, gpus)| (name.clone(), gpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")))
        .collect();
    assert_eq!(pass.written, expected, "the honoured pod's annotation was already true");
    assert_eq!(pass.unsettled, 0, "every answered container is listed by the kubelet");

    // A new plugin (the agent restarted between Allocate and the write-back) knows nothing of its
    // answers; the kubelet's record is enough.
    let socket = node._dir.path().join("pod-resources.sock");
    let fresh = new_plugin(&node.kubelet, &socket, DeviceListStrategy::Envvar);
    let recorder = Recorder::default();
    let pass = reconcile_once(&fresh, &recorder).await.unwrap();
    assert_eq!(pass.written, expected);
    node.stop().await;
}

#[tokio::test]
async fn unknown_devices_are_refused_with_their_name() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let mut client = node.kubelet.plugin(GPU).await.unwrap();
    let request = weft_deviceplugin::api::AllocateRequest {
        container_requests: vec![weft_deviceplugin::api::ContainerAllocateRequest {
            devices_ids: vec!["GPU-nope".into()],
        }],
    };
    let status = client.allocate(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("GPU-nope"), "{}", status.message());
    node.stop().await;
}

#[tokio::test]
async fn pod_resources_answers_again_after_a_kubelet_restart() {
    let mut node = Node::start(DeviceListStrategy::Envvar).await;
    node.kubelet.admit(&pod("p", 1, &[("c", false, 1)], None)).await.unwrap();
    assert_eq!(node.plugin.assigned().await.unwrap().len(), 1);
    node.kubelet.restart().await;
    // The kept connection went with the old kubelet; the next call dials the new one.
    let listed = node.plugin.assigned().await.unwrap();
    assert_eq!(listed.len(), 1, "the kubelet's checkpoint keeps the assignment: {listed:?}");
    node.stop().await;
}

/// The write-back against the (fake) API server: the pod's annotation is patched, a pod replaced
/// under the same name is left alone, and every request is one the agent's RBAC grants.
#[tokio::test]
async fn the_write_back_patches_the_pod_on_the_api_server_within_the_agents_rbac() {
    use kube::api::{Api, PostParams};
    use weft_gpu_plugin::writeback::KubeAnnotator;

    let api = weft_fakeapi::FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(api.client(), "ml");
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let mut created = Vec::new();
    for (name, decision) in [("stale", ("elsewhere", [0usize, 5])), ("replaced", ("elsewhere", [1, 6]))] {
        let mut p = pod(name, 1, &[("c", false, 2)], Some((decision.0, &decision.1)));
        p.metadata.uid = None;
        p.metadata.creation_timestamp = None;
        created.push(pods.create(&PostParams::default(), &p).await.unwrap());
    }
    for p in &created {
        node.kubelet.admit(p).await.unwrap();
    }
    // `replaced` is deleted and created again under its name: the kubelet's pod is not this one.
    pods.delete("replaced", &Default::default()).await.unwrap();
    let mut again = created[1].clone();
    again.metadata.uid = None;
    again.metadata.resource_version = None;
    again.metadata.creation_timestamp = None;
    let again = pods.create(&PostParams::default(), &again).await.unwrap();

    let before = api.requests().len();
    let annotator = KubeAnnotator::new(api.client(), "weft-agent");
    let pass = reconcile_once(&node.plugin, &annotator).await.unwrap();
    // What the write-back asked of the API server (the test's own reads below are not its).
    let agent = api.requests().split_off(before);
    assert_eq!(pass.written.keys().collect::<Vec<_>>(), ["ml/stale"], "{pass:?}");
    let stale = pods.get("stale").await.unwrap();
    let written = &stale.metadata.annotations.as_ref().unwrap()["weft.io/gpu-ids"];
    assert_eq!(written, &pass.written["ml/stale"]);
    assert_ne!(written, "0,5", "the decision was for another node; the pod got the best-effort pair");
    let untouched = pods.get("replaced").await.unwrap();
    assert_eq!(untouched.metadata.uid, again.metadata.uid);
    assert_eq!(untouched.metadata.annotations.as_ref().unwrap()["weft.io/gpu-ids"], "1,6");

    weft_testkit::rbac::assert_granted(&agent, &["base/agent/rbac.yaml", "components/gpu-plugin/rbac.yaml"]);
    node.stop().await;
}

#[tokio::test]
async fn a_write_back_between_two_containers_does_not_lose_the_pods_share_of_its_decision() {
    let node = Node::start(DeviceListStrategy::Envvar).await;
    let p = pod("pair", 1, &[("a", false, 2), ("b", false, 2)], Some((NODE, &[0, 1, 4, 5])));
    let a = node.kubelet.admit_container(&p, "a").await.unwrap();
    // The write-back runs after container a's Allocate and settles the plugin's memory of it: the
    // kubelet's PodResources is now the only record of what a holds.
    reconcile_once(&node.plugin, &Recorder::default()).await.unwrap();
    assert!(node.plugin.grants().is_empty(), "settled");
    let b = node.kubelet.admit_container(&p, "b").await.unwrap();
    let mut all: Vec<usize> = indices(&a[0]).into_iter().chain(indices(&b[0])).collect();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 4, 5], "b got the rest of the decision, not a best-effort pair");
    node.stop().await;
}
