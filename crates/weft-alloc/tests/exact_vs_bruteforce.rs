//! Property tests: the best-effort solver against a brute force that enumerates partitions exactly
//! as go-gpuallocator does (tests/common), on random topologies up to 12 GPUs.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use proptest::prelude::*;
use weft_alloc::besteffort::{self, BestEffortOptions, TopPruning};
use weft_alloc::{AllocError, Optimality, Policy, PreparedNode, Request, StaticTable, allocate};
use weft_topology::model::uniform_node;
use weft_topology::{PairLink, PcieRelation};

/// A random PairLink: either fully random (any PCIe relation or none, 0..=18 NVLinks) or from a
/// small palette so that ties are frequent.
fn link() -> impl Strategy<Value = PairLink> {
    prop_oneof![
        (proptest::option::of(proptest::sample::select(PcieRelation::ALL.to_vec())), 0u8..=18)
            .prop_map(|(pcie, nvlinks)| PairLink { pcie, nvlinks }),
        (proptest::sample::select(vec![PcieRelation::Sys, PcieRelation::Pix]), 0u8..=2)
            .prop_map(|(p, nvlinks)| PairLink { pcie: Some(p), nvlinks }),
    ]
}

/// A random symmetric node of `n` GPUs.
fn node(n: usize) -> impl Strategy<Value = PreparedNode> {
    proptest::collection::vec(link(), n * (n.saturating_sub(1)) / 2).prop_map(move |links| {
        let mut t = uniform_node("random", n, PairLink::default());
        let mut it = links.into_iter();
        for a in 0..n {
            for b in a + 1..n {
                if let Some(l) = it.next() {
                    t.set_link(a, b, l);
                }
            }
        }
        PreparedNode::new(&t).unwrap()
    })
}

/// (node, available in random order, required ⊆ available, k)
fn case() -> impl Strategy<Value = (PreparedNode, Vec<usize>, Vec<usize>, usize)> {
    case_in(1, 1, 0)
}

/// Cases with at least `min_avail` free GPUs and `k_min ≤ k ≤ |available| − k_gap`.
fn case_in(
    min_avail: usize,
    k_min: usize,
    k_gap: usize,
) -> impl Strategy<Value = (PreparedNode, Vec<usize>, Vec<usize>, usize)> {
    (min_avail..=10)
        .prop_flat_map(move |n| (node(n), Just((0..n).collect::<Vec<_>>()).prop_shuffle(), min_avail..=n))
        .prop_flat_map(move |(node, perm, navail)| {
            let avail: Vec<usize> = perm[..navail].to_vec();
            (Just(node), Just(avail), k_min..=navail - k_gap)
        })
        .prop_flat_map(with_required)
}

/// Adds the required GPUs to a (node, available, k) case: half the time none, else a random subset
/// of the available GPUs of at most k.
fn with_required(
    (node, avail, k): (PreparedNode, Vec<usize>, usize),
) -> impl Strategy<Value = (PreparedNode, Vec<usize>, Vec<usize>, usize)> {
    let nreq = prop_oneof![Just(0usize), 0..=k];
    (Just(node), Just(avail.clone()), Just(avail).prop_shuffle(), nreq).prop_map(
        move |(node, avail, shuffled, nreq)| {
            let required = shuffled[..nreq].to_vec();
            (node, avail, required, k)
        },
    )
}

/// A node whose pairs take one of two links (SYS, or SYS plus one NVLink): optima tie very often.
fn two_valued_node(n: usize) -> impl Strategy<Value = PreparedNode> {
    proptest::collection::vec(proptest::bool::weighted(0.3), n * (n.saturating_sub(1)) / 2).prop_map(move |nv| {
        let mut t = uniform_node("two-valued", n, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
        let mut it = nv.into_iter();
        for a in 0..n {
            for b in a + 1..n {
                if it.next() == Some(true) {
                    t.set_link(a, b, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 1 });
                }
            }
        }
        PreparedNode::new(&t).unwrap()
    })
}

/// Cases with three or more groups: 6 to 12 free GPUs, 2 ≤ k ≤ |available| / 3 (where the top state
/// is solved by branch and bound when forced), on random or tie-heavy two-valued nodes; required
/// GPUs as in [`case`].
fn three_group_case() -> impl Strategy<Value = (PreparedNode, Vec<usize>, Vec<usize>, usize)> {
    (6usize..=12)
        .prop_flat_map(|n| {
            (prop_oneof![node(n), two_valued_node(n)], Just((0..n).collect::<Vec<_>>()).prop_shuffle(), 6..=n)
        })
        .prop_flat_map(|(node, perm, navail)| {
            let avail: Vec<usize> = perm[..navail].to_vec();
            (Just(node), Just(avail), 2..=navail / 3)
        })
        .prop_flat_map(with_required)
}

/// 1500 cases per property, or `PROPTEST_CASES` when set (e.g. a long release run).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn set_score(node: &PreparedNode, set: &[usize]) -> u64 {
    u64::from(node.set_score(set))
}

proptest! {
    #![proptest_config(config())]

    /// Same objective, same set (tie-breaks included), required held, size k, all from available.
    #[test]
    fn exact_solver_matches_upstream_enumeration((node, avail, required, k) in case()) {
        let req = Request { count: k, available: &avail, required: &required };
        let got = allocate(&node, &Policy::BestEffort, &req).unwrap();
        let (mut want, want_obj) = common::brute_force(&node, &avail, &required, k).unwrap();
        want.sort_unstable();
        prop_assert_eq!(&got.gpus, &want);
        prop_assert_eq!(got.objective, want_obj);
        prop_assert_eq!(got.optimality, Optimality::Exact);
        prop_assert_eq!(got.gpus.len(), k);
        prop_assert!(required.iter().all(|r| got.gpus.contains(r)));
        prop_assert!(got.gpus.iter().all(|g| avail.contains(g)));
        prop_assert_eq!(u64::from(got.set_score), set_score(&node, &got.gpus));
        // Branch and bound at the top state (on wherever it applies, and off) changes nothing.
        for top_pruning in [TopPruning::Always, TopPruning::Never] {
            let opts = BestEffortOptions { top_pruning, ..BestEffortOptions::default() };
            let other = besteffort::allocate_with(&node, &req, &opts).unwrap();
            prop_assert_eq!(&other, &got);
        }
    }

    /// Branch and bound at the top state, forced on where it applies (three or more groups): same
    /// set and objective as upstream's enumeration, tie-breaks included, on up to 12 free GPUs.
    #[test]
    fn pruned_top_state_matches_upstream_enumeration((node, avail, required, k) in three_group_case()) {
        let req = Request { count: k, available: &avail, required: &required };
        let opts = BestEffortOptions { top_pruning: TopPruning::Always, ..BestEffortOptions::default() };
        let got = besteffort::allocate_with(&node, &req, &opts).unwrap();
        let (mut want, want_obj) = common::brute_force(&node, &avail, &required, k).unwrap();
        want.sort_unstable();
        prop_assert_eq!(&got.gpus, &want);
        prop_assert_eq!(got.objective, want_obj);
        prop_assert_eq!(got.optimality, Optimality::Exact);
        // The whole partition (upstream's lexicographically first optimal one) is the unpruned DP's.
        let pruned = besteffort::solve(&node, &req, &opts).unwrap();
        let plain = BestEffortOptions { top_pruning: TopPruning::Never, ..BestEffortOptions::default() };
        prop_assert_eq!(pruned, besteffort::solve(&node, &req, &plain).unwrap());
    }

    /// The full solution is a partition of the free GPUs into groups of k plus one short group, its
    /// objective is the sum of the groups' scores, and the chosen group is full.
    #[test]
    fn solution_is_a_partition_with_the_reported_objective((node, avail, required, k) in case()) {
        let req = Request { count: k, available: &avail, required: &required };
        let sol = besteffort::solve(&node, &req, &BestEffortOptions::default()).unwrap();
        let mut all: Vec<usize> = sol.groups.iter().flatten().copied().collect();
        all.sort_unstable();
        let mut want = avail.clone();
        want.sort_unstable();
        prop_assert_eq!(all, want);
        let r = avail.len() % k;
        for (i, g) in sol.groups.iter().enumerate() {
            let expect = if Some(i) == sol.short_group { r } else { k };
            prop_assert_eq!(g.len(), expect);
        }
        prop_assert_eq!(sol.short_group.is_some(), r != 0 && k > 1);
        prop_assert_eq!(sol.groups[sol.chosen].len(), k);
        if k > 1 {
            let total: u64 = sol.groups.iter().map(|g| set_score(&node, g)).sum();
            prop_assert_eq!(total, sol.objective);
        }
    }

    /// Forcing the heuristic: a valid answer, never above the exact optimum, and a bound that is
    /// never below it.
    #[test]
    fn heuristic_is_valid_and_its_bound_holds((node, avail, required, k) in case_in(3, 2, 1)) {
        let req = Request { count: k, available: &avail, required: &required };
        let exact = besteffort::solve(&node, &req, &BestEffortOptions::default()).unwrap();
        let opts = BestEffortOptions { max_exact_work: 0, heuristic_iterations: 50, ..BestEffortOptions::default() };
        let h = besteffort::solve(&node, &req, &opts).unwrap();
        let Optimality::Heuristic { objective, upper_bound } = h.optimality else {
            return Err(TestCaseError::fail("expected a heuristic result"));
        };
        prop_assert_eq!(objective, h.objective);
        prop_assert!(h.objective <= exact.objective);
        prop_assert!(upper_bound >= exact.objective, "bound {} < optimum {}", upper_bound, exact.objective);
        let total: u64 = h.groups.iter().map(|g| set_score(&node, g)).sum();
        prop_assert_eq!(total, h.objective);
        let chosen = &h.groups[h.chosen];
        prop_assert_eq!(chosen.len(), k);
        prop_assert!(required.iter().all(|r| chosen.contains(r)));
        let a = h.allocation(&node);
        prop_assert_eq!(a.gpus.len(), k);
        prop_assert!(a.gpus.iter().all(|g| avail.contains(g)));
    }

    /// Arbitrary (often invalid) requests never panic, under any policy; the error is the one the
    /// documented validation order gives, and valid requests succeed under best-effort.
    #[test]
    fn bad_requests_are_typed_errors(
        n in 1usize..=8,
        count in 0usize..=10,
        available in proptest::collection::vec(0usize..12, 0..10),
        required in proptest::collection::vec(0usize..12, 0..4),
    ) {
        let node = PreparedNode::new(&uniform_node("u", n, PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 1 })).unwrap();
        let req = Request { count, available: &available, required: &required };
        let expected = expected_validation(n, &req);
        for policy in [Policy::BestEffort, Policy::Simple, Policy::Static(StaticTable::builtin("hgx-8gpu").unwrap())] {
            let got = allocate(&node, &policy, &req);
            match (&expected, &got) {
                (Some(e), Err(g)) => prop_assert_eq!(e, g),
                (Some(e), Ok(a)) => return Err(TestCaseError::fail(format!("expected {e:?}, got {a:?}"))),
                (None, Ok(a)) => {
                    prop_assert_eq!(a.gpus.len(), count);
                    prop_assert!(required.iter().all(|r| a.gpus.contains(r)));
                    prop_assert!(a.gpus.iter().all(|g| available.contains(g)));
                    prop_assert!(a.gpus.windows(2).all(|w| w[0] < w[1]));
                }
                (None, Err(e)) => {
                    // Only a static table may refuse a valid request.
                    prop_assert!(matches!(policy, Policy::Static(_)), "{:?}", e);
                    let ok = matches!(e, AllocError::NoStaticSet { .. } | AllocError::BadStaticTable { .. });
                    prop_assert!(ok, "{:?}", e);
                }
            }
        }
    }
}

/// The validation rules, in order, written independently of the library.
fn expected_validation(n: usize, req: &Request<'_>) -> Option<AllocError> {
    if req.count == 0 {
        return Some(AllocError::ZeroCount);
    }
    for (i, &g) in req.available.iter().enumerate() {
        if g >= n {
            return Some(AllocError::UnknownGpu { gpu: g, n });
        }
        if req.available[..i].contains(&g) {
            return Some(AllocError::DuplicateGpu { gpu: g });
        }
    }
    for (i, &g) in req.required.iter().enumerate() {
        if g >= n {
            return Some(AllocError::UnknownGpu { gpu: g, n });
        }
        if !req.available.contains(&g) {
            return Some(AllocError::RequiredNotAvailable { gpu: g });
        }
        if req.required[..i].contains(&g) {
            return Some(AllocError::DuplicateGpu { gpu: g });
        }
    }
    if req.required.len() > req.count {
        return Some(AllocError::TooManyRequired { required: req.required.len(), count: req.count });
    }
    if req.available.len() < req.count {
        return Some(AllocError::InsufficientGpus { requested: req.count, available: req.available.len() });
    }
    None
}
