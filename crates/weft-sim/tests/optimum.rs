//! The optimum bound on pods placed: hand-made instances whose optimum is worked out by hand, an
//! exhaustive search on tiny random ones, the bound against every policy on small random streams,
//! and bad input.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use weft_alloc::ScoreConfig;
use weft_sim::optimum::{
    BoundKind, OptimumError, OptimumOptions, build_program, checked_instants, compare, placed_bound, placement_fits,
};
use weft_sim::{Cluster, ClusterSpec, Generate, NodeTypeSpec, PlacementPolicy, SimError, SimPod, run_policy};

fn cluster(types: Vec<NodeTypeSpec>) -> Cluster {
    ClusterSpec { api_version: weft_sim::API_VERSION.into(), kind: "SimCluster".into(), node_types: types }
        .build(None)
        .expect("the test cluster builds")
}

fn with_vfs(name: &str, count: usize, vfs_per_nic: usize) -> NodeTypeSpec {
    NodeTypeSpec { vfs_per_nic: Some(vfs_per_nic), ..NodeTypeSpec::builtin(name, count) }
}

/// A pod of `gpus` GPUs and `vfs` VFs of `fabric`.
fn pod(i: usize, gpus: usize, vfs: usize, arrival: f64, duration: f64) -> SimPod {
    let mut p = SimPod::gpus(&format!("p{i}"), gpus, arrival, duration);
    if vfs > 0 {
        p.vfs = vec![(Arc::from("fabric"), vfs)];
    }
    p
}

fn options() -> OptimumOptions {
    OptimumOptions { time_limit: Duration::from_secs(60) }
}

fn placed(cluster: &Cluster, pods: &[SimPod], policy: PlacementPolicy) -> usize {
    run_policy(cluster, pods, policy, &ScoreConfig::default(), 1, &mut |_| {}).expect("the policy runs").placed
}

/// Two 8-GPU nodes. A 1-GPU pod arrives first and stays; an 8-GPU pod takes the other node; two
/// short 8-GPU pods follow one after the other. Every policy admits the 1-GPU pod (it fits), which
/// leaves no node for the short pods: 2 placed. Offline, turning the 1-GPU pod away lets both short
/// pods run on the node it would have held: 3. No placement has 4 (the long 8-GPU pod overlaps
/// both short ones, so with the 1-GPU pod on one node only one 8-GPU pod runs at a time).
#[test]
fn the_optimum_turns_away_a_small_pod_that_every_policy_admits() {
    let c = cluster(vec![NodeTypeSpec::builtin("pcie-8gpu", 2)]);
    let pods =
        vec![pod(0, 1, 0, 0.0, 100.0), pod(1, 8, 0, 1.0, 100.0), pod(2, 8, 0, 2.0, 1.0), pod(3, 8, 0, 4.0, 100.0)];
    let b = placed_bound(&c, &pods, &options()).unwrap();
    assert_eq!((b.bound, b.kind, b.best_found), (3, BoundKind::Optimal, Some(3)), "{b:?}");
    for policy in PlacementPolicy::ALL {
        assert_eq!(placed(&c, &pods, policy), 2, "{}", policy.name());
    }
    let r = compare(&c, &pods, &PlacementPolicy::ALL, &ScoreConfig::default(), 1, &options()).unwrap();
    assert_eq!(r.optimum_at_least, 3);
    let gaps: Vec<(&str, usize, f64)> = r.policies.iter().map(|p| (p.policy.as_str(), p.placed, p.gap)).collect();
    assert_eq!(gaps, [("weft", 2, 1.0 / 3.0), ("blind", 2, 1.0 / 3.0), ("least-allocated", 2, 1.0 / 3.0)]);
}

/// One 4-GPU node with 2 VFs (one per NIC). A pod asking both VFs arrives first and stays; two
/// pods asking one VF each follow. The first takes every VF: 1 placed by any policy; the optimum
/// turns it away and places the two: 2. GPUs are not what limits here (3 of 4 would do).
#[test]
fn vfs_limit_the_optimum_as_gpus_do() {
    let c = cluster(vec![with_vfs("a100-pcie-4gpu", 1, 1)]);
    let pods = vec![pod(0, 1, 2, 0.0, 100.0), pod(1, 1, 1, 1.0, 100.0), pod(2, 1, 1, 2.0, 100.0)];
    let b = placed_bound(&c, &pods, &options()).unwrap();
    assert_eq!((b.bound, b.kind), (2, BoundKind::Optimal), "{b:?}");
    assert_eq!(placed(&c, &pods, PlacementPolicy::Weft), 1);
    // Without VF asks the three fit together.
    let plain: Vec<SimPod> = pods.iter().map(|p| SimPod { vfs: Vec::new(), ..p.clone() }).collect();
    assert_eq!(placed_bound(&c, &plain, &options()).unwrap().bound, 3);
}

/// A pod that leaves at the very instant another arrives frees its GPUs for it, as in the engine
/// (departures at or before an arrival come first), and so does a pod of duration 0.
#[test]
fn a_departure_at_an_arrival_frees_its_gpus_first() {
    let c = cluster(vec![NodeTypeSpec::builtin("pcie-8gpu", 1)]);
    let back_to_back =
        vec![pod(0, 8, 0, 0.0, 5.0), pod(1, 8, 0, 5.0, 5.0), pod(2, 8, 0, 10.0, 0.0), pod(3, 8, 0, 10.0, 1.0)];
    let b = placed_bound(&c, &back_to_back, &options()).unwrap();
    assert_eq!((b.bound, b.kind), (4, BoundKind::Optimal), "{b:?}");
    assert_eq!(placed(&c, &back_to_back, PlacementPolicy::Weft), 4);
    // One instant later they overlap: only every other pod runs.
    let overlapping = vec![pod(0, 8, 0, 0.0, 5.5), pod(1, 8, 0, 5.0, 5.5), pod(2, 8, 0, 10.0, 1.0)];
    assert_eq!(placed_bound(&c, &overlapping, &options()).unwrap().bound, 2);
}

/// The instants checked are those just before a departure and the last: the running set there is
/// largest, and any other arrival's set is inside the next one's.
#[test]
fn the_checked_instants_are_the_largest_running_sets() {
    // p0 [0, 10), p1 [1, 3), p2 [2, 12), p3 [4, 6), p4 [5, 20).
    let pods = vec![
        pod(0, 1, 0, 0.0, 10.0),
        pod(1, 1, 0, 1.0, 2.0),
        pod(2, 1, 0, 2.0, 10.0),
        pod(3, 1, 0, 4.0, 2.0),
        pod(4, 1, 0, 5.0, 15.0),
    ];
    // p1 leaves before p3 arrives: {0, 1, 2} is checked; p3 leaves only after p4 arrives.
    assert_eq!(checked_instants(&pods), vec![vec![0, 1, 2], vec![0, 2, 3, 4]]);
    // A pod that ends at the next arrival has left by then: two instants, not one.
    let back_to_back = vec![pod(0, 1, 0, 0.0, 5.0), pod(1, 1, 0, 5.0, 5.0)];
    assert_eq!(checked_instants(&back_to_back), vec![vec![0], vec![1]]);
    assert!(checked_instants(&[]).is_empty());
}

/// A pod larger than every node counts as never placed; an empty cluster, a pod of 0 GPUs and a
/// pod with no real arrival time are errors that name what is wrong.
#[test]
fn bad_input_is_an_error_or_a_clear_zero() {
    let c = cluster(vec![NodeTypeSpec::builtin("pcie-8gpu", 2)]);
    let huge = vec![pod(0, 16, 0, 0.0, 1.0), pod(1, 2, 4, 0.0, 1.0)];
    let b = placed_bound(&c, &huge, &options()).unwrap();
    assert_eq!((b.placeable, b.bound, b.kind, b.variables), (0, 0, BoundKind::Optimal, 0), "{b:?}");
    assert_eq!(placed_bound(&c, &[], &options()).unwrap().bound, 0);

    let empty = Cluster { types: c.types.clone(), nodes: Vec::new() };
    let e = placed_bound(&empty, &huge, &options()).unwrap_err();
    assert!(matches!(e, OptimumError::Sim(SimError::EmptyCluster)), "{e}");

    let e = placed_bound(&c, &[pod(0, 1, 0, 0.0, 1.0), pod(1, 0, 0, 1.0, 1.0)], &options()).unwrap_err().to_string();
    assert!(e.contains("pod 'p1'") && e.contains("position 1") && e.contains("no GPU"), "{e}");
    let e = placed_bound(&c, &[pod(0, 1, 0, f64::NAN, 1.0)], &options()).unwrap_err().to_string();
    assert!(e.contains("pod 'p0'") && e.contains("NaN"), "{e}");
    let e = placed_bound(&c, &[pod(0, 1, 0, 0.0, -1.0)], &options()).unwrap_err().to_string();
    assert!(e.contains("pod 'p0'") && e.contains("-1"), "{e}");
}

/// The most pods any placement keeps, by trying every placement (each pod on no node or one).
fn exhaustive(cluster: &Cluster, pods: &[SimPod]) -> usize {
    let choices = cluster.nodes.len() + 1;
    let total = choices.pow(pods.len() as u32);
    let mut best = 0;
    for code in 0..total {
        let mut c = code;
        let placement: Vec<Option<usize>> = (0..pods.len())
            .map(|_| {
                let d = c % choices;
                c /= choices;
                d.checked_sub(1)
            })
            .collect();
        let count = placement.iter().filter(|n| n.is_some()).count();
        if count > best && placement_fits(cluster, pods, &placement).expect("the stream is valid") {
            best = count;
        }
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// On tiny instances (up to 3 nodes of small types, up to 6 pods, some asking VFs) the program's
    /// optimum is the most pods of any placement, found by trying them all.
    #[test]
    fn the_optimum_is_the_best_placement_of_all(
        nodes in proptest::collection::vec(prop::sample::select(vec![0usize, 1, 2]), 1..4),
        shape in proptest::collection::vec((prop::sample::select(vec![1usize, 2, 3, 4]), 0usize..3, 0u8..8, 1u8..6), 0..7),
    ) {
        // a100-pcie-4gpu: 4 GPUs, 2 NICs; with 1 VF per NIC (2 VFs) or none.
        let kinds = [with_vfs("a100-pcie-4gpu", 0, 1), with_vfs("a100-pcie-4gpu", 0, 0), with_vfs("dgx1-v100", 0, 1)];
        let mut types = kinds.to_vec();
        for &k in &nodes {
            types[k].count += 1;
        }
        types.retain(|t| t.count > 0);
        let c = cluster(types);
        let mut arrival = 0.0;
        let pods: Vec<SimPod> = shape
            .iter()
            .enumerate()
            .map(|(i, &(g, v, gap, d))| {
                arrival += f64::from(gap);
                pod(i, g, v, arrival, f64::from(d) * 2.0)
            })
            .collect();
        let b = placed_bound(&c, &pods, &options()).unwrap();
        prop_assert_eq!(b.kind, BoundKind::Optimal, "{:?}", b);
        prop_assert_eq!(b.bound, exhaustive(&c, &pods), "{:?}", b);
    }

    /// On small random streams of the default mix (8–12 nodes of the embedded types, 40–100 pods,
    /// half asking a VF, loads up to twice the cluster), the bound is at least what every policy
    /// places, and a placement the solver reports holds that many pods.
    #[test]
    fn the_bound_is_above_every_policy(nodes in 8usize..13, pods in 40usize..100, load in 0.8f64..2.0, seed in any::<u64>()) {
        let c = ClusterSpec::embedded_default().scaled(nodes).build(None).unwrap();
        let mut g = Generate::default_for(c.total_gpus(), pods, seed);
        g.mean_interarrival_seconds *= Generate::DEFAULT_LOAD / load;
        let stream = g.pods().unwrap();
        let b = placed_bound(&c, &stream, &OptimumOptions { time_limit: Duration::from_secs(2) }).unwrap();
        for policy in PlacementPolicy::ALL {
            let p = placed(&c, &stream, policy);
            prop_assert!(b.bound >= p, "{}: placed {} > bound {:?}", policy.name(), p, b);
        }
        if let Some(found) = b.best_found {
            prop_assert!(found <= b.bound);
        }
    }
}

/// The program's size: one variable per pod and node that can hold it, and no capacity row where
/// the running pods fit anyway.
#[test]
fn the_program_has_a_variable_per_pod_and_node_that_can_hold_it() {
    let c = cluster(vec![NodeTypeSpec::builtin("pcie-8gpu", 2), with_vfs("a100-pcie-4gpu", 1, 1)]);
    // p0 fits all three nodes; p1 (8 GPUs) only the pcie-8gpu ones; p2 (a VF) only the 4-GPU node.
    let pods = vec![pod(0, 1, 0, 0.0, 1.0), pod(1, 8, 0, 0.0, 1.0), pod(2, 1, 1, 0.0, 1.0)];
    let p = build_program(&c, &pods).unwrap();
    assert_eq!(p.vars, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 2)]);
    // Pod rows for p0 and p1; capacity rows: 1 + 8 > 8 on each pcie-8gpu node; none on the 4-GPU
    // node (1 + 1 GPUs, 1 VF); symmetry rows for the two pcie-8gpu nodes (2 per pod on both).
    let capacity: Vec<_> = p.rows.iter().filter(|(_, rhs)| *rhs == 8.0).collect();
    assert_eq!(capacity.len(), 2, "{:?}", p.rows);
    assert_eq!(p.placeable, 3);
}
