//! NRI round-trip latency with weft's real handler: the containerd-like harness runtime
//! (`weft-nri-harness`, calls not recorded) on a unix socket in a temporary directory, weft's plugin
//! (`Manager` over a `ResourceManager` on a synthetic 2-socket 128-CPU layout, CPUs 0 and 64
//! reserved, `best-effort` policy, a real `Checkpoint` next to the socket, pod specs from an
//! in-memory pod list) connected and synchronized, then 200 pods with one container each (1 in 4
//! Guaranteed with 1–2 exclusive CPUs, the others Burstable in the shared pool).
//!
//! Measured from the runtime's side (the time `Runtime::<call>` takes, socket and ttrpc included):
//!
//! - `CreateContainer`: a further container created (timed) and removed (not timed) in one of the
//!   200 existing pods, in turn; steady state, so the answer carries no updates for other containers.
//! - `CreateContainer` of a new Guaranteed pod: the first container of a Guaranteed pod just
//!   admitted; its answer carries no updates of other containers (issue #24 item 4), and the
//!   `UpdateContainers` that then moves every Burstable container off the new exclusive CPUs (in
//!   batches of `UPDATE_BATCH`) is timed on its own, from weft's side.
//! - `RunPodSandbox`: admission of a new pod (Guaranteed 2 CPUs, or Burstable) including the
//!   checkpoint write with its two fsyncs (file, directory); the pod is removed again (not timed).
//!
//! The checkpoint lives in the system temporary directory (`TMPDIR`): its filesystem is printed,
//! since fsync on tmpfs costs nothing. `cargo bench -p weft-agent --bench nri_roundtrip` runs the
//! full measurement; without `--bench` (`cargo test --benches`) a small smoke run checks the wiring.

#![allow(clippy::unwrap_used)] // benchmark setup

mod support;

use support::{NoDevices, Pods, container, k8s_pod, sandbox};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use weft_agent::agent::{Manager, PodCatalog};
use weft_agent::checkpoint::Checkpoint;
use weft_agent::kubelet::PodSource;
use weft_agent::nri::{NriHandler, Translation, UPDATE_BATCH, reconcile_once};
use weft_agent::orm::{OrmConfig, ResourceManager};
use weft_agent::policy::TopologyPolicy;
use weft_nri::api;
use weft_nri::event::{Event, EventMask};
use weft_nri::plugin::{self, ContainerCreation, Handler, HandlerError, PluginOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{Runtime, RuntimeOptions};
use weft_topology::CpuLayout;

const PLUGIN: &str = "10-weft";

/// The transport floor: a plugin that answers `CreateContainer` with nothing.
struct Noop;
#[async_trait]
impl Handler for Noop {
    fn events(&self) -> EventMask {
        [Event::CreateContainer].into_iter().collect()
    }
    async fn synchronize(
        &self,
        _pods: Vec<api::PodSandbox>,
        _containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }
    async fn create_container(
        &self,
        _pod: api::PodSandbox,
        _container: api::Container,
    ) -> Result<ContainerCreation, HandlerError> {
        Ok(ContainerCreation::default())
    }
}

/// `CreateContainer` round trips against a no-op plugin with the same pods and containers in the
/// runtime: what the harness, the socket and ttrpc cost without weft's work.
async fn floor(sizes: &Sizes) -> Series {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime =
        Runtime::start(&socket, RuntimeOptions { record_calls: false, ..RuntimeOptions::default() }).await.unwrap();
    let mut opts = PluginOptions::new("noop", "10");
    opts.socket = SocketSource::Path(socket.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(plugin::run(opts, Arc::new(Noop), RuntimeHandle::new(), stop.clone()));
    tokio::time::timeout(Duration::from_secs(30), runtime.wait_synchronized("10-noop"))
        .await
        .expect("never synchronized");
    for i in 0..sizes.pods {
        let uid = resident(i).0;
        runtime.run_pod_sandbox(sandbox(&uid)).await.unwrap();
        runtime.create_container(&format!("sb-{uid}"), container(&uid, &format!("c-{uid}"))).await.unwrap();
    }
    let mut out = Series::new("floor: CreateContainer, no-op plugin", sizes.create);
    for n in 0..sizes.warmup + sizes.create {
        let uid = resident(n % sizes.pods).0;
        let id = format!("x-{n}");
        let t = Instant::now();
        runtime.create_container(&format!("sb-{uid}"), container(&uid, &id)).await.unwrap();
        let took = t.elapsed();
        runtime.remove_container(&id).await.unwrap();
        if n >= sizes.warmup {
            out.samples.push(took);
        }
    }
    stop.cancel();
    task.abort();
    let _ = task.await;
    out
}

/// Pod `i` of the resident set: every 4th Guaranteed with 1 or 2 CPUs, the others Burstable.
fn resident(i: usize) -> (String, Pod) {
    let uid = format!("pod-{i:03}");
    let pod = if i.is_multiple_of(4) {
        k8s_pod(&uid, if i.is_multiple_of(8) { "1" } else { "2" }, true)
    } else {
        k8s_pod(&uid, "100m", false)
    };
    (uid, pod)
}

struct Sizes {
    pods: usize,
    warmup: usize,
    create: usize,
    fanout: usize,
    sandbox: usize,
}

/// Latencies of one kind of call.
struct Series {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Series {
    fn new(name: &'static str, n: usize) -> Series {
        Series { name, samples: Vec::with_capacity(n) }
    }

    fn row(&mut self) -> String {
        self.samples.sort();
        let s = &self.samples;
        let at = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize];
        let us = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e6);
        format!(
            "{:<44} {:>6} {:>9} {:>9} {:>9} {:>9}",
            self.name,
            s.len(),
            us(at(0.5)),
            us(at(0.9)),
            us(at(0.99)),
            us(s[s.len() - 1])
        )
    }
}

/// The filesystem type holding `path` (longest mount-point prefix in /proc/mounts).
fn filesystem_of(path: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || !path.starts_with(f[1]) {
            continue;
        }
        if best.as_ref().is_none_or(|(len, _)| f[1].len() >= *len) {
            best = Some((f[1].len(), format!("{} on {}", f[2], f[1])));
        }
    }
    best.map_or_else(|| "unknown".into(), |(_, fs)| fs)
}

fn machine_facts(dir: &Path, workers: usize) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("machine: nproc {nproc}, {model}, kernel {}", kernel.trim());
    println!("tokio: multi-thread, {workers} workers; checkpoint dir {} ({})", dir.display(), filesystem_of(dir));
}

async fn bench(sizes: Sizes, workers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime =
        Runtime::start(&socket, RuntimeOptions { record_calls: false, ..RuntimeOptions::default() }).await.unwrap();

    let source = Arc::new(Pods::default());
    {
        let mut pods = source.0.lock().unwrap();
        pods.extend((0..sizes.pods).map(|i| resident(i).1));
        pods.push(k8s_pod("new-g", "2", true));
        pods.push(k8s_pod("new-b", "250m", false));
    }
    let layout = CpuLayout::synthetic(2, 1, 32, 2).unwrap().with_memory_per_numa(512 << 30);
    let config =
        OrmConfig { reserved: "0,64".parse().unwrap(), policy: TopologyPolicy::BestEffort, ..OrmConfig::default() };
    let rm = ResourceManager::new(layout, config).unwrap();
    let catalog = Arc::new(PodCatalog::new(Some(source as Arc<dyn PodSource>)));
    let store = Arc::new(Checkpoint::new(dir.path().join("orm.json")));
    let manager = Arc::new(Manager::new(rm, store, catalog, Arc::new(NoDevices)));
    let translation = Translation { unified: true };
    let handler = Arc::new(NriHandler::new(manager.clone(), translation));
    let mut opts = PluginOptions::new("weft", "10");
    opts.socket = SocketSource::Path(socket.clone());
    let handle = RuntimeHandle::new();
    let stop = CancellationToken::new();
    let task = tokio::spawn(plugin::run(opts, handler, handle.clone(), stop.clone()));
    tokio::time::timeout(Duration::from_secs(30), runtime.wait_synchronized(PLUGIN))
        .await
        .expect("plugin never synchronized");

    // The resident pods, each with its container.
    for i in 0..sizes.pods {
        let uid = resident(i).0;
        runtime.run_pod_sandbox(sandbox(&uid)).await.unwrap();
        runtime.create_container(&format!("sb-{uid}"), container(&uid, &format!("c-{uid}"))).await.unwrap();
    }
    let exclusive = manager.state().pods.iter().map(|p| p.exclusive.len()).sum::<usize>();
    println!(
        "node: 128 CPUs (2 sockets x 32 cores x 2 threads), reserved 0,64, best-effort; {} pods / {} containers \
         resident ({} Guaranteed holding {exclusive} exclusive CPUs)",
        manager.admitted().len(),
        manager.containers().len(),
        sizes.pods.div_ceil(4),
    );
    // The resident Guaranteed pods moved the pool while the others were created: push it once
    // (the service's loop does so after each start), then nothing is stale.
    reconcile_once(&manager, &handle, translation).await.unwrap();
    assert_eq!(reconcile_once(&manager, &handle, translation).await.unwrap(), 0, "nothing stale before measuring");

    // CreateContainer into an existing pod, steady state.
    let mut create = Series::new("CreateContainer (existing pod, steady)", sizes.create);
    let mut create_g = Series::new("  of which into a Guaranteed pod", sizes.create / 4 + 1);
    let mut create_b = Series::new("  of which into a Burstable pod", sizes.create);
    for n in 0..sizes.warmup + sizes.create {
        let i = n % sizes.pods;
        let uid = resident(i).0;
        let id = format!("x-{n}");
        let t = Instant::now();
        let c = runtime.create_container(&format!("sb-{uid}"), container(&uid, &id)).await.unwrap();
        let took = t.elapsed();
        assert!(!c.linux.resources.cpu.cpus.is_empty(), "weft set no cpuset on {id}");
        runtime.remove_container(&id).await.unwrap();
        if n >= sizes.warmup {
            create.samples.push(took);
            (if i.is_multiple_of(4) { &mut create_g } else { &mut create_b }).samples.push(took);
        }
    }

    // In process, no NRI: the scan of every tracked container's wanted settings that each
    // CreateContainer answer does (`Manager::stale`, for the updates to other containers).
    let mut stale = Series::new("  in process: Manager::stale() scan", sizes.create);
    for n in 0..sizes.warmup + sizes.create {
        let t = Instant::now();
        let moved = std::hint::black_box(manager.stale()).len();
        let took = t.elapsed();
        assert_eq!(moved, 0);
        if n >= sizes.warmup {
            stale.samples.push(took);
        }
    }

    // RunPodSandbox: admit + checkpoint fsyncs.
    let mut run_g = Series::new("RunPodSandbox Guaranteed 2 CPUs (+fsync)", sizes.sandbox);
    let mut run_b = Series::new("RunPodSandbox Burstable (+fsync)", sizes.sandbox);
    let mut remove = Series::new("RemovePodSandbox (release +fsync)", 2 * sizes.sandbox);
    for n in 0..sizes.warmup + sizes.sandbox {
        for (uid, series) in [("new-g", &mut run_g), ("new-b", &mut run_b)] {
            let t = Instant::now();
            runtime.run_pod_sandbox(sandbox(uid)).await.unwrap();
            let took = t.elapsed();
            let t = Instant::now();
            runtime.remove_pod_sandbox(&format!("sb-{uid}")).await.unwrap();
            let took_remove = t.elapsed();
            if n >= sizes.warmup {
                series.samples.push(took);
                remove.samples.push(took_remove);
            }
        }
    }
    // The shared pool is back to what the containers have: nothing to push.
    assert_eq!(reconcile_once(&manager, &handle, translation).await.unwrap(), 0);

    // A Guaranteed pod's first container, then the push that moves every shared container.
    let shared = manager.containers().len() - sizes.pods.div_ceil(4);
    let mut fanout = Series::new("CreateContainer (new Guaranteed pod)", sizes.fanout);
    let mut shrink = Series::new("  then UpdateContainers (pool shrink)", sizes.fanout);
    for n in 0..sizes.warmup.min(50) + sizes.fanout {
        runtime.run_pod_sandbox(sandbox("new-g")).await.unwrap();
        let t = Instant::now();
        runtime.create_container("sb-new-g", container("new-g", "c-new-g")).await.unwrap();
        let took = t.elapsed();
        let t = Instant::now();
        let pushed = reconcile_once(&manager, &handle, translation).await.unwrap();
        let took_shrink = t.elapsed();
        assert_eq!(pushed, shared, "every shared container moves off the new exclusive CPUs");
        runtime.remove_pod_sandbox("sb-new-g").await.unwrap();
        // Give the CPUs back to the shared containers (not timed).
        let pushed = reconcile_once(&manager, &handle, translation).await.unwrap();
        assert_eq!(pushed, shared, "every shared container moves back");
        if n >= sizes.warmup.min(50) {
            fanout.samples.push(took);
            shrink.samples.push(took_shrink);
        }
    }

    let mut floor = floor(&sizes).await;

    println!();
    println!(
        "{:<44} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "round trip (runtime side), microseconds", "n", "p50", "p90", "p99", "max"
    );
    for s in [
        &mut create,
        &mut create_g,
        &mut create_b,
        &mut stale,
        &mut floor,
        &mut fanout,
        &mut shrink,
        &mut run_g,
        &mut run_b,
        &mut remove,
    ] {
        println!("{}", s.row());
    }
    println!("(the pool shrink updates {shared} shared containers, {} per UpdateContainers)", UPDATE_BATCH);
    println!();
    let p99 = |s: &Series| s.samples[((s.samples.len() as f64 - 1.0) * 0.99).round() as usize];
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "targets: CreateContainer p99 <= 1 ms: {} ({:.0} us; new Guaranteed pod {:.0} us); RunPodSandbox p99 <= 5 ms: {} \
         ({:.0} us Guaranteed)",
        verdict(p99(&create) <= Duration::from_millis(1)),
        p99(&create).as_secs_f64() * 1e6,
        p99(&fanout).as_secs_f64() * 1e6,
        verdict(p99(&run_g).max(p99(&run_b)) <= Duration::from_millis(5)),
        p99(&run_g).as_secs_f64() * 1e6,
    );
    machine_facts(dir.path(), workers);

    stop.cancel();
    task.abort();
    let _ = task.await;
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes { pods: 200, warmup: 200, create: 2000, fanout: 500, sandbox: 1000 }
    } else {
        Sizes { pods: 20, warmup: 5, create: 40, fanout: 10, sandbox: 10 }
    };
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
    rt.block_on(bench(sizes, workers));
}
