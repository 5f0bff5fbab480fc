//! The bottleneck-ring measure on the shipped topologies: a set whose every pair is NVLinked beats
//! every set of the same size that no ring can cross without a SYS (cross-socket) hop, on every
//! built-in node type at once. The mean over pairs does not (the issue that asked for the ring:
//! a100-pcie-4gpu's quad, one NV12 pair and four SYS pairs, averages above DGX-1's all-NVLink quad).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use weft_sim::{builtin_topology, builtin_types};
use weft_topology::{NodeTopology, PcieRelation, best_ring};

fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|m| m.count_ones() as usize == k)
        .map(|m| (0..n).filter(|&g| m >> g & 1 == 1).collect())
        .collect()
}

/// Whether every ring over `set` has a hop between GPUs whose only path is SYS.
fn every_ring_crosses_sys(t: &NodeTopology, set: &[usize]) -> bool {
    let sys = |a: usize, b: usize| t.link(a, b).nvlinks == 0 && t.link(a, b).pcie == Some(PcieRelation::Sys);
    best_ring(set.len(), &|a, b| if sys(set[a], set[b]) { 0.0 } else { 1.0 }).unwrap().gbps == 0.0
}

#[test]
fn every_all_nvlink_set_beats_every_set_that_must_cross_sockets() {
    let nodes: Vec<(&str, NodeTopology)> =
        builtin_types().into_iter().map(|(name, _)| (name, builtin_topology(name).unwrap())).collect();
    for size in 2..=8 {
        let mut worst_nvlink: Option<(f64, &str, Vec<usize>)> = None;
        let mut best_sys: Option<(f64, &str, Vec<usize>)> = None;
        for (name, t) in &nodes {
            for set in subsets(t.gpu_count(), size) {
                let ring = t.ring_bandwidth(&set).unwrap();
                assert!(ring.is_exact(), "{name} {set:?}");
                if t.all_nvlinked(&set) && worst_nvlink.as_ref().is_none_or(|w| ring.gbps < w.0) {
                    worst_nvlink = Some((ring.gbps, name, set.clone()));
                }
                if every_ring_crosses_sys(t, &set) && best_sys.as_ref().is_none_or(|b| ring.gbps > b.0) {
                    best_sys = Some((ring.gbps, name, set));
                }
            }
        }
        if let (Some(nv), Some(sys)) = (worst_nvlink, best_sys) {
            assert!(nv.0 > sys.0, "{size} GPUs: all-NVLink {nv:?} does not beat cross-socket {sys:?}");
        }
    }
}

#[test]
fn the_issue_example_is_ranked_by_its_slowest_hop_not_its_mean() {
    let pcie = builtin_topology("a100-pcie-4gpu").unwrap();
    let dgx1 = builtin_topology("dgx1-v100").unwrap();
    let quad = [0, 1, 2, 3];
    assert!(dgx1.all_nvlinked(&quad));
    // The mean prefers the PCIe quad ...
    assert!(pcie.mean_pair_bandwidth_gbps(&quad) > dgx1.mean_pair_bandwidth_gbps(&quad));
    // ... the ring does not: the PCIe quad runs at its cross-socket hop.
    let (p, d) = (pcie.ring_bandwidth(&quad).unwrap().gbps, dgx1.ring_bandwidth(&quad).unwrap().gbps);
    assert!(d > p, "DGX-1 quad {d} GB/s, a100-pcie-4gpu quad {p} GB/s");
    assert_eq!(p, 10.0, "the inter-socket rate");
}
