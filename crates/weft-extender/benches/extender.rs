//! Prioritize over 5,000 8-GPU nodes for a 4-GPU pod.
//!
//! - `prioritize/pure/*`: `decision::prioritize` alone (a fresh score cache per call), nodes already
//!   prepared. `two-topologies`: DGX-1 V100 and A100 NVSwitch nodes alternating, as real clusters
//!   have few SKUs; `unique-topologies`: every node's PCIe relations differ, so no two nodes share a
//!   best-effort result (the worst case).
//! - `prioritize/pure/gpus-and-vfs`: the same 5,000 nodes' worth for a pod asking 2 GPUs and 1
//!   SR-IOV VF: 4-GPU two-switch nodes with 4 VFs per NIC, NICs beside the GPUs on every other node,
//!   0–2 GPUs and 0–3 VFs in use; every node runs the joint GPU + VF decision.
//! - `prioritize/request`: a 5,000-name `NodeNames` request end to end without the socket: JSON
//!   decode, topology cache lookups, GPU accounting from bound pods, decisions, JSON encode.
//! - `bind/decide`: one bind on the same 5,000-node cluster (pod read, ledger, the node's GPU
//!   accounting, best-effort set, the Binding's annotations) with an in-memory API in place of the
//!   API server; `bind/cycle`: filter + prioritize over all 5,000 nodes, then bind on the best, as
//!   kube-scheduler drives one pod. Both also print p50/p99 over 2,000 timed runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use weft_alloc::PreparedNode;
use weft_extender::decision::{Deadline, NodeState, NodeVfs, PodAsk, prioritize, prioritize_pod_until};
use weft_extender::wire::{ExtenderArgs, ExtenderBindingArgs};
use weft_extender::{ExtenderConfig, ExtenderState, InMemoryView};

const NODES: usize = 5_000;
const REQUEST: u64 = 4;

/// Deterministic GPUs-in-use mask for node `i`: 0 to 4 of 8 GPUs.
fn used_mask(i: usize) -> u128 {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut mask = 0u128;
    let k = (x % 5) as usize;
    while (mask.count_ones() as usize) < k {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        mask |= 1 << (x % 8);
    }
    mask
}

fn topology(i: usize) -> weft_topology::NodeTopology {
    let name = format!("gpu-{i:05}");
    if i.is_multiple_of(2) { common::dgx1_v100(&name) } else { common::a100_nvswitch(&name) }
}

/// A DGX-1 V100 whose non-NVLink pairs carry a PCIe relation pattern unique to `i`.
fn unique_topology(i: usize) -> weft_topology::NodeTopology {
    use weft_topology::{PairLink, PcieRelation};
    let mut t = common::dgx1_v100(&format!("u-{i:05}"));
    let mut code = i;
    for a in 0..8 {
        for b in (a + 1)..8 {
            if t.link(a, b).nvlinks == 0 {
                let rel = [PcieRelation::Sys, PcieRelation::Node, PcieRelation::Phb][code % 3];
                code /= 3;
                t.set_link(a, b, PairLink { pcie: Some(rel), nvlinks: 0 });
            }
        }
    }
    t
}

fn bench_pure(c: &mut Criterion) {
    let cfg = ExtenderConfig::default();
    let two: Vec<PreparedNode> = (0..NODES).map(|i| PreparedNode::new(&topology(i)).unwrap()).collect();
    let two: Vec<NodeState<'_>> =
        two.iter().enumerate().map(|(i, p)| NodeState::Known { prepared: p, used: used_mask(i), vfs: None }).collect();
    let unique: Vec<PreparedNode> = (0..NODES).map(|i| PreparedNode::new(&unique_topology(i)).unwrap()).collect();
    let unique: Vec<NodeState<'_>> = unique
        .iter()
        .enumerate()
        .map(|(i, p)| NodeState::Known { prepared: p, used: used_mask(i), vfs: None })
        .collect();
    let mut g = c.benchmark_group("prioritize/pure");
    g.bench_function("two-topologies", |b| b.iter(|| prioritize(black_box(REQUEST), black_box(&two), &cfg)));
    g.sample_size(20);
    g.bench_function("unique-topologies", |b| b.iter(|| prioritize(black_box(REQUEST), black_box(&unique), &cfg)));
    g.finish();
    bench_vfs(c, &cfg);
}

fn bench_vfs(c: &mut Criterion, cfg: &ExtenderConfig) {
    use weft_topology::PcieRelation;
    let topologies: Vec<weft_topology::NodeTopology> = (0..NODES)
        .map(|i| {
            let nic = if i.is_multiple_of(2) { PcieRelation::Pix } else { PcieRelation::Node };
            common::two_switches(&format!("v-{i:05}"), nic, 4)
        })
        .collect();
    let prepared: Vec<PreparedNode> = topologies.iter().map(|t| PreparedNode::new(t).unwrap()).collect();
    // Node i: GPUs (i % 3) of GPU0-1 in use, (i % 4) VFs of NIC0 in use.
    let vfs_used: Vec<std::collections::BTreeSet<String>> =
        (0..NODES).map(|i| (0..i % 4).map(|f| format!("0000:0c:00.{}", f + 2)).collect()).collect();
    let nodes: Vec<NodeState<'_>> = (0..NODES)
        .map(|i| NodeState::Known {
            prepared: &prepared[i],
            used: (1u128 << (i % 3)) - 1,
            vfs: Some(NodeVfs { topology: &topologies[i], used: &vfs_used[i] }),
        })
        .collect();
    let ask = PodAsk { gpus: 2, vfs: BTreeMap::from([("fabric".to_string(), 1)]) };
    let mut g = c.benchmark_group("prioritize/pure");
    g.bench_function("gpus-and-vfs", |b| {
        b.iter(|| {
            let mut cache = weft_alloc::ScoreCache::with_capacity(NODES);
            prioritize_pod_until(black_box(&ask), black_box(&nodes), cfg, &mut cache, Deadline::NEVER).unwrap()
        })
    });
    g.finish();
}

/// The 5,000-node view (bound pods hold `used_mask(i)`) and its node names.
fn cluster_view() -> (Arc<InMemoryView>, Vec<String>) {
    let view = Arc::new(InMemoryView::new());
    let mut names = Vec::with_capacity(NODES);
    for i in 0..NODES {
        let t = topology(i);
        let name = t.name.clone().unwrap();
        view.insert_node(common::node(&name, Some(&t), 8));
        let used = used_mask(i);
        if used != 0 {
            let ids: Vec<usize> = (0..8).filter(|g| used & (1 << g) != 0).collect();
            let ids = ids.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            let gpus = used.count_ones();
            view.insert_pod(common::bound_pod(&format!("job-{i}"), &name, gpus, Some(&ids), "2026-01-05T09:00:00Z"));
        }
        names.push(name);
    }
    (view, names)
}

fn bench_request(c: &mut Criterion) {
    let (view, names) = cluster_view();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let body = serde_json::to_vec(&common::args_with_names(common::pending_pod_json("p", REQUEST as u32), &name_refs))
        .unwrap();
    let state = ExtenderState::new(view, ExtenderConfig::default());
    // Warm the topology cache, as a running extender's is.
    let args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
    state.prioritize(&args, false).unwrap();
    let mut g = c.benchmark_group("prioritize");
    g.sample_size(30);
    g.bench_function("request", |b| {
        b.iter(|| {
            let args: ExtenderArgs = serde_json::from_slice(black_box(&body)).unwrap();
            let list = state.prioritize(&args, false).unwrap();
            serde_json::to_vec(&list).unwrap()
        })
    });
    g.finish();
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}

fn bench_bind(c: &mut Criterion) {
    let (view, names) = cluster_view();
    let pod_json = common::pending_pod_json("p", 1);
    let pod: Pod = serde_json::from_value(pod_json.clone()).unwrap();
    // Reservations expire at once: every run decides against the same cluster, not one that fills.
    let cfg = ExtenderConfig { reservation_ttl: Duration::from_nanos(1), ..ExtenderConfig::default() };
    let state = ExtenderState::new(view, cfg).with_binder(Arc::new(common::MemoryApi { pod }));
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let args = |i: usize| ExtenderBindingArgs {
        pod_name: "p".into(),
        pod_namespace: "ml".into(),
        pod_uid: "uid-p".into(),
        node: names[i % names.len()].clone(),
    };
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let request: ExtenderArgs = serde_json::from_value(common::args_with_names(pod_json, &name_refs)).unwrap();
    let cycle = |i: usize| {
        let passed = state.filter(request.clone()).node_names.unwrap_or_default();
        let scored = state.prioritize(&ExtenderArgs { node_names: Some(passed), ..request.clone() }, false).unwrap();
        let best = scored.iter().max_by_key(|h| h.score).unwrap().host.clone();
        runtime.block_on(state.bind(&ExtenderBindingArgs { node: best, ..args(i) }))
    };
    // Warm the topology cache.
    assert_eq!(cycle(0).error, "");

    let mut g = c.benchmark_group("bind");
    let mut i = 0;
    g.bench_function("decide", |b| {
        b.iter(|| {
            i += 1;
            runtime.block_on(state.bind(black_box(&args(i))))
        })
    });
    g.sample_size(20);
    g.bench_function("cycle", |b| {
        b.iter(|| {
            i += 1;
            cycle(i)
        })
    });
    g.finish();

    let timed = |f: &mut dyn FnMut(usize)| {
        (0..2_000)
            .map(|i| {
                let t = Instant::now();
                f(i);
                t.elapsed()
            })
            .collect::<Vec<_>>()
    };
    let (p50, p99) = percentiles(timed(&mut |i| assert_eq!(runtime.block_on(state.bind(&args(i))).error, "")));
    println!("bind/decide over 2,000 binds: p50 {p50:?}, p99 {p99:?}");
    let (p50, p99) = percentiles(timed(&mut |i| assert_eq!(cycle(i).error, "")));
    println!("bind/cycle (filter + prioritize over 5,000 nodes + bind), 2,000 pods: p50 {p50:?}, p99 {p99:?}");
}

criterion_group!(benches, bench_pure, bench_request, bench_bind);
criterion_main!(benches);
