//! `weft agent --nic-dra` as the DaemonSet runs it, against the fake API server and the test
//! kubelet: the VFs of its physnets published as ResourceSlices, the two sockets served, the
//! registration accepted, a claim's prepare reaching the PF (this machine has none, so the claim's
//! error names it), and an orderly stop that removes the sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::CustomResourceExt;
use serde_json::json;
use weft_crds::network_address::NetworkAddress;
use weft_fakeapi::FakeApiServer;
use weft_kubelet_harness::dra::DraKubelet;
use weft_topology::discover::FakeSriovTree;

/// Longest a step may take (a hang guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Waits for `child` to exit, at most [`HANG_GUARD`].
fn wait_exit(child: Child) -> Option<ExitStatus> {
    weft_testkit::process::wait_exit(child, HANG_GUARD)
}

/// The fake API server (with the NetworkAddress CRD) and a node: a kubeconfig, a fake sysfs with
/// one PF `pf` and `vfs` VFs (0000:3b:00.2 on), and a GPU-less topology file.
struct Node {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    sysfs: std::path::PathBuf,
    topology: std::path::PathBuf,
}

async fn node(pf: &str, vfs: u32) -> Node {
    let api = FakeApiServer::start().await;
    api.insert_typed(&NetworkAddress::crd()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let sysfs = dir.path().join("host");
    let tree = FakeSriovTree::new(&sysfs);
    tree.pf("0000:3b:00.0", &["0000:3a:00.0"], pf, 0).link(pf, "up", 25_000);
    for i in 0..vfs {
        tree.vf("0000:3b:00.0", i, &format!("0000:3b:00.{}", i + 2), None);
    }
    let topology = dir.path().join("node.yaml");
    std::fs::write(&topology, "apiVersion: weft.io/v1alpha1\nkind: NodeTopology\ngpus: []\n").unwrap();
    Node { api, dir, kubeconfig, sysfs, topology }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_publishes_its_vfs_registers_and_prepares_claims() {
    let Node { api, dir, kubeconfig, sysfs, topology } = node("wnd9pf0", 3).await;
    let (plugins, registry) = (dir.path().join("plugins"), dir.path().join("plugins_registry"));
    let child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["agent", "--node=n1", "--mode=off", "--publish-topology=false", "--ops-listen=127.0.0.1:0", "--nic-dra"])
        .arg(format!("--topology={}", topology.display()))
        .arg(format!("--root={}", sysfs.display()))
        .arg("--physical-device-mappings=fabric:wnd9pf0#0-1")
        .arg(format!("--kubelet-plugins-dir={}", plugins.display()))
        .arg(format!("--kubelet-registry-dir={}", registry.display()))
        .arg(format!("--nic-dra-checkpoint={}", dir.path().join("state/nic-dra.json").display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let slices = |a: &FakeApiServer| a.list("resourceslices", None);
    tokio::time::timeout(HANG_GUARD, api.wait_for(|a| !slices(a).is_empty())).await.expect("the VFs are published");
    let slice = &slices(&api)[0];
    assert_eq!(slice["spec"]["driver"], "nic.weft.io");
    assert_eq!(slice["spec"]["nodeName"], "n1");
    assert_eq!(slice["spec"]["pool"]["name"], "n1");
    let names: Vec<&str> =
        slice["spec"]["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["vf-0000-3b-00-2", "vf-0000-3b-00-3"], "the VFs of physnet fabric");

    // The sockets are served before the slices are published.
    let kubelet = DraKubelet::new(api.client());
    let info = tokio::time::timeout(HANG_GUARD, kubelet.register(&registry.join("nic.weft.io-reg.sock")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.endpoint, plugins.join("nic.weft.io/dra.sock").display().to_string());

    // A claim reaches the PF, which this machine does not have: the claim's error names it.
    let config = json!({"apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": "net-a", "ipRange": "10.0.0.0/24"});
    api.insert(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default", "uid": "claim-1"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.weft.io"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "nic.weft.io", "pool": "n1", "device": "vf-0000-3b-00-3"}],
                "config": [{"source": "FromClass", "opaque": {"driver": "nic.weft.io", "parameters": config}}]}},
            "reservedFor": [{"resource": "pods", "name": "p1", "uid": "pod-1"}]
        }
    }))
    .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1", "namespace": "default", "uid": "pod-1"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": [{"name": "nic", "resourceClaimName": "c1"}]}
    }))
    .unwrap();
    let e = tokio::time::timeout(HANG_GUARD, kubelet.prepare(&pod)).await.unwrap().unwrap_err();
    assert!(e.contains("NodePrepareResources failed for ResourceClaim c1"), "{e}");
    assert!(e.contains("VF 1 (0000:3b:00.3) on PF wnd9pf0") && e.contains("wnd9pf0"), "{e}");
    assert!(api.list("networkaddresses.weft.io", None).is_empty(), "no address before the VF is known");

    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(wait_exit(child).is_some_and(|s| s.success()), "the agent stops on SIGTERM");
    assert!(!registry.join("nic.weft.io-reg.sock").exists() && !plugins.join("nic.weft.io/dra.sock").exists());
}

/// With the SR-IOV device plugin on too, the physnets are split: --nic-dra-physnet names the NIC
/// DRA driver's, the device plugin serves the others; without the flag the agent refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_sriov_plugin_the_physnets_are_split_between_the_two() {
    let Node { api, dir, kubeconfig, sysfs, topology } = node("wnd8pf0", 4).await;
    let device_plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&device_plugins).unwrap();
    let agent = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
        cmd.args(["agent", "--node=n1", "--mode=off", "--publish-topology=false", "--ops-listen=127.0.0.1:0"])
            .args(["--nic-dra", "--sriov-plugin", "--no-kubelet"])
            .arg(format!("--topology={}", topology.display()))
            .arg(format!("--root={}", sysfs.display()))
            .arg("--physical-device-mappings=fabric:wnd8pf0#0-1,storage:wnd8pf0#2-3")
            .arg(format!("--device-plugin-dir={}", device_plugins.display()))
            .arg(format!("--pod-resources-socket={}", dir.path().join("pod-resources.sock").display()))
            .arg(format!("--kubelet-plugins-dir={}", dir.path().join("plugins").display()))
            .arg(format!("--kubelet-registry-dir={}", dir.path().join("plugins_registry").display()))
            .arg(format!("--nic-dra-checkpoint={}", dir.path().join("state/nic-dra.json").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(extra);
        cmd
    };
    let refused = agent(&[]).output().unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--sriov-plugin with --nic-dra needs --nic-dra-physnet"), "{err}");

    let child = agent(&["--nic-dra-physnet=fabric"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let slices = |a: &FakeApiServer| a.list("resourceslices", None);
    tokio::time::timeout(HANG_GUARD, api.wait_for(|a| !slices(a).is_empty())).await.expect("the VFs are published");
    let names: Vec<String> = slices(&api)[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["vf-0000-3b-00-2", "vf-0000-3b-00-3"], "the DRA driver offers fabric's VFs only");
    let storage = device_plugins.join("weft-sriov-storage.sock");
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while !storage.exists() && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        std::thread::park_timeout(Duration::from_millis(20));
    }
    assert!(storage.exists(), "the device plugin serves storage");
    assert!(!device_plugins.join("weft-sriov-fabric.sock").exists(), "and not the DRA driver's fabric");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    assert!(wait_exit(child).is_some_and(|s| s.success()), "the agent stops on SIGTERM");
}
