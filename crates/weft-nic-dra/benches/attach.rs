//! The NIC driver's sandbox hooks, timed: a prepared VF (a veth host end standing in, named as a VF
//! in a fake sysfs) moved into a fresh network namespace, configured (name, MTU, address, up) and
//! moved back, per cycle a new namespace (made and deleted outside the timing, as the runtime makes
//! it before RunPodSandbox). Four levels:
//!
//! - `kernel floor`: the bare move of the netdev (one `RTM_SETLINK` each way), what any driver that
//!   moves a netdev pays;
//! - `link steps`: weft-cni's shared `Host::attach` / `Host::detach` alone (netlink only);
//! - `hook`: `NicAttacher::attach_pod` / `detach_pod` (the pod's NICs looked up, sysfs read, the
//!   record written and synced before the move, removed after the move back);
//! - `NRI round trip`: RunPodSandbox / StopPodSandbox as the containerd-like harness runtime sees
//!   them, through weft's NRI plugin runtime over a unix socket.
//!
//! The claim status write is not timed: it goes to the API server in the background, after the
//! hook has answered (a no-op writer here).
//!
//! `cargo bench -p weft-nic-dra --bench attach` (root, iproute2); `WEFT_NIC_ATTACH_BENCH_CYCLES`
//! sets the cycles (default 200, after 10 warm-up cycles). Prints p50, p99, mean and max per call
//! in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/attach_common/mod.rs"]
mod attach_common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use attach_common::*;
use weft_cni::attach::{Host, PodLink};
use weft_cni::net::Netns;
use weft_cni::state::OriginalState;
use weft_nic_dra::attach::{AttachConfig, NicAttacher, PLUGIN_INDEX, PLUGIN_NAME};
use weft_nic_dra::prepared::ClaimRef;
use weft_nic_dra::status::{ClaimStatus, DeviceNetwork, StatusError};
use weft_nri::plugin::{self, PluginOptions, RuntimeHandle, SocketSource};
use weft_nri_harness::{Runtime, RuntimeOptions};

struct NoStatus;

#[async_trait]
impl ClaimStatus for NoStatus {
    async fn publish(&self, _claim: &ClaimRef, _devices: &[DeviceNetwork]) -> Result<(), StatusError> {
        Ok(())
    }
}

struct Stats {
    p50: f64,
    p99: f64,
    mean: f64,
    max: f64,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    Stats {
        p50: at(0.50),
        p99: at(0.99),
        mean: v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64,
        max: ms(*v.last().unwrap()),
    }
}

fn row(what: &str, v: Vec<Duration>) {
    let n = v.len();
    let s = stats(v);
    println!("{what:<34} {n:>6} {:>9.3} {:>9.3} {:>9.3} {:>9.3}", s.p50, s.p99, s.mean, s.max);
}

fn claim() -> ClaimRef {
    ClaimRef { namespace: "ml".into(), name: "bench".into(), uid: "u-bench".into() }
}

async fn link_steps(node: &Node, warm: usize, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (pci, vf) = (&node.vfs[0].0, node.vfs[0].1.name.clone());
    let host = Host::new().unwrap();
    let l = host.links().get(&vf).await.unwrap().unwrap();
    let original = OriginalState { host_ifname: vf.clone(), mac: l.mac, mtu: l.mtu, up: l.up, pf: None };
    let address = ["192.168.90.5/24".parse().unwrap()];
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let ns = NetnsGuard::new();
        let start = Instant::now();
        let netns = Netns::open(Path::new(&ns.path())).unwrap();
        let pod = netns.links().unwrap();
        let index = host.links().get(&vf).await.unwrap().unwrap().index;
        let want = PodLink { ifname: "net1", mac: None, mtu: Some(1400) };
        host.attach(&netns, &pod, pci, index, &original, &want, &address).await.unwrap();
        let attached = start.elapsed();
        let start = Instant::now();
        host.detach(Path::new(&ns.path()), &node.sysfs(), pci, "net1", &original).await.unwrap();
        let detached = start.elapsed();
        if i >= warm {
            ins.push(attached);
            outs.push(detached);
        }
    }
    (ins, outs)
}

/// The kernel's share: the bare move of the netdev into the namespace and back (one
/// `RTM_SETLINK` with `IFLA_NET_NS_FD` each way), nothing else.
async fn bare_move(node: &Node, warm: usize, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let vf = node.vfs[0].1.name.clone();
    let host = Host::new().unwrap();
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let ns = NetnsGuard::new();
        let netns = Netns::open(Path::new(&ns.path())).unwrap();
        let pod = netns.links().unwrap();
        let index = host.links().get(&vf).await.unwrap().unwrap().index;
        let start = Instant::now();
        host.links().move_to(index, &vf, &netns).await.unwrap();
        let moved_in = start.elapsed();
        let index = pod.get(&vf).await.unwrap().unwrap().index;
        let start = Instant::now();
        pod.move_to(index, &vf, host.netns()).await.unwrap();
        let moved_out = start.elapsed();
        if i >= warm {
            ins.push(moved_in);
            outs.push(moved_out);
        }
    }
    (ins, outs)
}

async fn hook(node: &Node, warm: usize, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let prepared = Arc::new(Prepared::default());
    let cfg = AttachConfig { state_dir: node.state(), sysfs_root: node.sysfs(), ..AttachConfig::default() };
    let attacher = NicAttacher::new(prepared.clone(), Arc::new(NoStatus), cfg);
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let ns = NetnsGuard::new();
        let uid = format!("bench-hook-{i}");
        prepared.set(&uid, vec![nic(&claim(), &uid, (&node.vfs[0].0, 0), "192.168.91.5/24", None, Some(1400))]);
        let sb = sandbox(&uid, "bench", Some(&ns.path()));
        let start = Instant::now();
        attacher.attach_pod(&sb).await.unwrap();
        let attached = start.elapsed();
        let start = Instant::now();
        let errors = attacher.detach_pod(&sb).await;
        let detached = start.elapsed();
        assert!(errors.is_empty(), "{errors:?}");
        if i >= warm {
            ins.push(attached);
            outs.push(detached);
        }
    }
    (ins, outs)
}

async fn nri(node: &Node, warm: usize, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let opts = RuntimeOptions { record_calls: false, ..RuntimeOptions::default() };
    let runtime = Runtime::start(&socket, opts).await.unwrap();
    let prepared = Arc::new(Prepared::default());
    let cfg = AttachConfig { state_dir: dir.path().join("state"), sysfs_root: node.sysfs(), ..AttachConfig::default() };
    let handler = Arc::new(NicAttacher::new(prepared.clone(), Arc::new(NoStatus), cfg));
    let mut popts = PluginOptions::new(PLUGIN_NAME, PLUGIN_INDEX);
    popts.socket = SocketSource::Path(socket);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(plugin::run(popts, handler, RuntimeHandle::new(), stop.clone()));
    runtime.wait_synchronized(&format!("{PLUGIN_INDEX}-{PLUGIN_NAME}")).await;
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let ns = NetnsGuard::new();
        let uid = format!("bench-nri-{i}");
        prepared.set(&uid, vec![nic(&claim(), &uid, (&node.vfs[0].0, 0), "192.168.92.5/24", None, Some(1400))]);
        let start = Instant::now();
        runtime.run_pod_sandbox(sandbox(&uid, "bench", Some(&ns.path()))).await.unwrap();
        let attached = start.elapsed();
        let start = Instant::now();
        runtime.stop_pod_sandbox(&format!("sb-{uid}")).await.unwrap();
        let detached = start.elapsed();
        runtime.remove_pod_sandbox(&format!("sb-{uid}")).await.unwrap();
        if i >= warm {
            ins.push(attached);
            outs.push(detached);
        }
    }
    stop.cancel();
    let _ = task.await;
    (ins, outs)
}

fn main() {
    if !can_netns() {
        return;
    }
    let n: usize = std::env::var("WEFT_NIC_ATTACH_BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let warm = 10;
    let cpus = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let node = Node::new(1);
        println!("weft-nic-dra attach bench: {n} cycles after {warm} warm-up, {cpus} CPUs, a veth as the VF");
        println!("{:<34} {:>6} {:>9} {:>9} {:>9} {:>9}", "call (ms)", "n", "p50", "p99", "mean", "max");
        let (i, o) = bare_move(&node, warm, n).await;
        row("kernel floor: bare move in", i);
        row("kernel floor: bare move out", o);
        let (i, o) = link_steps(&node, warm, n).await;
        row("link steps: into the pod", i);
        row("link steps: back to the host", o);
        let (i, o) = hook(&node, warm, n).await;
        row("hook: attach_pod", i);
        row("hook: detach_pod", o);
        let (i, o) = nri(&node, warm, n).await;
        row("NRI round trip: RunPodSandbox", i);
        row("NRI round trip: StopPodSandbox", o);
    });
}
