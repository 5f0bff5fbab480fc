//! The framework against a test kubelet over real gRPC on unix sockets: registration, device lists
//! with NUMA topology, health changes, re-registration after a kubelet restart, preferred
//! allocation and Allocate shapes, refusals, an orderly stop. Waits are on what the kubelet saw,
//! under a hang guard; nothing sleeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use weft_deviceplugin::api::{self, Device, NumaNode, TopologyInfo};
use weft_deviceplugin::{DeviceSource, HEALTHY, PluginOptions, UNHEALTHY, serve};
use weft_kubelet_harness::{CHECKPOINT, TestKubelet};

const HANG_GUARD: Duration = Duration::from_secs(60);

async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("hung waiting for {what}"))
}

fn device(id: &str, health: &str, numa: i64) -> Device {
    Device { id: id.into(), health: health.into(), topology: Some(TopologyInfo { nodes: vec![NumaNode { id: numa }] }) }
}

/// A device source for tests: devices in a watch, a fixed preferred answer, Allocate echoing ids.
struct Source {
    resource: String,
    devices: watch::Sender<Vec<Device>>,
    preferred: Mutex<Option<Vec<String>>>,
}

impl Source {
    fn new(resource: &str) -> Arc<Source> {
        let (devices, _) = watch::channel(vec![device("gpu-0", HEALTHY, 0), device("gpu-1", HEALTHY, 1)]);
        Arc::new(Source { resource: resource.into(), devices, preferred: Mutex::new(None) })
    }
}

#[tonic::async_trait]
impl DeviceSource for Source {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
    }

    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    async fn preferred_allocation(
        &self,
        request: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        let fixed = self.preferred.lock().unwrap().clone();
        Ok(fixed.unwrap_or_else(|| {
            let mut out = request.must_include_device_i_ds.clone();
            for id in &request.available_device_i_ds {
                if out.len() < request.allocation_size as usize && !out.contains(id) {
                    out.push(id.clone());
                }
            }
            out
        }))
    }

    async fn allocate(
        &self,
        request: &api::ContainerAllocateRequest,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        Ok(api::ContainerAllocateResponse {
            envs: HashMap::from([("WEFT_DEVICES".to_string(), request.devices_ids.join(","))]),
            cdi_devices: request
                .devices_ids
                .iter()
                .map(|id| api::CdiDevice { name: format!("example.com/dev={id}") })
                .collect(),
            ..Default::default()
        })
    }
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), weft_deviceplugin::PluginError>>,
}

fn start(source: Arc<Source>, dir: &std::path::Path) -> Running {
    let mut options = PluginOptions::new(dir, "test.sock");
    options.kubelet_check = Duration::from_millis(20);
    options.register_retry = Duration::from_millis(20);
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(source, options, stop.clone()));
    Running { stop, task }
}

#[tokio::test]
async fn registers_and_lists_devices_with_their_numa_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let plugin = start(Source::new("example.com/gpu"), dir.path());
    let seen = guard("the device list", kubelet.wait_for(|s| s.devices.contains_key("example.com/gpu"))).await;
    let r = &seen.registrations[0];
    assert_eq!(
        (r.version.as_str(), r.endpoint.as_str(), r.resource_name.as_str()),
        ("v1beta1", "test.sock", "example.com/gpu")
    );
    assert_eq!(
        r.options,
        Some(api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true })
    );
    let devices = &seen.devices["example.com/gpu"];
    assert_eq!(devices, &vec![device("gpu-0", HEALTHY, 0), device("gpu-1", HEALTHY, 1)]);
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
    kubelet.stop().await;
}

#[tokio::test]
async fn a_health_change_reaches_the_kubelet_as_a_new_list() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let source = Source::new("example.com/gpu");
    let plugin = start(source.clone(), dir.path());
    guard("the first list", kubelet.wait_for(|s| s.updates.get("example.com/gpu") == Some(&1))).await;
    source.devices.send_modify(|d| d[1].health = UNHEALTHY.into());
    let seen = guard("the second list", kubelet.wait_for(|s| s.updates.get("example.com/gpu") == Some(&2))).await;
    assert_eq!(seen.devices["example.com/gpu"][1].health, "Unhealthy");
    assert_eq!(seen.devices["example.com/gpu"][0].health, "Healthy");
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn after_a_kubelet_restart_the_plugin_serves_a_new_socket_and_registers_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CHECKPOINT), b"{}").unwrap();
    let mut kubelet = TestKubelet::start(dir.path()).await;
    let plugin = start(Source::new("example.com/gpu"), dir.path());
    guard("the first list", kubelet.wait_for(|s| s.devices.contains_key("example.com/gpu"))).await;

    let removed = kubelet.restart().await;
    assert_eq!(removed, ["kubelet.sock", "test.sock"], "the restarted kubelet removed its socket and the plugin's");
    assert!(dir.path().join(CHECKPOINT).exists(), "and kept its checkpoint");
    let seen = guard(
        "a second registration and list",
        kubelet.wait_for(|s| s.registrations.len() == 2 && s.devices.contains_key("example.com/gpu")),
    )
    .await;
    assert_eq!(seen.registrations[1].endpoint, "test.sock");
    assert!(dir.path().join("test.sock").exists());
    // The kubelet can call the plugin on its new socket.
    let mut client = kubelet.plugin("example.com/gpu").await.unwrap();
    let options = client.get_device_plugin_options(api::Empty {}).await.unwrap().into_inner();
    assert!(options.get_preferred_allocation_available);
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn preferred_allocation_is_checked_and_allocate_carries_env_and_cdi_names() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let source = Source::new("example.com/gpu");
    let plugin = start(source.clone(), dir.path());
    guard("the device list", kubelet.wait_for(|s| s.devices.contains_key("example.com/gpu"))).await;
    let mut client = kubelet.plugin("example.com/gpu").await.unwrap();

    let ask = |size: i32, must: &[&str]| api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["gpu-0".into(), "gpu-1".into()],
            must_include_device_i_ds: must.iter().map(|s| s.to_string()).collect(),
            allocation_size: size,
        }],
    };
    let answer = client.get_preferred_allocation(ask(1, &["gpu-1"])).await.unwrap().into_inner();
    assert_eq!(answer.container_responses[0].device_i_ds, vec!["gpu-1".to_string()]);

    // A source that answers outside the request is stopped before the kubelet sees it.
    *source.preferred.lock().unwrap() = Some(vec!["gpu-7".into()]);
    let err = client.get_preferred_allocation(ask(1, &[])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert!(err.message().contains("'gpu-7' is not among the available ones"), "{}", err.message());
    *source.preferred.lock().unwrap() = Some(vec!["gpu-0".into()]);
    let err = client.get_preferred_allocation(ask(1, &["gpu-1"])).await.unwrap_err();
    assert!(err.message().contains("'gpu-1' must be included"), "{}", err.message());

    let allocated = client
        .allocate(api::AllocateRequest {
            container_requests: vec![
                api::ContainerAllocateRequest { devices_ids: vec!["gpu-0".into(), "gpu-1".into()] },
                api::ContainerAllocateRequest { devices_ids: vec!["gpu-1".into()] },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocated.container_responses.len(), 2, "one response per container, in order");
    assert_eq!(allocated.container_responses[0].envs["WEFT_DEVICES"], "gpu-0,gpu-1");
    assert_eq!(
        allocated.container_responses[1].cdi_devices,
        vec![api::CdiDevice { name: "example.com/dev=gpu-1".into() }]
    );
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_refused_registration_is_retried_and_the_kubelets_reason_kept() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let plugin = start(Source::new("gpu"), dir.path());
    let seen = guard("two refusals", kubelet.wait_for(|s| s.refused.len() >= 2)).await;
    assert!(seen.refused[0].1.contains("invalid name of device plugin socket: gpu"), "{:?}", seen.refused);
    assert!(seen.registrations.is_empty());
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn stopping_ends_the_device_stream_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let plugin = start(Source::new("example.com/gpu"), dir.path());
    guard("the device list", kubelet.wait_for(|s| s.devices.contains_key("example.com/gpu"))).await;
    let mut client = kubelet.plugin("example.com/gpu").await.unwrap();
    let mut stream = client.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some(), "the current list comes first");
    plugin.stop.cancel();
    guard("the plugin to stop", plugin.task).await.unwrap().unwrap();
    assert!(guard("the stream to end", stream.message()).await.unwrap_or(None).is_none(), "the stream ended");
    assert!(!dir.path().join("test.sock").exists());
}

#[tokio::test]
async fn an_endpoint_that_is_not_a_file_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for endpoint in ["", "../x.sock", "kubelet.sock"] {
        let e =
            serve(Source::new("example.com/gpu"), PluginOptions::new(dir.path(), endpoint), CancellationToken::new())
                .await
                .unwrap_err();
        assert!(e.to_string().contains("must be a file name"), "{endpoint}: {e}");
    }
}
