//! `weft simulate --pipelines`: the real binary, the embedded video pipeline and scenario files.

use std::collections::BTreeSet;
use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "weft failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

const SCENARIO: &str = include_str!("../../weft-sim/scenarios/video-pipeline.yaml");

#[test]
fn the_embedded_pipeline_places_every_vertex_pod_with_its_own_address_and_domain() {
    let v = stdout_json(&weft(&["simulate", "--pipelines", "--seed", "4", "-o", "json"]));
    let policies = v["policies"].as_array().unwrap();
    let names: Vec<&str> = policies.iter().map(|p| p["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["weft", "blind", "least-allocated"]);
    for p in policies {
        assert_eq!((p["placed"].as_u64(), p["unplaced"].as_u64()), (Some(8), Some(0)), "{p}");
        let mut ips = BTreeSet::new();
        for pod in p["pods"].as_array().unwrap() {
            assert!(pod["node"].is_string(), "{pod}");
            for nic in pod["nics"].as_array().unwrap() {
                let ip = nic["ip"].as_str().unwrap().to_string();
                assert!(ip.starts_with("192.168.10."), "{ip}");
                assert!(ips.insert(ip), "{}: address handed out twice", p["policy"]);
                let vertex = pod["vertex"].as_str().unwrap();
                assert_eq!(
                    nic["domain"].as_str().unwrap(),
                    format!("{vertex}.pipeline1-multi-network.video.default.vertexdomain.local")
                );
            }
        }
        assert_eq!(ips.len(), 6, "filter-resize, inference and out: 2 pods each");
    }
    let share = |i: usize| policies[i]["alignmentShare"].as_f64().unwrap();
    assert_eq!(share(0), 1.0);
    assert!(share(0) >= share(1) && share(0) >= share(2));
    assert_eq!(v["networks"][0]["usableAddresses"], 254);
}

#[test]
fn the_table_has_a_row_per_pod_and_the_alignment_line() {
    let out = weft(&["simulate", "--pipelines", "--replicas", "3", "--policies", "weft,blind"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // Lines wrap at 100 columns: look for the needles with the line breaks taken out.
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for needle in [
        "NIC and VF",
        "DNS names",
        "video-inference-2",
        "inference.pipeline1-multi-network.video.default.vertexdomain.local",
        "video/filter-resize VERTEX_DOMAIN_TARGETS=inference.pipeline1-multi-network.video.default.vertexdomain.local",
        "weft: 12/12 vertex pods placed",
        "NIC–GPU alignment: weft 100.0% (6/6), blind ",
    ] {
        assert!(flat.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn a_range_too_small_for_the_replicas_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.yaml");
    std::fs::write(&path, SCENARIO.replace("192.168.10.0/24", "192.168.10.0/30")).unwrap();
    let out = weft(&["simulate", "--pipelines", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NumaNetwork 'pipeline1-multi-network'") && err.contains("192.168.10.0/30"), "{err}");
    assert!(err.contains("6 vertex pods"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
