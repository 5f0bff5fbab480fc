//! Best-effort allocation time: every k on 8 GPUs (DGX-1 Volta) and on 16 GPUs (a seeded random
//! topology), and k = 8 on 72 GPUs (an NVL72-like domain and a seeded random one; the heuristic
//! path — the gap to the proven bound is printed once).
//!
//! `cargo bench -p weft-alloc --bench besteffort -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use weft_alloc::{Optimality, Policy, PreparedNode, Request, allocate};
use weft_topology::NodeTopology;
use weft_topology::reference::dgx1_volta;

#[path = "../tests/common/mod.rs"]
mod common;

fn random_node(n: usize, max_nv: u8, seed: u64) -> NodeTopology {
    common::random_topology(n, max_nv, seed)
}

fn bench_node(c: &mut Criterion, group: &str, node: &PreparedNode, ks: impl Iterator<Item = usize>) {
    let all: Vec<usize> = (0..node.len()).collect();
    let mut g = c.benchmark_group(group);
    for k in ks {
        let req = Request { count: k, available: &all, required: &[] };
        if let Ok(a) = allocate(node, &Policy::BestEffort, &req)
            && let Optimality::Heuristic { objective, upper_bound } = a.optimality
        {
            eprintln!(
                "{group} k={k}: heuristic objective {objective}, bound {upper_bound}, gap {:.3}%",
                100.0 * a.optimality.gap()
            );
        }
        g.bench_with_input(BenchmarkId::new("k", k), &req, |b, req| {
            b.iter(|| allocate(black_box(node), &Policy::BestEffort, black_box(req)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let prep = |t: &NodeTopology| PreparedNode::new(t).unwrap_or_else(|e| panic!("{e}"));
    bench_node(c, "besteffort/8gpu-dgx1v", &prep(&dgx1_volta()), 1..=8);
    bench_node(c, "besteffort/16gpu-random", &prep(&random_node(16, 4, 16)), 1..=16);
    bench_node(c, "besteffort/72gpu-nvl72", &prep(&common::nvl72()), [8].into_iter());
    bench_node(c, "besteffort/72gpu-random", &prep(&random_node(72, 18, 72)), [8].into_iter());
}

criterion_group!(besteffort, benches);
criterion_main!(besteffort);
