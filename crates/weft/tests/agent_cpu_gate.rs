//! `weft agent --mode=… --cpu-management-label KEY=VALUE`, as the DaemonSet runs it: CPU management
//! only on nodes labelled for it, placement only (topology publishing) everywhere else. The real
//! binary against the fake API server over HTTP and the containerd-like NRI harness over a real
//! unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use weft_fakeapi::FakeApiServer;
use weft_nri_harness::{Runtime, RuntimeOptions};

/// Longest a process may take to do what a step expects (a hang guard, not a measurement).
const HANG_GUARD: Duration = Duration::from_secs(60);

const GATE: &str = "--cpu-management-label=weft.io/cpu-management=enabled";

fn agent(node: &str, dir: &Path, kubeconfig: &Path, socket: &Path) -> Child {
    let topology = dir.join("node.yaml");
    std::fs::write(&topology, "apiVersion: weft.io/v1alpha1\nkind: NodeTopology\ngpus:\n  - {index: 0}\n").unwrap();
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["agent", "--mode=nri", GATE, "--no-kubelet", "--ops-listen=127.0.0.1:0", "--log=info"])
        .arg(format!("--node={node}"))
        .arg(format!("--topology={}", topology.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--nri-socket={}", socket.display()))
        .arg(format!("--checkpoint={}", dir.join(format!("{node}-orm.json")).display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weft binary runs")
}

/// stderr of `child`, line by line, read on a thread.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn published(nodes: &Api<Node>, name: &str) {
    tokio::time::timeout(HANG_GUARD, async {
        loop {
            let n = nodes.get(name).await.unwrap();
            if n.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(weft_record::TOPOLOGY_ANNOTATION)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the agent published the topology");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_management_runs_only_on_nodes_with_the_label() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let nodes: Api<Node> = Api::all(api.client());
    for (name, labels) in [
        ("labelled", serde_json::json!({"weft.io/cpu-management": "enabled"})),
        ("plain", serde_json::json!({"weft.io/cpu-management": "disabled"})),
    ] {
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    // Not labelled `enabled`: the agent says so, publishes the topology (placement works), and
    // never registers with the runtime.
    let socket = dir.path().join("plain.sock");
    let rt = Runtime::start(&socket, RuntimeOptions::default()).await.unwrap();
    let mut child = agent("plain", dir.path(), &kubeconfig, &socket);
    let stderr = lines(&mut child);
    let said = loop {
        let line = stderr.recv_timeout(HANG_GUARD).expect("the agent says what it runs");
        if line.contains("placement only") || line.contains("resource manager") {
            break line;
        }
    };
    assert!(said.contains("placement only") && said.contains("weft.io/cpu-management=enabled"), "{said}");
    published(&nodes, "plain").await;
    child.kill().unwrap();
    child.wait().unwrap();
    let rest: Vec<String> = stderr.try_iter().collect();
    assert!(!rest.iter().any(|l| l.contains("resource manager")), "{rest:?}");
    assert!(rt.events().is_empty(), "the runtime saw the agent: {:?}", rt.events());

    // Labelled: the resource manager registers and synchronizes.
    let socket = dir.path().join("labelled.sock");
    let rt = Runtime::start(&socket, RuntimeOptions::default()).await.unwrap();
    let mut child = agent("labelled", dir.path(), &kubeconfig, &socket);
    tokio::time::timeout(HANG_GUARD, rt.wait_synchronized("10-weft")).await.expect("the agent registers with NRI");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_malformed_label_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["agent", "--node=n1", "--mode=auto", "--cpu-management-label=weft.io/cpu-management"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--cpu-management-label") && e.contains("KEY=VALUE"), "{e}");
}
