//! `weft wait-for` as the init container runs it: the real binary against real sockets on loopback.

use std::net::TcpListener;
use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).output().expect("weft binary runs")
}

#[test]
fn exits_zero_once_every_target_accepts_a_connection() {
    let a = TcpListener::bind("127.0.0.1:0").expect("bind");
    let b = TcpListener::bind("127.0.0.1:0").expect("bind");
    let (pa, pb) = (a.local_addr().expect("addr").port(), b.local_addr().expect("addr").port());
    let out = weft(&["wait-for", "--timeout=60", &format!("127.0.0.1:{pa}"), &format!("localhost:{pb}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("2/2 ready"), "{stderr}");
}

#[test]
fn exits_one_naming_the_target_when_nothing_listens_before_the_timeout() {
    // Bound to pick a free port, then closed: connections are refused. Takes about 1 s.
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let target = format!("127.0.0.1:{port}");
    let out = weft(&["wait-for", "--timeout=1", "--interval=1", &target]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("not ready: {target} (")), "{stderr}");
    assert!(stderr.contains("connection refused"), "{stderr}");
}

#[test]
fn a_malformed_target_is_refused_before_waiting() {
    let out = weft(&["wait-for", "--timeout=0", "host-{0..2:22"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("host-{0..2:22"), "{stderr}");
}
