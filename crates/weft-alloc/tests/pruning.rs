//! Branch and bound at the DP's top state changes nothing: on 16- and 17-GPU nodes (random,
//! all-equal, and a DGX-2-like node full of ties), with and without required GPUs, the whole
//! solution is the one of the plain DP.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;
use common::random_topology;
use weft_alloc::besteffort::{self, BestEffortOptions, TopPruning};
use weft_alloc::{PreparedNode, Request};
use weft_topology::model::uniform_node;
use weft_topology::{NodeTopology, PairLink, PcieRelation};

fn random_node(n: usize, max_nv: u8, seed: u64) -> NodeTopology {
    random_topology(n, max_nv, seed)
}

/// Every pair NV6 through switches; PCIe PIX by twos, PXB by fours, NODE by eights, else SYS.
fn dgx2_like(n: usize) -> NodeTopology {
    let mut node = uniform_node("dgx2-like", n, PairLink::default());
    for a in 0..n {
        for b in a + 1..n {
            let rel = if a / 2 == b / 2 {
                PcieRelation::Pix
            } else if a / 4 == b / 4 {
                PcieRelation::Pxb
            } else if a / 8 == b / 8 {
                PcieRelation::Node
            } else {
                PcieRelation::Sys
            };
            node.set_link(a, b, PairLink { pcie: Some(rel), nvlinks: 6 });
        }
    }
    node
}

fn solve(
    node: &PreparedNode,
    avail: &[usize],
    required: &[usize],
    k: usize,
    top_pruning: TopPruning,
) -> besteffort::Solution {
    let req = Request { count: k, available: avail, required };
    besteffort::solve(node, &req, &BestEffortOptions { top_pruning, ..BestEffortOptions::default() }).unwrap()
}

#[test]
fn pruned_and_plain_dp_agree_on_16_and_17_gpus() {
    let nodes = [
        random_node(16, 4, 16),
        random_node(17, 18, 5),
        uniform_node("uniform", 16, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 6 }),
        dgx2_like(16),
    ];
    for topo in &nodes {
        let node = PreparedNode::new(topo).unwrap();
        let n = node.len();
        // Available in a scrambled order (the order breaks ties), all GPUs free.
        let avail: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
        for k in [3, 5, 6, 7] {
            for required in [&[][..], &[avail[4]][..], &[avail[9], avail[2]][..]] {
                let plain = solve(&node, &avail, required, k, TopPruning::Never);
                for mode in [TopPruning::Auto, TopPruning::Always] {
                    let got = solve(&node, &avail, required, k, mode);
                    assert_eq!(got, plain, "{:?} k={k} required={required:?} {mode:?}", topo.name);
                }
            }
        }
    }
}
