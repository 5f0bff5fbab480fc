//! Request sizes real schedulers send, end to end over loopback HTTP: time to the answer and how
//! much the process's peak RSS (VmHWM, reset before each request) rose over its RSS before the
//! request. The body the client sends is built (and resident) before, and the client sends it from
//! one shared buffer; the server is the in-process extender over a cluster view of 5,000 nodes.
//!
//! - `volcano 1000x20` and `volcano 5000x30`: vc-scheduler's BatchNodeOrderFn body, every NodeInfo
//!   with its task pods (`tests/sizes`), against a cluster view of the same nodes;
//! - `kube 5000 Nodes`: kube-scheduler's prioritize with `nodeCacheCapable: false`, 5,000 Node
//!   objects with topology annotations;
//! - `bare 1.9M`: 1.9M bare Nodes (59 MiB), over the 10,000-node limit.
//!
//! Run: `cargo bench -p weft-extender --bench request_size` (prints one line per case).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/sizes/mod.rs"]
mod sizes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_extender::{ExtenderConfig, InMemoryView};

/// A field of /proc/self/status, KiB → bytes.
fn status(field: &str) -> usize {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

/// Reset the peak RSS (VmHWM) to the current RSS (Linux: `echo 5 > /proc/PID/clear_refs`).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

const MIB: f64 = (1 << 20) as f64;

fn view_of(names: &[String]) -> Arc<InMemoryView> {
    let view = Arc::new(InMemoryView::new());
    for (i, name) in names.iter().enumerate() {
        let t = if i % 2 == 0 { common::dgx1_v100(name) } else { common::a100_nvswitch(name) };
        view.insert_node(common::node(name, Some(&t), 8));
    }
    view
}

/// POSTs `body` `runs` times; prints the body size, the status and answer size, the median and
/// worst time, and the largest rise of the peak RSS over the RSS before one request.
async fn measure(case: &str, url: &str, body: Vec<u8>, runs: usize) {
    let client = reqwest::Client::new();
    let body = axum::body::Bytes::from(body);
    let size = body.len();
    let mut times = Vec::new();
    let mut peak = 0;
    let mut outcome = String::new();
    for _ in 0..runs {
        reset_peak();
        let base = status("VmRSS:");
        let start = Instant::now();
        let r = client.post(url).header("Content-Type", "application/json").body(body.clone()).send().await.unwrap();
        let code = r.status().as_u16();
        let text = r.text().await.unwrap();
        times.push(start.elapsed());
        peak = peak.max(status("VmHWM:").saturating_sub(base));
        outcome = format!("{code}, {} B answer{}", text.len(), if code == 200 { "" } else { ": " });
        if code != 200 || text.contains("at most") {
            outcome.push_str(text.trim().chars().take(100).collect::<String>().as_str());
        }
    }
    times.sort();
    println!(
        "{case}: body {:.1} MiB -> {outcome}; time median {:?}, max {:?} ({runs} runs); peak RSS +{:.1} MiB",
        size as f64 / MIB,
        times[times.len() / 2],
        times[times.len() - 1],
        peak as f64 / MIB
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let names: Vec<String> = (0..5_000).map(|i| format!("gpu-{i:05}")).collect();
        let cfg = ExtenderConfig { request_timeout: Duration::from_secs(30), ..ExtenderConfig::default() };
        let server = common::TestServer::start(view_of(&names), cfg).await;
        let task = sizes::task_info(&sizes::running_pod("w-0", "uid-w-0", ""), "", 1);
        let volcano = format!("{}/volcano/prioritize", server.base);

        // Warm the topology cache, as a running extender's is.
        measure("warm-up", &volcano, sizes::prioritize_body(&task, &names, 0), 1).await;
        measure("volcano 1000x20", &volcano, sizes::prioritize_body(&task, &names[..1_000], 20), 5).await;
        measure("volcano 5000x30", &volcano, sizes::prioritize_body(&task, &names, 30), 3).await;

        let pod = common::pending_pod_json("p", 4);
        let nodes: Vec<serde_json::Value> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let t = if i % 2 == 0 { common::dgx1_v100(n) } else { common::a100_nvswitch(n) };
                common::node_json(n, Some(&t), 8)
            })
            .collect();
        let kube = serde_json::to_vec(&common::args_with_nodes(pod.clone(), nodes)).unwrap();
        measure("kube 5000 Nodes /prioritize", &format!("{}/prioritize", server.base), kube.clone(), 5).await;
        measure("kube 5000 Nodes /filter", &format!("{}/filter", server.base), kube, 5).await;

        let bare = sizes::bare_nodes_body(&pod, 1_900_000);
        measure("bare 1.9M Nodes /prioritize", &format!("{}/prioritize", server.base), bare.clone(), 3).await;
        measure("bare 1.9M Nodes /filter", &format!("{}/filter", server.base), bare, 3).await;
        server.stop().await.unwrap();
    });
}
