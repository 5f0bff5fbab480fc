//! End-to-end tests of the `weft` binary: real processes, real files, checked output.

use std::path::PathBuf;
use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "weft failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

fn topology(name: &str) -> String {
    let p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "weft-sim", "topologies", name].iter().collect();
    p.to_string_lossy().into_owned()
}

#[test]
fn simulate_reports_every_policy_and_accounts_for_every_pod() {
    let out = weft(&["simulate", "--pods", "400", "--seed", "3", "-o", "json"]);
    let v = stdout_json(&out);
    let policies = v["policies"].as_array().unwrap();
    let names: Vec<&str> = policies.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["weft", "blind", "least-allocated"]);
    for p in policies {
        let placed = p["placed"].as_u64().unwrap();
        let unplaced = p["unplaced"].as_u64().unwrap();
        assert_eq!(placed + unplaced, 400, "{p}");
        let by_size_offered: u64 =
            p["bySize"].as_object().unwrap().values().map(|c| c["offered"].as_u64().unwrap()).sum();
        assert_eq!(by_size_offered, 400);
    }
    assert_eq!(v["cluster"]["nodes"], 88);
}

#[test]
fn simulate_default_weft_beats_blind_on_bandwidth_and_stranding() {
    // The product claim on the embedded default, with a fixed seed.
    let v = stdout_json(&weft(&["simulate", "--pods", "3000", "--seed", "1", "-o", "json"]));
    let p = |name: &str| v["policies"].as_array().unwrap().iter().find(|p| p["policy"] == name).unwrap().clone();
    let (w, b) = (p("weft"), p("blind"));
    let f = |x: &serde_json::Value, k: &str| x[k].as_f64().unwrap();
    assert!(f(&w, "meanPairBandwidthGbps") > f(&b, "meanPairBandwidthGbps"), "weft {w} blind {b}");
    assert!(f(&w, "p10PairBandwidthGbps") >= f(&b, "p10PairBandwidthGbps"), "weft {w} blind {b}");
    assert!(f(&w, "meanStrandedGpus") < f(&b, "meanStrandedGpus"), "weft {w} blind {b}");
}

#[test]
fn simulate_shows_how_often_vfs_sit_by_their_gpus_weft_more_than_blind() {
    // The default stream: half the pods ask for one VF of `fabric`, every NIC of the embedded
    // cluster offers VFs.
    let table = weft(&["simulate", "--pods", "1000", "--seed", "1"]);
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("VFs by GPUs"), "the column is there, with its legend line: {text}");
    assert!(text.contains("SR-IOV VFs") && text.contains("asking for VFs"), "{text}");
    let v = stdout_json(&weft(&["simulate", "--pods", "1000", "--seed", "1", "-o", "json"]));
    assert!(v["cluster"]["vfs"].as_u64().unwrap() > 0, "{}", v["cluster"]);
    let asking = v["workload"]["vfPods"].as_u64().unwrap();
    assert!(asking > 300 && asking < 700, "about half of 1000: {asking}");
    let p = |name: &str| v["policies"].as_array().unwrap().iter().find(|p| p["policy"] == name).unwrap().clone();
    let (w, b) = (p("weft"), p("blind"));
    for x in [&w, &b] {
        assert!(x["vfPodsPlaced"].as_u64().unwrap() > 0, "{x}");
        assert!(x["unplacedForVfs"].as_u64().unwrap() <= x["unplaced"].as_u64().unwrap(), "{x}");
    }
    let share = |x: &serde_json::Value| x["vfNearGpuShare"].as_f64().unwrap();
    assert!(share(&w) > share(&b), "weft {w} blind {b}");
}

#[test]
fn simulate_reads_cluster_and_pod_manifest_files() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.txt");
    std::fs::copy(topology("a100-pcie-nvlink-bridges.txt"), &node).unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  - {name: lab, topology: node.txt, count: 1}\n",
    )
    .unwrap();
    let pods = dir.path().join("pods.yaml");
    let pod = |name: &str, gpus: u32, at: u32| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: {{sim.weft.io/arrival: \"{at}\", sim.weft.io/duration: \"1000\"}}\nspec:\n  containers:\n    - name: c\n      resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}\n"
        )
    };
    // Two 2-GPU pods on an 8-GPU node whose NVLinks join pairs: weft gives each an NVLinked pair.
    std::fs::write(&pods, format!("{}---\n{}", pod("a", 2, 1), pod("b", 2, 2))).unwrap();
    let v = stdout_json(&weft(&[
        "simulate",
        "--cluster",
        cluster.to_str().unwrap(),
        "--workload",
        pods.to_str().unwrap(),
        "--policies",
        "weft",
        "-o",
        "json",
    ]));
    let w = &v["policies"][0];
    assert_eq!(w["placed"], 2);
    assert_eq!(w["allNvlinkShare"].as_f64(), Some(1.0), "{w}");
    assert_eq!(v["cluster"]["nodeTypes"]["lab"], 1);
}

#[test]
fn simulate_reads_vf_requests_and_vfs_per_nic_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  - {name: h100, topology: builtin:hgx-h100, count: 1, vfsPerNic: 1}\n",
    )
    .unwrap();
    let pods = dir.path().join("pods.yaml");
    let pod = |name: &str, vfs: u32, at: u32| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: {{sim.weft.io/arrival: \"{at}\", sim.weft.io/duration: \"1000\"}}\nspec:\n  containers:\n    - name: c\n      resources: {{limits: {{nvidia.com/gpu: 1, sriov.weft.io/fabric: {vfs}}}}}\n"
        )
    };
    // 8 VFs on the node (one per NIC): two pods of one VF fit, then one of 7 does not.
    std::fs::write(&pods, format!("{}---\n{}---\n{}", pod("a", 1, 1), pod("b", 1, 2), pod("c", 7, 3))).unwrap();
    let v = stdout_json(&weft(&[
        "simulate",
        "--cluster",
        cluster.to_str().unwrap(),
        "--workload",
        pods.to_str().unwrap(),
        "--policies",
        "weft",
        "-o",
        "json",
    ]));
    assert_eq!(v["cluster"]["vfs"], 8);
    assert_eq!(v["workload"]["vfPods"], 3);
    let w = &v["policies"][0];
    assert_eq!((w["placed"].as_u64(), w["unplacedForVfs"].as_u64()), (Some(2), Some(1)), "{w}");
    assert_eq!(w["vfNearGpuShare"].as_f64(), Some(1.0), "each VF on its GPU's own NIC: {w}");
}

#[test]
fn simulate_bad_cluster_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("c.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  - {name: x, topology: builtin:nope, count: 1}\n",
    )
    .unwrap();
    let out = weft(&["simulate", "--cluster", cluster.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope") && err.contains("dgx-a100"), "{err}");
}

#[test]
fn topo_show_converts_text_to_inventory_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let json_out = weft(&["topo", "show", &topology("dgx1-v100-mlx5-columns.txt"), "-o", "json"]);
    let inv = stdout_json(&json_out);
    assert_eq!(inv["apiVersion"], "weft.io/v1alpha1");
    assert_eq!(inv["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(inv["links"].as_array().unwrap().len(), 28, "every pair once");
    let json_path = dir.path().join("n.json");
    std::fs::write(&json_path, &json_out.stdout).unwrap();
    let yaml = weft(&["topo", "show", json_path.to_str().unwrap(), "-o", "yaml"]);
    assert!(yaml.status.success());
    let yaml_path = dir.path().join("n.yaml");
    std::fs::write(&yaml_path, &yaml.stdout).unwrap();
    let again = stdout_json(&weft(&["topo", "show", yaml_path.to_str().unwrap(), "-o", "json"]));
    assert_eq!(again["links"], inv["links"]);
    assert_eq!(again["gpus"], inv["gpus"]);
}

#[test]
fn topo_show_reports_line_and_column_of_a_bad_token() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(topology("a100-pcie-4gpu-mlx5.txt")).unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, text.replacen("NODE", "PXBNODE", 1)).unwrap();
    let out = weft(&["topo", "show", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.txt:2:") && err.contains("PXBNODE"), "{err}");
}

#[test]
fn gpu_allocate_picks_an_nvlinked_pair_and_rejects_unknown_gpus() {
    let t = topology("a100-pcie-nvlink-bridges.txt");
    let v = stdout_json(&weft(&["gpu", "allocate", "-t", &t, "-k", "2", "--required", "3", "-o", "json"]));
    // GPU3's NVLink bridge partner is GPU1 (NV12); every other pair with GPU3 is SYS.
    assert_eq!(v["gpus"], serde_json::json!([1, 3]));
    let out = weft(&["gpu", "allocate", "-t", &t, "-k", "2", "--required", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPU9"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn gpu_score_ranks_nvlinked_node_first_and_filters_full_nodes() {
    let nv = topology("hgx-h100-nv18-8nic.txt");
    let pcie = topology("pcie-8gpu-2socket.txt");
    let full = format!("{}@0-6", topology("dgx-a100-nvswitch-10nic.txt"));
    let v = stdout_json(&weft(&["gpu", "score", "-k", "2", &pcie, &nv, &full, "-o", "json"]));
    let rows = v.as_array().unwrap();
    assert_eq!(rows[0]["node"], "hgx-h100-nv18-8nic");
    assert_eq!(rows[1]["node"], "pcie-8gpu-2socket");
    assert!(rows[0]["score"].as_u64() > rows[1]["score"].as_u64());
    assert!(rows[1]["score"].as_u64().unwrap() > 0, "a PCIe-only node that fits scores above 0");
    assert_eq!(rows[2]["fits"], false);
    assert!(rows[2]["reason"].as_str().unwrap().contains("only 1"), "{}", rows[2]);
}
