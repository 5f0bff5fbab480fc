//! `weft simulate --pods-out`: one record per pod per policy, in CSV or JSON lines, that agrees with
//! the report's counts and bandwidths, and whose fields are the ones docs/simulate.md lists.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

fn weft(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).current_dir(dir).output().expect("weft runs")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "weft failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("test fixture")
}

/// The field names docs/simulate.md's "Per-pod output" table lists, in order.
fn documented_fields() -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/simulate.md"))
        .expect("test fixture");
    let section = text.split("## Per-pod output").nth(1).expect("docs/simulate.md has a Per-pod output section");
    let section = section.split("\n## ").next().expect("test fixture");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l.split('`').next().expect("test fixture").to_string())
        .collect()
}

/// Per policy, from the CSV rows: placed, not placed for want of VFs, and the ring bandwidths of the
/// placed multi-GPU pods.
#[derive(Default, Debug)]
struct Tally {
    records: usize,
    placed: usize,
    short_of_vfs: usize,
    rings: Vec<f64>,
}

#[test]
fn csv_records_agree_with_the_report_and_have_the_documented_fields() {
    let dir = tempfile::tempdir().unwrap();
    let report = ok(&weft(dir.path(), &["simulate", "--pods", "600", "--pods-out", "pods.csv", "-o", "json"]));
    let report: serde_json::Value = serde_json::from_str(&report).expect("stdout is still the JSON report");
    let mut reader = csv::Reader::from_path(dir.path().join("pods.csv")).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_string).collect();
    assert_eq!(header, documented_fields(), "the CSV header is the documented field list");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let mut tally: BTreeMap<String, Tally> = BTreeMap::new();
    let mut last_index: BTreeMap<String, i64> = BTreeMap::new();
    for row in reader.records() {
        let row = row.unwrap();
        let get = |name: &str| row.get(col(name)).unwrap();
        let policy = get("policy").to_string();
        let index: i64 = get("index").parse().unwrap();
        assert_eq!(index, last_index.get(&policy).copied().unwrap_or(-1) + 1, "stream order within a policy");
        last_index.insert(policy.clone(), index);
        let t = tally.entry(policy).or_default();
        t.records += 1;
        let gpus: usize = get("gpus").parse().unwrap();
        let asked_vfs: usize = get("vfs")
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| s.split_once(':').unwrap().1.parse::<usize>().unwrap())
            .sum();
        match get("notPlaced") {
            "" => {
                t.placed += 1;
                assert!(!get("node").is_empty() && !get("nodeType").is_empty(), "{row:?}");
                assert!(get("node").starts_with(get("nodeType")), "nodes are named <type>-<i>: {row:?}");
                assert_eq!(get("gpuIds").split(';').count(), gpus, "{row:?}");
                let vfs = get("vfIds").split(';').filter(|s| !s.is_empty()).count();
                assert_eq!(vfs, asked_vfs, "{row:?}");
                assert_eq!(get("vfsNearGpus").is_empty(), asked_vfs == 0, "{row:?}");
                assert_eq!(get("start"), get("arrival"), "no queue: a pod starts on arrival");
                assert!(get("end").parse::<f64>().unwrap() >= get("start").parse::<f64>().unwrap());
                if gpus >= 2 {
                    t.rings.push(get("ringGbps").parse().unwrap());
                    assert!(get("meanPairGbps").parse::<f64>().unwrap() > 0.0);
                } else {
                    assert_eq!((get("ringGbps"), get("meanPairGbps")), ("", ""), "{row:?}");
                }
            }
            "short-of-vfs" => {
                t.short_of_vfs += 1;
                assert!(asked_vfs > 0, "{row:?}");
            }
            "no-gpus" => {}
            other => panic!("unknown reason {other:?}"),
        }
        if !get("notPlaced").is_empty() {
            for empty in ["node", "nodeType", "gpuIds", "vfIds", "vfsNearGpus", "ringGbps", "start", "end"] {
                assert_eq!(get(empty), "", "{empty} of a pod not placed: {row:?}");
            }
        }
    }
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(tally.len(), 3);
    for p in policies {
        let t = &tally[p["policy"].as_str().unwrap()];
        assert_eq!(t.records, 600);
        assert_eq!(t.placed as u64, p["placed"].as_u64().unwrap(), "{}", p["policy"]);
        assert_eq!(t.short_of_vfs as u64, p["unplacedForVfs"].as_u64().unwrap(), "{}", p["policy"]);
        let mean = t.rings.iter().sum::<f64>() / t.rings.len() as f64;
        let want = p["meanRingBandwidthGbps"].as_f64().unwrap();
        assert!((mean - want).abs() < 1e-9, "{}: ring mean of the records {mean}, report {want}", p["policy"]);
    }
}

#[test]
fn json_lines_hold_the_same_records_with_the_documented_keys_in_order() {
    let dir = tempfile::tempdir().unwrap();
    ok(&weft(dir.path(), &["simulate", "--pods", "200", "--policies", "weft,blind", "--pods-out", "p.csv"]));
    let stdout = ok(&weft(
        dir.path(),
        &["simulate", "--pods", "200", "--policies", "weft,blind", "--pods-out", "-", "--pods-format", "jsonl"],
    ));
    let fields = documented_fields();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 400, "--pods-out - prints the records only, one a line");
    let mut reader = csv::Reader::from_path(dir.path().join("p.csv")).unwrap();
    for (line, row) in lines.iter().zip(reader.records()) {
        let row = row.unwrap();
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
        let keys: Vec<&String> = v.keys().collect();
        assert_eq!(keys.len(), fields.len(), "{line}");
        // The parsed map sorts its keys: the order is checked on the line as written.
        let positions: Vec<usize> = fields.iter().map(|f| line.find(&format!("\"{f}\":")).unwrap()).collect();
        assert!(positions.is_sorted(), "keys in the documented order: {line}");
        assert_eq!(v["policy"].as_str().unwrap(), &row[0]);
        assert_eq!(v["pod"].as_str().unwrap(), &row[2]);
        let ids: Vec<String> = v["gpuIds"].as_array().unwrap().iter().map(|g| g.to_string()).collect();
        assert_eq!(ids.join(";"), &row[7], "{line}");
        assert_eq!(v["node"].as_str().unwrap_or(""), &row[5]);
        assert_eq!(v["notPlaced"].as_str().unwrap_or(""), &row[15]);
    }
}

#[test]
fn a_file_that_cannot_be_written_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft(dir.path(), &["simulate", "--pods", "50", "--pods-out", "no-such-dir/pods.csv"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-such-dir/pods.csv"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed: {}", String::from_utf8_lossy(&out.stdout));
    let out = weft(dir.path(), &["simulate", "--pods-format", "jsonl"]);
    assert!(!out.status.success(), "--pods-format needs --pods-out");
}

/// A reader that goes away after the first lines (`weft simulate --pods-out - | head`) ends the run
/// quietly, as every weft command does on a closed pipe, in both formats.
#[test]
fn records_to_a_closed_pipe_end_the_run_quietly() {
    use std::io::{BufRead, BufReader};
    for format in ["csv", "jsonl"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["simulate", "--pods", "3000", "--pods-out", "-", "--pods-format", format])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("weft runs");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a first line");
        assert!(first.starts_with("policy") || first.starts_with('{'), "{first}");
        // The reader is dropped here: the pipe closes with thousands of records still to write.
        let out = child.wait_with_output().expect("weft ends");
        assert!(out.status.success(), "{format}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "{format}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
