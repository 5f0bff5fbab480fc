//! The CLI as a new user meets it: bad numbers, lists, files and values get one clear message
//! each, and inspection commands write nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

fn topology(name: &str) -> String {
    let p: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "weft-sim", "topologies", name].iter().collect();
    p.to_string_lossy().into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_gpu_count_below_one_is_named_as_such() {
    let v100 = topology("dgx1-v100-mlx5-columns.txt");
    for k in ["-1", "0"] {
        let out = weft(&["gpu", "allocate", "-t", &v100, "-k", k]);
        assert_eq!(out.status.code(), Some(2));
        let e = stderr(&out);
        assert!(e.contains("--count") && e.contains("at least 1") && !e.contains("unexpected argument"), "{e}");
    }
    let out = weft(&["gpu", "score", "-k", "-3", &v100]);
    assert!(stderr(&out).contains("at least 1 GPU, not -3"), "{}", stderr(&out));
}

#[test]
fn a_bad_gpu_list_speaks_of_gpus() {
    let out =
        weft(&["gpu", "allocate", "-t", &topology("dgx1-v100-mlx5-columns.txt"), "-k", "2", "--available", "0,x"]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("'x' is not a GPU number or range"), "{e}");
    assert!(!e.contains("CPU"), "{e}");
}

#[test]
fn parse_errors_give_the_position_once() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bad.json");
    std::fs::write(&json, "{\n  \"apiVersion\": 3,\n}").unwrap();
    let e = stderr(&weft(&["topo", "show", json.to_str().unwrap()]));
    assert!(e.contains("bad.json:2:17: invalid type"), "{e}");
    assert!(!e.contains("at line"), "{e}");
    let yaml = dir.path().join("bad.yaml");
    std::fs::write(&yaml, "apiVersion: weft.io/v1alpha1\nkind: NodeTopology\ngpus: [{index: x}]\n").unwrap();
    let e = stderr(&weft(&["topo", "show", yaml.to_str().unwrap()]));
    assert!(e.contains("bad.yaml:3:16: "), "{e}");
    assert_eq!(e.matches("3:16").count() + e.matches("line 3").count(), 1, "{e}");
}

#[test]
fn out_of_range_values_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = weft(&["topo", "show", &topology("dgx1-v100-mlx5-columns.txt"), "-o", "json"]);
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["interSocketGbps"] = serde_json::json!(-5.0);
    let file = dir.path().join("neg.json");
    std::fs::write(&file, v.to_string()).unwrap();
    let out = weft(&["topo", "show", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("interSocketGbps: -5 is not a bandwidth"), "{}", stderr(&out));
}

#[test]
fn generations_are_shown_by_their_names() {
    let out = weft(&["topo", "show", &topology("dgx1-v100-mlx5-columns.txt")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("NVLink generation: NVLink 2\n"), "{text}");
    assert!(!text.contains("Nvlink2"), "{text}");
}

#[test]
fn a_v100_nv1_pair_is_rated_at_its_nvlink_not_at_a_pcie_the_system_lacks() {
    // GPU0–GPU1 of a DGX-1 V100 share one NVLink 2 (25 GB/s); the system's PCIe is Gen3
    // (15.75 GB/s x16), so NVLink is the faster path and the pair's rate.
    let out = weft(&[
        "gpu",
        "allocate",
        "-t",
        &topology("dgx1-v100-mlx5-columns.txt"),
        "-k",
        "2",
        "--available",
        "0,1",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["meanPairBandwidthGbps"], 25.0, "{v}");
    let shown = weft(&["topo", "show", &topology("dgx1-v100-mlx5-columns.txt")]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("PCIe generation:   Gen3"));
}

#[test]
fn topo_discover_writes_no_cache_unless_given_one() {
    let default = std::path::Path::new("/var/lib/weft/topology.json");
    let before = std::fs::metadata(default).ok().map(|m| m.modified().unwrap());
    let out = weft(&["topo", "discover", "--no-gpus", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let after = std::fs::metadata(default).ok().map(|m| m.modified().unwrap());
    assert_eq!(before, after, "topo discover touched {}", default.display());
    // Asked for, a cache is written where asked.
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.json");
    let out = weft(&["topo", "discover", "--no-gpus", "-o", "json", "--cache", cache.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(cache.exists(), "no cache at {}", cache.display());
}

#[test]
fn simulate_sizes_it_cannot_hold_are_clear_errors_not_aborts() {
    for (args, said) in [
        (["simulate", "--pods", "1000000000"], "pods: 1000000000 is more than the simulator takes (at most 10000000)"),
        (
            ["simulate", "--nodes", "100000000000"],
            "--nodes 100000000000 is more than the simulator takes (at most 1000000)",
        ),
    ] {
        let out = weft(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn simulate_with_no_pods_offers_no_load_and_says_so_without_a_sign() {
    let out = weft(&["simulate", "--pods", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // The report wraps at 100 columns: compare with the line breaks taken out.
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(
            "workload: 0 pods, offered load 0% of GPU capacity while pods are present (0% over the arrival window, \
             generated for 95%)"
        ),
        "{text}"
    );
    assert!(!text.contains("-0"), "{text}");
}

#[test]
fn simulate_shows_what_it_was_generated_for_beside_what_the_stream_offers() {
    let out = weft(&["simulate", "--pods", "500", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workload"]["targetLoad"], 0.95);
    // The rate it was drawn for is what the stream offers over its arrival window; over the time its
    // pods are present (the drain after the last arrival included) it offers less.
    let window = v["workload"]["arrivalWindowLoad"].as_f64().unwrap();
    assert!(window > 0.5 && window < 1.5, "{window}");
    let offered = v["workload"]["offeredLoad"].as_f64().unwrap();
    assert!(offered > 0.0 && offered < window, "{offered} over the time present, {window} over the arrivals");
}

/// Run weft with stdout and stderr on a terminal (util-linux `script` gives it a pseudo-terminal);
/// returns everything written to it.
fn weft_on_a_terminal(args: &str) -> String {
    let command = format!("{} {args}", env!("CARGO_BIN_EXE_weft"));
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("util-linux `script` runs (Debian's bsdutils, an essential package)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn simulate_progress_is_drawn_for_tables_on_a_terminal_only() {
    let args = "simulate --nodes 300 --pods 20000";
    // A terminal and a table: a bar per policy, with pods placed.
    let tty = weft_on_a_terminal(args);
    for policy in ["weft", "blind", "least-allocated"] {
        assert!(tty.contains(&format!("{policy} [")), "no bar for {policy}: {tty}");
    }
    assert!(tty.contains(" placed, ") && tty.contains(" left"), "{tty}");
    // A terminal and JSON: nothing but the JSON.
    let json = weft_on_a_terminal(&format!("{args} -o json"));
    assert!(!json.contains(" placed, "), "{json}");
    assert!(serde_json::from_str::<serde_json::Value>(json.trim()).is_ok(), "{json}");
    // stderr a pipe (logs, CI): nothing on it.
    let out = weft(&args.split(' ').collect::<Vec<_>>());
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
}

#[test]
fn scheduler_extender_help_names_every_verb_it_serves_and_bind_verb() {
    let out = weft(&["scheduler-extender", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    for verb in ["/filter", "/prioritize", "/bind", "/volcano/predicate", "/volcano/allocate", "bindVerb: bind"] {
        assert!(help.contains(verb), "`weft scheduler-extender --help` does not mention {verb}:\n{help}");
    }
}

fn weft_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("weft binary runs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn topo_show_reads_standard_input_for_a_dash() {
    let file = topology("dgx1-v100-mlx5-columns.txt");
    let from_file = weft(&["topo", "show", &file, "-o", "json"]);
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    let from_stdin = weft_stdin(&["topo", "show", "-", "-o", "json"], &std::fs::read(&file).unwrap());
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    // The same topology; a file names the node after itself, standard input has no name.
    let mut from_file: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    from_file.as_object_mut().unwrap().remove("name");
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&from_stdin.stdout).unwrap(), from_file);
    // Bad input on stdin is named as such.
    let bad = weft_stdin(&["topo", "show", "-"], b"GPU0 GPU1\nGPU0 X ??\n");
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("<stdin>"), "{}", stderr(&bad));
}

#[test]
fn topo_show_and_gpu_commands_take_an_embedded_node_type() {
    let out = weft(&["topo", "show", "builtin:dgx-a100"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("node dgx-a100: 8 GPUs"), "{text}");
    let out = weft(&["gpu", "allocate", "-t", "builtin:dgx-a100", "-k", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = weft(&["gpu", "score", "-k", "2", "builtin:dgx-a100@0-3", "builtin:hgx-h100"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // An unknown name lists the known ones.
    let out = weft(&["topo", "show", "builtin:dgx-z9"]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("dgx-z9") && e.contains("dgx-a100") && e.contains("hgx-h100"), "{e}");
}

#[test]
fn list_defaults_are_shown_as_they_must_be_typed() {
    let out = weft(&["simulate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: weft,blind,least-allocated]"), "{help}");
    // … and typing the default as shown is accepted.
    let out = weft(&["simulate", "--pods", "10", "--policies", "weft,blind,least-allocated", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn every_command_names_the_node_with_node_and_still_takes_node_name() {
    for spelling in ["--node", "--node-name"] {
        let out = weft(&["topo", "discover", spelling, "n7", "--no-gpus", "-o", "json"]);
        assert!(out.status.success(), "{spelling}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["name"], "n7", "{spelling}");
    }
    for cmd in [&["topo", "discover"][..], &["topo", "publish"], &["agent"]] {
        let out = weft(&[cmd, &["--help"]].concat());
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--node <NAME>"), "{cmd:?}: {help}");
        assert!(!help.contains("--node-name <"), "{cmd:?} shows a second node flag: {help}");
    }
}

/// Every duration flag of every command, with a value in its old form (bare seconds).
const DURATION_FLAGS: &[(&[&str], &str)] = &[
    (&["agent"], "--interval"),
    (&["agent"], "--reconcile-period"),
    (&["agent"], "--gpu-write-back-period"),
    (&["agent"], "--sriov-health-period"),
    (&["agent"], "--sriov-write-back-period"),
    (&["scheduler-extender"], "--request-timeout"),
    (&["scheduler-extender"], "--reservation-ttl"),
    (&["scheduler-extender"], "--tls-reload-interval"),
    (&["webhook"], "--tls-reload-interval"),
    (&["controller"], "--volcano-poll"),
    (&["controller"], "--lease-duration"),
    (&["controller"], "--renew-grace"),
    (&["controller"], "--dns-ttl"),
    (&["controller"], "--dns-lease-ttl"),
    (&["wait-for"], "--timeout"),
    (&["wait-for"], "--interval"),
    (&["wait-for"], "--connect-timeout"),
];

#[test]
fn every_duration_flag_takes_units_and_shows_its_default_with_one() {
    for (cmd, flag) in DURATION_FLAGS {
        let out = weft(&[*cmd, &["--help"]].concat());
        let help = String::from_utf8_lossy(&out.stdout);
        let at = help.find(&format!("{flag} <DURATION>")).unwrap_or_else(|| panic!("{cmd:?} {flag}: {help}"));
        let entry = help[at..help[at..].find("\n      --").map_or(help.len(), |n| at + n)]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let default = entry.split("[default: ").nth(1).map(|d| d.split(']').next().unwrap());
        let default = default.unwrap_or_else(|| panic!("{cmd:?} {flag} shows no default: {entry}"));
        assert!(default.ends_with(['s', 'm', 'h']), "{cmd:?} {flag} default {default:?} has no unit");
        // A malformed value is refused naming the flag and the convention.
        let bad = format!("{flag}=5 parsecs");
        let out = weft(&[*cmd, &[bad.as_str()]].concat());
        assert_eq!(out.status.code(), Some(2), "{cmd:?} {flag}");
        let e = stderr(&out);
        assert!(e.contains(flag) && e.contains("30s"), "{cmd:?} {flag}: {e}");
    }
}

#[test]
fn wait_for_takes_its_timeout_in_units_and_in_the_old_bare_seconds() {
    // Nothing listens on port 9 of 127.0.0.1 here: the wait gives up at its timeout and says it.
    for timeout in ["1s", "1", "1500ms"] {
        let out = weft(&["wait-for", "--timeout", timeout, "--interval", "200ms", "--quiet", "127.0.0.1:9"]);
        assert_eq!(out.status.code(), Some(1), "{timeout}: {}", stderr(&out));
        assert!(stderr(&out).contains("127.0.0.1:9"), "{}", stderr(&out));
    }
}
