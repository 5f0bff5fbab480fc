//! Static partition tables and node scoring.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{dgx1_volta, prepared};
use weft_alloc::{
    AllocError, NodeFit, Optimality, Policy, PreparedNode, Request, ScoreCache, ScoreConfig, SetQuality, StaticTable,
    allocate, score_node, stranded_gpus,
};
use weft_topology::model::uniform_node;
use weft_topology::{PairLink, PcieRelation};

fn sys_node(n: usize) -> PreparedNode {
    prepared(&uniform_node("sys", n, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 }))
}

fn static_alloc(
    table: &StaticTable,
    node: &PreparedNode,
    available: &[usize],
    required: &[usize],
    count: usize,
) -> Result<Vec<usize>, AllocError> {
    allocate(node, &Policy::Static(table.clone()), &Request { count, available, required }).map(|a| a.gpus)
}

// ------------------------------------------------------------------------------------------------
// Static tables
// ------------------------------------------------------------------------------------------------

#[test]
fn builtin_tables_exist_and_fit_their_nodes() {
    assert_eq!(StaticTable::builtin_names(), &["dgx1-pascal", "dgx1-volta", "dgx2-volta", "hgx-8gpu"]);
    let eight = sys_node(8);
    let sixteen = sys_node(16);
    for name in StaticTable::builtin_names() {
        let t = StaticTable::builtin(name).unwrap();
        assert_eq!(&t.name, name);
        let node = if *name == "dgx2-volta" { &sixteen } else { &eight };
        assert_eq!(t.validate_for(node), Ok(()), "{name}");
    }
    assert!(StaticTable::builtin("dgx-9000").is_none());
}

#[test]
fn builtin_tables_have_upstreams_sets() {
    let volta = StaticTable::builtin("dgx1-volta").unwrap();
    assert_eq!(volta.sets[&2], vec![vec![0, 3], vec![1, 2], vec![4, 7], vec![5, 6]]);
    assert_eq!(volta.sets[&4], vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(volta.sets[&1].len(), 8);
    let pascal = StaticTable::builtin("dgx1-pascal").unwrap();
    assert_eq!(pascal.sets[&2], vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
    let dgx2 = StaticTable::builtin("dgx2-volta").unwrap();
    assert_eq!(dgx2.sets[&2].len(), 8);
    assert_eq!(dgx2.sets[&2][7], vec![14, 15]);
    assert_eq!(dgx2.sets[&4][3], vec![12, 13, 14, 15]);
    assert_eq!(dgx2.sets[&8], vec![(0..8).collect::<Vec<_>>(), (8..16).collect()]);
    assert_eq!(dgx2.sets[&16], vec![(0..16).collect::<Vec<_>>()]);
    let hgx = StaticTable::builtin("hgx-8gpu").unwrap();
    assert_eq!(hgx.sets.keys().copied().collect::<Vec<_>>(), vec![1, 2, 4, 8]);
    assert_eq!(hgx.sets[&2], vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
    assert_eq!(hgx.sets[&4], vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(hgx.sets[&8], vec![(0..8).collect::<Vec<_>>()]);
}

#[test]
fn static_policy_takes_the_first_free_listed_set() {
    let node = prepared(&dgx1_volta());
    let t = StaticTable::builtin("dgx1-volta").unwrap();
    let all: Vec<usize> = (0..8).collect();
    assert_eq!(static_alloc(&t, &node, &all, &[], 2), Ok(vec![0, 3]));
    assert_eq!(static_alloc(&t, &node, &[1, 2, 4, 5, 6, 7], &[], 2), Ok(vec![1, 2]));
    assert_eq!(static_alloc(&t, &node, &all, &[5], 2), Ok(vec![5, 6]));
    assert_eq!(static_alloc(&t, &node, &all, &[4], 4), Ok(vec![4, 5, 6, 7]));
    assert_eq!(
        static_alloc(&t, &node, &all, &[], 3),
        Err(AllocError::NoStaticSet { table: "dgx1-volta".into(), count: 3 })
    );
    // 0 and 5 are never in one listed pair.
    assert_eq!(
        static_alloc(&t, &node, &all, &[0, 5], 2),
        Err(AllocError::NoStaticSet { table: "dgx1-volta".into(), count: 2 })
    );
    let a = allocate(&node, &Policy::Static(t), &Request { count: 2, available: &all, required: &[] }).unwrap();
    assert_eq!((a.set_score, a.optimality), (230, Optimality::NotApplicable));
}

#[test]
fn tables_parse_from_json_and_yaml() {
    let json = r#"{ "name": "fm", "sets": { "1": [[0], [1], [2], [3]], "2": [[0, 1], [2, 3]], "4": [[0, 1, 2, 3]] } }"#;
    let yaml_quoted =
        "name: fm\nsets:\n  \"1\": [[0], [1], [2], [3]]\n  \"2\": [[0, 1], [2, 3]]\n  \"4\": [[0, 1, 2, 3]]\n";
    let yaml_plain =
        "name: fm\nsets:\n  1: [[0], [1], [2], [3]]\n  2:\n    - [0, 1]\n    - [2, 3]\n  4: [[0, 1, 2, 3]]\n";
    let a = StaticTable::from_json(json).unwrap();
    assert_eq!(a.name, "fm");
    assert_eq!(a.sets[&2], vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(StaticTable::from_yaml(yaml_quoted).unwrap(), a);
    assert_eq!(StaticTable::from_yaml(yaml_plain).unwrap(), a);
    assert_eq!(StaticTable::parse(json).unwrap(), a);
    assert_eq!(StaticTable::parse(yaml_plain).unwrap(), a);
    // A builtin survives a JSON round trip.
    let hgx = StaticTable::builtin("hgx-8gpu").unwrap();
    assert_eq!(StaticTable::from_json(&serde_json::to_string(&hgx).unwrap()).unwrap(), hgx);
}

#[test]
fn malformed_table_text_is_a_format_error() {
    for text in [
        r#"{ "name": "x", "sets": { "two": [[0, 1]] } }"#,
        r#"{ "name": "x" }"#,
        r#"{ "name": "x", "sets": {}, "extra": 1 }"#,
        "name: [unclosed",
    ] {
        assert!(matches!(StaticTable::parse(text), Err(AllocError::StaticTableFormat(_))), "{text}");
    }
}

#[test]
fn validation_names_table_size_and_set() {
    let node = sys_node(8);
    let bad = |json: &str| StaticTable::from_json(json).unwrap().validate_for(&node).unwrap_err();
    let AllocError::BadStaticTable { table, size, set, why } = bad(r#"{"name": "t", "sets": {"2": [[0, 1], [6, 9]]}}"#)
    else {
        panic!("wrong variant")
    };
    assert_eq!((table.as_str(), size, set), ("t", 2, vec![6, 9]));
    assert!(why.contains("GPU9") && why.contains("8 GPUs"), "{why}");
    let AllocError::BadStaticTable { size, set, why, .. } = bad(r#"{"name": "t", "sets": {"2": [[0, 1, 2]]}}"#) else {
        panic!("wrong variant")
    };
    assert_eq!((size, set), (2, vec![0, 1, 2]));
    assert!(why.contains("3 GPUs"), "{why}");
    let AllocError::BadStaticTable { set, why, .. } = bad(r#"{"name": "t", "sets": {"2": [[3, 3]]}}"#) else {
        panic!("wrong variant")
    };
    assert_eq!(set, vec![3, 3]);
    assert!(why.contains("twice"), "{why}");
    // The message carries all of it.
    let msg = bad(r#"{"name": "fm-part", "sets": {"4": [[0, 1, 2, 12]]}}"#).to_string();
    assert!(msg.contains("fm-part") && msg.contains("size 4") && msg.contains("[0, 1, 2, 12]"), "{msg}");
    // The DGX-2 table does not fit an 8-GPU node.
    let e = StaticTable::builtin("dgx2-volta").unwrap().validate_for(&node).unwrap_err();
    assert!(matches!(e, AllocError::BadStaticTable { size: 1, ref set, .. } if set == &vec![8]), "{e:?}");
}

#[test]
fn allocation_refuses_a_malformed_candidate_set() {
    let node = sys_node(8);
    let t = StaticTable::from_json(r#"{"name": "t", "sets": {"2": [[3, 3], [0, 1]]}}"#).unwrap();
    let e = static_alloc(&t, &node, &[0, 1, 3], &[], 2).unwrap_err();
    assert!(matches!(e, AllocError::BadStaticTable { .. }), "{e:?}");
}

// ------------------------------------------------------------------------------------------------
// Node scoring
// ------------------------------------------------------------------------------------------------

fn score(node: &PreparedNode, free: &[usize], q: usize) -> NodeFit {
    score_node(node, free, q, &ScoreConfig::default()).unwrap()
}

#[test]
fn one_gpu_requests_score_without_dividing_by_zero() {
    let node = prepared(&dgx1_volta());
    let all: Vec<usize> = (0..8).collect();
    let f = score(&node, &all, 1);
    assert_eq!(f.affinity, 100.0);
    assert_eq!(f.gpus, vec![0]);
    assert!((1..=100).contains(&f.score));
    // GPU0 taken: every other GPU still has a free NVLink peer, nothing stranded.
    assert_eq!((f.remainder, f.score), (100.0, 100));
}

#[test]
fn scores_never_exceed_100() {
    // 18 NVLinks + SameBoard on every pair: the real maximum pair score 1860.
    let node = prepared(&uniform_node("nv18", 8, PairLink { pcie: Some(PcieRelation::SameBoard), nvlinks: 18 }));
    let all: Vec<usize> = (0..8).collect();
    let pair_score = ScoreConfig { set_quality: SetQuality::PairScore, ..ScoreConfig::default() };
    for q in 1..=8 {
        let f = score_node(&node, &all, q, &pair_score).unwrap();
        assert_eq!(f.affinity, 100.0, "q={q}");
        // q = 7 leaves one GPU whose every NVLink peer is busy: R = 0, score 0.8 · 100.
        let want = if q == 7 { 80 } else { 100 };
        assert_eq!(f.score, want, "q={q}");
        // The ring measure: 18 links of the guessed generation (NVLink 2, 25 GB/s) per hop.
        let r = score(&node, &all, q);
        let ring = if q == 1 { 0.0 } else { 450.0 };
        assert_eq!(r.ring_gbps, ring, "q={q}");
        assert_eq!(r.affinity, weft_alloc::score::ring_affinity(ring, q), "q={q}");
        assert!(r.affinity <= 100.0 && r.score <= 100, "q={q}: {r:?}");
    }
}

#[test]
fn sys_only_nodes_score_above_zero_and_below_nvlinked_nodes() {
    let sys = sys_node(8);
    let volta = prepared(&dgx1_volta());
    let all: Vec<usize> = (0..8).collect();
    for q in [2, 4, 8] {
        let s = score(&sys, &all, q);
        let v = score(&volta, &all, q);
        assert!(s.score > 0 && s.affinity > 30.0, "q={q}: {s:?}");
        assert!(s.score < v.score, "q={q}: SYS {} vs DGX-1V {}", s.score, v.score);
    }
    // On go-gpuallocator's scale the weakest NVLinked pair (NV1 + SYS) with the worst remainder
    // (everything left stranded) still beats the best SYS-only pair (nothing to strand).
    let mut t = uniform_node("weak", 4, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
    t.set_link(0, 1, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 1 });
    t.set_link(2, 3, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 1 });
    let weak = prepared(&t);
    let pair_score = ScoreConfig { set_quality: SetQuality::PairScore, ..ScoreConfig::default() };
    let w = score_node(&weak, &[0, 1, 2], 2, &pair_score).unwrap();
    assert_eq!((w.gpus.clone(), w.remainder), (vec![0, 1], 0.0));
    let s = score_node(&sys, &all, 2, &pair_score).unwrap();
    assert!(w.score > s.score, "NV1 {} vs SYS {}", w.score, s.score);
    // On the ring's scale the NV1 pair (25 GB/s) has the higher affinity than SYS (10 GB/s), and
    // what it strands counts: one link's worth is not worth stranding every GPU left.
    let (w, s) = (score(&weak, &[0, 1, 2], 2), score(&sys, &all, 2));
    assert!(w.affinity > s.affinity, "NV1 {} vs SYS {}", w.affinity, s.affinity);
    assert_eq!((w.ring_gbps, s.ring_gbps), (25.0, 10.0));
    // PCIe-only nodes are told apart (the KEP's integer formula gives 0 for both).
    let pix = prepared(&uniform_node("pix", 8, PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 }));
    assert!(score(&pix, &all, 2).score > s.score);
}

#[test]
fn remainder_term_prefers_not_stranding() {
    // X: NV2 pairs (0,1), (2,3). Y: a chain 0–1–2 (NV2 each). Both give a q=2 pod an NV2 pair, but
    // on Y the GPU left behind has lost its only NVLink peer.
    let nv2 = PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 2 };
    let pix = PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 };
    let mut x = uniform_node("x", 4, pix);
    x.set_link(0, 1, nv2);
    x.set_link(2, 3, nv2);
    let mut y = uniform_node("y", 3, pix);
    y.set_link(0, 1, nv2);
    y.set_link(1, 2, nv2);
    let (x, y) = (prepared(&x), prepared(&y));
    let fx = score(&x, &[0, 1, 2, 3], 2);
    let fy = score(&y, &[0, 1, 2], 2);
    assert_eq!(fx.affinity, fy.affinity);
    assert_eq!((fx.remainder, fy.remainder), (100.0, 0.0));
    assert!(fx.score > fy.score, "{} vs {}", fx.score, fy.score);
    assert_eq!(stranded_gpus(&y, 0b100), 1);
    // With the remainder weight at 0 they tie.
    let cfg = ScoreConfig { remainder_weight: 0.0, ..ScoreConfig::default() };
    assert_eq!(
        score_node(&x, &[0, 1, 2, 3], 2, &cfg).unwrap().score,
        score_node(&y, &[0, 1, 2], 2, &cfg).unwrap().score
    );
}

#[test]
fn scoring_errors_are_typed() {
    let node = prepared(&dgx1_volta());
    let cfg = ScoreConfig::default();
    assert_eq!(score_node(&node, &[0, 1], 3, &cfg), Err(AllocError::InsufficientGpus { requested: 3, available: 2 }));
    assert_eq!(score_node(&node, &[0, 1], 0, &cfg), Err(AllocError::ZeroCount));
    assert_eq!(score_node(&node, &[0, 9], 1, &cfg), Err(AllocError::UnknownGpu { gpu: 9, n: 8 }));
    assert_eq!(score_node(&node, &[1, 1], 1, &cfg), Err(AllocError::DuplicateGpu { gpu: 1 }));
}

#[test]
fn score_does_not_depend_on_free_list_order() {
    let node = prepared(&uniform_node("u", 6, PairLink { pcie: Some(PcieRelation::Pix), nvlinks: 0 }));
    let a = score(&node, &[5, 4, 3, 2, 1, 0], 2);
    let b = score(&node, &[0, 1, 2, 3, 4, 5], 2);
    assert_eq!(a, b);
    assert_eq!(a.gpus, vec![0, 1]);
}

#[test]
fn cache_returns_the_uncached_result_and_counts_hits() {
    let volta = prepared(&dgx1_volta());
    let volta2 = prepared(&dgx1_volta());
    let sys = sys_node(8);
    assert_eq!(volta.fingerprint(), volta2.fingerprint());
    assert_ne!(volta.fingerprint(), sys.fingerprint());
    let mut cache = ScoreCache::new();
    let cfg = ScoreConfig::default();
    let mut calls = 0u64;
    for mask in 1u32..256 {
        let free: Vec<usize> = (0..8).filter(|g| mask >> g & 1 == 1).collect();
        for q in 1..=free.len() {
            for node in [&volta, &volta2, &sys] {
                let want = score_node(node, &free, q, &cfg).unwrap();
                assert_eq!(cache.score(node, &free, q, &cfg).unwrap(), want);
                calls += 1;
            }
        }
    }
    // volta and volta2 share entries; sys has its own.
    assert_eq!(cache.topologies(), 2);
    let (hits, misses) = cache.stats();
    assert_eq!(hits + misses, calls);
    assert_eq!(misses, calls / 3 * 2);
    assert_eq!(cache.len() as u64, misses);
    // A different weight on a cached entry is honoured.
    let w0 = ScoreConfig { remainder_weight: 0.0, ..ScoreConfig::default() };
    assert_eq!(cache.score(&volta, &[0, 1, 2], 2, &w0).unwrap(), score_node(&volta, &[0, 1, 2], 2, &w0).unwrap());
    // Errors are not cached and still reported.
    assert_eq!(cache.score(&volta, &[0], 2, &cfg), Err(AllocError::InsufficientGpus { requested: 2, available: 1 }));
}

#[test]
fn cache_capacity_bounds_its_size() {
    let node = prepared(&dgx1_volta());
    let mut cache = ScoreCache::with_capacity(3);
    let cfg = ScoreConfig::default();
    for q in 1..=8 {
        cache.score(&node, &(0..8).collect::<Vec<_>>(), q, &cfg).unwrap();
        assert!(cache.len() <= 3);
    }
    assert!(!cache.is_empty());
    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.topologies(), 0);
}

/// Best-effort maximises the pair-score sum and takes a set with a cross-socket hop (two NV3 pairs
/// and one SYS pair sum higher than an NV3 pair and two NV1 pairs); the ring quality takes the set
/// whose every hop is NVLink, and go-gpuallocator's choice stays one flag away.
#[test]
fn the_ring_quality_trades_pair_score_for_a_set_without_a_slow_hop() {
    let sys = PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 };
    let nv = |n| PairLink { pcie: Some(PcieRelation::Sys), nvlinks: n };
    let mut t = uniform_node("hop", 4, sys);
    t.set_link(0, 1, nv(3));
    t.set_link(0, 2, nv(3));
    t.set_link(0, 3, nv(1));
    t.set_link(1, 3, nv(1));
    let node = prepared(&t);
    let all = [0, 1, 2, 3];
    let pair_score = ScoreConfig { set_quality: SetQuality::PairScore, ..ScoreConfig::default() };
    let upstream = score_node(&node, &all, 3, &pair_score).unwrap();
    assert_eq!(upstream.gpus, vec![0, 1, 2]);
    assert_eq!(upstream.ring_gbps, 10.0, "its ring crosses the sockets");
    let ring = score_node(&node, &all, 3, &ScoreConfig::default()).unwrap();
    assert_eq!(ring.gpus, vec![0, 1, 3]);
    assert_eq!(ring.ring_gbps, 25.0);
    assert!(ring.set_score < upstream.set_score);
    // The cache gives the same answers, each under its own quality.
    let mut cache = ScoreCache::new();
    assert_eq!(cache.score(&node, &all, 3, &pair_score).unwrap(), upstream);
    assert_eq!(cache.score(&node, &all, 3, &ScoreConfig::default()).unwrap(), ring);
    // Where best-effort's set already has the fastest ring it stands: of the two NV3 pairs, the one
    // that leaves the NV1 pair 1–3 whole (go-gpuallocator's packing).
    assert_eq!(score_node(&node, &all, 2, &ScoreConfig::default()).unwrap().gpus, vec![0, 2]);
}
