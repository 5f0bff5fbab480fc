//! Scoring 5,000 8-GPU nodes for a 4-GPU pod: three topologies (DGX-1 Volta, HGX A100 NVSwitch,
//! PCIe-only), each node with a seeded random free set of at least 4 GPUs. Measured without a cache,
//! with a cold cache (new for every pass), and with a warm cache.
//!
//! `cargo bench -p weft-alloc --bench score -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use weft_alloc::{PreparedNode, ScoreCache, ScoreConfig, score_node};
use weft_topology::model::uniform_node;
use weft_topology::reference::dgx1_volta;
use weft_topology::{NodeTopology, PairLink, PcieRelation};

fn halves(node: &mut NodeTopology, near: PcieRelation, mid: PcieRelation, nvlinks: u8) {
    for a in 0..8 {
        for b in a + 1..8 {
            let rel = if a / 4 != b / 4 {
                PcieRelation::Sys
            } else if a / 2 == b / 2 {
                near
            } else {
                mid
            };
            node.set_link(a, b, PairLink { pcie: Some(rel), nvlinks });
        }
    }
}

fn hgx_a100() -> NodeTopology {
    let mut node = uniform_node("hgx-a100", 8, PairLink::default());
    halves(&mut node, PcieRelation::Pxb, PcieRelation::Node, 12);
    node
}

fn pcie_only() -> NodeTopology {
    let mut node = uniform_node("pcie", 8, PairLink::default());
    halves(&mut node, PcieRelation::Pix, PcieRelation::Pxb, 0);
    node
}

struct Cluster {
    topologies: Vec<PreparedNode>,
    /// (topology index, free GPUs)
    nodes: Vec<(usize, Vec<usize>)>,
}

fn cluster() -> Cluster {
    let topologies: Vec<PreparedNode> = [dgx1_volta(), hgx_a100(), pcie_only()]
        .iter()
        .map(|t| PreparedNode::new(t).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut state = 0x5c0e_u64;
    let mut next = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut nodes = Vec::with_capacity(5000);
    while nodes.len() < 5000 {
        let mask = next() & 0xff;
        if mask.count_ones() < 4 {
            continue;
        }
        let free: Vec<usize> = (0..8).filter(|g| mask >> g & 1 == 1).collect();
        nodes.push(((next() % 3) as usize, free));
    }
    Cluster { topologies, nodes }
}

fn benches(c: &mut Criterion) {
    let cl = cluster();
    let cfg = ScoreConfig::default();
    let mut g = c.benchmark_group("score/5000x8gpu-q4");
    g.bench_function("no-cache", |b| {
        b.iter(|| {
            let mut total = 0u64;
            for (t, free) in &cl.nodes {
                if let Ok(f) = score_node(&cl.topologies[*t], black_box(free), 4, &cfg) {
                    total += u64::from(f.score);
                }
            }
            total
        })
    });
    g.bench_function("cold-cache", |b| {
        b.iter(|| {
            let mut cache = ScoreCache::new();
            let mut total = 0u64;
            for (t, free) in &cl.nodes {
                if let Ok(f) = cache.score(&cl.topologies[*t], black_box(free), 4, &cfg) {
                    total += u64::from(f.score);
                }
            }
            total
        })
    });
    let mut warm = ScoreCache::new();
    for (t, free) in &cl.nodes {
        let _ = warm.score(&cl.topologies[*t], free, 4, &cfg);
    }
    g.bench_function("warm-cache", |b| {
        b.iter(|| {
            let mut total = 0u64;
            for (t, free) in &cl.nodes {
                if let Ok(f) = warm.score(&cl.topologies[*t], black_box(free), 4, &cfg) {
                    total += u64::from(f.score);
                }
            }
            total
        })
    });
    g.finish();
}

criterion_group!(score, benches);
criterion_main!(score);
