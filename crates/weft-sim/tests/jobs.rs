//! `weft simulate --jobs`'s engine: the cluster's network from a cluster file, the queue rule
//! shared by every policy, the per-job bandwidth estimate, and every policy's placements checked on
//! a generated stream.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use weft_gang::{TierConstraint, TierRef};
use weft_sim::ClusterSpec;
use weft_sim::jobs::network::{CLIQUE_LABEL, LEAF_LABEL, SPINE_LABEL};
use weft_sim::jobs::{
    JobGenerate, JobPolicyKind, JobRun, JobsFile, NetCluster, SimJob, asks, bandwidth, default_scenario, run_jobs,
    simulate_jobs,
};

const FILE: &str = "\
apiVersion: weft.io/v1alpha1
kind: SimCluster
nodeTypes:
  - {name: nvl72, topology: builtin:gb200-nvl72-tray, count: 36, vfsPerNic: 0}
  - {name: h100, topology: builtin:hgx-h100, count: 8, vfsPerNic: 0}
network:
  nicGbps: 50
  spineOversubscription: 2
  coreOversubscription: 4
  leavesPerSpine: 1
  groups:
    - {nodeType: nvl72, nodesPerLeaf: 36, nodesPerNvlinkDomain: 18, nvlinkDomainGbps: 900}
    - {nodeType: h100, nodesPerLeaf: 4}
";

fn net() -> NetCluster {
    let (spec, network) = ClusterSpec::parse_with_network(FILE, "test").expect("parses");
    network.expect("has a network").build(&spec, None).expect("builds")
}

fn job(name: &str, members: usize, gpus: usize, arrival: f64, duration: f64) -> SimJob {
    SimJob { name: name.into(), members, gpus, arrival, duration, topology: None }
}

/// The network section gives each node its spine, leaf and (NVL72 trays) GPU clique, and the model
/// has the tiers innermost first.
#[test]
fn a_cluster_file_network_becomes_tiers_and_domains() {
    let net = net();
    assert_eq!(net.model.tiers_text(), format!("1 ({CLIQUE_LABEL}), 2 ({LEAF_LABEL}), 3 ({SPINE_LABEL}), 4 (cluster)"));
    let count = |t: usize| net.model.tier_domains(t).len();
    assert_eq!((count(0), count(1), count(2)), (2, 3, 3), "2 NVLink domains, 1 + 2 leaves, a spine per leaf");
    let clique = net.clique_tier.unwrap();
    let tray0 = net.model.node_index("nvl72-0").unwrap();
    let tray17 = net.model.node_index("nvl72-17").unwrap();
    let tray18 = net.model.node_index("nvl72-18").unwrap();
    assert_eq!(net.domain_at(tray0, clique), net.domain_at(tray17, clique));
    assert_ne!(net.domain_at(tray0, clique), net.domain_at(tray18, clique));
    assert_eq!(net.domain_at(tray0, net.leaf_tier), net.domain_at(tray18, net.leaf_tier), "two racks per leaf");
    let h = net.model.node_index("h100-0").unwrap();
    assert_eq!(net.domain_at(h, clique), None, "no NVLink domain beyond the node");
}

/// Bad network sections name the field and what is wrong.
#[test]
fn bad_network_sections_say_where() {
    let bad = |from: &str, to: &str| {
        ClusterSpec::parse_with_network(&FILE.replace(from, to), "cluster.yaml").unwrap_err().to_string()
    };
    let e = bad("nodesPerNvlinkDomain: 18", "nodesPerNvlinkDomain: 20");
    assert!(e.contains("network.groups[0] ('nvl72').nodesPerNvlinkDomain") && e.contains("divide"), "{e}");
    let e = bad("nodeType: h100,", "nodeType: h200,");
    assert!(e.contains("network.groups[1] ('h200').nodeType") && e.contains("nvl72, h100"), "{e}");
    let e = bad("spineOversubscription: 2", "spineOversubscription: 0.5");
    assert!(e.contains("oversubscription") && e.contains("≥ 1"), "{e}");
    let e = bad("nicGbps: 50", "nicGbs: 50");
    assert!(e.contains("cluster.yaml") && e.contains("nicGbs"), "{e}");
    // The pod simulator reads the same file and leaves the network out.
    let path = std::env::temp_dir().join(format!("weft-sim-jobs-net-{}.yaml", std::process::id()));
    std::fs::write(&path, FILE).unwrap();
    let spec = ClusterSpec::from_file(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(spec.unwrap().node_types.len(), 2);
}

/// A job's bandwidth is its slowest hop: the ring on each node, then the link of the innermost
/// domain holding its nodes (NVLink domain, leaf NIC, NIC over the spine's oversubscription, over
/// both across spines).
#[test]
fn bandwidth_is_the_slowest_hop() {
    let net = net();
    let n = |name: &str| net.model.node_index(name).unwrap();
    let all = |k: usize| (1u128 << k) - 1;
    // One tray, 4 GPUs: NVLink 5 between every pair.
    assert_eq!(bandwidth(&net, &vec![(n("nvl72-0"), all(4))]), Some(900.0));
    // Two trays of one rack: the NVLink domain.
    assert_eq!(bandwidth(&net, &vec![(n("nvl72-0"), all(4)), (n("nvl72-5"), all(4))]), Some(900.0));
    // Two racks under one leaf: the NICs.
    assert_eq!(bandwidth(&net, &vec![(n("nvl72-0"), all(4)), (n("nvl72-20"), all(4))]), Some(50.0));
    // Two H100 nodes of one leaf, then of two leaves (two spines: 50 / (2 × 4)).
    assert_eq!(bandwidth(&net, &vec![(n("h100-0"), all(8)), (n("h100-1"), all(8))]), Some(50.0));
    assert_eq!(bandwidth(&net, &vec![(n("h100-0"), all(8)), (n("h100-4"), all(8))]), Some(6.25));
    // A single GPU has no hop.
    assert_eq!(bandwidth(&net, &vec![(n("h100-0"), 1)]), None);
    // One GPU on each of two nodes: only the network hop.
    assert_eq!(bandwidth(&net, &vec![(n("h100-0"), 1), (n("h100-1"), 1)]), Some(50.0));
}

/// The queue, the same for every policy: a job that does not fit waits; when a job leaves, the
/// waiting jobs are tried in arrival order and each that fits goes (a later one is not held behind
/// an earlier one); a job waiting longer than the patience gives up.
#[test]
fn waiting_jobs_are_retried_at_departures_in_arrival_order_with_backfill() {
    let net = net();
    // The cluster: 36 trays of 4 GPUs and 8 H100 nodes, 52 slots of 4 GPUs. `big` takes 32 trays
    // for 100 s and `h` half the H100 nodes; `wide` (34 × 4) cannot fit beside them (12 slots
    // left); `small` (2 × 4) can, though it arrives after `wide`. (34 pods fit the trays alone: Kueue
    // gives a pod set one flavor, one node type.)
    let jobs = vec![
        job("big", 32, 4, 0.0, 100.0),
        job("h", 4, 8, 1.0, 1000.0),
        job("wide", 34, 4, 2.0, 10.0),
        job("small", 2, 4, 3.0, 10.0),
        job("late", 34, 4, 4.0, 10.0),
    ];
    let asks = asks(&jobs).unwrap();
    for kind in JobPolicyKind::ALL {
        let mut policy = kind.build(&net, &Default::default()).unwrap();
        let out = run_jobs(&net, &jobs, &asks, policy.as_mut(), &JobRun { patience: 200.0, ..JobRun::default() });
        let start: Vec<Option<f64>> = out.iter().map(|o| o.start).collect();
        assert_eq!(start[0], Some(0.0), "{}", kind.name());
        assert_eq!(start[3], Some(3.0), "{}: small backfills at once", kind.name());
        // `small` leaves at 13 s (nothing frees room for `wide`); `big` at 100 s: `wide` goes first,
        // then `late` waits for `wide` to leave at 110 s.
        assert_eq!(start[2], Some(100.0), "{}", kind.name());
        assert_eq!(start[4], Some(110.0), "{}", kind.name());
        let short = run_jobs(
            &net,
            &jobs,
            &asks,
            kind.build(&net, &Default::default()).unwrap().as_mut(),
            &JobRun { patience: 50.0, ..JobRun::default() },
        );
        assert_eq!(short[2].start, None, "{}: gave up before `big` left", kind.name());
        assert_eq!(short[4].start, None, "{}", kind.name());
    }
}

/// Every policy's placements on a generated stream: every member gets its GPUs on one node, no GPU
/// is held twice at once, hard constraints hold (but for weft-pods, which does not read them), and
/// the same seed gives the same report.
#[test]
fn every_policy_places_whole_jobs_on_free_gpus() {
    let (spec, network) = default_scenario();
    let net = network.build(&spec, None).unwrap();
    let jobs =
        JobGenerate { jobs: 400, seed: 3, load: 1.2, ..JobGenerate::default() }.jobs(net.cluster.total_gpus()).unwrap();
    let asks = asks(&jobs).unwrap();
    for kind in JobPolicyKind::ALL {
        let mut policy = kind.build(&net, &Default::default()).unwrap();
        let out = run_jobs(&net, &jobs, &asks, policy.as_mut(), &JobRun::default());
        // Replay: at every instant, the held GPUs of each node are disjoint.
        let mut events: Vec<(f64, bool, usize)> = Vec::new();
        for (j, o) in out.iter().enumerate() {
            if let Some(s) = o.start {
                assert_eq!(o.placement.len(), jobs[j].members, "{}: {}", kind.name(), jobs[j].name);
                for &(_, m) in &o.placement {
                    assert_eq!(m.count_ones() as usize, jobs[j].gpus);
                }
                events.push((s, true, j));
                events.push((s + jobs[j].duration, false, j));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut held = vec![0u128; net.cluster.nodes.len()];
        for (_, take, j) in events {
            for &(n, m) in &out[j].placement {
                if take {
                    assert_eq!(held[n] & m, 0, "{}: GPU held twice on node {n}", kind.name());
                    held[n] |= m;
                } else {
                    held[n] &= !m;
                }
            }
        }
        if kind != JobPolicyKind::WeftPods {
            for (j, o) in out.iter().enumerate() {
                if o.start.is_some() && jobs[j].topology.as_deref() == Some(&format!("hard:{LEAF_LABEL}")) {
                    let tier = net.model.domains()[o.domain.unwrap()].tier;
                    assert!(tier <= net.leaf_tier, "{}: {} beyond its leaf", kind.name(), jobs[j].name);
                }
            }
        }
    }
    let a = simulate_jobs(&net, &jobs, &JobPolicyKind::ALL, &JobRun::default()).unwrap();
    let b = simulate_jobs(&net, &jobs, &JobPolicyKind::ALL, &JobRun::default()).unwrap();
    let strip = |r: &weft_sim::jobs::JobsReport| {
        r.policies.iter().map(|p| weft_sim::jobs::JobPolicyReport { run_ms: 0.0, ..p.clone() }).collect::<Vec<_>>()
    };
    assert_eq!(strip(&a), strip(&b));
    assert!(a.policies.iter().all(|p| p.placed > 0));
}

/// A job stream file: generated and listed jobs by arrival; a bad topology names the job.
#[test]
fn jobs_files_merge_generated_and_listed_jobs() {
    let text = "apiVersion: weft.io/v1alpha1\nkind: SimJobs\ngenerate: {jobs: 5, seed: 2}\njobs:\n  - {name: a, members: 4, gpus: 8, arrival: 0, duration: 10, topology: soft}\n";
    let f = JobsFile::parse(text, "jobs.yaml").unwrap();
    let jobs = f.jobs(1000, "jobs.yaml").unwrap();
    assert_eq!(jobs.len(), 6);
    assert_eq!(jobs[0].name, "a");
    assert!(jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    assert_eq!(jobs[0].constraint().unwrap(), Some(TierConstraint::soft()));
    let e = JobsFile::parse(&text.replace("topology: soft", "topology: hardest"), "jobs.yaml")
        .unwrap()
        .jobs(1000, "jobs.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("jobs[0] ('a')") && e.contains("weft.io/network-topology"), "{e}");
    let _ = TierRef::Number(1);
}

/// weft pod by pod: members one by one on the best-scored node, whole jobs or nothing (a member
/// that fits nowhere leaves no trace), constraints not read; the gang plan keeps them.
#[test]
fn weft_pods_is_per_pod_and_all_or_nothing() {
    let net = net();
    let free: Vec<u128> = net.cluster.nodes.iter().map(|n| if n.name.starts_with("h100") { 0xff } else { 0 }).collect();
    let hard_leaf = weft_sim::jobs::JobAsk {
        members: 5,
        gpus: 8,
        constraint: Some(TierConstraint::hard(TierRef::Name(LEAF_LABEL.into()))),
    };
    let mut pods = JobPolicyKind::WeftPods.build(&net, &Default::default()).unwrap();
    let mut gang = JobPolicyKind::WeftGang.build(&net, &Default::default()).unwrap();
    // The policies' indexes hear of the trays being taken, as the engine tells them.
    let all = |n: usize| (1u128 << net.cluster.types[net.cluster.nodes[n].node_type].topology.gpu_count()) - 1;
    for (n, &f) in free.iter().enumerate() {
        if f != all(n) {
            pods.changed(n, all(n), f);
            gang.changed(n, all(n), f);
        }
    }
    assert!(gang.place(&net, &free, &hard_leaf).is_none(), "no leaf of 4 H100 nodes holds 5");
    let placed = pods.place(&net, &free, &hard_leaf).expect("weft-pods does not read the constraint");
    assert_eq!(placed.len(), 5);
    assert!(placed.iter().all(|&(_, m)| m == 0xff));
    // Nine whole nodes do not fit eight; the failed try leaves the index as it was.
    let nine = weft_sim::jobs::JobAsk { members: 9, gpus: 8, constraint: None };
    assert!(pods.place(&net, &free, &nine).is_none());
    let two = weft_sim::jobs::JobAsk { members: 2, gpus: 4, constraint: None };
    let mut other = JobPolicyKind::WeftPods.build(&net, &Default::default()).unwrap();
    for (n, &f) in free.iter().enumerate() {
        if f != all(n) {
            other.changed(n, all(n), f);
        }
    }
    let fresh = other.place(&net, &free, &two);
    assert_eq!(pods.place(&net, &free, &two), fresh);
    assert_eq!(
        fresh.as_ref().map(|p| p[0].0 == p[1].0),
        Some(true),
        "both halves of one node: fewer free GPUs after the first"
    );
}
