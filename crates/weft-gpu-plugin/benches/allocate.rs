//! GetPreferredAllocation + Allocate over gRPC on a unix socket, as the kubelet calls them for one
//! container, against weft's GPU plugin served by the device-plugin framework. Each call runs the
//! whole handshake: the kubelet's pod list (20 pods on the node, in memory here; an HTTP call to
//! the kubelet in production), PodResources `List` over its own gRPC socket (the test kubelet
//! serves it), the choice and the response. Before each timed run the plugin forgets its answers,
//! so every run attributes the call to the same pending pod and walks the same path.
//!
//! - `allocate/8-gpus-decision`: DGX-1 V100, a 4-GPU container with a recorded decision;
//! - `allocate/8-gpus-best-effort`: the same without a decision (exact best-effort set);
//! - `allocate/16-gpus-best-effort`: 16 PCIe GPUs, an 8-GPU container without a decision.
//!
//! Also prints p50/p99 over 2,000 timed runs of each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::api;
use weft_deviceplugin::handshake::NodePods;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_gpu_plugin::{DeviceListStrategy, GpuInventory, GpuPlugin, GpuPluginConfig};
use weft_kubelet_harness::TestKubelet;
use weft_topology::NodeTopology;

const GPU: &str = "nvidia.com/gpu";
const NODE: &str = "bench-node";

struct Pods(Vec<Pod>);

#[async_trait]
impl NodePods for Pods {
    async fn pods(&self) -> Result<Vec<Pod>, String> {
        Ok(self.0.clone())
    }
}

/// 19 running CPU-only pods and one pending pod asking for `size` GPUs.
fn pods(size: usize, decision: Option<&[usize]>) -> Vec<Pod> {
    let mut pods: Vec<Pod> = (0..19)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("web-{i}"), "namespace": "apps", "uid": format!("web-{i}"),
                             "creationTimestamp": "2026-11-25T09:00:00Z"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        })
        .collect();
    let mut annotations = serde_json::Map::new();
    if let Some(gpus) = decision {
        let d = json!({"node": NODE, "gpus": gpus, "decidedAt": "2026-11-25T10:00:00Z", "by": "weft-extender"});
        annotations.insert("weft.io/gpu-decision".into(), d.to_string().into());
    }
    pods.push(
        serde_json::from_value(json!({
            "metadata": {"name": "trainer", "namespace": "ml", "uid": "trainer",
                         "creationTimestamp": "2026-11-25T10:00:00Z", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: size.to_string()}}}]}
        }))
        .unwrap(),
    );
    pods
}

fn with_uuids(mut t: NodeTopology) -> NodeTopology {
    for g in &mut t.gpus {
        g.uuid = Some(format!("GPU-bench-{:04}", g.index));
        g.numa_node = Some(0);
    }
    t
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    plugin: Arc<GpuPlugin>,
    client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    available: Vec<String>,
    size: i32,
    _kubelet: TestKubelet,
    _dir: tempfile::TempDir,
    _stop: CancellationToken,
}

impl Bench {
    fn new(topology: NodeTopology, size: usize, decision: Option<&[usize]>) -> Bench {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir(&plugins).unwrap();
        let socket = dir.path().join("pod-resources.sock");
        let inventory = GpuInventory::new(&topology).unwrap();
        let available: Vec<String> = inventory.devices().iter().map(|d| d.id.clone()).collect();
        let stop = CancellationToken::new();
        let (kubelet, plugin, client) = runtime.block_on(async {
            let kubelet = TestKubelet::start_with_pod_resources(&plugins, &socket).await;
            let cfg = GpuPluginConfig { resource: GPU.into(), node: NODE.into(), strategy: DeviceListStrategy::Envvar };
            let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new(socket.clone()));
            let plugin = Arc::new(GpuPlugin::new(cfg, inventory, Arc::new(Pods(pods(size, decision))), assigned));
            tokio::spawn(weft_deviceplugin::serve(
                plugin.clone(),
                weft_deviceplugin::PluginOptions::new(&plugins, "weft-gpu.sock"),
                stop.clone(),
            ));
            kubelet.wait_for(|s| s.devices.contains_key(GPU)).await;
            let client = kubelet.plugin(GPU).await.unwrap();
            (kubelet, plugin, client)
        });
        Bench {
            runtime,
            plugin,
            client,
            available,
            size: i32::try_from(size).unwrap(),
            _kubelet: kubelet,
            _dir: dir,
            _stop: stop,
        }
    }

    /// One container's calls, timed; the plugin's memory of earlier answers is cleared first.
    fn run(&mut self) -> Duration {
        self.plugin.settle(&BTreeMap::new(), &[]);
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: self.available.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: self.size,
            }],
        };
        let client = &mut self.client;
        self.runtime.block_on(async {
            let start = Instant::now();
            let preferred = client.get_preferred_allocation(request).await.unwrap().into_inner();
            let devices_ids = preferred.container_responses[0].device_i_ds.clone();
            let allocate =
                api::AllocateRequest { container_requests: vec![api::ContainerAllocateRequest { devices_ids }] };
            let response = client.allocate(allocate).await.unwrap().into_inner();
            let elapsed = start.elapsed();
            assert_eq!(response.container_responses.len(), 1);
            elapsed
        })
    }
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}

fn bench_allocate(c: &mut Criterion) {
    let cases: [(&str, NodeTopology, usize, Option<&[usize]>); 3] = [
        ("8-gpus-decision", with_uuids(weft_topology::reference::dgx1_volta()), 4, Some(&[0, 1, 4, 5])),
        ("8-gpus-best-effort", with_uuids(weft_topology::reference::dgx1_volta()), 4, None),
        ("16-gpus-best-effort", with_uuids(weft_testkit::pcie_only(NODE, 16)), 8, None),
    ];
    let mut group = c.benchmark_group("allocate");
    for (name, topology, size, decision) in cases {
        let mut bench = Bench::new(topology, size, decision);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| bench.run()).sum());
        });
        let (p50, p99) = percentiles((0..2_000).map(|_| bench.run()).collect());
        println!("allocate/{name} over 2,000 runs: p50 {p50:?}, p99 {p99:?}");
    }
    group.finish();
}

criterion_group!(benches, bench_allocate);
criterion_main!(benches);
