//! The extender's test server on loopback and HTTP helpers, beside the shared fixtures of
//! weft-testkit.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use weft_extender::{ExtenderConfig, ExtenderState, InMemoryView, KubeClusterView, KubePodBinder};
use weft_fakeapi::FakeApiServer;
pub use weft_testkit::*;
use weft_topology::NodeTopology;

/// An extender with API access over the fake API server, served on 127.0.0.1.
pub struct BindCluster {
    /// The API server.
    pub api: FakeApiServer,
    /// The extender's base URL.
    pub base: String,
    /// The extender's state.
    pub state: Arc<ExtenderState>,
    /// A client for its routes.
    pub http: reqwest::Client,
}

/// The fake API server with one node per `(name, topology)` (capacity: its GPUs).
pub async fn api_with_nodes(nodes: &[(&str, NodeTopology)]) -> FakeApiServer {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, PostParams};
    let api = FakeApiServer::start().await;
    let node_api: Api<Node> = Api::all(api.client());
    for (name, topology) in nodes {
        let mut n = node(name, Some(topology), topology.gpu_count());
        n.metadata.resource_version = None;
        n.metadata.uid = None;
        node_api.create(&PostParams::default(), &n).await.unwrap();
    }
    api
}

/// The fake API server with one node per `(name, topology)` (capacity: its GPUs), an extender over
/// it with the real reflector-backed view and binder.
pub async fn bind_cluster(nodes: &[(&str, NodeTopology)]) -> BindCluster {
    let api = api_with_nodes(nodes).await;
    let client = api.client();
    let view = KubeClusterView::spawn(client.clone());
    tokio::time::timeout(std::time::Duration::from_secs(60), view.wait_until_ready()).await.expect("the view syncs");
    let state = Arc::new(
        ExtenderState::new(Arc::new(view), ExtenderConfig::default())
            .with_binder(Arc::new(KubePodBinder::new(client).with_record_namespace("weft-system"))),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(weft_extender::serve(listener, state.clone(), Default::default(), std::future::pending()));
    BindCluster { api, base, state, http: reqwest::Client::new() }
}

/// Creates a pending pod in `ml` on `api` asking for `gpus` GPUs and the `extra` limits; returns it
/// as the API server stored it.
pub async fn create_pending(
    api: &FakeApiServer,
    name: &str,
    gpus: u32,
    extra: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    use kube::api::{Api, PostParams};
    let mut v = pending_pod_json(name, gpus);
    for k in ["uid", "resourceVersion", "creationTimestamp", "ownerReferences"] {
        v["metadata"].as_object_mut().unwrap().remove(k);
    }
    v["status"] = serde_json::json!({});
    for (resource, amount) in extra {
        v["spec"]["containers"][0]["resources"]["limits"][*resource] = serde_json::json!(amount);
    }
    let pod = serde_json::from_value(v).unwrap();
    Api::namespaced(api.client(), "ml").create(&PostParams::default(), &pod).await.unwrap()
}

/// [`create_pending`] on the cluster's API server.
pub async fn pending(
    c: &BindCluster,
    name: &str,
    gpus: u32,
    extra: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Pod {
    create_pending(&c.api, name, gpus, extra).await
}

/// POSTs `body` to the extender's `verb`; expects 200 and returns the answer.
pub async fn post_verb(c: &BindCluster, verb: &str, body: &Value) -> Value {
    let r = c.http.post(format!("{}/{verb}", c.base)).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{verb}");
    r.json().await.unwrap()
}

/// The `ExtenderBindingArgs` that bind `pod` to `node`.
pub fn bind_args(pod: &k8s_openapi::api::core::v1::Pod, node: &str) -> Value {
    serde_json::json!({"PodName": pod.metadata.name, "PodNamespace": pod.metadata.namespace,
                       "PodUID": pod.metadata.uid, "Node": node})
}

/// An extender served on 127.0.0.1 with an ephemeral port.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The state behind it.
    pub state: Arc<ExtenderState>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Start serving `view` with `cfg`.
    pub async fn start(view: Arc<InMemoryView>, cfg: ExtenderConfig) -> TestServer {
        TestServer::start_with(view, cfg, weft_kube::http::ServeOptions::default()).await
    }

    /// Start serving `view` with `cfg` and these connection limits.
    pub async fn start_with(
        view: Arc<InMemoryView>,
        cfg: ExtenderConfig,
        opts: weft_kube::http::ServeOptions,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(ExtenderState::new(view, cfg));
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(weft_extender::serve(listener, state.clone(), opts, async move {
            let _ = rx.await;
        }));
        TestServer { base, state, shutdown: Some(tx), handle: Some(handle) }
    }

    /// Shut down gracefully and return what `serve` returned.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.handle.take().unwrap().await.unwrap()
    }
}

/// POST a JSON body; returns status and body text.
pub async fn post(url: &str, body: &Value) -> (u16, String) {
    post_raw(url, serde_json::to_vec(body).unwrap(), &[]).await
}

/// POST raw bytes with extra headers; returns status and body text.
pub async fn post_raw(url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> (u16, String) {
    let client = reqwest::Client::new();
    let mut req = client.post(url).header("Content-Type", "application/json").body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// A GPU node as kube-scheduler's informer holds it and sends it in `Nodes` (node `i` of a cluster,
/// GPU `product`, `gpus` GPUs and `vfs` SR-IOV VFs): the labels GPU feature discovery, NFD and the
/// cloud set, capacity and allocatable, the four conditions, addresses, node info, images, runtime
/// handlers, a taint, and weft's topology `annotation` (text) beside other annotations.
pub fn kube_node_json(name: &str, i: usize, product: &str, gpus: usize, vfs: usize, annotation: &str) -> Value {
    let ip = format!("10.{}.{}.{}", 16 + i / 65_536, (i / 256) % 256, i % 256);
    let images: Vec<Value> = [
        ("nvcr.io/nvidia/pytorch", "24.01-py3", 9_654_321_987u64),
        ("nvcr.io/nvidia/tritonserver", "24.01-py3", 7_123_456_789),
        ("nvcr.io/nvidia/k8s/dcgm-exporter", "3.3.5-3.4.0-ubuntu22.04", 343_211_222),
        ("nvcr.io/nvidia/k8s-device-plugin", "v0.15.0", 129_845_331),
        ("nvcr.io/nvidia/gpu-feature-discovery", "v0.8.2", 88_123_456),
        ("registry.k8s.io/kube-proxy", "v1.34.1", 30_123_456),
        ("ghcr.io/weft/weft", "0.9.0", 41_234_567),
        ("docker.io/calico/node", "v3.27.2", 117_654_321),
        ("docker.io/calico/cni", "v3.27.2", 93_456_789),
        ("registry.k8s.io/pause", "3.10", 320_368),
    ]
    .iter()
    .enumerate()
    .map(|(k, (repo, tag, size))| {
        json!({"names": [format!("{repo}@sha256:{:064x}", (i as u128 + 1) * 0x9E37_79B9 + k as u128),
                         format!("{repo}:{tag}")], "sizeBytes": size})
    })
    .collect();
    let mut resources = json!({"cpu": "128", "memory": "2113123456Ki", "ephemeral-storage": "3750000000Ki",
        "hugepages-1Gi": "0", "hugepages-2Mi": "0", "pods": "110", "nvidia.com/gpu": gpus.to_string()});
    if vfs > 0 {
        resources["sriov.weft.io/fabric"] = json!(vfs.to_string());
    }
    let mut allocatable = resources.clone();
    allocatable["cpu"] = json!("126");
    allocatable["memory"] = json!("2092123456Ki");
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "lastHeartbeatTime": "2026-01-05T10:55:12Z",
            "lastTransitionTime": "2026-01-02T08:14:40Z", "reason": reason, "message": message})
    };
    json!({
        "metadata": {
            "name": name, "uid": format!("4c1d2e3f-{i:04x}-4a5b-8c7d-{:012x}", i * 7919),
            "resourceVersion": format!("{}", 81_000_000 + i), "creationTimestamp": "2026-01-02T08:12:03Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": product,
                "topology.kubernetes.io/region": "eu-west-4", "topology.kubernetes.io/zone": format!("eu-west-4{}", ["a", "b", "c"][i % 3]),
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": gpus.to_string(), "nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.machine": product,
                "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
                "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "54",
                "nvidia.com/cuda.driver.rev": "15", "nvidia.com/cuda.runtime.major": "12",
                "nvidia.com/cuda.runtime.minor": "4", "nvidia.com/mig.capable": "false",
                "nvidia.com/gfd.timestamp": "1767341234",
                "feature.node.kubernetes.io/cpu-model.vendor_id": "AMD",
                "feature.node.kubernetes.io/kernel-version.full": "6.8.0-45-generic",
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "feature.node.kubernetes.io/pci-15b3.present": "true",
                "feature.node.kubernetes.io/network-sriov.capable": "true",
                "weft.io/cpu-management": "enabled"
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"csi.example.com\":\"{name}\"}}"),
                "nfd.node.kubernetes.io/feature-labels": "cpu-model.vendor_id,kernel-version.full,pci-10de.present,pci-15b3.present,network-sriov.capable",
                "projectcalico.org/IPv4Address": format!("{ip}/16"),
                weft_record::TOPOLOGY_ANNOTATION: annotation
            }
        },
        "spec": {
            "podCIDR": format!("10.244.{}.0/24", i % 256), "podCIDRs": [format!("10.244.{}.0/24", i % 256)],
            "providerID": format!("metal://{name}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        },
        "status": {
            "capacity": resources, "allocatable": allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{:032x}", i * 104_729), "systemUUID": format!("{:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b", i),
                "bootID": format!("{:08x}-aaaa-4bbb-8ccc-dddddddddddd", i), "kernelVersion": "6.8.0-45-generic",
                "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64"},
            "images": images,
            "runtimeHandlers": [{"name": "nvidia", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}}],
            "features": {"supplementalGroupsPolicy": true}
        }
    })
}

/// The API server's side of a bind, in memory (for benches): the pending pod is read, every write
/// accepted.
pub struct MemoryApi {
    /// The pod every read returns.
    pub pod: k8s_openapi::api::core::v1::Pod,
}

#[async_trait::async_trait]
impl weft_extender::PodBinder for MemoryApi {
    async fn pod(&self, _: &str, _: &str) -> Result<Option<k8s_openapi::api::core::v1::Pod>, String> {
        Ok(Some(self.pod.clone()))
    }

    async fn resource_claim(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<k8s_openapi::api::resource::v1::ResourceClaim>, String> {
        Ok(None)
    }

    async fn bind(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        a: std::collections::BTreeMap<String, String>,
    ) -> Result<(), String> {
        std::hint::black_box(a);
        Ok(())
    }

    async fn annotate(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Option<&str>,
        a: std::collections::BTreeMap<String, Option<String>>,
    ) -> Result<(), String> {
        std::hint::black_box(a);
        Ok(())
    }

    // No node record: every run decides against the same empty node (a bench releases its
    // reservations); the record's API round trips are not part of the decision's cost.
    async fn node_record(&self, _: &str) -> Result<(Option<String>, weft_extender::reservations::NodeRecord), String> {
        Ok((None, weft_extender::reservations::NodeRecord::default()))
    }

    async fn write_node_record(
        &self,
        _: &str,
        _: Option<&str>,
        r: &weft_extender::reservations::NodeRecord,
    ) -> Result<bool, String> {
        std::hint::black_box(r);
        Ok(true)
    }
}
