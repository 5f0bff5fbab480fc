//! The upstream baselines of `weft simulate --jobs` on hand-worked small clusters: each test pins
//! one documented behaviour of Volcano's network-topology-aware allocate path or Kueue's TAS
//! assignment (the upstream file is named in the test's comment; the facts are collected in
//! shared/reference/job-topology.md §2 and §3).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use weft_gang::{TierConstraint, TierRef};
use weft_sim::jobs::network::{LEAF_LABEL, SPINE_LABEL};
use weft_sim::jobs::{GroupNetwork, JobAsk, NetCluster, NetworkSpec, kueue, volcano};
use weft_sim::{ClusterSpec, NodeTypeSpec};

/// `n` HGX H100 nodes (8 GPUs), leaves of `per_leaf` nodes, spines of `per_spine` leaves.
fn h100(n: usize, per_leaf: usize, per_spine: usize) -> NetCluster {
    let spec = ClusterSpec {
        api_version: weft_sim::API_VERSION.into(),
        kind: "SimCluster".into(),
        node_types: vec![NodeTypeSpec { vfs_per_nic: Some(0), ..NodeTypeSpec::builtin("hgx-h100", n) }],
    };
    let network = NetworkSpec {
        leaves_per_spine: per_spine,
        groups: vec![GroupNetwork {
            node_type: "hgx-h100".into(),
            nodes_per_leaf: per_leaf,
            nodes_per_nvlink_domain: None,
            nvlink_domain_gbps: None,
        }],
        ..NetworkSpec::default()
    };
    network.build(&spec, None).expect("the test cluster builds")
}

fn ask(members: usize, gpus: usize, constraint: Option<TierConstraint>) -> JobAsk {
    JobAsk { members, gpus, constraint }
}

fn hard(tier: &str) -> Option<TierConstraint> {
    Some(TierConstraint::hard(TierRef::Name(tier.into())))
}

/// The leaf (by name) of each node of a placement.
fn leaves(net: &NetCluster, nodes: &[usize]) -> Vec<String> {
    nodes.iter().map(|&n| net.model.domains()[net.domain_at(n, net.leaf_tier).unwrap()].name.clone()).collect()
}

/// The reference's worked skeleton (§2.11, the user guide's §3.3 scenario): four tier-1 HyperNodes
/// of 4 nodes, two tier-2 ones over two each; 8 whole-node pods, hard up to tier 2. No tier-1
/// candidate holds them, both tier-2 ones do with binpack 1.0; Volcano's winner is arbitrary (Go
/// map order), the simulator's is the first by name.
/// volcano: pkg/scheduler/actions/allocate/allocate.go allocateForJob,
/// pkg/scheduler/plugins/network-topology-aware/network_topology_aware.go hyperNodeGradientFn.
#[test]
fn volcano_climbs_to_the_first_tier_that_holds_the_job() {
    let net = h100(16, 4, 2);
    let free = vec![8u32; 16];
    let nodes = volcano::decide(&net, &free, &ask(8, 8, hard(SPINE_LABEL))).expect("fits in a spine");
    let mut l = leaves(&net, &nodes);
    l.sort();
    l.dedup();
    assert_eq!(l, ["leaf-0", "leaf-1"], "spine-0, the first of the tied tier-2 HyperNodes");
    assert!(volcano::decide(&net, &free, &ask(8, 8, hard(LEAF_LABEL))).is_none(), "hard at tier 1: no leaf holds 8");
}

/// Among the candidates of a tier, the fullest wins: `(used + request) / allocatable`.
/// volcano: network_topology_aware.go getSubJobHyperNodeBinPackingScore.
#[test]
fn volcano_prefers_the_fullest_hypernode_that_holds_the_job() {
    let net = h100(8, 4, 2);
    // leaf-0 wholly free (binpack (0 + 16) / 32); leaf-1 half used ((16 + 16) / 32).
    let free = vec![8, 8, 8, 8, 8, 8, 0, 0];
    let nodes = volcano::decide(&net, &free, &ask(2, 8, hard(LEAF_LABEL))).expect("fits in a leaf");
    assert_eq!(leaves(&net, &nodes), ["leaf-1", "leaf-1"]);
}

/// A candidate is eligible on its summed idle GPUs, but only a dry run that places every task
/// makes it a solution: leaf-0 has 16 GPUs idle as 4 per node, which holds no 8-GPU pod, and
/// loses to leaf-1 although both score 1.0 and leaf-0 comes first by name.
/// volcano: network_topology_aware.go isEligibleHyperNode; allocate.go allocateForJob (a candidate
/// whose statement is not Ready is no solution).
#[test]
fn volcano_counts_idle_gpus_to_admit_and_whole_pods_to_succeed() {
    let net = h100(8, 4, 2);
    let free = vec![4, 4, 4, 4, 8, 8, 0, 0];
    let nodes = volcano::decide(&net, &free, &ask(2, 8, hard(LEAF_LABEL))).expect("leaf-1 holds it");
    assert_eq!(leaves(&net, &nodes), ["leaf-1", "leaf-1"]);
}

/// `soft` is `hard` up to the virtual root since v1.15, so a job that no spine holds still goes
/// (across spines); `hard` up to the spine tier does not.
/// volcano: pkg/scheduler/framework/session.go convertSoftToHardTopology.
#[test]
fn volcano_soft_falls_back_to_the_whole_cluster() {
    let net = h100(16, 4, 2);
    let mut free = vec![0u32; 16];
    for n in [0, 1, 2, 8, 9, 10] {
        free[n] = 8;
    }
    assert!(volcano::decide(&net, &free, &ask(6, 8, hard(SPINE_LABEL))).is_none());
    let nodes = volcano::decide(&net, &free, &ask(6, 8, Some(TierConstraint::soft()))).expect("soft reaches the root");
    let mut got = nodes.clone();
    got.sort();
    assert_eq!(got, [0, 1, 2, 8, 9, 10]);
}

/// `hard` without a tier is not hard (`IsHardTopologyMode` needs `highestTierAllowed`): the job
/// takes the normal path, as one without a constraint.
/// volcano: pkg/scheduler/api/job_info.go IsHardTopologyMode.
#[test]
fn volcano_hard_without_a_tier_is_no_constraint() {
    let net = h100(16, 4, 2);
    let free: Vec<u32> = (0..16).map(|i| [8, 4, 8, 2][i % 4]).collect();
    let no_tier = Some(TierConstraint { mode: weft_gang::Mode::Hard, highest: None });
    assert_eq!(volcano::decide(&net, &free, &ask(5, 2, no_tier)), volcano::decide(&net, &free, &ask(5, 2, None)));
}

/// Without a topology, every task goes where the normal-pod score is highest: the tiers' binpack
/// faded by 0.8 per tier, so the fullest leaf (then spine) that still has room wins. Here leaf-2
/// (in spine-1) is the fullest leaf with a node that fits; the 2-GPU pod goes there although
/// leaf-0 comes first.
/// volcano: network_topology_aware.go batchNodeOrderFnForNormalPods, getPodHyperNodeBinPackingScore.
#[test]
fn volcano_normal_pods_go_to_the_fullest_hypernodes() {
    let net = h100(16, 4, 2);
    let mut free = vec![8u32; 16];
    // leaf-2: three nodes full, one with 2 free.
    for n in [8, 9, 10] {
        free[n] = 0;
    }
    free[11] = 2;
    let nodes = volcano::decide(&net, &free, &ask(1, 2, None)).expect("fits");
    assert_eq!(nodes, [11]);
    // A pod the full leaf cannot take goes to the fullest of the others with room: spine-1's leaf-3
    // (spine-1 is fuller than spine-0), not leaf-0.
    let nodes = volcano::decide(&net, &free, &ask(1, 4, None)).expect("fits");
    assert_eq!(leaves(&net, &nodes), ["leaf-3"]);
}

/// The flavor of `net`'s only node type.
fn flavor(net: &NetCluster) -> kueue::Flavor {
    let mut f = kueue::Flavor::of(net);
    assert_eq!(f.len(), 1);
    f.remove(0)
}

/// The KEP's first example (keps/2724-topology-aware-scheduling/README.md, "Example"): hosts of 3,
/// 3, 2 and 1 free pods, 7 pods. BestFit takes 3 + 3 and then the best fit for the last one, the
/// 1-node; LeastFreeCapacity takes them in ascending order, 1 + 2 + 3 and 1 on the second 3-node.
/// kueue: pkg/cache/scheduler/tas_flavor_snapshot.go findLevelWithFitDomains,
/// updateCountsToMinimumGeneric, sortedDomains.
#[test]
fn kueue_best_fit_and_least_free_capacity_as_in_the_kep() {
    let net = h100(4, 4, 1);
    let f = flavor(&net);
    let free = vec![3u32, 3, 2, 1];
    let best = f.assign(&free, 1, 7, kueue::Request::Preferred(1)).expect("the leaf holds 9");
    assert_eq!(count_per_node(&best, 4), [3, 3, 0, 1]);
    let lfc = f.assign(&free, 1, 7, kueue::Request::Unconstrained).expect("the hosts hold 9");
    assert_eq!(count_per_node(&lfc, 4), [3, 1, 2, 1], "h100-0 and h100-1 tie at 3; the first by name comes first");
}

fn count_per_node(nodes: &[usize], n: usize) -> Vec<usize> {
    (0..n).map(|i| nodes.iter().filter(|&&x| x == i).count()).collect()
}

/// BestFit at the requested level: the domain with the smallest count that holds the job, not the
/// largest. Leaves hold 8, 5 and 3 pods of 8 GPUs... as 1-GPU pods: 8 x 1, 5, 3 free GPUs.
/// kueue: tas_flavor_snapshot.go findBestFitDomainBy.
#[test]
fn kueue_required_takes_the_best_fitting_domain() {
    let net = h100(3, 1, 3);
    let f = flavor(&net);
    let free = vec![8u32, 5, 3];
    let nodes = f.assign(&free, 1, 4, kueue::Request::Required(1)).expect("leaf-1 holds 5");
    assert_eq!(nodes, [1, 1, 1, 1]);
}

/// `required` places at exactly its level or not at all; `preferred` climbs one level at a time and
/// at the top level spreads over several domains.
/// kueue: tas_flavor_snapshot.go findLevelWithFitDomains.
#[test]
fn kueue_required_fails_where_preferred_climbs() {
    let net = h100(8, 2, 2);
    let f = flavor(&net);
    // Every leaf holds 2 whole-node pods; spines hold 4.
    let free = vec![8u32; 8];
    assert!(f.assign(&free, 8, 3, kueue::Request::Required(1)).is_none(), "no leaf holds 3");
    let nodes = f.assign(&free, 8, 3, kueue::Request::Preferred(1)).expect("a spine holds 3");
    let mut l = leaves(&net, &nodes);
    l.sort();
    assert_eq!(l, ["leaf-0", "leaf-0", "leaf-1"], "spine-0: one leaf whole, the best fit for the last pod");
    let nodes = f.assign(&free, 8, 6, kueue::Request::Preferred(1)).expect("two spines hold 6");
    assert_eq!(nodes.len(), 6);
    assert!(f.assign(&free, 8, 9, kueue::Request::Preferred(1)).is_none());
}

/// The request a job's constraint becomes: hard at a tier is `required` at that level, `soft` is
/// `preferred` at the lowest level above the hostname, none is unconstrained (implied TAS).
/// kueue: pkg/controller/jobframework/tas.go; pkg/scheduler/flavorassigner/tas_flavorassigner.go
/// isTASImplied.
#[test]
fn kueue_requests_from_constraints() {
    let net = h100(4, 2, 2);
    let f = flavor(&net);
    assert_eq!(f.request(&net, &ask(2, 8, hard(LEAF_LABEL))), Some(kueue::Request::Required(1)));
    assert_eq!(f.request(&net, &ask(2, 8, hard(SPINE_LABEL))), Some(kueue::Request::Required(0)));
    assert_eq!(f.request(&net, &ask(2, 8, Some(TierConstraint::soft()))), Some(kueue::Request::Preferred(1)));
    assert_eq!(f.request(&net, &ask(2, 8, None)), Some(kueue::Request::Unconstrained));
}
