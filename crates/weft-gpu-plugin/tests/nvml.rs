//! The GPU plugin's NVML side (feature `nvml`, as the image ships it) against the real library:
//! on a machine without the driver's library (CI's host) the health watcher refuses to start with
//! an error that says so and every GPU stays healthy; on a GPU machine (`scripts/gpu-check.sh`,
//! where no skip is allowed) NVML discovery finds a consistent node and the watcher registers for
//! its events. Everything above the NVML calls runs through `FakeNvml` in weft-topology's tests.
//!
//! ```text
//! cargo test -p weft-gpu-plugin --features nvml --test nvml
//! ```
#![cfg(feature = "nvml")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use weft_deviceplugin::DeviceSource;
use weft_deviceplugin::podresources::{AssignedDevices, PodResourcesClient};
use weft_gpu_plugin::health::watch_nvml;
use weft_gpu_plugin::{DeviceListStrategy, GpuInventory, GpuPlugin, GpuPluginConfig};
use weft_topology::NodeTopology;
use weft_topology::discover::{DiscoverOptions, NvmlLib, NvmlLike, discover};

const NODE: &str = "nvml-node";

/// A plugin for `topology` whose pod and PodResources sources are never asked (nothing allocates).
fn plugin(topology: &NodeTopology) -> Arc<GpuPlugin> {
    let cfg =
        GpuPluginConfig { resource: "nvidia.com/gpu".into(), node: NODE.into(), strategy: DeviceListStrategy::Envvar };
    let pods = || -> Result<Vec<Pod>, String> { Ok(Vec::new()) };
    let assigned: Arc<dyn AssignedDevices> = Arc::new(PodResourcesClient::new("/nonexistent/pod-resources.sock"));
    Arc::new(GpuPlugin::new(cfg, GpuInventory::new(topology).expect("inventory"), Arc::new(pods), assigned))
}

/// The health the plugin lists to the kubelet, per device.
fn health(plugin: &GpuPlugin) -> Vec<String> {
    plugin.devices().borrow().iter().map(|d| d.health.clone()).collect()
}

/// Without the library: `watch_nvml` returns an error naming NVML (the agent logs it and goes
/// on), starts nothing, and the GPUs stay listed healthy. On a machine with the library this path
/// cannot be reached and the test checks nothing (the next test is the one that runs there).
#[test]
fn without_nvml_the_health_watcher_refuses_to_start_and_gpus_stay_healthy() {
    if NvmlLib::open().is_ok() {
        return;
    }
    let plugin = plugin(&weft_testkit::dgx1_v100(NODE));
    let shutdown = CancellationToken::new();
    let err = watch_nvml(plugin.clone(), shutdown.clone()).expect_err("no NVML library here");
    assert!(err.starts_with("NVML: "), "{err}");
    assert_eq!(health(&plugin), vec!["Healthy".to_string(); 8]);
    assert_eq!(Arc::strong_count(&plugin), 1, "no watcher thread holds the plugin");
}

/// On a GPU machine: NVML discovery lists every GPU the library counts, with UUIDs and bus IDs
/// sysfs knows and a PCIe relation for every pair; the health watcher starts on them and the GPUs
/// are listed healthy.
#[test]
fn real_nvml_discovers_the_gpus_and_the_health_watcher_starts() {
    let lib = NvmlLib::open().map_err(|e| format!("NVML and a GPU ({e})"));
    let Some(lib) = weft_testkit::require_ok(lib) else { return };
    let count = lib.device_count().expect("device count") as usize;
    let d = discover(&DiscoverOptions { netdevs: true, ..DiscoverOptions::default() }).expect("discover");
    eprintln!("{}", weft_topology::render::to_table(&d.node));
    eprintln!("notes: {:#?}", d.notes);
    assert!(count > 0, "NVML loaded and counts no GPU");
    assert_eq!(d.node.gpu_count(), count);
    for (i, g) in d.node.gpus.iter().enumerate() {
        assert!(g.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")), "GPU{i} uuid");
        let bus = g.pci_bus_id.as_deref().expect("bus id");
        assert!(Path::new("/sys/bus/pci/devices").join(bus).exists(), "GPU{i} {bus} in sysfs");
    }
    for a in 0..count {
        for b in (a + 1)..count {
            assert!(d.node.link(a, b).pcie.is_some(), "GPU{a}-GPU{b} has a PCIe relation");
        }
    }

    let plugin = plugin(&d.node);
    let shutdown = CancellationToken::new();
    watch_nvml(plugin.clone(), shutdown.clone()).expect("the watcher starts");
    assert_eq!(health(&plugin), vec!["Healthy".to_string(); count]);
    shutdown.cancel();
}
