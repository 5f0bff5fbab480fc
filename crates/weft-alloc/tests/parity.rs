//! Parity with go-gpuallocator's golden values (reference §1.7) on its own test topologies, and the
//! places where weft deliberately differs (k = 1, padded sets, empty results → typed errors).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{dgx1_pascal, dgx1_volta, prepared, rtx8000x4};
use weft_alloc::{AllocError, Allocation, Optimality, Policy, PreparedNode, Request, allocate};
use weft_topology::model::uniform_node;
use weft_topology::{PairLink, PcieRelation};

fn best_effort(
    node: &PreparedNode,
    available: &[usize],
    required: &[usize],
    count: usize,
) -> Result<Allocation, AllocError> {
    allocate(node, &Policy::BestEffort, &Request { count, available, required })
}

fn gpus(node: &PreparedNode, available: &[usize], required: &[usize], count: usize) -> Vec<usize> {
    best_effort(node, available, required, count).unwrap().gpus
}

/// Upstream's `Allocator`: repeatedly allocate from the remaining GPUs (ascending), removing what
/// was handed out.
fn sequential(node: &PreparedNode, sizes: &[usize]) -> Vec<Result<Vec<usize>, AllocError>> {
    let mut remaining: Vec<usize> = (0..node.len()).collect();
    sizes
        .iter()
        .map(|&k| {
            let a = best_effort(node, &remaining, &[], k)?;
            remaining.retain(|g| !a.gpus.contains(g));
            Ok(a.gpus)
        })
        .collect()
}

#[test]
fn dgx1_volta_pair_scores_are_upstreams() {
    let node = prepared(&dgx1_volta());
    assert_eq!(node.pair_score(0, 3), 230); // NV2 + PHB
    assert_eq!(node.pair_score(0, 4), 210); // NV2 + SYS
    assert_eq!(node.pair_score(0, 1), 150); // NV1 + PIX
    assert_eq!(node.pair_score(0, 5), 10); // SYS
    assert_eq!(node.pair_score(6, 7), 250); // NV2 + PIX
}

#[test]
fn besteffort_test_go_expectations_on_dgx1_volta() {
    let node = prepared(&dgx1_volta());
    let all: Vec<usize> = (0..8).collect();
    // TestBestEffortAllocate
    assert_eq!(gpus(&node, &[0, 2, 4, 5], &[], 2), vec![4, 5], "single NVLink, prefer same switch");
    assert_eq!(gpus(&node, &[0, 4, 5, 6], &[], 2), vec![5, 6], "single NVLink, prefer same socket");
    assert_eq!(gpus(&node, &[0, 3, 1], &[], 2), vec![0, 3], "prefer dual NVLink same socket");
    assert_eq!(gpus(&node, &[0, 1, 4], &[], 2), vec![0, 4], "prefer dual NVLink cross socket");
    assert_eq!(gpus(&node, &all, &[4], 1), vec![4], "must include, size 1");
    assert_eq!(gpus(&node, &all, &[4], 2), vec![4, 7], "must include, size 2");
    assert_eq!(gpus(&node, &all, &[4], 4), vec![4, 5, 6, 7], "must include, size 4");
    assert_eq!(gpus(&node, &all, &[0, 2, 4, 6], 4), vec![0, 2, 4, 6], "must include the full set");
}

#[test]
fn upstream_empty_results_are_typed_errors() {
    let node = prepared(&dgx1_volta());
    let all: Vec<usize> = (0..8).collect();
    // "Must include with unavailable device": upstream [], weft names the missing GPU.
    assert_eq!(
        best_effort(&node, &[1, 2, 3, 4, 5, 6, 7], &[0, 1, 2, 3], 4),
        Err(AllocError::RequiredNotAvailable { gpu: 0 })
    );
    // "Must include with too many devices specified"
    assert_eq!(
        best_effort(&node, &all, &[1, 2, 3, 4, 5, 6], 4),
        Err(AllocError::TooManyRequired { required: 6, count: 4 })
    );
    // "Required too many devices than available": GPU6 is required but not free.
    assert_eq!(
        best_effort(&node, &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5, 6], 1),
        Err(AllocError::RequiredNotAvailable { gpu: 6 })
    );
    // Sizes upstream answers with [] before enumerating.
    assert_eq!(best_effort(&node, &all, &[], 0), Err(AllocError::ZeroCount));
    assert_eq!(best_effort(&node, &[0, 1], &[], 3), Err(AllocError::InsufficientGpus { requested: 3, available: 2 }));
}

#[test]
fn measured_results_for_every_size_with_all_free() {
    let node = prepared(&dgx1_volta());
    let all: Vec<usize> = (0..8).collect();
    let expected: [(usize, &[usize], u32); 7] = [
        (2, &[0, 3], 230),
        (3, &[0, 2, 3], 610),
        (4, &[0, 1, 2, 3], 1120),
        (5, &[0, 1, 2, 3, 4], 1360),
        (6, &[0, 1, 2, 3, 4, 5], 1750),
        (7, &[0, 1, 2, 3, 4, 5, 6], 2250),
        (8, &[0, 1, 2, 3, 4, 5, 6, 7], 3000),
    ];
    for (k, want, score) in expected {
        let a = best_effort(&node, &all, &[], k).unwrap();
        assert_eq!(a.gpus, want, "k={k}");
        assert_eq!(a.set_score, score, "k={k}");
        assert_eq!(a.optimality, Optimality::Exact, "k={k}");
    }
}

#[test]
fn k1_takes_the_gpu_whose_loss_hurts_least() {
    let node = prepared(&dgx1_volta());
    // On DGX-1V every GPU has 6 NVLinks, one PIX, two PHB and four SYS peers: the same total (750).
    let totals: Vec<u32> = (0..8).map(|a| (0..8).map(|b| node.pair_score(a, b)).sum()).collect();
    assert_eq!(totals, vec![750; 8]);
    // So with all free the rule ties and takes the earliest, GPU0 — the same answer as upstream.
    let a = best_effort(&node, &(0..8).collect::<Vec<_>>(), &[], 1).unwrap();
    assert_eq!((a.gpus, a.set_score, a.objective), (vec![0], 0, 0));
    // Upstream then hands out GPU1, GPU2, … in index order. Weft takes the GPU that keeps least to
    // the free ones: after GPU0 it is GPU3 (its NV2+PHB partner GPU0 is gone: 750 − 230 = 520),
    // then GPU2 (370: partners 0 and 3 busy), then GPU1 (240): it fills the half that is already
    // broken and keeps GPUs 4–7, NVLinked among themselves, free together for a 4-GPU pod.
    let seq: Vec<Vec<usize>> = sequential(&node, &[1; 8]).into_iter().map(Result::unwrap).collect();
    assert_eq!(seq, vec![vec![0], vec![3], vec![2], vec![1], vec![4], vec![5], vec![6], vec![7]]);
    // Order matters only for ties: the earliest listed of equally good GPUs wins.
    assert_eq!(gpus(&node, &[6, 7], &[], 1), vec![6]);
    assert_eq!(gpus(&node, &[7, 6], &[], 1), vec![7]);
    assert_eq!(gpus(&node, &[7, 6, 5], &[], 1), vec![5], "5 keeps 360, 7 keeps 380, 6 keeps 480");
}

#[test]
fn k1_prefers_a_leftover_whose_nvlink_partner_is_busy() {
    // 4x RTX 8000: NV2 bridges 0-3 and 1-2. With GPU3 busy, GPU0 is a leftover: take it, not GPU1.
    let node = prepared(&rtx8000x4());
    assert_eq!(gpus(&node, &[0, 1, 2], &[], 1), vec![0]);
    // And with GPU0 busy, GPU3.
    assert_eq!(gpus(&node, &[1, 2, 3], &[], 1), vec![3]);
}

#[test]
fn sequential_allocations_match_upstream_for_k_at_least_2() {
    let volta = prepared(&dgx1_volta());
    let pascal = prepared(&dgx1_pascal());
    let rtx = prepared(&rtx8000x4());
    let ok = |v: &[Result<Vec<usize>, AllocError>]| -> Vec<Vec<usize>> { v.iter().flatten().cloned().collect() };
    // TestBestEffortDGX1VoltaGPUAllocTwo / Four / Eight
    let s = sequential(&volta, &[2, 2, 2, 2, 1]);
    assert_eq!(ok(&s), vec![vec![0, 3], vec![1, 2], vec![4, 7], vec![5, 6]]);
    assert_eq!(s[4], Err(AllocError::InsufficientGpus { requested: 1, available: 0 }));
    assert_eq!(ok(&sequential(&volta, &[4, 4])), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(ok(&sequential(&volta, &[8])), vec![(0..8).collect::<Vec<_>>()]);
    // TestBestEffortDGX1PascalGPUAllocTwo / Four
    assert_eq!(ok(&sequential(&pascal, &[2, 2, 2, 2])), vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
    assert_eq!(ok(&sequential(&pascal, &[4, 4])), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    // TestBestEffort4xRTX8000GPUAllocTwo / Four
    assert_eq!(ok(&sequential(&rtx, &[2, 2])), vec![vec![0, 3], vec![1, 2]]);
    assert_eq!(ok(&sequential(&rtx, &[4])), vec![vec![0, 1, 2, 3]]);
}

#[test]
fn best_set_in_the_last_slot_of_the_best_partition_is_found() {
    // TestBestEffortAllocateRetainsBestPartition: 14 GPUs, NV2 pairs (0,1)…(10,11), NV4 (12,13).
    let mut t = uniform_node("14", 14, PairLink::default());
    for i in (0..12).step_by(2) {
        t.set_link(i, i + 1, PairLink { pcie: None, nvlinks: 2 });
    }
    t.set_link(12, 13, PairLink { pcie: None, nvlinks: 4 });
    let node = prepared(&t);
    assert_eq!(gpus(&node, &(0..14).collect::<Vec<_>>(), &[], 2), vec![12, 13]);
}

#[test]
fn padded_set_is_never_returned() {
    // Reference §1.3: GPU0–GPU1 NV12 + SYS, GPUs 2–4 mutually SameBoard, the rest SYS; request 3.
    // Upstream returns [0 1 <nil>] (and its Allocator then panics). The best partition is
    // {2,3,4} (180) + {0,1} short (1210); weft returns the full group.
    let mut t = uniform_node("pr80", 5, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
    t.set_link(0, 1, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 12 });
    for (a, b) in [(2, 3), (2, 4), (3, 4)] {
        t.set_link(a, b, PairLink { pcie: Some(PcieRelation::SameBoard), nvlinks: 0 });
    }
    let node = prepared(&t);
    let a = best_effort(&node, &[0, 1, 2, 3, 4], &[], 3).unwrap();
    assert_eq!(a.gpus, vec![2, 3, 4]);
    assert_eq!(a.set_score, 180);
    assert_eq!(a.objective, 180 + 1210);
    // The solution keeps the short group visible for callers that want it.
    let sol = weft_alloc::besteffort::solve(
        &node,
        &Request { count: 3, available: &[0, 1, 2, 3, 4], required: &[] },
        &Default::default(),
    )
    .unwrap();
    assert_eq!(sol.short_group.map(|i| sol.groups[i].clone()), Some(vec![0, 1]));
}

#[test]
fn available_order_breaks_ties_like_upstream() {
    // Uniform node: every partition ties, so upstream keeps the first: available[0] with the next
    // k−1 listed GPUs.
    let node = prepared(&uniform_node("u", 6, PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 }));
    assert_eq!(gpus(&node, &[5, 4, 3, 2, 1, 0], &[], 2), vec![4, 5]);
    assert_eq!(gpus(&node, &[3, 1, 5, 0, 2, 4], &[], 3), vec![1, 3, 5]);
    assert_eq!(gpus(&node, &[3, 1, 5, 0, 2, 4], &[2], 3), vec![0, 2, 4]);
}
