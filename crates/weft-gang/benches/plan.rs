//! The gang plan at cluster scale: `cargo bench -p weft-gang`.
//!
//! - `plan/hgx-5000/64x8`: 5,000 8-GPU NVSwitch nodes, leaves of 32, spines of 8 leaves; about
//!   half the nodes wholly free, the rest with 0-6 GPUs free; a gang of 64 pods × 8 GPUs (the
//!   spine tier is the tightest that holds it).
//! - `plan/gb200-5004/64x4` and `16x4`: 278 GB200 NVL72 racks (5,004 trays, one clique each),
//!   leaves of 4 racks, spines of 8 leaves; three trays in four wholly free; 64 × 4 GPUs (a
//!   spine) and 16 × 4 (one clique).
//! - `cold`: the same 64 × 8 plan with a new set cache each time (the first plan a process makes).
//! - `model/labels-5000`: building the model from 5,000 nodes' labels.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use weft_alloc::SetQuality;
use weft_gang::builtin::gb200_nvl72_tray;
use weft_gang::network::CLIQUE_LABEL;
use weft_gang::{AllocSets, ClusterNode, Gang, LabelLevels, NetworkModel, NodeFree, TierConstraint, from_labels, plan};
use weft_topology::PairLink;
use weft_topology::model::uniform_node;

const SPINE: &str = "example.com/spine";
const LEAF: &str = "example.com/leaf";

fn mix(mut x: u64) -> u64 {
    // splitmix64: a fixed pseudo-random occupancy per node.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn hgx_nodes() -> Vec<ClusterNode> {
    (0..5000)
        .map(|i| {
            ClusterNode::new(
                &format!("node-{i:05}"),
                &[(SPINE, &format!("spine-{:02}", i / 256)), (LEAF, &format!("leaf-{:03}", i / 32))],
            )
        })
        .collect()
}

fn hgx_free(n: usize) -> Vec<NodeFree> {
    (0..n)
        .map(|i| {
            let r = mix(i as u64);
            let gpus = if r.is_multiple_of(2) { 0xff } else { (0xffu128 << (2 * (r >> 8) % 8 + 2)) & 0xff };
            NodeFree { gpus, vfs: BTreeMap::new() }
        })
        .collect()
}

fn gb200_nodes() -> Vec<ClusterNode> {
    (0..278 * 18)
        .map(|i| {
            let rack = i / 18;
            let clique = format!("{:08x}-0000-4000-8000-000000000000.1", rack);
            ClusterNode::new(
                &format!("tray-{i:05}"),
                &[
                    (SPINE, &format!("spine-{:02}", rack / 32)),
                    (LEAF, &format!("leaf-{:03}", rack / 4)),
                    (CLIQUE_LABEL, &clique),
                ],
            )
        })
        .collect()
}

fn gb200_free(n: usize) -> Vec<NodeFree> {
    (0..n)
        .map(|i| {
            let r = mix(i as u64);
            let gpus = if !r.is_multiple_of(4) { 0xf } else { (0xfu128 << ((r >> 8) % 4 + 1)) & 0xf };
            NodeFree { gpus, vfs: BTreeMap::new() }
        })
        .collect()
}

fn gang(members: usize, gpus: usize) -> Gang {
    Gang { members, gpus_per_member: gpus, constraint: TierConstraint::soft(), ..Gang::default() }
}

fn hgx() -> (NetworkModel, Vec<NodeFree>, AllocSets) {
    let nodes = hgx_nodes();
    let model = from_labels(&LabelLevels::new(&[SPINE, LEAF]), &nodes).expect("model");
    let free = hgx_free(nodes.len());
    let node = uniform_node("hgx", 8, PairLink { pcie: None, nvlinks: 18 });
    let sets = AllocSets::new(&[node], vec![0; nodes.len()], SetQuality::Ring).expect("sets");
    (model, free, sets)
}

fn bench(c: &mut Criterion) {
    let (model, free, mut sets) = hgx();
    let g = gang(64, 8);
    let p = plan(&model, &free, &g, &mut sets).expect("plan");
    eprintln!("hgx 64x8: {} {} ({} nodes)", p.tier, p.domain, p.nodes);
    c.bench_function("plan/hgx-5000/64x8", |b| b.iter(|| plan(&model, black_box(&free), &g, &mut sets)));
    let node = uniform_node("hgx", 8, PairLink { pcie: None, nvlinks: 18 });
    c.bench_function("plan/hgx-5000/64x8/cold", |b| {
        b.iter_batched(
            || {
                AllocSets::new(std::slice::from_ref(&node), vec![0; model.node_count()], SetQuality::Ring)
                    .expect("sets")
            },
            |mut s| plan(&model, black_box(&free), &g, &mut s),
            BatchSize::SmallInput,
        )
    });

    let nodes = gb200_nodes();
    let model = from_labels(&LabelLevels::new(&[SPINE, LEAF]).with_clique(), &nodes).expect("model");
    let free = gb200_free(nodes.len());
    let mut sets =
        AllocSets::new(&[gb200_nvl72_tray().expect("tray")], vec![0; nodes.len()], SetQuality::Ring).expect("sets");
    for (m, name) in [(64, "plan/gb200-5004/64x4"), (16, "plan/gb200-5004/16x4")] {
        let g = gang(m, 4);
        let p = plan(&model, &free, &g, &mut sets).expect("plan");
        eprintln!("gb200 {m}x4: {} {} ({} nodes)", p.tier, p.domain, p.nodes);
        c.bench_function(name, |b| b.iter(|| plan(&model, black_box(&free), &g, &mut sets)));
    }

    let nodes = hgx_nodes();
    let levels = LabelLevels::new(&[SPINE, LEAF]);
    c.bench_function("model/labels-5000", |b| b.iter(|| from_labels(&levels, black_box(&nodes))));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
