//! The bound on mean bottleneck ring bandwidth at a given number of pods placed: hand-worked
//! instances on the built-in types (hgx-h100's 8 GPUs ring at 450 GB/s, pcie-8gpu's at 10, a
//! dgx1-v100 quad at most 50 and its pairs at most 50), the bound against every policy on small
//! random streams, and bad input.

use std::time::Duration;

use proptest::prelude::*;
use weft_alloc::ScoreConfig;
use weft_sim::optimum::{OptimumOptions, best_ring_of_size, ring_bound};
use weft_sim::{Cluster, ClusterSpec, Generate, NodeTypeSpec, PlacementPolicy, SimPod, builtin_topology, run_policy};

fn cluster(types: Vec<NodeTypeSpec>) -> Cluster {
    ClusterSpec { api_version: weft_sim::API_VERSION.into(), kind: "SimCluster".into(), node_types: types }
        .build(None)
        .expect("the test cluster builds")
}

fn pod(i: usize, gpus: usize, arrival: f64, duration: f64) -> SimPod {
    SimPod::gpus(&format!("p{i}"), gpus, arrival, duration)
}

fn options() -> OptimumOptions {
    OptimumOptions { time_limit: Duration::from_secs(60) }
}

fn bound(c: &Cluster, pods: &[SimPod], min_placed: usize) -> Option<f64> {
    ring_bound(c, pods, min_placed, &options()).expect("the bound is computed").mean_gbps
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-6)
}

/// The best set of a size is found over every subset: an 8-GPU hgx-h100 rings at its NVSwitch rate,
/// pcie-8gpu's at its slowest hop, and a single GPU has no ring.
#[test]
fn the_best_set_of_each_size_is_the_best_ring_over_all_subsets() {
    let h100 = builtin_topology("hgx-h100").unwrap();
    let pcie = builtin_topology("pcie-8gpu").unwrap();
    assert_eq!(best_ring_of_size(&h100, 8), h100.ring_bandwidth(&(0..8).collect::<Vec<_>>()).unwrap().gbps);
    assert_eq!(best_ring_of_size(&pcie, 8), pcie.ring_bandwidth(&(0..8).collect::<Vec<_>>()).unwrap().gbps);
    assert_eq!(best_ring_of_size(&h100, 1), 0.0);
    assert_eq!(best_ring_of_size(&h100, 9), 0.0);
    // A pair behind one PCIe switch is faster than the 8-GPU ring, which must cross the sockets.
    let pair = (0..8).flat_map(|a| (a + 1..8).map(move |b| (a, b))).map(|(a, b)| pcie.pair_bandwidth_gbps(a, b));
    assert_eq!(best_ring_of_size(&pcie, 2), pair.fold(0.0, f64::max));
    assert!(best_ring_of_size(&pcie, 2) > best_ring_of_size(&pcie, 8));
}

/// One fast and one slow 8-GPU node, two 8-GPU pods running at once: placing one, it goes to the
/// fast node (450); placing both, one must take the slow node ((450 + 10) / 2 = 230); three cannot
/// be placed from a stream of two. When the pods do not overlap, both can take the fast node.
#[test]
fn more_pods_placed_can_cost_bandwidth_and_the_bound_says_how_much() {
    let c = cluster(vec![NodeTypeSpec::builtin("hgx-h100", 1), NodeTypeSpec::builtin("pcie-8gpu", 1)]);
    let fast = best_ring_of_size(&builtin_topology("hgx-h100").unwrap(), 8);
    let slow = best_ring_of_size(&builtin_topology("pcie-8gpu").unwrap(), 8);
    assert_eq!((fast, slow), (450.0, 10.0));
    let together = vec![pod(0, 8, 0.0, 10.0), pod(1, 8, 1.0, 10.0)];
    assert!(close(bound(&c, &together, 0), 450.0));
    assert!(close(bound(&c, &together, 1), 450.0));
    assert!(close(bound(&c, &together, 2), 230.0), "{:?}", bound(&c, &together, 2));
    let none = ring_bound(&c, &together, 3, &options()).unwrap();
    assert_eq!(none.mean_gbps, None);
    assert!(none.note.as_deref().is_some_and(|n| n.contains("no placement of 3 pods")), "{none:?}");
    let apart = vec![pod(0, 8, 0.0, 1.0), pod(1, 8, 2.0, 1.0)];
    assert!(close(bound(&c, &apart, 2), 450.0));
}

/// Single-GPU pods have no ring: they count towards the pods placed but not in the mean. One 8-GPU
/// node: a 1-GPU pod that must be placed leaves 7 GPUs, so the 4-GPU pod running beside it gets a
/// quad; with nothing to place beside it, the quad is still the best it can get.
#[test]
fn single_gpu_pods_count_as_placed_but_not_in_the_mean() {
    let c = cluster(vec![NodeTypeSpec::builtin("dgx1-v100", 1)]);
    let quad = best_ring_of_size(&builtin_topology("dgx1-v100").unwrap(), 4);
    let pods = vec![pod(0, 1, 0.0, 10.0), pod(1, 4, 1.0, 10.0)];
    assert!(close(bound(&c, &pods, 2), quad));
    // Only 1-GPU pods: there is no mean to bound.
    let singles = vec![pod(0, 1, 0.0, 1.0)];
    let b = ring_bound(&c, &singles, 1, &options()).unwrap();
    assert_eq!(b.mean_gbps, None);
    assert!(b.note.is_some());
}

/// Bad input is an error naming the pod, as for the bound on pods placed.
#[test]
fn a_pod_without_gpus_is_an_error_naming_it() {
    let c = cluster(vec![NodeTypeSpec::builtin("hgx-h100", 1)]);
    let err = ring_bound(&c, &[pod(0, 0, 0.0, 1.0)], 0, &options()).unwrap_err().to_string();
    assert!(err.contains("p0") && err.contains("no GPU"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// On small random streams of the default mix, no policy's mean bottleneck is above the bound
    /// at the count it placed.
    #[test]
    fn no_policy_beats_the_bound_at_its_own_count(nodes in 8usize..13, pods in 30usize..80, seed in any::<u64>()) {
        let c = ClusterSpec::embedded_default().scaled(nodes).build(None).unwrap();
        let stream = Generate::default_for(c.total_gpus(), pods, seed).pods().unwrap();
        for policy in PlacementPolicy::ALL {
            let r = run_policy(&c, &stream, policy, &ScoreConfig::default(), seed, &mut |_| {}).unwrap();
            if r.multi_gpu_placed == 0 {
                continue;
            }
            let b = ring_bound(&c, &stream, r.placed, &OptimumOptions { time_limit: Duration::from_secs(20) }).unwrap();
            let Some(mean) = b.mean_gbps else { panic!("{}: no bound at {} placed: {b:?}", policy.name(), r.placed) };
            prop_assert!(r.mean_ring_bandwidth_gbps <= mean + 1e-6, "{}: {} > {mean}", policy.name(), r.mean_ring_bandwidth_gbps);
        }
    }
}
