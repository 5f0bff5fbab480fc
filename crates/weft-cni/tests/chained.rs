//! Chained mode (no Multus, no deviceID): weft-cni follows the primary plugin in a conflist, asks
//! the kubelet's PodResources which `sriov.weft.io/<physnet>` VFs the pod holds, and attaches each
//! as net1, net2, … The kubelet is weft's test kubelet over the real device plugin and PodResources
//! gRPC, with a VF device plugin on weft's device plugin framework.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use weft_deviceplugin::api;
use weft_deviceplugin::{DeviceSource, PluginOptions, serve};
use weft_kubelet_harness::TestKubelet;

const RESOURCE: &str = "sriov.weft.io/physnet2";

/// A VF device plugin: devices are the VFs' PCI addresses.
struct Vfs {
    devices: watch::Sender<Vec<api::Device>>,
}

#[tonic::async_trait]
impl DeviceSource for Vfs {
    fn resource_name(&self) -> String {
        RESOURCE.into()
    }
    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions::default()
    }
    fn devices(&self) -> watch::Receiver<Vec<api::Device>> {
        self.devices.subscribe()
    }
    async fn preferred_allocation(&self, _: &api::ContainerPreferredAllocationRequest) -> Result<Vec<String>, Status> {
        Err(Status::unimplemented("no preference"))
    }
    async fn allocate(&self, _: &api::ContainerAllocateRequest) -> Result<api::ContainerAllocateResponse, Status> {
        Ok(api::ContainerAllocateResponse::default())
    }
}

fn pod(name: &str, vfs: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: vfs.to_string()}, "requests": {RESOURCE: vfs.to_string()}}}]}
    }))
    .unwrap()
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.unwrap_or_else(|_| panic!("waited 30s for {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_mode_attaches_the_pods_vfs_from_pod_resources() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(3, "wcpf0");
    let ns = NetnsGuard::new();
    // The primary plugin's interface, already in the pod; net1 is taken by something else.
    let primary = VethGuard::new("wce");
    std::process::Command::new("ip")
        .args(["link", "set", &primary.name, "netns", &ns.name, "name", "eth0"])
        .status()
        .unwrap();
    let other = VethGuard::new("wco");
    std::process::Command::new("ip")
        .args(["link", "set", &other.name, "netns", &ns.name, "name", "net1"])
        .status()
        .unwrap();

    let plugins = node.dir.path().join("device-plugins");
    std::fs::create_dir(&plugins).unwrap();
    let socket = node.dir.path().join("pod-resources.sock");
    let kubelet = TestKubelet::start_with_pod_resources(&plugins, &socket).await;
    let devices: Vec<api::Device> = node
        .vfs
        .iter()
        .map(|(pci, _)| api::Device { id: pci.clone(), health: weft_deviceplugin::HEALTHY.into(), topology: None })
        .collect();
    let (tx, _) = watch::channel(devices);
    let source = Arc::new(Vfs { devices: tx });
    let stop = CancellationToken::new();
    let mut options = PluginOptions::new(&plugins, "weft-vf.sock");
    options.kubelet_check = Duration::from_millis(20);
    options.register_retry = Duration::from_millis(20);
    let task = tokio::spawn(serve(source, options, stop.clone()));
    bounded("the VF list", kubelet.wait_for(|s| s.devices.contains_key(RESOURCE))).await;
    let p = pod("trainer", 2);
    let got = kubelet.admit(&p).await.unwrap();
    let mut held = got[0].devices.clone();
    held.sort();
    assert_eq!(held, [node.vfs[0].0.clone(), node.vfs[1].0.clone()]);

    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:99", "sandbox": ns.path()}],
        "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.96.0.10"]}
    });
    let mut conf = node.conf(
        "1.0.0",
        "weft-chain",
        None,
        "10.75.0.0/24",
        json!({"physnet": "physnet2", "podResourcesSocket": socket}),
    );
    conf["prevResult"] = prev.clone();
    let mut env = cni_env("ADD", "sandbox1", Some(&ns.path()), "eth0");
    env.push(("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer;K8S_POD_UID=uid-trainer".into()));
    let (add_env, add_conf) = (env.clone(), conf.clone());
    let (result, ok, err) = tokio::task::spawn_blocking(move || exec(&add_env, &add_conf)).await.unwrap();
    assert!(ok, "chained ADD failed: {result} {err}");

    // prevResult passes through; the VFs are appended as net2 and net3 (net1 was taken).
    let names: Vec<&str> =
        result["interfaces"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["eth0", "net2", "net3"]);
    assert_eq!(result["interfaces"][1]["pciID"], Value::Null, "1.0.0 results have no pciID");
    assert_eq!(result["ips"][0], prev["ips"][0]);
    assert_eq!(result["ips"][1]["interface"], 1);
    assert_eq!(result["ips"][2]["interface"], 2);
    assert_eq!(result["dns"], prev["dns"]);
    let mut inside = link_names(&ns.name);
    inside.sort();
    assert_eq!(inside, ["eth0", "lo", "net1", "net2", "net3"]);
    assert!(link(&node.vfs[2].1.name, None).is_some(), "the VF the pod does not hold stays");
    assert_eq!(node.cached(), ["sandbox1-eth0.json"]);
    let cached: Value =
        serde_json::from_slice(&std::fs::read(node.cache().join("sandbox1-eth0.json")).unwrap()).unwrap();
    assert_eq!(cached["pod"], json!({"namespace": "ml", "name": "trainer", "uid": "uid-trainer"}));
    assert_eq!(cached["vfs"][0]["vif"]["physnet"], "physnet2");
    assert_eq!(node.held_ips("weft-chain").len(), 2);

    // CHECK with the result, then DEL: both VFs come back.
    let mut check = node.conf(
        "1.0.0",
        "weft-chain",
        None,
        "10.75.0.0/24",
        json!({"physnet": "physnet2", "podResourcesSocket": socket}),
    );
    check["prevResult"] = result.clone();
    let mut check_env = env.clone();
    check_env[0].1 = "CHECK".into();
    let (out, ok, err) = tokio::task::spawn_blocking(move || exec(&check_env, &check)).await.unwrap();
    assert!(ok, "CHECK failed: {out} {err}");
    let mut del_env = env.clone();
    del_env[0].1 = "DEL".into();
    let del_conf = conf.clone();
    let (out, ok, err) = tokio::task::spawn_blocking(move || exec(&del_env, &del_conf)).await.unwrap();
    assert!(ok, "DEL failed: {out} {err}");
    assert!(link(&node.vfs[0].1.name, None).is_some() && link(&node.vfs[1].1.name, None).is_some());
    let mut inside = link_names(&ns.name);
    inside.sort();
    assert_eq!(inside, ["eth0", "lo", "net1"]);
    assert!(node.cached().is_empty());
    assert!(node.held_ips("weft-chain").is_empty());

    // A pod without VFs: the result is prevResult, unchanged.
    let none = pod("plain", 0);
    kubelet.add_pod(none);
    let mut plain_env = env.clone();
    plain_env.retain(|(k, _)| *k != "CNI_ARGS");
    plain_env.push(("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=plain".into()));
    let plain_conf = conf.clone();
    let (out, ok, err) = tokio::task::spawn_blocking(move || exec(&plain_env, &plain_conf)).await.unwrap();
    assert!(ok, "{out} {err}");
    assert_eq!(out, prev);

    // Without the pod's identity chained mode cannot ask.
    let mut anon = env.clone();
    anon.retain(|(k, _)| *k != "CNI_ARGS");
    let anon_conf = conf.clone();
    let (out, ok, _) = tokio::task::spawn_blocking(move || exec(&anon, &anon_conf)).await.unwrap();
    assert!(!ok);
    assert_eq!(out["code"], 4);
    assert!(out["msg"].as_str().unwrap().starts_with("CNI_ARGS: chained mode"), "{out}");

    stop.cancel();
    bounded("the plugin to stop", task).await.unwrap().unwrap();
    kubelet.stop().await;
}

#[tokio::test]
async fn an_unreachable_kubelet_means_try_again_later() {
    if !can_host_local() {
        return;
    }
    let node = Node::new(0, "wcpf0");
    let ns = NetnsGuard::new();
    let conf = node.conf(
        "1.1.0",
        "weft-chain",
        None,
        "10.76.0.0/24",
        json!({"physnet": "physnet2", "podResourcesSocket": node.dir.path().join("no-kubelet.sock")}),
    );
    let mut env = cni_env("ADD", "sandbox1", Some(&ns.path()), "eth0");
    env.push(("CNI_ARGS", "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=p".into()));
    let (out, ok, _) = tokio::task::spawn_blocking(move || exec(&env, &conf)).await.unwrap();
    assert!(!ok);
    assert_eq!(out["code"], 11, "{out}");
    assert!(out["msg"].as_str().unwrap().contains("asking the kubelet for ml/p's devices"), "{out}");
}
