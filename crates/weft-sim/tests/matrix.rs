//! The scenario matrix: its file format, the shipped matrix, and a run's verdicts.

use std::path::PathBuf;

use weft_alloc::ScoreConfig;
use weft_sim::matrix::{
    CellVerdict, MatrixOptions, Measure, Outcome, cell_generator, parse_matrix, read_matrix, run_matrix,
};
use weft_sim::{Generate, SimError};

fn shipped() -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "scenarios", "matrix.yaml"].iter().collect()
}

fn error(text: &str) -> String {
    match parse_matrix(text, "m.yaml") {
        Err(e @ SimError::Format { .. }) => e.to_string(),
        other => panic!("expected a format error, got {other:?}"),
    }
}

const HEAD: &str = "apiVersion: weft.io/v1alpha1\nkind: SimMatrix\n";

#[test]
fn the_shipped_matrix_covers_the_issue_cells_and_its_dense_mixes_differ_as_named() {
    let m = read_matrix(&shipped()).expect("the shipped matrix parses");
    let names: Vec<&str> = m.cells.iter().map(|c| c.name.as_str()).collect();
    for want in ["default", "default-20-seeds", "vf-0", "vf-25", "vf-75", "vf-100", "all-8-gpu", "all-1-gpu"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    for want in ["gpu-dense", "nic-dense", "500x10k", "5000x100k"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let cell = |n: &str| m.cells.iter().find(|c| c.name == n).unwrap();
    assert_eq!(cell("default-20-seeds").stream.seeds, 20);
    assert_eq!(cell("500x10k").cluster.nodes, Some(500));
    assert_eq!(cell("5000x100k").cluster.nodes, Some(5000));
    assert!(!cell("5000x100k").small, "the 5,000-node cell is not for CI");
    assert!(m.cells.iter().any(|c| c.small));
    // NIC-dense has more VFs per GPU than the default, GPU-dense fewer.
    let vfs_per_gpu = |n: &str| {
        let c = m.cluster_spec(cell(n)).build(None).unwrap();
        c.total_vfs() as f64 / c.total_gpus() as f64
    };
    let (gpu, def, nic) = (vfs_per_gpu("gpu-dense"), vfs_per_gpu("default"), vfs_per_gpu("nic-dense"));
    assert!(gpu < def && def < nic, "VFs per GPU: gpu-dense {gpu}, default {def}, nic-dense {nic}");
}

#[test]
fn an_unknown_field_names_the_cell_and_the_field() {
    let text = format!(
        "{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}}}\n  - {{name: b, cluster: {{mix: default}}, stream: {{pods: 10, vfshare: 0.5}}}}\n"
    );
    let e = error(&text);
    assert!(e.contains("cells[1] ('b')") && e.contains("vfshare"), "{e}");
    assert!(e.starts_with("m.yaml: "), "{e}");
}

#[test]
fn bad_values_name_the_cell_and_the_field() {
    let cell = |stream: &str, cluster: &str| {
        format!(
            "{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}}}\n  - {{name: b, cluster: {cluster}, stream: {stream}}}\n"
        )
    };
    let ok = "{mix: default}";
    let cases = [
        (cell("{pods: 10, vfShare: 1.5}", ok), "cells[1] ('b').stream.vfShare: 1.5"),
        (cell("{pods: 0}", ok), "cells[1] ('b').stream.pods: 0"),
        (cell("{pods: 10, seeds: 0}", ok), "cells[1] ('b').stream.seeds: 0"),
        (cell("{pods: 10, sizes: {0: 1}}", ok), "cells[1] ('b').stream.sizes: a pod of 0 GPUs"),
        (cell("{pods: 10, sizes: {8: -1}}", ok), "cells[1] ('b').stream.sizes: give at least one size"),
        (cell("{pods: 10}", "{mix: dense}"), "cells[1] ('b').cluster.mix: 'dense'"),
        (cell("{pods: 10}", "{mix: default, nodes: 0}"), "cells[1] ('b').cluster.nodes"),
    ];
    for (text, want) in cases {
        let e = error(&text);
        assert!(e.contains(want), "want {want:?} in: {e}");
    }
    let dup = format!(
        "{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}}}\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}}}\n"
    );
    assert!(error(&dup).contains("cells[1] ('a').name: another cell has this name"), "{}", error(&dup));
    let file_topology = format!(
        "{HEAD}clusters:\n  mine:\n    nodeTypes: [{{name: x, topology: ./x.txt, count: 1}}]\ncells:\n  - {{name: a, cluster: {{mix: mine}}, stream: {{pods: 10}}}}\n"
    );
    let e = error(&file_topology);
    assert!(e.contains("clusters.mine.nodeTypes[0] ('x').topology: './x.txt' is not a built-in"), "{e}");
    let gate = format!("{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}, gate: maybe}}\n");
    let e = error(&gate);
    assert!(e.contains("cells[0] ('a')") && e.contains("gate: 'maybe' is not true, false or strict"), "{e}");
    let wrong_kind = "apiVersion: weft.io/v1alpha1\nkind: SimCluster\ncells: []\n";
    assert!(error(wrong_kind).contains("expected apiVersion weft.io/v1alpha1 kind SimMatrix"), "{}", error(wrong_kind));
}

#[test]
fn a_size_mix_keeps_the_streams_target_load() {
    let m = parse_matrix(
        &format!("{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10, vfShare: 0.25, sizes: {{8: 1}}}}}}\n"),
        "m",
    )
    .unwrap();
    let g = cell_generator(&m.cells[0].stream, 672, 3);
    let d = Generate::default_for(672, 10, 3);
    assert_eq!(g.sizes.keys().copied().collect::<Vec<_>>(), [8]);
    assert_eq!((g.seed, g.pods, g.vf_share), (3, 10, 0.25));
    // GPU-seconds offered per second: 8 GPUs × mean duration / mean interarrival = 95% of 672 GPUs.
    let offered = 8.0 * g.mean_duration_seconds / g.mean_interarrival_seconds;
    assert!((offered - Generate::DEFAULT_LOAD * 672.0).abs() < 1e-9, "{offered}");
    // The default mix keeps default_for's rate.
    let m =
        parse_matrix(&format!("{HEAD}cells:\n  - {{name: a, cluster: {{mix: default}}, stream: {{pods: 10}}}}\n"), "m")
            .unwrap();
    let g = cell_generator(&m.cells[0].stream, 672, 3);
    assert_eq!(g, d);
}

/// On a cluster of one NVSwitch type every 2-GPU set is as good as any other, so weft cannot be
/// higher on bandwidth: every seed ties. A strict gate fails on that, a plain one does not.
#[test]
fn a_run_covers_every_seed_and_policy_and_names_the_cells_whose_gate_failed() {
    let text = format!(
        "{HEAD}clusters:\n  h100:\n    nodeTypes: [{{name: h, topology: builtin:hgx-h100, count: 4}}]\ncells:\n  \
         - {{name: tie, cluster: {{mix: h100}}, stream: {{pods: 60, seeds: 3, sizes: {{2: 1}}}}, small: true, gate: strict}}\n  \
         - {{name: gated, cluster: {{mix: h100}}, stream: {{pods: 60, sizes: {{2: 1}}}}, small: true, gate: true}}\n  \
         - {{name: big, cluster: {{mix: h100, nodes: 8}}, stream: {{pods: 60, sizes: {{1: 1}}}}}}\n"
    );
    let m = parse_matrix(&text, "m").unwrap();
    let opts = |small_only| MatrixOptions { small_only, threads: 2, score_config: ScoreConfig::default() };
    let r = run_matrix(&m, &opts(true)).unwrap();
    let names: Vec<&str> = r.cells.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["tie", "gated"], "--small-only leaves 'big' out");
    let tie = &r.cells[0];
    assert_eq!(tie.policies.len(), 3);
    for p in &tie.policies {
        assert_eq!(p.seeds.len(), 3, "{}", p.policy);
        assert!(p.seeds.iter().all(|s| s.multi_gpu_placed > 0.0), "{}", p.policy);
    }
    let p10 = tie.checks.iter().find(|c| c.measure == Measure::P10Bottleneck && c.baseline == "blind").unwrap();
    assert_eq!((p10.outcome, p10.tied_seeds.clone()), (Outcome::Tie, vec![1, 2, 3]));
    assert!(p10.lost_seeds.is_empty());
    assert_eq!(tie.verdict, CellVerdict::Ties);
    assert_eq!(r.tying, ["tie", "gated"]);
    assert!(r.losing.is_empty());
    assert_eq!(r.gate_failed, ["tie"], "a strict gate fails on a tie, `gate: true` only on a loss");
    // Without --small-only every cell runs; an all-1-GPU stream has no bandwidth to compare.
    let r = run_matrix(&m, &opts(false)).unwrap();
    let big = r.cells.iter().find(|c| c.name == "big").unwrap();
    assert_eq!(big.nodes, 8);
    let bw: Vec<Outcome> = big
        .checks
        .iter()
        .filter(|c| matches!(c.measure, Measure::P10Bottleneck | Measure::MeanBottleneck | Measure::EightGpuPlaced))
        .map(|c| c.outcome)
        .collect();
    assert!(bw.iter().all(|o| *o == Outcome::NotApplicable), "{bw:?}");
}

/// The bottleneck columns are the ring bandwidth, not the pair mean: on a 4-GPU PCIe node with one
/// NVLink-bridged pair the two differ (a ring over all four runs at its cross-socket hop).
#[test]
fn the_bottleneck_columns_read_the_ring_bandwidth() {
    use weft_sim::matrix::Metrics;
    use weft_sim::{ClusterSpec, NodeTypeSpec, PlacementPolicy, SimPod, run_policy};
    let spec = ClusterSpec {
        api_version: weft_sim::API_VERSION.into(),
        kind: "SimCluster".into(),
        node_types: vec![NodeTypeSpec::builtin("a100-pcie-4gpu", 2)],
    };
    let cluster = spec.build(None).unwrap();
    let pods = vec![SimPod::gpus("a", 4, 1.0, 10.0), SimPod::gpus("b", 2, 2.0, 10.0)];
    let r = run_policy(&cluster, &pods, PlacementPolicy::Weft, &ScoreConfig::default(), 1, &mut |_| {}).unwrap();
    assert_ne!(r.mean_ring_bandwidth_gbps, r.mean_pair_bandwidth_gbps, "the node tells the two apart: {r:?}");
    let m = Metrics::of(&r);
    assert_eq!(m.mean_bottleneck_gbps, r.mean_ring_bandwidth_gbps);
    assert_eq!(m.p10_bottleneck_gbps, r.p10_ring_bandwidth_gbps);
    assert_eq!(m.mean_pair_gbps, r.mean_pair_bandwidth_gbps);
    assert_eq!((m.placed, m.multi_gpu_placed), (2.0, 2.0));
}
