//! The exact/heuristic switch, the heuristic's quality and bound, and large nodes.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;
use common::random_topology;
use weft_alloc::besteffort::{self, BestEffortOptions, exact_work_estimate};
use weft_alloc::{Optimality, Policy, PreparedNode, Request, allocate};

fn random_node(n: usize, max_nv: u8, seed: u64) -> PreparedNode {
    PreparedNode::new(&random_topology(n, max_nv, seed)).unwrap()
}

/// The NVL72-like domain of `common::nvl72`, prepared.
fn nvl72() -> PreparedNode {
    PreparedNode::new(&common::nvl72()).unwrap()
}

fn heuristic_opts() -> BestEffortOptions {
    BestEffortOptions { max_exact_work: 0, ..Default::default() }
}

#[test]
fn switch_follows_the_work_estimate_not_the_gpu_count() {
    // 18 GPUs: k = 6 is within the default budget, k = 7 is not.
    assert!(exact_work_estimate(18, 6) <= besteffort::DEFAULT_MAX_EXACT_WORK);
    assert!(exact_work_estimate(18, 7) > besteffort::DEFAULT_MAX_EXACT_WORK);
    let node = random_node(18, 4, 7);
    let all: Vec<usize> = (0..18).collect();
    let solve =
        |k| allocate(&node, &Policy::BestEffort, &Request { count: k, available: &all, required: &[] }).unwrap();
    assert_eq!(solve(6).optimality, Optimality::Exact);
    assert!(matches!(solve(7).optimality, Optimality::Heuristic { .. }));
    // 30 GPUs in groups of 28 is tiny for the DP (hash-map memo): exact.
    let big = random_node(30, 4, 8);
    let all30: Vec<usize> = (0..30).collect();
    let a = allocate(&big, &Policy::BestEffort, &Request { count: 28, available: &all30, required: &[] }).unwrap();
    assert_eq!(a.optimality, Optimality::Exact);
}

#[test]
fn heuristic_reaches_the_optimum_on_seeded_16_gpu_nodes() {
    // On every instance here the heuristic finds the exact optimum; its bound proves it or not.
    for seed in 1..=3 {
        let node = random_node(16, 4, seed);
        let all: Vec<usize> = (0..16).collect();
        for k in [2, 3, 4, 8] {
            let req = Request { count: k, available: &all, required: &[] };
            let exact = besteffort::solve(&node, &req, &BestEffortOptions::default()).unwrap();
            assert_eq!(exact.optimality, Optimality::Exact);
            let h = besteffort::solve(&node, &req, &heuristic_opts()).unwrap();
            let Optimality::Heuristic { objective, upper_bound } = h.optimality else { panic!("not heuristic") };
            assert_eq!(objective, exact.objective, "seed {seed} k={k}");
            assert!(upper_bound >= exact.objective);
        }
    }
}

#[test]
fn nvl72_k8_is_solved_with_a_tight_bound() {
    let node = nvl72();
    let all: Vec<usize> = (0..72).collect();
    let sol =
        besteffort::solve(&node, &Request { count: 8, available: &all, required: &[] }, &Default::default()).unwrap();
    let Optimality::Heuristic { objective, upper_bound } = sol.optimality else {
        panic!("72 GPUs, k=8 must be heuristic")
    };
    // Pairing whole trays gives every GPU its 7 best partners: the per-GPU bound is met.
    assert_eq!(objective, upper_bound);
    assert_eq!(sol.optimality.gap(), 0.0);
    assert_eq!(sol.groups.len(), 9);
    for g in &sol.groups {
        let mut trays: Vec<usize> = g.iter().map(|x| x / 4).collect();
        trays.dedup();
        assert_eq!(trays.len(), 2, "{g:?} is not two whole trays");
    }
}

#[test]
fn random_72_gpu_node_gets_a_valid_answer_and_a_sound_bound() {
    let node = random_node(72, 18, 72);
    let all: Vec<usize> = (0..72).collect();
    for required in [vec![], vec![5, 40]] {
        let req = Request { count: 8, available: &all, required: &required };
        let sol = besteffort::solve(&node, &req, &Default::default()).unwrap();
        let Optimality::Heuristic { objective, upper_bound } = sol.optimality else { panic!("heuristic expected") };
        assert!(objective <= upper_bound);
        let total: u64 = sol.groups.iter().map(|g| u64::from(node.set_score(g))).sum();
        assert_eq!(total, objective);
        assert!(sol.groups.iter().all(|g| g.len() == 8));
        let a = sol.allocation(&node);
        assert_eq!(a.gpus.len(), 8);
        assert!(required.iter().all(|r| a.gpus.contains(r)));
    }
}

#[test]
fn hash_memo_path_is_exact_on_26_gpus() {
    // 26 GPUs in groups of 24 (plus a short group of 2): the DP runs with the hash-map memo.
    // Direct answer: the short pair {a, b} maximising score(rest) + w(a, b).
    let node = random_node(26, 18, 3);
    let n = 26;
    let all: Vec<usize> = (0..n).collect();
    let total: i64 = i64::from(node.set_score(&all));
    let deg = |a: usize| -> i64 { (0..n).map(|b| i64::from(node.pair_score(a, b))).sum() };
    let mut best = (i64::MIN, 0, 0);
    for a in 0..n {
        for b in a + 1..n {
            let w = i64::from(node.pair_score(a, b));
            let v = total - deg(a) - deg(b) + w + w;
            if v > best.0 {
                best = (v, a, b);
            }
        }
    }
    let a = allocate(&node, &Policy::BestEffort, &Request { count: 24, available: &all, required: &[] }).unwrap();
    assert_eq!(a.optimality, Optimality::Exact);
    assert_eq!(a.objective as i64, best.0);
    let want: Vec<usize> = (0..n).filter(|&g| g != best.1 && g != best.2).collect();
    assert_eq!(a.gpus, want);
}

#[test]
fn largest_nodes_do_not_panic() {
    let node = random_node(128, 18, 128);
    let all: Vec<usize> = (0..128).collect();
    let opts = BestEffortOptions { heuristic_iterations: 20, ..Default::default() };
    for k in [1, 2, 64, 127, 128] {
        let a =
            besteffort::allocate_with(&node, &Request { count: k, available: &all, required: &[127] }, &opts).unwrap();
        assert_eq!(a.gpus.len(), k);
        assert!(a.gpus.contains(&127));
    }
}
