//! `weft simulate --optimum`: the real binary on small generated instances.

use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

#[test]
fn each_instance_has_a_bound_above_every_policy_and_their_gaps() {
    let out = weft(&[
        "simulate",
        "--optimum",
        "--instances",
        "2",
        "--nodes",
        "3",
        "--pods",
        "30",
        "--seed",
        "5",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let instances = v.as_array().unwrap();
    assert_eq!(instances.iter().map(|i| i["seed"].as_u64().unwrap()).collect::<Vec<_>>(), [5, 6]);
    for i in instances {
        let bound = i["bound"]["bound"].as_u64().unwrap();
        assert!(["optimal", "mip-bound", "lp-bound", "trivial"].contains(&i["bound"]["kind"].as_str().unwrap()), "{i}");
        let policies = i["policies"].as_array().unwrap();
        let at_least = i["optimumAtLeast"].as_u64().unwrap();
        assert!(at_least <= bound, "{i}");
        let names: Vec<&str> = policies.iter().map(|p| p["policy"].as_str().unwrap()).collect();
        assert_eq!(names, ["weft", "blind", "least-allocated"]);
        for p in policies {
            let placed = p["placed"].as_u64().unwrap();
            assert!(placed <= at_least && at_least <= bound, "{i}");
            let gap = p["gap"].as_f64().unwrap();
            assert!((gap - (bound - placed) as f64 / bound as f64).abs() < 1e-9, "{p}");
            // The bandwidth bound at the policy's own count is above its mean, and the gap is theirs.
            let mean = p["meanRingGbps"].as_f64().unwrap();
            if let Some(ring) = p["ringBoundGbps"].as_f64() {
                assert!(mean <= ring + 1e-6, "{p}");
                let ring_gap = p["ringGap"].as_f64().unwrap();
                assert!((ring_gap - (ring - mean) / ring).abs() < 1e-9, "{p}");
            } else {
                assert_eq!(mean, 0.0, "no bound only without multi-GPU pods placed: {p}");
            }
        }
    }
}

#[test]
fn the_table_names_what_the_bound_is() {
    let out = weft(&["simulate", "--optimum", "--nodes", "2", "--pods", "12", "--policies", "weft"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("upper bound")
            && text.contains("per policy: pods placed (gap)")
            && text.contains("mean gap over 1 instances")
            && text.contains("bottleneck ring, per policy")
            && text.contains("mean bottleneck gap over 1 instances"),
        "{text}"
    );
}

#[test]
fn instance_counts_and_sizes_it_cannot_take_are_refused_by_name() {
    let out = weft(&["simulate", "--optimum", "--instances", "0", "--nodes", "2", "--pods", "10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--instances must be at least 1"));
    // 5,000 pods on the 88-node embedded cluster: far more pod-node variables than the program takes.
    let out = weft(&["simulate", "--optimum"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pod-node variables") && err.contains("fewer nodes or pods"), "{err}");
    let out = weft(&["simulate", "--instances", "3"]);
    assert!(!out.status.success(), "--instances without --optimum");
}
