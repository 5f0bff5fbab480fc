//! `weft simulate --jobs`: the table's structure (a row per policy, at most 100 columns) and its
//! numbers against the library's report on the same cluster and stream, the JSON report equal to
//! the library's, and a cluster file with a network section with a jobs file.

use std::process::Command;

use weft_sim::jobs::{JobGenerate, JobPolicyKind, JobRun, JobsReport, default_scenario, simulate_jobs};

fn weft(args: &[&str], dir: Option<&std::path::Path>) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = c.output().expect("weft runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The library's report for the built-in scenario and a generated stream.
fn library(jobs: usize, seed: u64) -> JobsReport {
    let (spec, network) = default_scenario();
    let net = network.build(&spec, None).expect("builds");
    let stream = JobGenerate { jobs, seed, ..JobGenerate::default() }.jobs(net.cluster.total_gpus()).expect("stream");
    simulate_jobs(&net, &stream, &JobPolicyKind::ALL, &JobRun::default()).expect("runs")
}

fn cells(line: &str) -> Vec<String> {
    line.split(['│', '┆']).map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect()
}

#[test]
fn the_table_has_a_row_per_policy_with_the_librarys_numbers() {
    let (ok, out, err) = weft(&["simulate", "--jobs", "--job-count", "300", "--seed", "5"], None);
    assert!(ok, "{err}");
    for line in out.lines() {
        assert!(line.chars().count() <= 100, "over 100 columns: {line}");
    }
    let lib = library(300, 5);
    assert!(out.contains(&format!("jobs:     300 ({} gangs, {} single pods)", lib.gangs, 300 - lib.gangs)), "{out}");
    assert!(out.contains("cluster:  272 nodes, 1,600 GPUs"), "{out}");
    let rows: Vec<Vec<String>> = out
        .lines()
        .map(cells)
        .filter(|c| c.first().is_some_and(|p| JobPolicyKind::ALL.iter().any(|k| k.name() == p)))
        .collect();
    assert_eq!(rows.len(), 4, "{out}");
    for (row, p) in rows.iter().zip(&lib.policies) {
        assert_eq!(row[0], p.policy);
        assert_eq!(row[1], p.placed.to_string(), "{}", p.policy);
        assert_eq!(row[2], p.gangs_placed.to_string(), "{}", p.policy);
        assert_eq!(row[3], format!("{:.0}/{:.0}/{:.0}", p.mean_wait_s, p.p50_wait_s, p.p90_wait_s), "{}", p.policy);
        assert_eq!(row[4], format!("{:.1}%", p.one_nvlink_domain_share * 100.0));
        assert_eq!(row[5], format!("{:.1}%", p.one_leaf_share * 100.0));
        assert_eq!(row[6], format!("{:.1} / {:.1}", p.mean_bandwidth_gbps, p.p10_bandwidth_gbps));
        assert_eq!(row[7], p.constraint_violations.to_string());
    }
    assert!(out.contains("run time: weft-gang"), "{out}");
}

#[test]
fn json_is_the_librarys_report() {
    let (ok, out, err) = weft(&["simulate", "--jobs", "--job-count", "200", "--seed", "9", "-o", "json"], None);
    assert!(ok, "{err}");
    // Text against text (a parsed float may differ from the printed one in its last bit): the run
    // times set to 0 on both sides.
    let got: Vec<String> = out
        .lines()
        .map(|l| if l.trim_start().starts_with("\"runMs\"") { "runMs".to_string() } else { l.to_string() })
        .collect();
    let want = serde_json::to_string_pretty(&library(200, 9)).expect("serialises");
    let want: Vec<String> = want
        .lines()
        .map(|l| if l.trim_start().starts_with("\"runMs\"") { "runMs".to_string() } else { l.to_string() })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_cluster_file_with_a_network_and_a_jobs_file() {
    let dir = std::env::temp_dir().join(format!("weft-sim-jobs-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.join("cluster.yaml"),
        "apiVersion: weft.io/v1alpha1\nkind: SimCluster\nnodeTypes:\n  \
         - {name: nvl72, topology: builtin:gb200-nvl72-tray, count: 36}\n  \
         - {name: h100, topology: builtin:hgx-h100, count: 16}\nnetwork:\n  spineOversubscription: 2\n  \
         groups:\n    - {nodeType: h100, nodesPerLeaf: 8}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.join("jobs.yaml"),
        "apiVersion: weft.io/v1alpha1\nkind: SimJobs\njobs:\n  \
         - {name: a, members: 18, gpus: 4, arrival: 0, duration: 100, topology: \"hard:nvidia.com/gpu.clique\"}\n  \
         - {name: b, members: 3, gpus: 8, arrival: 1, duration: 100, topology: soft}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (ok, out, err) =
        weft(&["simulate", "--jobs", "jobs.yaml", "--cluster", "cluster.yaml", "-o", "json"], Some(&dir));
    let bad = weft(&["simulate", "--jobs", "jobs.yaml", "--cluster", "cluster.yaml", "--nodes", "10"], Some(&dir));
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(ok, "{err}");
    let r: JobsReport = serde_json::from_str(&out).expect("JSON report");
    assert_eq!((r.nodes, r.jobs, r.gangs), (52, 2, 2));
    // The gb200 trays keep their default racks (two per leaf); the H100 leaves are of 8.
    assert_eq!(r.domains_per_tier[..2], [2, 3]);
    let gang = r.policies.iter().find(|p| p.policy == "weft-gang").expect("weft-gang");
    assert_eq!((gang.placed, gang.one_nvlink_domain_share), (2, 0.5), "a: one rack; b: three H100 nodes of a leaf");
    assert_eq!(gang.one_leaf_share, 1.0);
    assert!(!bad.0 && bad.2.contains("--nodes"), "{}", bad.2);
    // Options of the pod simulator are refused beside --jobs rather than ignored.
    for other in [&["--report", "r.html"][..], &["--pods", "10"], &["--wide"]] {
        let mut args = vec!["simulate", "--jobs"];
        args.extend_from_slice(other);
        let (ok, _, err) = weft(&args, None);
        assert!(!ok && err.contains("cannot be used with"), "{other:?}: {err}");
    }
}
