//! The NIC driver's NRI hooks end to end: weft's NRI plugin runtime serving [`NicAttacher`] to the
//! containerd-like harness runtime over a real unix socket, real network namespaces with veth
//! host ends standing in for VFs (named as VFs in a fake sysfs), the claim status written to the
//! fake API server through kube. Assertions look into the namespace over rtnetlink. No sleeps, no
//! timed assertions: waits are on harness events and API server changes under a hang guard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod attach_common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use attach_common::*;
use ipnet::IpNet;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use weft_fakeapi::{FakeApiServer, Verb};
use weft_nic_dra::attach::{AttachConfig, NicAttacher, PLUGIN_INDEX, PLUGIN_NAME};
use weft_nic_dra::prepared::ClaimRef;
use weft_nic_dra::status::KubeClaimStatus;
use weft_nri::plugin::{self, PluginOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{Runtime, RuntimeError, RuntimeOptions};

async fn guard<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("test hung")
}

fn full_name() -> String {
    format!("{PLUGIN_INDEX}-{PLUGIN_NAME}")
}

/// The agent's NIC hooks as an NRI plugin.
struct Agent {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), plugin::PluginError>>,
}

impl Agent {
    /// Stop it as a crash would: tasks gone, only the record files stay.
    async fn kill(self) {
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

struct Setup {
    dir: tempfile::TempDir,
    runtime: Runtime,
    server: FakeApiServer,
    prepared: Arc<Prepared>,
}

impl Setup {
    async fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::start(dir.path().join("nri.sock"), RuntimeOptions::default()).await.unwrap();
        Setup { dir, runtime, server: FakeApiServer::start().await, prepared: Arc::new(Prepared::default()) }
    }

    fn agent(&self, node: &Node) -> Agent {
        let cfg = AttachConfig {
            state_dir: node.state(),
            sysfs_root: node.sysfs(),
            status_retry_min: Duration::from_millis(5),
            status_retry_max: Duration::from_millis(50),
        };
        let status = Arc::new(KubeClaimStatus::new(self.server.client()));
        let handler = Arc::new(NicAttacher::new(self.prepared.clone(), status, cfg));
        let mut opts = PluginOptions::new(PLUGIN_NAME, PLUGIN_INDEX);
        opts.socket = SocketSource::Path(self.dir.path().join("nri.sock"));
        opts.backoff_min = Duration::from_millis(10);
        opts.backoff_max = Duration::from_millis(50);
        let stop = CancellationToken::new();
        let task = tokio::spawn(plugin::run(opts, handler, RuntimeHandle::new(), stop.clone()));
        Agent { stop, task }
    }

    /// A claim in `ml`, allocated to nic.weft.io.
    fn claim(&self, name: &str) -> ClaimRef {
        let stored = self
            .server
            .insert(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.weft.io"}}]}},
            }))
            .unwrap();
        ClaimRef { namespace: "ml".into(), name: name.into(), uid: stored["metadata"]["uid"].as_str().unwrap().into() }
    }

    fn claim_status(&self, name: &str) -> Value {
        self.server.get("resourceclaims", Some("ml"), name).unwrap()["status"].clone()
    }

    async fn wait_status(&self, name: &str) -> Value {
        guard(self.server.wait_for(|s| {
            s.get("resourceclaims", Some("ml"), name).is_some_and(|c| c["status"]["devices"].is_array())
        }))
        .await;
        self.claim_status(name)
    }

    fn status_patches(&self) -> usize {
        self.server
            .requests()
            .iter()
            .filter(|r| r.verb == Verb::Patch && r.rbac_resource() == "resourceclaims/status")
            .count()
    }
}

fn record_path(node: &Node, uid: &str) -> std::path::PathBuf {
    node.state().join(format!("{uid}.json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pod_sandbox_moves_the_vf_in_and_stop_pod_sandbox_brings_it_back() {
    if !can_netns() {
        return;
    }
    let node = Node::new(1);
    let (pci, vf) = (&node.vfs[0].0, node.vfs[0].1.name.clone());
    let ns = NetnsGuard::new();
    let s = Setup::new().await;
    let claim = s.claim("c1");
    s.prepared.set("pod-a", vec![nic(&claim, "pod-a", (pci, 0), "192.168.77.5/24", None, Some(1400))]);
    let _agent = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;
    let before = link_in(None, &vf).await.expect("the VF is in the host");

    guard(s.runtime.run_pod_sandbox(sandbox("pod-a", "a", Some(&ns.path())))).await.unwrap();

    // In the pod: the first free netN, up, with the MTU and the address; gone from the host.
    let inside = link_in(Some(&ns.path()), "net1").await.expect("net1 in the pod");
    assert!(inside.up);
    assert_eq!(inside.mtu, 1400);
    assert_eq!(inside.mac, before.mac, "the VF keeps its MAC");
    let address: IpNet = "192.168.77.5/24".parse().unwrap();
    assert_eq!(addresses_in(&ns.path(), "net1").await, [address]);
    assert!(link_in(None, &vf).await.is_none());
    assert!(record_path(&node, "pod-a").exists());

    // The claim's status on the API server.
    let status = s.wait_status("c1").await;
    let e = &status["devices"][0];
    assert_eq!((e["driver"].as_str(), e["device"].as_str()), (Some("nic.weft.io"), Some("vf-0")));
    let mac = before.mac.as_ref().unwrap().to_string();
    assert_eq!(e["networkData"], json!({"interfaceName": "net1", "ips": ["192.168.77.5/24"], "hardwareAddress": mac}));
    assert_eq!(e["conditions"][0]["type"], "Ready");
    assert_eq!(e["conditions"][0]["status"], "True");
    assert_eq!(e["conditions"][1]["type"], "NetworkReady");
    assert_eq!(s.status_patches(), 1);

    // A repeated RunPodSandbox changes nothing: a canary address added in the pod would be gone if
    // the VF had been moved out and in again, the record is the same file, no status is written.
    let canary: IpNet = "10.99.0.1/32".parse().unwrap();
    ip_ok(&["-n", &ns.name, "addr", "add", "10.99.0.1/32", "dev", "net1"]);
    let record = std::fs::read(record_path(&node, "pod-a")).unwrap();
    guard(s.runtime.run_pod_sandbox(sandbox("pod-a", "a", Some(&ns.path())))).await.unwrap();
    let mut now = addresses_in(&ns.path(), "net1").await;
    now.sort();
    assert_eq!(now, [canary, address]);
    assert_eq!(std::fs::read(record_path(&node, "pod-a")).unwrap(), record);
    assert_eq!(s.status_patches(), 1);

    // StopPodSandbox: back in the host under its name, with its MTU and up state; the record goes.
    guard(s.runtime.stop_pod_sandbox("sb-pod-a")).await.unwrap();
    let back = link_in(None, &vf).await.expect("the VF is back in the host");
    assert_eq!((back.mtu, back.up, &back.mac), (before.mtu, before.up, &before.mac));
    assert!(link_in(Some(&ns.path()), "net1").await.is_none());
    assert!(!record_path(&node, "pod-a").exists());
    // RemovePodSandbox after it has nothing left to do.
    guard(s.runtime.remove_pod_sandbox("sb-pod-a")).await.unwrap();
    assert!(link_in(None, &vf).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_with_nics_fails_clearly_and_its_vf_stays() {
    if !can_netns() {
        return;
    }
    let node = Node::new(1);
    let (pci, vf) = (&node.vfs[0].0, node.vfs[0].1.name.clone());
    let s = Setup::new().await;
    let claim = s.claim("c-host");
    s.prepared.set("pod-h", vec![nic(&claim, "pod-h", (pci, 0), "192.168.78.5/24", None, None)]);
    // A hostNetwork pod without NICs is none of the driver's business.
    s.prepared.set("pod-plain", Vec::new());
    let _agent = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;
    let before = link_in(None, &vf).await.unwrap();

    guard(s.runtime.run_pod_sandbox(sandbox("pod-plain", "plain", None))).await.unwrap();
    let err = guard(s.runtime.run_pod_sandbox(sandbox("pod-h", "h", None))).await.unwrap_err();
    let RuntimeError::Plugin { plugin, method, message } = &err else { panic!("{err}") };
    assert_eq!(plugin, &full_name());
    assert!(method.contains("RunPodSandbox"), "{method}");
    assert!(message.contains("pod ml/h (uid pod-h)"), "{message}");
    assert!(message.contains("hostNetwork"), "{message}");
    assert!(message.contains("claims ml/c-host"), "{message}");
    assert_eq!(link_in(None, &vf).await, Some(before), "the VF is untouched");
    assert!(!record_path(&node, "pod-h").exists());
    assert_eq!(s.status_patches(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_half_way_returns_every_vf_of_the_pod_to_the_host() {
    if !can_netns() {
        return;
    }
    let node = Node::new(2);
    let ns = NetnsGuard::new();
    let s = Setup::new().await;
    let claim = s.claim("c-two");
    // The second VF's MTU is more than a veth takes: it fails after both VFs have moved.
    s.prepared.set(
        "pod-f",
        vec![
            nic(&claim, "pod-f", (&node.vfs[0].0, 0), "192.168.79.5/24", None, Some(1400)),
            nic(&claim, "pod-f", (&node.vfs[1].0, 1), "192.168.79.6/24", None, Some(70_000)),
        ],
    );
    let _agent = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;
    let before: Vec<_> = futures_join(node.vfs.iter().map(|(_, v)| v.name.clone()).collect::<Vec<_>>()).await;

    let err = guard(s.runtime.run_pod_sandbox(sandbox("pod-f", "f", Some(&ns.path())))).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&format!("VF {} into {} as net2", node.vfs[1].0, ns.path())), "{message}");
    assert!(message.contains("setting MTU 70000 on net2"), "{message}");
    for ((_, v), was) in node.vfs.iter().zip(&before) {
        assert_eq!(link_in(None, &v.name).await.as_ref(), Some(was), "{} is back as it was", v.name);
    }
    let left: Vec<String> = names_in(&ns.path()).await;
    assert_eq!(left, ["lo"], "nothing of the pod's VFs stays in its namespace");
    assert!(!record_path(&node, "pod-f").exists());
    assert_eq!(s.status_patches(), 0);
}

async fn futures_join(names: Vec<String>) -> Vec<weft_cni::net::Link> {
    let mut out = Vec::new();
    for n in names {
        out.push(link_in(None, &n).await.expect("the VF is in the host"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_come_from_the_claim_or_the_first_free_net_n_and_a_gone_namespace_still_stops() {
    if !can_netns() {
        return;
    }
    let node = Node::new(2);
    let ns = NetnsGuard::new();
    // The pod already has a net1 (another network's interface).
    let other = VethGuard::new("wdo");
    ip_ok(&["link", "set", &other.peer, "netns", &ns.name, "name", "net1"]);
    let s = Setup::new().await;
    let (c1, c2) = (s.claim("c-named"), s.claim("c-free"));
    s.prepared.set(
        "pod-n",
        vec![
            nic(&c1, "pod-n", (&node.vfs[0].0, 0), "192.168.80.5/24", Some("fast0"), None),
            nic(&c2, "pod-n", (&node.vfs[1].0, 1), "192.168.81.5/24", None, None),
        ],
    );
    let _agent = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;
    let mtu = link_in(None, &node.vfs[1].1.name).await.unwrap().mtu;

    guard(s.runtime.run_pod_sandbox(sandbox("pod-n", "n", Some(&ns.path())))).await.unwrap();
    assert!(link_in(Some(&ns.path()), "fast0").await.is_some_and(|l| l.up));
    let net2 = link_in(Some(&ns.path()), "net2").await.expect("net1 is taken, so net2");
    assert_eq!(net2.mtu, mtu, "no MTU asked: the VF's own");
    assert_eq!(addresses_in(&ns.path(), "net2").await, ["192.168.81.5/24".parse::<IpNet>().unwrap()]);
    // One status apply per claim.
    assert_eq!(s.wait_status("c-named").await["devices"][0]["networkData"]["interfaceName"], "fast0");
    assert_eq!(s.wait_status("c-free").await["devices"][0]["networkData"]["interfaceName"], "net2");

    // The sandbox's namespace disappears before StopPodSandbox (a veth dies with it; a real VF
    // would come back to the host): the stop still succeeds and the record goes.
    ns.delete();
    guard(s.runtime.stop_pod_sandbox("sb-pod-n")).await.unwrap();
    assert!(!record_path(&node, "pod-n").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_returns_the_vfs_of_a_sandbox_removed_while_it_was_away() {
    if !can_netns() {
        return;
    }
    let node = Node::new(2);
    let (a, b) = (NetnsGuard::new(), NetnsGuard::new());
    let s = Setup::new().await;
    let (ca, cb) = (s.claim("c-gone"), s.claim("c-stays"));
    s.prepared.set("pod-gone", vec![nic(&ca, "pod-gone", (&node.vfs[0].0, 0), "192.168.82.5/24", None, Some(1300))]);
    s.prepared.set("pod-stays", vec![nic(&cb, "pod-stays", (&node.vfs[1].0, 1), "192.168.82.6/24", None, None)]);
    let first = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;
    let before = link_in(None, &node.vfs[0].1.name).await.unwrap();
    guard(s.runtime.run_pod_sandbox(sandbox("pod-gone", "gone", Some(&a.path())))).await.unwrap();
    guard(s.runtime.run_pod_sandbox(sandbox("pod-stays", "stays", Some(&b.path())))).await.unwrap();
    s.wait_status("c-stays").await;

    first.kill().await;
    guard(s.runtime.wait_dropped(&full_name(), 0)).await;
    // While no agent runs, the runtime stops and removes one sandbox; the other keeps running.
    guard(s.runtime.stop_pod_sandbox("sb-pod-gone")).await.unwrap();
    guard(s.runtime.remove_pod_sandbox("sb-pod-gone")).await.unwrap();
    assert!(link_in(Some(&a.path()), "net1").await.is_some(), "nobody moved it back yet");

    let _second = s.agent(&node);
    guard(s.runtime.wait_synchronized_times(&full_name(), 2)).await;
    let back = link_in(None, &node.vfs[0].1.name).await.expect("back in the host under its name");
    assert_eq!((back.mtu, back.up), (before.mtu, before.up));
    assert!(!record_path(&node, "pod-gone").exists());
    // The running pod keeps its VF where it is.
    assert!(link_in(Some(&b.path()), "net1").await.is_some_and(|l| l.up));
    assert!(record_path(&node, "pod-stays").exists());
    assert!(Path::new(&b.path()).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sandbox_of_the_same_pod_takes_the_vf_from_the_old_one() {
    if !can_netns() {
        return;
    }
    let node = Node::new(1);
    let (old, new) = (NetnsGuard::new(), NetnsGuard::new());
    let s = Setup::new().await;
    let claim = s.claim("c-again");
    s.prepared.set("pod-r", vec![nic(&claim, "pod-r", (&node.vfs[0].0, 0), "192.168.83.5/24", Some("fast0"), None)]);
    let _agent = s.agent(&node);
    guard(s.runtime.wait_synchronized(&full_name())).await;

    guard(s.runtime.run_pod_sandbox(sandbox("pod-r", "r", Some(&old.path())))).await.unwrap();
    assert!(link_in(Some(&old.path()), "fast0").await.is_some());
    // The kubelet makes a new sandbox for the pod (the old one died without a StopPodSandbox).
    let mut again = sandbox("pod-r", "r", Some(&new.path()));
    again.id = "sb-pod-r-2".into();
    guard(s.runtime.run_pod_sandbox(again)).await.unwrap();
    assert!(link_in(Some(&old.path()), "fast0").await.is_none());
    assert!(link_in(Some(&new.path()), "fast0").await.is_some_and(|l| l.up));
    assert_eq!(addresses_in(&new.path(), "fast0").await, ["192.168.83.5/24".parse::<IpNet>().unwrap()]);
    let record: Value = serde_json::from_slice(&std::fs::read(record_path(&node, "pod-r")).unwrap()).unwrap();
    assert_eq!(record["sandboxId"], "sb-pod-r-2");
    // A late StopPodSandbox of the old sandbox leaves the new one's VF alone.
    guard(s.runtime.stop_pod_sandbox("sb-pod-r")).await.unwrap();
    assert!(link_in(Some(&new.path()), "fast0").await.is_some());
    guard(s.runtime.stop_pod_sandbox("sb-pod-r-2")).await.unwrap();
    assert!(link_in(None, &node.vfs[0].1.name).await.is_some());
}
