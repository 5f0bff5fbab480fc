//! Exec'd ADD and DEL of weft-cni, as a runtime runs them (one process per call, a veth host end
//! as the VF, moved into a network namespace and back), side by side with Debian's plugins on the
//! same kind of veth: `host-device` (moves an existing netdev into the pod, as weft-cni and
//! sriov-cni do) and `macvlan` (creates a new link in the pod: no move). All use host-local IPAM;
//! weft-cni is also measured with its in-process IPAM (`"type": "weft"`). The floor every moving
//! plugin shares is measured too: `ip link set <dev> netns <ns>` and back, and each binary's bare
//! start-up (VERSION).
//!
//! `cargo bench -p weft-cni --bench exec` (root, `containernetworking-plugins` installed);
//! `WEFT_CNI_BENCH_CYCLES` sets the cycles (default 200, after 10 warm-up cycles). Prints p50,
//! p99 and mean per call in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn call(binary: &str, env: &[(&str, String)], stdin: &Value) -> Duration {
    let start = Instant::now();
    let (out, ok, err) = exec_bin(binary, env, stdin);
    let took = start.elapsed();
    assert!(ok, "{binary} {:?} failed: {out} {err}", env.first());
    took
}

struct Stats {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| ms(v[((v.len() as f64 - 1.0) * q).round() as usize]);
    Stats { p50: at(0.50), p99: at(0.99), mean: v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64 }
}

fn cycles(binary: &str, conf: &Value, netns: &str, warm: usize, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..warm + n {
        let cid = format!("bench{i}");
        let add = call(binary, &cni_env("ADD", &cid, Some(netns), "net1"), conf);
        let del = call(binary, &cni_env("DEL", &cid, Some(netns), "net1"), conf);
        if i >= warm {
            adds.push(add);
            dels.push(del);
        }
    }
    (adds, dels)
}

fn version_starts(binary: &str, n: usize) -> Vec<Duration> {
    (0..n).map(|_| call(binary, &[("CNI_COMMAND", "VERSION".into())], &json!({"cniVersion": "1.0.0"}))).collect()
}

fn row(name: &str, what: &str, s: &Stats) {
    println!("{name:<22} {what:<8} p50 {:>7.2} ms   p99 {:>7.2} ms   mean {:>7.2} ms", s.p50, s.p99, s.mean);
}

/// `ip link set <dev> netns <ns>` and back, `n` times: (in, out).
fn raw_moves(dev: &str, netns: &str, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let ip = |args: &[&str]| {
        let start = Instant::now();
        let ok = std::process::Command::new("ip").args(args).status().expect("ip").success();
        assert!(ok, "ip {args:?}");
        start.elapsed()
    };
    (0..n)
        .map(|_| (ip(&["link", "set", dev, "netns", netns]), ip(&["-n", netns, "link", "set", dev, "netns", "1"])))
        .unzip()
}

fn main() {
    let macvlan = format!("{CNI_BIN_DIR}/macvlan");
    let host_device = format!("{CNI_BIN_DIR}/host-device");
    if !can_host_local()
        || !weft_testkit::require(Path::new(&macvlan).exists(), format!("{macvlan} (containernetworking-plugins)"))
        || !weft_testkit::require(
            Path::new(&host_device).exists(),
            format!("{host_device} (containernetworking-plugins)"),
        )
    {
        return;
    }
    let n: usize = std::env::var("WEFT_CNI_BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let warm = 10;
    let node = Node::new(1, "wcpf0");
    let ns = NetnsGuard::new();
    let master = VethGuard::new("wcm");
    let device = VethGuard::new("wcd");
    let spare = VethGuard::new("wcr");

    // The same IPAM for all: host-local over a /16, data under the bench's directory.
    let ipam = |net: &str| json!({"type": "host-local", "dataDir": node.ipam_dir(), "ranges": [[{"subnet": net}]]});
    let weft = node.conf("1.0.0", "bench-weft", Some(0), "10.80.0.0/16", json!({}));
    let physnets = node.dir.path().join("physnets.yaml");
    std::fs::write(&physnets, "physnets:\n  - name: bench\n    devices: [wcpf0]\n    subnet: 10.82.0.0/16\n")
        .expect("physnets");
    let weft_own = node.conf(
        "1.0.0",
        "bench-weft-ipam",
        Some(0),
        "unused",
        json!({"physnet": "bench", "physnetConfig": physnets, "ipam": {"type": "weft"}}),
    );
    let hd = json!({"cniVersion": "1.0.0", "name": "bench-hd", "type": "host-device", "device": device.name, "ipam": ipam("10.83.0.0/16")});
    let mv = json!({"cniVersion": "1.0.0", "name": "bench-macvlan", "type": "macvlan", "master": master.name, "mode": "bridge", "ipam": ipam("10.81.0.0/16")});

    println!("exec'd CNI calls, {n} cycles after {warm} warm-up, one network namespace");
    let results = [
        ("weft-cni (host-local)", cycles(BIN, &weft, &ns.path(), warm, n)),
        ("weft-cni (weft IPAM)", cycles(BIN, &weft_own, &ns.path(), warm, n)),
        ("host-device (h-local)", cycles(&host_device, &hd, &ns.path(), warm, n)),
        ("macvlan (host-local)", cycles(&macvlan, &mv, &ns.path(), warm, n)),
    ];
    for (name, (adds, dels)) in results {
        row(name, "ADD", &stats(adds));
        row(name, "DEL", &stats(dels));
    }
    let (moves_in, moves_out) = raw_moves(&spare.name, &ns.name, n);
    row("ip link set netns", "in", &stats(moves_in));
    row("ip link set netns", "out", &stats(moves_out));
    row("weft-cni", "VERSION", &stats(version_starts(BIN, n)));
    row("host-device", "VERSION", &stats(version_starts(&host_device, n)));
    assert!(link(&node.vfs[0].1.name, None).is_some(), "the VF ends the bench in the host");
}
