//! `weft agent --mode nri` as the DaemonSet runs it: the real binary registers with the
//! containerd-like harness runtime over a real unix socket, admits pods and adjusts containers on
//! this machine's real CPU layout, and after a SIGKILL comes back from its checkpoint.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use weft_nri::api;
use weft_nri_harness::{Runtime, RuntimeOptions};
use weft_topology::CpuSet;
use weft_topology::discover::{SysfsRoot, read_cpu_layout};

async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f).await.expect("test hung")
}

fn agent(socket: &Path, checkpoint: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["agent", "--node=test-node", "--publish-topology=false", "--mode=nri", "--no-kubelet", "--no-gpus"])
        .arg(format!("--nri-socket={}", socket.display()))
        .arg(format!("--checkpoint={}", checkpoint.display()))
        .args(["--ops-listen=127.0.0.1:0", "--no-cache", "--log=info"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("weft binary runs")
}

fn sandbox(uid: &str) -> api::PodSandbox {
    let mut p = api::PodSandbox::new();
    p.id = format!("sb-{uid}");
    p.uid = uid.into();
    p.name = uid.into();
    p.namespace = "default".into();
    p
}

fn container(uid: &str) -> api::Container {
    let mut c = api::Container::new();
    c.id = format!("c-{uid}");
    c.pod_sandbox_id = format!("sb-{uid}");
    c.name = "main".into();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_registers_adjusts_containers_and_recovers_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let checkpoint = dir.path().join("orm.json");
    let rt = Runtime::start(&socket, RuntimeOptions::default()).await.unwrap();
    let mut child = agent(&socket, &checkpoint);
    guard(rt.wait_synchronized("10-weft")).await;

    // Without the kubelet every pod runs in the shared pool: all of this machine's CPUs.
    let online = read_cpu_layout(&SysfsRoot::new("/")).unwrap().online();
    guard(rt.run_pod_sandbox(sandbox("a"))).await.unwrap();
    let c = guard(rt.create_container("sb-a", container("a"))).await.unwrap();
    let cpus: CpuSet = c.linux.resources.cpu.cpus.parse().unwrap();
    assert_eq!(cpus, online);
    assert!(c.env.iter().any(|e| e == &format!("WEFT_CPUS={online}")), "{:?}", c.env);
    let stored = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(stored.contains("\"uid\":\"a\"") || stored.contains("\\\"uid\\\":\\\"a\\\""), "{stored}");

    // Killed without warning; the runtime sees the plugin go and carries on without it.
    child.kill().unwrap();
    child.wait().unwrap();
    guard(rt.wait_dropped("10-weft", 0)).await;
    guard(rt.remove_pod_sandbox("sb-a")).await.unwrap();
    guard(rt.run_pod_sandbox(sandbox("b"))).await.unwrap();
    guard(rt.create_container("sb-b", container("b"))).await.unwrap();

    // Restarted: Synchronize releases the gone pod and admits the one that started meanwhile.
    let mut child = agent(&socket, &checkpoint);
    guard(rt.wait_synchronized_times("10-weft", 2)).await;
    let fixed = rt.container("c-b").unwrap();
    assert_eq!(fixed.linux.resources.cpu.cpus.parse::<CpuSet>().unwrap(), online, "corrected by the Synchronize reply");
    let stored = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(!stored.contains("\\\"uid\\\":\\\"a\\\"") && !stored.contains("\"uid\":\"a\""), "{stored}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn contradictory_flags_are_refused_with_the_flag_named() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["agent", "--node=test-node", "--publish-topology=false", "--no-gpus", "--no-cache"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--mode=bypass", "--no-kubelet"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("--no-kubelet"), "{err}");
    let (code, err) = run(&["--mode=off"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("nothing to do"), "{err}");
    let (code, err) = run(&["--mode=nri", "--nri-plugin-index=7", "--no-kubelet"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("index"), "{err}");
    let (code, err) = run(&["--mode=nri", "--reserved-cpus=0-x"]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("0-x"), "{err}");
}
