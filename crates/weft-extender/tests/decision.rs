//! The pure decisions and the topology cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use weft_alloc::{PreparedNode, score_node};
use weft_extender::ExtenderConfig;
use weft_extender::cache::TopologyCache;
use weft_extender::decision::{NodeState, Verdict, filter, prioritize, prioritize_with, spread};
use weft_record::TOPOLOGY_ANNOTATION;

fn prep(t: &weft_topology::NodeTopology) -> PreparedNode {
    PreparedNode::new(t).unwrap()
}

#[test]
fn filter_verdicts_follow_free_and_total_gpus() {
    let cfg = ExtenderConfig::default();
    let n8 = prep(&common::a100_nvswitch("n"));
    let n2 = prep(&common::pcie_only("s", 2));
    let nodes = [
        NodeState::Known { prepared: &n8, used: 0, vfs: None },
        NodeState::Known { prepared: &n8, used: 0b1111_1000, vfs: None },
        NodeState::Known { prepared: &n2, used: 0, vfs: None },
        NodeState::Unknown { reason: "node has no annotation" },
    ];
    let v = filter(3, &nodes, &cfg);
    assert_eq!(v[0], Verdict::Pass { note: None });
    assert_eq!(v[1], Verdict::Pass { note: None }, "exactly as many free as requested");
    assert_eq!(v[2], Verdict::Unresolvable("node has 2 GPUs; pod requests 3".into()));
    assert!(matches!(&v[3], Verdict::Pass { note: Some(n) } if n.contains("node has no annotation")));

    let strict = ExtenderConfig { require_topology: true, ..ExtenderConfig::default() };
    assert!(matches!(&filter(3, &nodes, &strict)[3], Verdict::Unresolvable(r) if r.contains("required")));
    assert!(filter(0, &nodes, &strict).iter().all(Verdict::passes), "a pod without GPUs is not constrained");
}

#[test]
fn filter_fails_when_fewer_free_than_requested() {
    let cfg = ExtenderConfig::default();
    let n8 = prep(&common::a100_nvswitch("n"));
    let v = filter(4, &[NodeState::Known { prepared: &n8, used: 0b0001_1111, vfs: None }], &cfg);
    // The reason reaches the pod's events: it names the request, not the node's occupancy.
    assert_eq!(v[0], Verdict::Fail("not enough free GPUs; pod requests 4".into()));
}

#[test]
fn prioritize_equals_weft_alloc_score_spread_over_the_candidates_for_any_usage() {
    let cfg = ExtenderConfig::default();
    let topo = common::dgx1_v100("n");
    let p = prep(&topo);
    let masks: Vec<u128> = (0u128..256).step_by(7).collect();
    let nodes: Vec<NodeState<'_>> =
        masks.iter().map(|&used| NodeState::Known { prepared: &p, used, vfs: None }).collect();
    for count in [1usize, 2, 4] {
        let got = prioritize(count as u64, &nodes, &cfg);
        let raw: Vec<Option<u8>> = masks
            .iter()
            .map(|&used| {
                let free: Vec<usize> = (0..8).filter(|g| used & (1 << g) == 0).collect();
                score_node(&p, &free, count, &cfg.score_config).ok().map(|fit| fit.score)
            })
            .collect();
        let lo = raw.iter().flatten().copied().min().unwrap();
        let hi = raw.iter().flatten().copied().max().unwrap();
        assert!(lo < hi, "the usages give a spread of raw scores");
        for (i, &used) in masks.iter().enumerate() {
            let free: Vec<usize> = (0..8).filter(|g| used & (1 << g) == 0).collect();
            let want = raw[i].map_or(0, |r| spread(r, lo, hi));
            assert_eq!(got[i].score, want, "count {count}, used {used:#b}");
            // The order of raw scores is kept, and the best node gets the top score.
            for j in 0..masks.len() {
                if let (Some(a), Some(b)) = (raw[i], raw[j])
                    && a > b
                {
                    assert!(got[i].score >= got[j].score, "{a} > {b} but {} < {}", got[i].score, got[j].score);
                }
            }
            if raw[i] == Some(hi) {
                assert_eq!(got[i].score, 10);
            }
            assert!((0..=10).contains(&got[i].score));
            if free.len() < count {
                assert!(got[i].reason.as_deref().unwrap_or("").contains("GPUs free"), "{:?}", got[i]);
            }
        }
    }
}

#[test]
fn shared_prepared_nodes_score_like_separate_ones() {
    let cfg = ExtenderConfig::default();
    let shared = prep(&common::dgx1_v100("a"));
    let other = prep(&common::dgx1_v100("b"));
    let used = 0b0000_0110;
    let memo = prioritize(
        2,
        &[
            NodeState::Known { prepared: &shared, used, vfs: None },
            NodeState::Known { prepared: &shared, used, vfs: None },
        ],
        &cfg,
    );
    let fresh = prioritize(2, &[NodeState::Known { prepared: &other, used, vfs: None }], &cfg);
    assert_eq!(memo[0], fresh[0]);
    assert_eq!(memo[1], fresh[0]);
}

#[test]
fn unknown_nodes_score_zero_and_gpu_free_pods_get_the_neutral_score() {
    let cfg = ExtenderConfig::default();
    let n8 = prep(&common::a100_nvswitch("n"));
    let nodes =
        [NodeState::Unknown { reason: "no annotation" }, NodeState::Known { prepared: &n8, used: 0, vfs: None }];
    let s = prioritize(2, &nodes, &cfg);
    assert_eq!(s[0].score, 0);
    assert!(s[0].reason.as_deref().unwrap_or("").contains("no annotation"));
    assert!(s[1].fit.is_some());
    let s = prioritize(0, &nodes, &cfg);
    assert!(s.iter().all(|x| x.score == cfg.neutral_score), "{s:?}");
}

#[test]
fn cache_keeps_one_entry_per_node_and_reports_unknown_nodes() {
    let cache = TopologyCache::new();
    let a = common::node("a", Some(&common::dgx1_v100("a")), 8);
    let c = common::node("c", Some(&common::a100_nvswitch("c")), 8);
    let bare = common::node("bare", None, 8);
    let r = cache.resolve_all([Some(&a), Some(&c), Some(&bare), None]);
    assert_eq!(r[0].as_ref().unwrap().len(), 8);
    assert_eq!(r[1].as_ref().unwrap().len(), 8);
    assert!(r[2].as_ref().unwrap_err().contains("no weft.io/gpu-topology annotation"));
    assert!(r[3].as_ref().unwrap_err().contains("not in the extender's node cache"));
    let again = cache.resolve_all([Some(&a), Some(&c)]);
    assert!(Arc::ptr_eq(r[0].as_ref().unwrap(), again[0].as_ref().unwrap()));
    assert_eq!(cache.parses(), 2);
    assert_eq!(cache.len(), 2);
}

#[test]
fn a_score_cache_kept_across_calls_gives_the_same_scores() {
    let cfg = ExtenderConfig::default();
    let a = prep(&common::dgx1_v100("a"));
    let b = prep(&common::a100_nvswitch("b"));
    let nodes: Vec<NodeState<'_>> = (0u128..64)
        .map(|used| NodeState::Known { prepared: if used % 2 == 0 { &a } else { &b }, used: used * 3 % 256, vfs: None })
        .collect();
    let mut cache = weft_alloc::ScoreCache::new();
    let first = prioritize_with(2, &nodes, &cfg, &mut cache);
    let second = prioritize_with(2, &nodes, &cfg, &mut cache);
    assert_eq!(first, prioritize(2, &nodes, &cfg));
    assert_eq!(second, first);
    let (hits, _) = cache.stats();
    assert!(hits > 0);
}

#[test]
fn cache_rereads_a_changed_annotation_even_without_resource_version() {
    let cache = TopologyCache::new();
    let mut n = common::node("n", Some(&common::a100_nvswitch("n")), 8);
    n.metadata.resource_version = None;
    let first = cache.resolve(&n).unwrap();
    let again = cache.resolve(&n).unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(cache.parses(), 1);
    n.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(TOPOLOGY_ANNOTATION.into(), weft_topology::inventory::to_json(&common::pcie_only("n", 4)));
    let changed = cache.resolve(&n).unwrap();
    assert_eq!(changed.len(), 4);
    assert_eq!(cache.parses(), 2);
    n.metadata.annotations.as_mut().unwrap().insert(TOPOLOGY_ANNOTATION.into(), "GPU0 X".into());
    let e = cache.resolve(&n).unwrap_err();
    assert!(e.contains("not weft inventory JSON"), "{e}");
}

#[test]
fn nodes_with_one_annotation_share_one_parse_and_the_cache_stays_within_its_limits() {
    use weft_extender::cache::CacheLimits;
    let limits = CacheLimits { max_nodes: 100, max_bytes: 256 << 10 };
    let cache = TopologyCache::with_limits(limits);
    let topo = common::a100_nvswitch("same");
    // A thousand tiny nodes with one and the same annotation (a prioritize request can carry them).
    let nodes: Vec<_> = (0..1000).map(|i| common::node(&format!("n{i}"), Some(&topo), 8)).collect();
    let got = cache.resolve_all(nodes.iter().map(Some));
    assert!(got.iter().all(|r| r.as_ref().is_ok_and(|p| p.len() == 8)));
    assert!(got.windows(2).all(|w| Arc::ptr_eq(w[0].as_ref().unwrap(), w[1].as_ref().unwrap())), "one shared entry");
    assert_eq!(cache.parses(), 1);
    assert!(cache.len() <= limits.max_nodes, "{} names kept", cache.len());
    assert!(cache.bytes() <= limits.max_bytes);

    // Many distinct annotations, request after request: the bytes held stay under the limit and
    // every answer is still right.
    for batch in 0..20 {
        let nodes: Vec<_> = (0..50)
            .map(|i| {
                let name = format!("d{batch}-{i}");
                common::node(&name, Some(&common::pcie_only(&name, 1 + i % 8)), 8)
            })
            .collect();
        let got = cache.resolve_all(nodes.iter().map(Some));
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().len(), 1 + i % 8);
        }
        assert!(cache.bytes() <= limits.max_bytes, "batch {batch}: {} bytes held", cache.bytes());
        assert!(cache.len() <= limits.max_nodes);
    }
    // An evicted node is read again, correctly.
    let again = cache.resolve(&common::node("d0-3", Some(&common::pcie_only("d0-3", 4)), 8)).unwrap();
    assert_eq!(again.len(), 4);
}

#[test]
fn a_view_node_is_answered_by_its_object_until_the_view_hands_out_another() {
    let cache = TopologyCache::new();
    let a = Arc::new(common::node("a", Some(&common::dgx1_v100("a")), 8));
    let bare = Arc::new(common::node("bare", None, 8));
    let first = cache.resolve_shared([("a", Some(&a)), ("bare", Some(&bare)), ("gone", None)]);
    assert!(first[1].as_ref().unwrap_err().contains("no weft.io/gpu-topology annotation"));
    assert!(first[2].as_ref().unwrap_err().contains("not in the extender's node cache"));
    let again = cache.resolve_shared([("a", Some(&a)), ("bare", Some(&bare))]);
    assert!(Arc::ptr_eq(first[0].as_ref().unwrap(), again[0].as_ref().unwrap()));
    assert!(again[1].is_err());
    assert_eq!(cache.parses(), 1);
    // The same answers as for the node read field by field.
    assert!(Arc::ptr_eq(first[0].as_ref().unwrap(), cache.resolve(&a).as_ref().unwrap()));
    // The view replaced the node: the new object is read (new version, new topology)...
    let mut changed = common::node("a", Some(&common::pcie_only("a", 4)), 8);
    changed.metadata.resource_version = Some("1002".into());
    let changed = Arc::new(changed);
    assert_eq!(cache.resolve_shared([("a", Some(&changed))])[0].as_ref().unwrap().len(), 4);
    assert_eq!(cache.parses(), 2);
    // ...and the old object, should the view hand it out again, is read for what it is, not
    // mistaken for the entry's object (its text is still cached: no parse).
    assert_eq!(cache.resolve_shared([("a", Some(&a))])[0].as_ref().unwrap().len(), 8);
    assert_eq!(cache.resolve_shared([("a", Some(&changed))])[0].as_ref().unwrap().len(), 4);
    assert_eq!(cache.parses(), 2);
}
