//! Pod start latency of an exclusive pod next to N shared containers (issue #24 item 4), with
//! containerd's cost of applying container updates modelled.
//!
//! containerd applies the updates a plugin returns in a `CreateContainer` answer inside that call,
//! one synchronous `UpdateContainerResources` each (the container's spec written to the metadata
//! store, then the task updated through the shim and runc), under its NRI lock
//! (`internal/nri/nri.go` `CreateContainer` → `applyUpdates`; `internal/cri/nri/nri_api_linux.go`
//! `UpdateContainer`); an unsolicited `UpdateContainers` is applied the same way under the same
//! lock (`updateFromPlugin`). The harness runtime (`weft-nri-harness`) models exactly that: each
//! applied update costs `--update-cost-ms` (default 25 ms: the real containerd took
//! 2.0–2.6 s for 91 updates, ~60 ms without them), under its lifecycle lock. Nothing else of
//! containerd's work (creating and starting the container, runc, the shim) is modelled, so the
//! absolute times are the NRI round trips plus weft's work plus the modelled updates; a real
//! node adds its ~60 ms of container creation to both kinds of pod.
//!
//! weft runs as in production: `weft_agent::service::run` in NRI mode (real checkpoint, pod specs
//! from an in-memory kubelet pod list), with a reconcile period of an hour so that only the
//! pod's own events move the shared pool. Node: 2 sockets × 32 cores × 2 threads (128 CPUs, 0 and
//! 64 reserved), best-effort policy.
//!
//! For each N in 50, 100, 200: N Burstable pods (one started container each) run; then, `rounds`
//! times, a Burstable pod and then a Guaranteed pod with 1 exclusive CPU are started, each timed as
//! the kubelet sees it: RunPodSandbox + CreateContainer + StartContainer. After the Guaranteed pod
//! the bench waits until no shared container is left on its CPU any more and reports that wait
//! (the window in which shared containers may still run on the new exclusive CPU), and how long a
//! shared pod started inside that window takes (it waits for containerd's NRI lock).
//!
//! `cargo bench -p weft-agent --bench pod_start` runs the full measurement; `cargo test --benches`
//! runs a small smoke run.

#![allow(clippy::unwrap_used)] // benchmark setup

mod support;

use support::{NoDevices, Pods, container, k8s_pod, sandbox};

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use weft_agent::kubelet::PodSource;
use weft_agent::orm::OrmConfig;
use weft_agent::policy::TopologyPolicy;
use weft_agent::service::{self, Mode, ServiceConfig};
use weft_nri::api;
use weft_nri::plugin::{PluginOptions, SocketSource};
use weft_nri_harness::{HarnessEvent, Runtime, RuntimeOptions};
use weft_topology::{CpuLayout, CpuSet};

fn cpus_of(c: &api::Container) -> CpuSet {
    c.linux.resources.cpu.cpus.parse().unwrap_or_default()
}

/// One node: the harness runtime and weft's service on it.
struct Node {
    runtime: Runtime,
    pods: Arc<Pods>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), service::ServiceError>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(update_cost: Duration) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nri.sock");
        let runtime =
            Runtime::start(&socket, RuntimeOptions { record_calls: false, update_cost, ..RuntimeOptions::default() })
                .await
                .unwrap();
        let pods = Arc::new(Pods::default());
        let mut nri = PluginOptions::new("weft", "10");
        nri.socket = SocketSource::Path(socket);
        let cfg = ServiceConfig {
            mode: Mode::Nri,
            layout: CpuLayout::synthetic(2, 1, 32, 2).unwrap(),
            orm: OrmConfig {
                reserved: "0,64".parse().unwrap(),
                policy: TopologyPolicy::BestEffort,
                ..OrmConfig::default()
            },
            locator: Arc::new(NoDevices),
            checkpoint: dir.path().join("orm.json"),
            nri,
            kubelet: Some(pods.clone() as Arc<dyn PodSource>),
            cgroups: None,
            cgroup_layout: weft_agent::cgroup::CgroupLayout::new(
                weft_agent::cgroup::CgroupDriver::Cgroupfs,
                weft_agent::cgroup::ContainerRuntime::Containerd,
            ),
            period: Duration::from_secs(3600),
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(service::run(cfg, stop.clone()));
        tokio::time::timeout(Duration::from_secs(30), runtime.wait_synchronized("10-weft"))
            .await
            .expect("weft never synchronized");
        Node { runtime, pods, stop, task, _dir: dir }
    }

    /// RunPodSandbox + CreateContainer + StartContainer of a new pod, as the kubelet starts it.
    async fn start_pod(&self, uid: &str, guaranteed: bool) -> (Duration, api::Container) {
        self.pods.0.lock().unwrap().push(k8s_pod(uid, if guaranteed { "1" } else { "100m" }, guaranteed));
        let t = Instant::now();
        self.runtime.run_pod_sandbox(sandbox(uid)).await.unwrap();
        let c = self.runtime.create_container(&format!("sb-{uid}"), container(uid, &format!("c-{uid}"))).await.unwrap();
        self.runtime.start_container(&c.id).await.unwrap();
        (t.elapsed(), c)
    }

    /// Waits until no container but `except` runs on any of `cpus`.
    async fn wait_off(&self, cpus: &CpuSet, shared: &[String], from: usize) {
        let on = |id: &String| {
            let c = self.runtime.container(id).unwrap();
            cpus_of(&c).iter().any(|x| cpus.contains(x))
        };
        let mut from = from;
        while shared.iter().any(on) {
            let (i, _) = tokio::time::timeout(
                Duration::from_secs(600),
                self.runtime.wait_event(from, |e| matches!(e, HarnessEvent::Unsolicited { .. })),
            )
            .await
            .expect("the shared pool never shrank");
            from = i + 1;
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn measure(n: usize, rounds: usize, cost: Duration) {
    let node = Node::start(cost).await;
    let mut shared_ids = Vec::with_capacity(n);
    for i in 0..n {
        let (_, c) = node.start_pod(&format!("s{i:03}"), false).await;
        shared_ids.push(c.id);
    }
    let (mut shared, mut exclusive, mut window, mut during) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (took, c) = node.start_pod(&format!("b{r}"), false).await;
        shared.push(took);
        shared_ids.push(c.id);

        let from = node.runtime.event_count();
        let (took, g) = node.start_pod(&format!("g{r}"), true).await;
        let ended = Instant::now();
        exclusive.push(took);
        let cpus = cpus_of(&g);
        assert_eq!(cpus.len(), 1, "the Guaranteed pod got no exclusive CPU");
        // A shared pod started right after, inside the window.
        let (took, c) = node.start_pod(&format!("w{r}"), false).await;
        during.push(took);
        shared_ids.push(c.id);
        node.wait_off(&cpus, &shared_ids, from).await;
        window.push(ended.elapsed());
    }
    let s = median(shared);
    let e = median(exclusive);
    println!(
        "| {n} | {:.1} | {:.1} | {:.2}x | {:.0} | {:.1} |",
        ms(s),
        ms(e),
        e.as_secs_f64() / s.as_secs_f64(),
        ms(median(window)),
        ms(median(during)),
    );
    node.stop().await;
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let arg = |name: &str| {
        let args: Vec<String> = std::env::args().collect();
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<u64>().ok())
    };
    let cost = Duration::from_millis(arg("--update-cost-ms").unwrap_or(if full { 25 } else { 1 }));
    let (sizes, rounds): (Vec<usize>, usize) = if full { (vec![50, 100, 200], 5) } else { (vec![10], 2) };
    let rounds = arg("--rounds").map_or(rounds, |r| r as usize);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("update cost {} ms per applied update; {rounds} rounds per size; medians", cost.as_millis());
    println!(
        "| shared containers | shared pod start (ms) | exclusive pod start (ms) | exclusive / shared | window until \
         the pool shrank (ms) | shared pod started in the window (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    rt.block_on(async {
        for n in sizes {
            measure(n, rounds, cost).await;
        }
    });
}
