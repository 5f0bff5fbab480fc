//! The network model and the gang plan, with hand-worked expected values.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use weft_alloc::SetQuality;
use weft_gang::builtin::gb200_nvl72_tray;
use weft_gang::network::CLIQUE_LABEL;
use weft_gang::{
    AllocSets, ClusterNode, Gang, LabelLevels, ModelError, NetworkModel, NodeFree, PlanError, RailConfig,
    TierConstraint, TierRef, from_hypernodes, from_labels, parse_hypernodes, plan,
};

const SPINE: &str = "example.com/spine";
const LEAF: &str = "example.com/leaf";
const UUID_A: &str = "1b968a6d-c8aa-45e1-9e07-e1e51be99c31";
const UUID_B: &str = "2b968a6d-c8aa-45e1-9e07-e1e51be99c31";

fn clique(uuid: &str, id: u32) -> String {
    format!("{uuid}.{id}")
}

/// Eight nodes: spine s1 holds leaf l1 (n1-n4; n1, n2 in clique A.1, n3, n4 in clique A.2) and
/// leaf l2 (n5, n6); spine s2 holds leaf l3 (n7, n8).
fn eight_nodes() -> Vec<ClusterNode> {
    let (a1, a2) = (clique(UUID_A, 1), clique(UUID_A, 2));
    vec![
        ClusterNode::new("n1", &[(SPINE, "s1"), (LEAF, "l1"), (CLIQUE_LABEL, &a1)]),
        ClusterNode::new("n2", &[(SPINE, "s1"), (LEAF, "l1"), (CLIQUE_LABEL, &a1)]),
        ClusterNode::new("n3", &[(SPINE, "s1"), (LEAF, "l1"), (CLIQUE_LABEL, &a2)]),
        ClusterNode::new("n4", &[(SPINE, "s1"), (LEAF, "l1"), (CLIQUE_LABEL, &a2)]),
        ClusterNode::new("n5", &[(SPINE, "s1"), (LEAF, "l2")]),
        ClusterNode::new("n6", &[(SPINE, "s1"), (LEAF, "l2")]),
        ClusterNode::new("n7", &[(SPINE, "s2"), (LEAF, "l3")]),
        ClusterNode::new("n8", &[(SPINE, "s2"), (LEAF, "l3")]),
    ]
}

/// The same cluster as HyperNodes, each member form used once at least.
fn eight_hypernodes() -> String {
    format!(
        r#"
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {{name: "{a}.1"}}
spec:
  tier: 1
  tierName: clique
  members:
    - {{type: Node, selector: {{exactMatch: {{name: n1}}}}}}
    - {{type: Node, selector: {{exactMatch: {{name: n2}}}}}}
---
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {{name: "{a}.2"}}
spec:
  tier: 1
  members:
    - {{type: Node, selector: {{regexMatch: {{pattern: "n[34]"}}}}}}
---
apiVersion: v1
kind: List
items:
  - apiVersion: topology.volcano.sh/v1alpha1
    kind: HyperNode
    metadata: {{name: l1}}
    spec:
      tier: 2
      tierName: leaf
      members:
        - {{type: HyperNode, selector: {{exactMatch: {{name: "{a}.1"}}}}}}
        - {{type: HyperNode, selector: {{exactMatch: {{name: "{a}.2"}}}}}}
  - apiVersion: topology.volcano.sh/v1alpha1
    kind: HyperNode
    metadata: {{name: l2}}
    spec:
      tier: 2
      members:
        - type: Node
          selector: {{labelMatch: {{matchLabels: {{example.com/leaf: l2}}}}}}
  - apiVersion: topology.volcano.sh/v1alpha1
    kind: HyperNode
    metadata: {{name: l3}}
    spec:
      tier: 2
      members:
        - type: Node
          selector:
            labelMatch:
              matchExpressions: [{{key: example.com/leaf, operator: In, values: [l3]}}]
  - apiVersion: topology.volcano.sh/v1alpha1
    kind: HyperNode
    metadata: {{name: s1}}
    spec:
      tier: 3
      tierName: spine
      members:
        - {{type: HyperNode, selector: {{exactMatch: {{name: l1}}}}}}
        - {{type: HyperNode, selector: {{exactMatch: {{name: l2}}}}}}
  - apiVersion: topology.volcano.sh/v1alpha1
    kind: HyperNode
    metadata: {{name: s2}}
    spec:
      tier: 3
      members:
        - {{type: HyperNode, selector: {{exactMatch: {{name: l3}}}}}}
"#,
        a = UUID_A
    )
}

fn eight_levels() -> LabelLevels {
    LabelLevels::new(&[SPINE, LEAF]).with_clique()
}

#[test]
fn labels_and_hypernodes_give_the_same_tree() {
    let nodes = eight_nodes();
    let by_labels = from_labels(&eight_levels(), &nodes).unwrap();
    let hns = parse_hypernodes(&eight_hypernodes(), "hypernodes.yaml").unwrap();
    assert_eq!(hns.len(), 7);
    let by_hypernodes = from_hypernodes(&hns, &nodes).unwrap();
    assert!(by_hypernodes.warnings().is_empty(), "{:?}", by_hypernodes.warnings());
    assert_eq!(by_labels.describe(), by_hypernodes.describe());
    // Hand-worked: 2 cliques, 3 leaves, 2 spines, the root; tiers 1..4.
    let d = by_labels.describe();
    assert_eq!(d.len(), 8);
    let l1 = d.iter().find(|v| v.name == "l1").unwrap();
    assert_eq!((l1.tier, l1.parent.as_deref(), l1.nodes.len()), (2, Some("s1"), 4));
    let root = d.iter().find(|v| v.parent.is_none()).unwrap();
    assert_eq!((root.tier, root.name.as_str(), root.nodes.len()), (4, "cluster", 8));
    let tiers: Vec<(u32, &str)> = by_hypernodes.tiers().iter().map(|t| (t.number, t.name.as_str())).collect();
    assert_eq!(tiers, [(1, "clique"), (2, "leaf"), (3, "spine"), (4, "cluster")]);
    let tiers: Vec<&str> = by_labels.tiers().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tiers, [CLIQUE_LABEL, LEAF, SPINE, "cluster"]);
    // Every domain is a contiguous range of the depth-first order.
    for (i, dom) in by_labels.domains().iter().enumerate() {
        let mut names: Vec<&str> = by_labels.domain_nodes(i).iter().map(|&n| by_labels.node_name(n)).collect();
        names.sort_unstable();
        let expect = d.iter().find(|v| v.name == dom.name).unwrap();
        assert_eq!(names, expect.nodes.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

fn hypernode_error(yaml: &str) -> String {
    let hns = parse_hypernodes(yaml, "h.yaml").unwrap();
    from_hypernodes(&hns, &eight_nodes()).unwrap_err().to_string()
}

#[test]
fn hypernodes_volcano_rejects_are_rejected() {
    // Two parents (Volcano's addChild).
    let e = hypernode_error(
        r#"
{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}
---
{metadata: {name: p}, spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: a}}}]}}
---
{metadata: {name: q}, spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: a}}}]}}
"#,
    );
    assert_eq!(e, "HyperNode `a` is a member of both `p` and `q`; a HyperNode has one parent");
    // A cycle.
    let e = hypernode_error(
        r#"
{metadata: {name: a}, spec: {tier: 1, members: [{type: HyperNode, selector: {exactMatch: {name: b}}}]}}
---
{metadata: {name: b}, spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: a}}}]}}
"#,
    );
    // Walked from the first HyperNode by name: a is a member of b, b of a.
    assert_eq!(e, "HyperNodes form a cycle (each a member of the next): a -> b -> a");
    // No members (the webhook).
    let e = hypernode_error("{metadata: {name: a}, spec: {tier: 1, members: []}}");
    assert_eq!(e, "HyperNode `a`: spec.members: no members (at least one)");
    // A regex that does not compile (the webhook).
    let e = hypernode_error(
        r#"{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {regexMatch: {pattern: "n[1"}}}]}}"#,
    );
    assert!(e.starts_with("HyperNode `a`: spec.members[0].selector.regexMatch.pattern: `n[1` does not compile"), "{e}");
    // Two selector forms (the CRD's CEL rule), and none.
    let e = hypernode_error(
        r#"{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {exactMatch: {name: n1}}}, {type: Node, selector: {exactMatch: {name: n2}, regexMatch: {pattern: n}}}]}}"#,
    );
    assert_eq!(
        e,
        "HyperNode `a`: spec.members[1].selector: 2 of exactMatch, regexMatch, labelMatch given; exactly one is required"
    );
    let e = hypernode_error(r#"{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {}}]}}"#);
    assert!(e.contains("spec.members[0].selector: 0 of exactMatch"), "{e}");
    // Tier: missing, negative (the CRD's minimum 0).
    let e = hypernode_error(
        r#"{metadata: {name: a}, spec: {members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}"#,
    );
    assert_eq!(e, "HyperNode `a`: spec.tier: missing (required)");
    let e = hypernode_error(
        r#"{metadata: {name: a}, spec: {tier: -1, members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}"#,
    );
    assert_eq!(e, "HyperNode `a`: spec.tier: -1 is negative (minimum 0)");
    // A label selector LabelSelectorAsSelector refuses.
    let e = hypernode_error(
        r#"{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {labelMatch: {matchExpressions: [{key: k, operator: Near}]}}}]}}"#,
    );
    assert!(e.contains("spec.members[0].selector.labelMatch: matchExpressions[0]: unknown operator `Near`"), "{e}");
}

#[test]
fn hypernodes_weft_needs_a_tree() {
    // A node in two tier-1 HyperNodes: Volcano keeps both, weft's tree cannot.
    let e = hypernode_error(
        r#"
{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}
---
{metadata: {name: b}, spec: {tier: 1, members: [{type: Node, selector: {regexMatch: {pattern: "^n1$"}}}]}}
"#,
    );
    assert_eq!(
        e,
        "node `n1` is a member of HyperNode `a` (tier 1) and of `b` (tier 1), which do not contain one another; weft needs each node on one path of the tree"
    );
    // A node in a leaf and again in the leaf's parent is one path: accepted.
    let hns = parse_hypernodes(
        r#"
{metadata: {name: a}, spec: {tier: 1, members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}
---
{metadata: {name: p}, spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: a}}}, {type: Node, selector: {exactMatch: {name: n1}}}, {type: HyperNode, selector: {exactMatch: {name: gone}}}]}}
"#,
        "h.yaml",
    )
    .unwrap();
    let m = from_hypernodes(&hns, &eight_nodes()).unwrap();
    assert_eq!(m.domains()[m.lowest_domain(0)].name, "a");
    assert_eq!(m.warnings(), ["HyperNode `p`: member HyperNode `gone` does not exist; skipped"]);
    // A member HyperNode whose tier is not below its parent's.
    let e = hypernode_error(
        r#"
{metadata: {name: a}, spec: {tier: 2, members: [{type: Node, selector: {exactMatch: {name: n1}}}]}}
---
{metadata: {name: p}, spec: {tier: 2, members: [{type: HyperNode, selector: {exactMatch: {name: a}}}]}}
"#,
    );
    assert_eq!(e, "HyperNode `p`: spec.members: member HyperNode `a` has tier 2, not below this HyperNode's tier 2");
}

#[test]
fn hypernode_parse_errors_name_line_and_column() {
    let e = parse_hypernodes(
        "{metadata: {name: a}, spec: {tier: 1, members: []}}\n---\n{metadata: {name: b}, spec: {tier: 1, members: [{type: Rack, selector: {}}]}}\n",
        "h.yaml",
    )
    .unwrap_err()
    .to_string();
    // Line 3 is the second document; column 56 is `Rack`.
    assert!(
        e.starts_with("h.yaml: error: line 3 column 56: unknown variant `Rack`, expected one of Node, HyperNode"),
        "{e}"
    );
}

#[test]
fn label_errors_name_node_and_label() {
    let mut nodes = eight_nodes();
    nodes[5].labels.remove(LEAF);
    let e = from_labels(&eight_levels(), &nodes).unwrap_err();
    assert_eq!(e, ModelError::MissingLabel { node: "n6".into(), key: LEAF.into() });
    assert_eq!(
        e.to_string(),
        "node `n6` has no label `example.com/leaf`, which every node needs (a required tier level)"
    );

    let mut nodes = eight_nodes();
    nodes[7].labels.insert(LEAF.into(), "l2".into());
    let e = from_labels(&eight_levels(), &nodes).unwrap_err().to_string();
    assert_eq!(
        e,
        "example.com/leaf domain `l2` is under two parents: `s1` (node `n5`) and `s2` (node `n8`); a tier's domain must sit inside one domain of each tier above it"
    );

    let mut nodes = eight_nodes();
    nodes[0].labels.insert(CLIQUE_LABEL.into(), "rack-7".into());
    let e = from_labels(&eight_levels(), &nodes).unwrap_err().to_string();
    assert!(e.starts_with("node `n1`: label `nvidia.com/gpu.clique` = `rack-7` is not a GPU clique"), "{e}");

    let mut nodes = eight_nodes();
    nodes.push(nodes[2].clone());
    assert_eq!(from_labels(&eight_levels(), &nodes).unwrap_err(), ModelError::DuplicateNode { name: "n3".into() });
    assert_eq!(
        from_labels(&LabelLevels::new(&[LEAF, LEAF]), &eight_nodes()).unwrap_err(),
        ModelError::DuplicateLevel { key: LEAF.into() }
    );
}

// ---- Plans over GB200 NVL72 trays ------------------------------------------------------------

/// One leaf `leaf-a` over two NVL72 racks (cliques A.1 and B.1) of 18 trays each, `a01`..`a18`
/// and `b01`..`b18`; every tray a GB200 tray.
fn two_racks() -> (NetworkModel, AllocSets) {
    let mut nodes = Vec::new();
    for (rack, uuid) in [("a", UUID_A), ("b", UUID_B)] {
        for t in 1..=18 {
            let c = clique(uuid, 1);
            nodes.push(ClusterNode::new(&format!("{rack}{t:02}"), &[(LEAF, "leaf-a"), (CLIQUE_LABEL, &c)]));
        }
    }
    let model = from_labels(&LabelLevels::new(&[LEAF]).with_clique(), &nodes).unwrap();
    let sets = AllocSets::new(&[gb200_nvl72_tray().unwrap()], vec![0; nodes.len()], SetQuality::Ring).unwrap();
    (model, sets)
}

/// Free capacity: the first `a_free` trays of rack a and `b_free` of rack b wholly free, the rest
/// with one GPU (GPU 3) free.
fn racks_free(model: &NetworkModel, a_free: usize, b_free: usize) -> Vec<NodeFree> {
    (0..model.node_count())
        .map(|i| {
            let name = model.node_name(i);
            let t: usize = name[1..].parse().unwrap();
            let free = if name.starts_with('a') { t <= a_free } else { t <= b_free };
            if free { NodeFree::all_gpus(4) } else { NodeFree { gpus: 0b1000, vfs: BTreeMap::new() } }
        })
        .collect()
}

fn gang(members: usize, gpus: usize, constraint: TierConstraint) -> Gang {
    Gang { members, gpus_per_member: gpus, constraint, ..Gang::default() }
}

#[test]
fn a_gang_that_fits_one_nvlink_domain_gets_it() {
    let (model, mut sets) = two_racks();
    // Rack a: 10 free trays (and 8 single GPUs: 48 GPUs free, enough in sum for 12 members);
    // rack b: 16 free trays. 16 members × 4 GPUs fit only rack b.
    let free = racks_free(&model, 10, 16);
    let p = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!((p.domain.as_str(), p.tier.as_str(), p.tier_number), (clique(UUID_B, 1).as_str(), CLIQUE_LABEL, 1));
    let nodes: Vec<&str> = p.members.iter().map(|m| m.node.as_str()).collect();
    let expect: Vec<String> = (1..=16).map(|t| format!("b{t:02}")).collect();
    assert_eq!(nodes, expect);
    assert!(p.members.iter().all(|m| m.gpus == [0, 1, 2, 3]));
    assert_eq!(p.nodes, 16);
    assert_eq!(p.rail_aligned, None);
}

#[test]
fn best_fit_takes_the_fullest_domain_that_fits() {
    let (model, mut sets) = two_racks();
    // Both racks hold 16 members; rack a has 16 free trays, rack b all 18: a fits tighter.
    let free = racks_free(&model, 16, 18);
    let p = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!(p.domain, clique(UUID_A, 1));
    // Equal slots (16 and 16): the fewer free GPUs. Both racks have 16 free trays and 2 trays
    // with one GPU free (66 GPUs); a17 gets two more (68, still no slot there), so rack b wins.
    let mut free = racks_free(&model, 16, 16);
    let a17 = model.node_index("a17").unwrap();
    free[a17].gpus = 0b0111;
    let p = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!(p.domain, clique(UUID_B, 1));
    // All equal: the name (A's UUID sorts first).
    let free = racks_free(&model, 16, 16);
    let p = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!(p.domain, clique(UUID_A, 1));
    let free = racks_free(&model, 18, 16);
    let p = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!(p.domain, clique(UUID_B, 1));
}

#[test]
fn hard_highest_tier_refuses_what_soft_places_a_tier_up() {
    let (model, mut sets) = two_racks();
    // 10 free trays in each rack: 16 members fit no clique, only the leaf.
    let free = racks_free(&model, 10, 10);
    let e = plan(&model, &free, &gang(16, 4, TierConstraint::hard(TierRef::Number(1))), &mut sets).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "a gang of 16 × 4 GPU(s) does not fit within tier 1 (nvidia.com/gpu.clique): the most members one nvidia.com/gpu.clique domain holds is 10 (`{}`), 6 short",
            clique(UUID_A, 1)
        )
    );
    let by_name = TierConstraint::hard(TierRef::Name(CLIQUE_LABEL.into()));
    assert!(matches!(plan(&model, &free, &gang(16, 4, by_name), &mut sets), Err(PlanError::NoFit { .. })));
    // Soft falls back to the leaf: rack a's 10 trays whole (largest first), then 6 of rack b.
    let soft = plan(&model, &free, &gang(16, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!((soft.domain.as_str(), soft.tier.as_str(), soft.tier_number), ("leaf-a", LEAF, 2));
    let nodes: Vec<&str> = soft.members.iter().map(|m| m.node.as_str()).collect();
    let mut expect: Vec<String> = (1..=10).map(|t| format!("a{t:02}")).collect();
    expect.extend((1..=6).map(|t| format!("b{t:02}")));
    assert_eq!(nodes, expect);
    // Hard up to the leaf (by number or name) is the same plan.
    for tier in [TierRef::Number(2), TierRef::Name(LEAF.into())] {
        assert_eq!(plan(&model, &free, &gang(16, 4, TierConstraint::hard(tier)), &mut sets).unwrap(), soft);
    }
    // Hard without a tier constrains nothing (Volcano's IsHardTopologyMode).
    let c = TierConstraint { mode: weft_gang::Mode::Hard, highest: None };
    assert_eq!(plan(&model, &free, &gang(16, 4, c), &mut sets).unwrap(), soft);
    // A tier below every tier, and an unknown tier name.
    let e = plan(&model, &free, &gang(1, 4, TierConstraint::hard(TierRef::Number(0))), &mut sets).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a gang of 1 × 4 GPU(s) does not fit within tier 0: no tier of this cluster is that low (tiers: 1 (nvidia.com/gpu.clique), 2 (example.com/leaf), 3 (cluster))"
    );
    let e =
        plan(&model, &free, &gang(1, 4, TierConstraint::hard(TierRef::Name("rack".into()))), &mut sets).unwrap_err();
    assert_eq!(
        e.to_string(),
        "highest tier `rack` is not a tier of this cluster's network (tiers: 1 (nvidia.com/gpu.clique), 2 (example.com/leaf), 3 (cluster))"
    );
}

#[test]
fn members_pack_onto_the_fewest_nodes_and_leave_a_whole_node() {
    // One leaf, three trays: t1 and t3 with 4 GPUs free (2 slots of 2 GPUs), t2 with GPUs 2, 3 free.
    let nodes: Vec<ClusterNode> = ["t1", "t2", "t3"].iter().map(|n| ClusterNode::new(n, &[(LEAF, "l")])).collect();
    let model = from_labels(&LabelLevels::new(&[LEAF]), &nodes).unwrap();
    let mut sets = AllocSets::new(&[gb200_nvl72_tray().unwrap()], vec![0; 3], SetQuality::Ring).unwrap();
    let free = vec![NodeFree::all_gpus(4), NodeFree { gpus: 0b1100, vfs: BTreeMap::new() }, NodeFree::all_gpus(4)];
    let p = plan(&model, &free, &gang(3, 2, TierConstraint::soft()), &mut sets).unwrap();
    // Largest first: t1 (2 members); the last member goes to the smallest node that holds it, t2,
    // so t3 stays whole.
    let got: Vec<(&str, &[usize])> = p.members.iter().map(|m| (m.node.as_str(), m.gpus.as_slice())).collect();
    assert_eq!(got, [("t1", &[0, 1][..]), ("t1", &[2, 3][..]), ("t2", &[2, 3][..])]);
    assert_eq!(p.nodes, 2);
}

/// Two trays under one leaf with rails: NIC mlx5_k of both reaches leaf `rail-k`. Tray r1 has GPUs
/// 2, 3 free; r2 GPUs 1, 2, 3. Gang: 2 members × 2 GPUs, each asking a VF.
fn rails_case(rail_align: Option<bool>) -> weft_gang::Plan {
    let labels: Vec<(String, String)> =
        (0..4).map(|k| (format!("rail.weft.io/mlx5_{k}"), format!("rail-{k}"))).collect();
    let nodes: Vec<ClusterNode> = ["r1", "r2"]
        .iter()
        .map(|n| {
            let mut node = ClusterNode::new(n, &[(LEAF, "l")]);
            node.labels.extend(labels.iter().cloned());
            node
        })
        .collect();
    let mut model = from_labels(&LabelLevels::new(&[LEAF]), &nodes).unwrap();
    model.rails_from_labels(&nodes).unwrap();
    let mut sets = AllocSets::new(&[gb200_nvl72_tray().unwrap()], vec![0; 2], SetQuality::Ring).unwrap();
    let vfs: BTreeMap<String, u32> = [("fabric".to_string(), 4)].into();
    let free = vec![NodeFree { gpus: 0b1100, vfs: vfs.clone() }, NodeFree { gpus: 0b1110, vfs }];
    let g = Gang {
        members: 2,
        gpus_per_member: 2,
        vfs_per_member: [("fabric".to_string(), 1)].into(),
        constraint: TierConstraint::soft(),
        rail_align,
    };
    plan(&model, &free, &g, &mut sets).unwrap()
}

#[test]
fn rail_alignment_puts_gpu_i_of_every_member_on_one_leaf() {
    let p = rails_case(None);
    assert_eq!(p.rail_aligned, Some(true));
    let got: Vec<(&str, &[usize])> = p.members.iter().map(|m| (m.node.as_str(), m.gpus.as_slice())).collect();
    // r1 holds only {2, 3} (rails 2, 3); on r2 the member takes the GPUs on those rails.
    assert_eq!(got, [("r1", &[2, 3][..]), ("r2", &[2, 3][..])]);
    for m in &p.members {
        assert_eq!(m.rails, [Some("rail-2".to_string()), Some("rail-3".to_string())]);
        assert_eq!(m.nics, [Some("mlx5_2".to_string()), Some("mlx5_3".to_string())]);
    }
    // Without alignment r2's member gets weft-alloc's set among {1, 2, 3}: every pair is NV18, so
    // the earliest pair, {1, 2} (rails 1 and 2: GPU 0 of the two members on different leaves).
    let p = rails_case(Some(false));
    assert_eq!(p.rail_aligned, None);
    assert_eq!(p.members[1].gpus, [1, 2]);
}

#[test]
fn rails_config_and_plan_input_errors_say_where() {
    let (mut model, mut sets) = two_racks();
    let cfg: RailConfig = serde_saphyr::from_str("nodes: {z99: {mlx5_0: leaf-1}}").unwrap();
    assert_eq!(model.set_rails(&cfg).unwrap_err().to_string(), "rails: node `z99`: not a node of the network model");
    let cfg: RailConfig = serde_saphyr::from_str("nodes: {a01: {mlx5_0: ''}}").unwrap();
    assert!(model.set_rails(&cfg).unwrap_err().to_string().starts_with("rails: node `a01`: NIC `mlx5_0`"));
    let free = racks_free(&model, 18, 18);
    assert_eq!(
        plan(&model, &free[..3], &gang(1, 4, TierConstraint::soft()), &mut sets).unwrap_err().to_string(),
        "free capacity lists 3 nodes; the network model has 36"
    );
    assert_eq!(plan(&model, &free, &gang(0, 4, TierConstraint::soft()), &mut sets).unwrap_err(), PlanError::EmptyGang);
    // More members than the whole cluster holds: the root's shortfall.
    let e = plan(&model, &free, &gang(37, 4, TierConstraint::soft()), &mut sets).unwrap_err().to_string();
    assert_eq!(
        e,
        "a gang of 37 × 4 GPU(s) does not fit within tier 3 (cluster): the most members one cluster domain holds is 36 (`cluster`), 1 short"
    );
}

#[test]
fn free_vfs_limit_the_members_a_node_holds() {
    // Two trays, every GPU free; t1 has one VF of `fabric` free, t2 four. Members of 2 GPUs and
    // 1 VF: t1 holds one (its one VF), t2 two.
    let nodes: Vec<ClusterNode> = ["t1", "t2"].iter().map(|n| ClusterNode::new(n, &[(LEAF, "l")])).collect();
    let model = from_labels(&LabelLevels::new(&[LEAF]), &nodes).unwrap();
    let mut sets = AllocSets::new(&[gb200_nvl72_tray().unwrap()], vec![0; 2], SetQuality::Ring).unwrap();
    let vfs = |n: u32| -> BTreeMap<String, u32> { [("fabric".to_string(), n)].into() };
    let g = Gang {
        members: 2,
        gpus_per_member: 2,
        vfs_per_member: vfs(1),
        constraint: TierConstraint::soft(),
        rail_align: None,
    };
    let free = vec![NodeFree { gpus: 0xf, vfs: vfs(1) }, NodeFree { gpus: 0xf, vfs: vfs(4) }];
    let p = plan(&model, &free, &g, &mut sets).unwrap();
    let got: Vec<&str> = p.members.iter().map(|m| m.node.as_str()).collect();
    // By GPUs alone t1 and t2 hold two members each and t1 (first by name) would take both.
    assert_eq!(got, ["t2", "t2"]);
    // No rails in this model: alignment is not reported.
    assert_eq!(p.rail_aligned, None);
    // Three members: t2 (2, the larger first), then t1 (1). A node without the physnet holds none.
    let g3 = Gang { members: 3, ..g.clone() };
    let p = plan(&model, &free, &g3, &mut sets).unwrap();
    let got: Vec<&str> = p.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(got, ["t2", "t2", "t1"]);
    let none = vec![NodeFree { gpus: 0xf, vfs: BTreeMap::new() }, NodeFree { gpus: 0xf, vfs: vfs(4) }];
    assert!(matches!(plan(&model, &none, &g3, &mut sets), Err(PlanError::NoFit { .. })));
}

#[test]
fn label_levels_read_from_yaml_as_docs_gang_md_shows_them() {
    let yaml = "levels:\n  - keys: [example.com/spine]\n  - keys: [example.com/leaf]\n  - keys: [nvidia.com/gpu.clique]\n    optional: true\n";
    let levels: LabelLevels = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(levels, eight_levels());
    let e = serde_saphyr::from_str::<LabelLevels>("levels:\n  - key: example.com/leaf\n").unwrap_err().to_string();
    assert!(e.contains("unknown field `key`"), "{e}");
}

#[test]
fn volcano_highest_tier_name_bounds_a_plan_over_hypernodes() {
    // The eight-node HyperNode cluster, every node a GB200 tray with its 4 GPUs free.
    let nodes = eight_nodes();
    let model = from_hypernodes(&parse_hypernodes(&eight_hypernodes(), "h.yaml").unwrap(), &nodes).unwrap();
    let mut sets = AllocSets::new(&[gb200_nvl72_tray().unwrap()], vec![0; 8], SetQuality::Ring).unwrap();
    let free = vec![NodeFree::all_gpus(4); 8];
    let spec: weft_gang::NetworkTopologySpec = serde_saphyr::from_str("mode: hard\nhighestTierName: leaf\n").unwrap();
    let leaf = TierConstraint::from_volcano(&spec, "spec.networkTopology").unwrap();
    // 3 members: no clique holds 3 (2 each); of the leaves only l1 (4) does. Inside l1 the cliques
    // largest first: A.1 (2 members), then the rest (1) on A.2's first node.
    let p = plan(&model, &free, &gang(3, 4, leaf.clone()), &mut sets).unwrap();
    assert_eq!((p.domain.as_str(), p.tier.as_str(), p.tier_number), ("l1", "leaf", 2));
    let got: Vec<&str> = p.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(got, ["n1", "n2", "n3"]);
    // 5 members fit no leaf: hard refuses, naming the tier and the best leaf.
    let e = plan(&model, &free, &gang(5, 4, leaf), &mut sets).unwrap_err().to_string();
    assert_eq!(
        e,
        "a gang of 5 × 4 GPU(s) does not fit within tier 2 (leaf): the most members one leaf domain holds is 4 (`l1`), 1 short"
    );
    // Soft: spine s1 (6); l1 whole (4), then 1 on l2.
    let p = plan(&model, &free, &gang(5, 4, TierConstraint::soft()), &mut sets).unwrap();
    assert_eq!((p.domain.as_str(), p.tier.as_str()), ("s1", "spine"));
    let got: Vec<&str> = p.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(got, ["n1", "n2", "n3", "n4", "n5"]);
}
