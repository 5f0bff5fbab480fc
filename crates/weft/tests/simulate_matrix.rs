//! `weft simulate --matrix`: the real binary on matrix files, its table, JSON and exit status.

use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

/// One NVSwitch node type: every 2-GPU set is as good as any other, so weft cannot be higher on
/// bandwidth than a baseline: the cell ties by the rule, whatever the policies do.
fn tie_matrix(dir: &tempfile::TempDir, gate: &str) -> String {
    let path = dir.path().join("m.yaml");
    let text = format!(
        "apiVersion: weft.io/v1alpha1\nkind: SimMatrix\nclusters:\n  h100:\n    description: one NVSwitch type\n    \
         nodeTypes: [{{name: h, topology: builtin:hgx-h100, count: 4}}]\ncells:\n  \
         - {{name: tie, cluster: {{mix: h100}}, stream: {{pods: 40, seeds: 2, sizes: {{2: 1}}}}, small: true, gate: {gate}}}\n  \
         - {{name: not-small, cluster: {{mix: h100}}, stream: {{pods: 40, sizes: {{2: 1}}}}, gate: {gate}}}\n"
    );
    std::fs::write(&path, text).expect("matrix file written");
    path.to_string_lossy().into_owned()
}

#[test]
fn a_cell_whose_gate_fails_fails_the_command_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let m = tie_matrix(&dir, "strict");
    let out = weft(&["simulate", "--matrix", &m, "--small-only"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout {stdout}\nstderr {stderr}");
    assert!(stderr.contains("the gate fails on cells: tie"), "{stderr}");
    assert!(stdout.contains("cell tie [small, strict gate]"), "{stdout}");
    assert!(
        stdout.contains("verdict for tie: weft ties (gate failed): p10 bottleneck = blind on seeds 1,2"),
        "{stdout}"
    );
    assert!(!stdout.contains("not-small"), "--small-only runs the small cells only: {stdout}");
    // Two-line headers: each line of each header.
    for column in ["bottleneck", "p10 GB/s", "mean GB/s", "mean pair", "8-GPU", "placed", "stranded"] {
        assert!(stdout.contains(column), "{column}: {stdout}");
    }
}

#[test]
fn a_tie_under_a_plain_gate_is_reported_but_does_not_fail() {
    let dir = tempfile::tempdir().unwrap();
    let m = tie_matrix(&dir, "true");
    let out = weft(&["simulate", "--matrix", &m, "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(v["tying"], serde_json::json!(["tie", "not-small"]));
    assert_eq!(v["losing"], serde_json::json!([]));
    assert_eq!(v["gateFailed"], serde_json::json!([]));
    assert_eq!(v["cells"][0]["verdict"], "ties");
    let tie = &v["cells"][0];
    assert_eq!(tie["name"], "tie");
    assert_eq!(tie["policies"][0]["seeds"].as_array().unwrap().len(), 2);
    assert!(tie["policies"][0]["mean"]["p10BottleneckGbps"].as_f64().unwrap() > 0.0, "{tie}");
    assert!(v["bandwidthMeasure"].is_string());
}

#[test]
fn a_bad_matrix_file_names_the_cell_and_field_and_the_flags_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "apiVersion: weft.io/v1alpha1\nkind: SimMatrix\ncells:\n  - {name: a, cluster: {mix: default}, stream: {pods: 10}}\n  - {name: b, cluster: {mix: nope}, stream: {pods: 10}}\n",
    )
    .unwrap();
    let out = weft(&["simulate", "--matrix", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cells[1] ('b').cluster.mix: 'nope'"), "{stderr}");
    let out = weft(&["simulate", "--matrix", path.to_str().unwrap(), "--nodes", "5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let out = weft(&["simulate", "--small-only"]);
    assert!(!out.status.success(), "--small-only needs --matrix");
}
