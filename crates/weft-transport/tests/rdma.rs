//! The RDMA verbs backend.
//!
//! ```text
//! cargo test -p weft-transport --features rdma --test rdma
//! ```
//!
//! The side-channel handshake runs over real TCP sockets everywhere. The device tests need an
//! RDMA device with an active port (a NIC, or soft-RoCE: `rdma link add rxe0 type rxe netdev
//! eth0`); without one they skip through `weft_testkit::require`, whose allow-list names them. They bind to the address a
//! RoCE GID carries (or `WEFT_RDMA_TEST_ADDR`, needed on InfiniBand, where GIDs carry no IP).
#![cfg(feature = "rdma")]

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use weft_transport::rdma::wire::{self, Hello};
use weft_transport::rdma::{RdmaBackend, RdmaConfig};
use weft_transport::{Backend, FrameListener, FrameReader, FrameWriter, conformance};

const DEADLINE: Duration = Duration::from_secs(60);
/// Set in the child process of the peer-death test: the parent's address.
const CHILD_ENV: &str = "WEFT_RDMA_TEST_CHILD_PEER";
/// The address to bind the device tests to, when GIDs carry none (InfiniBand).
const ADDR_ENV: &str = "WEFT_RDMA_TEST_ADDR";

async fn guard<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("{what}: no progress within {DEADLINE:?}"))
}

fn hello(qpn: u32) -> Hello {
    Hello {
        link_layer: 2,
        mtu: 5,
        lid: 0,
        port: 1,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, qpn as u8],
        qpn,
        psn: qpn * 1000,
        ring_addr: 0x7f00_0000_0000 + qpn as u64 * 4096,
        ring_capacity: 1 << 20,
        ring_rkey: 0x100 + qpn,
        max_records: 64,
        max_header: 4096,
    }
}

/// A connected pair of TCP streams on loopback.
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (a, b) = tokio::join!(l.accept(), TcpStream::connect(addr));
    (a.expect("accept").0, b.expect("connect"))
}

#[tokio::test]
async fn hellos_cross_over_a_real_socket() {
    let (mut a, mut b) = tcp_pair().await;
    let (ha, hb) = (hello(1), hello(2));
    let (got_a, got_b) =
        guard("exchange", async { tokio::join!(wire::exchange_hello(&mut a, &ha), wire::exchange_hello(&mut b, &hb)) })
            .await;
    assert_eq!(got_a.expect("a's exchange"), hb);
    assert_eq!(got_b.expect("b's exchange"), ha);
    let (sa, sb) = guard("status", async {
        tokio::join!(wire::exchange_status(&mut a, Ok(())), wire::exchange_status(&mut b, Ok(())))
    })
    .await;
    sa.expect("a ready");
    sb.expect("b ready");
}

#[tokio::test]
async fn a_refusal_reaches_the_peer_with_its_reason() {
    let (mut a, mut b) = tcp_pair().await;
    let (sa, sb) = guard("status", async {
        tokio::join!(
            wire::exchange_status(&mut a, Err("ring too small for you")),
            wire::exchange_status(&mut b, Ok(()))
        )
    })
    .await;
    let ea = sa.expect_err("a refused");
    assert!(ea.to_string().contains("refused the peer: ring too small"), "{ea}");
    let eb = sb.expect_err("b was refused");
    assert_eq!(eb.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(eb.to_string().contains("the peer refused: ring too small for you"), "{eb}");
}

#[tokio::test]
async fn a_peer_that_is_not_weft_rdma_is_named() {
    let (mut a, mut b) = tcp_pair().await;
    let talker = tokio::spawn(async move {
        let mut junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        junk.resize(wire::HELLO_LEN, b' ');
        b.write_all(&junk).await.expect("write");
        b
    });
    let err = guard("exchange", wire::exchange_hello(&mut a, &hello(1))).await.expect_err("garbage");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("not a weft RDMA endpoint"), "{err}");
    drop(talker.await);

    let (mut a, b) = tcp_pair().await;
    drop(b);
    let err = guard("exchange", wire::exchange_hello(&mut a, &hello(1))).await.expect_err("closed");
    assert!(err.to_string().contains("before its hello"), "{err}");
}

/// Without a device, both ends of a link fail with an error that says so, instead of hanging
/// or panicking. (With a device this test checks nothing and passes.)
#[tokio::test]
async fn without_a_device_links_fail_with_a_clear_error() {
    if !weft_transport::rdma::device_names().expect("device list").is_empty() {
        eprintln!("this machine has an RDMA device; the no-device path is not reachable");
        return;
    }
    let backend = RdmaBackend::new(RdmaConfig::default()).expect("backend");
    let mut listener =
        backend.bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind works without a device: it is TCP");
    let addr = listener.local_addr().expect("addr");
    let (accepted, connected) = guard("link", async { tokio::join!(listener.accept(), backend.connect(addr)) }).await;
    for err in [accepted.map(|_| ()).expect_err("accept"), connected.map(|_| ()).expect_err("connect")] {
        let text = err.to_string();
        assert!(text.contains("no RDMA device"), "{text}");
        assert!(text.contains("RDMA link with"), "names the peer: {text}");
    }
}

/// The address the device tests run on, or `None` when there is no usable device (a skip
/// through `weft_testkit::require`; these tests are in its allow-list, since CI has no device).
fn device(test: &str) -> Option<IpAddr> {
    let endpoints = weft_transport::rdma::endpoints().expect("listing RDMA endpoints");
    if endpoints.is_empty() {
        let names = weft_transport::rdma::device_names().expect("device list");
        weft_testkit::require(
            false,
            format!("an RDMA NIC or soft-RoCE: a device with an active port (devices: {names:?})"),
        );
        return None;
    }
    if let Ok(a) = std::env::var(ADDR_ENV) {
        return Some(a.parse().unwrap_or_else(|e| panic!("{ADDR_ENV}={a:?}: {e}")));
    }
    match endpoints.iter().find_map(|e| e.ip) {
        Some(ip) => Some(ip),
        None => panic!(
            "{test}: the active RDMA ports {endpoints:?} carry no IP address (InfiniBand); set \
             {ADDR_ENV} to this node's IPoIB address"
        ),
    }
}

async fn link(
    backend: &RdmaBackend,
    ip: IpAddr,
) -> (
    weft_transport::rdma::RdmaWriter,
    weft_transport::rdma::RdmaReader,
    weft_transport::rdma::RdmaWriter,
    weft_transport::rdma::RdmaReader,
    weft_transport::rdma::RdmaListener,
) {
    let mut listener = backend.bind(SocketAddr::new(ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (accepted, connected) = guard("link", async { tokio::join!(listener.accept(), backend.connect(addr)) }).await;
    let (sw, sr, _) = accepted.expect("accept");
    let (cw, cr) = connected.expect("connect");
    (cw, cr, sw, sr, listener)
}

fn payload(i: usize, len: usize) -> Bytes {
    Bytes::from((0..len).map(|j| (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8).collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_backend_passes_the_conformance_suite() {
    let Some(ip) = device("device_backend_passes_the_conformance_suite") else {
        return;
    };
    let backend = RdmaBackend::new(RdmaConfig::default()).expect("backend");
    let largest = backend.config().largest_payload(64);
    conformance::run_all(&backend, SocketAddr::new(ip, 0), largest).await.expect("conformance");
}

/// Thousands of frames of mixed sizes through a 64 KiB ring: many laps, skips at the ring's
/// end, credits throttling the sender; every frame arrives whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_small_ring_wraps_many_times_under_credits() {
    let Some(ip) = device("device_small_ring_wraps_many_times_under_credits") else {
        return;
    };
    let backend =
        RdmaBackend::new(RdmaConfig { ring_size: 64 * 1024, max_records: 8, max_header: 4096, ..Default::default() })
            .expect("backend");
    let (cw, _cr, _sw, mut sr, _l) = link(&backend, ip).await;
    let sizes = [0usize, 1, 63, 64, 65, 4000, 20_000, 31_000, 777];
    conformance::many_frames_in_order(cw, &mut sr, &sizes, 5000).await.expect("laps of the ring");
}

/// A payload kept while later frames pass through the ring is not overwritten (the sender
/// reuses space only after it was given back), and the ring moves on once it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_held_payload_is_never_overwritten() {
    let Some(ip) = device("device_held_payload_is_never_overwritten") else {
        return;
    };
    let backend =
        RdmaBackend::new(RdmaConfig { ring_size: 64 * 1024, max_header: 4096, ..Default::default() }).expect("backend");
    let (cw, _cr, _sw, mut sr, _l) = link(&backend, ip).await;
    conformance::held_payload_then_released(cw, &mut sr, 8000).await.expect("held payload");
}

/// A peer process that dies mid-stream (abort, no clean close): the frames it sent arrive,
/// then the reader fails instead of reporting a clean end or hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_peer_process_death_fails_the_reader_after_its_frames() {
    if let Ok(peer) = std::env::var(CHILD_ENV) {
        let backend = RdmaBackend::new(RdmaConfig::default()).expect("backend");
        let (mut w, mut r) =
            backend.connect(peer.parse().expect("parent address")).await.expect("connect to the parent");
        for i in 0..10 {
            w.write_frame(format!("c{i}").as_bytes(), &payload(i, 100_000)).await.expect("write");
        }
        // Wait for the parent to have all ten, then die without closing anything.
        let _ = r.read_frame().await;
        std::process::abort();
    }
    let Some(ip) = device("device_peer_process_death_fails_the_reader_after_its_frames") else {
        return;
    };
    let backend = RdmaBackend::new(RdmaConfig::default()).expect("backend");
    let mut listener = backend.bind(SocketAddr::new(ip, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "device_peer_process_death_fails_the_reader_after_its_frames", "--nocapture"])
        .env(CHILD_ENV, addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child");
    let (mut w, mut r, _) = guard("accept", listener.accept()).await.expect("accept");
    for i in 0..10 {
        let f = guard("read", r.read_frame()).await.expect("read").expect("frame");
        assert_eq!(f.header, Bytes::from(format!("c{i}")));
        assert!(f.payload == payload(i, 100_000));
    }
    w.write_frame(b"got them", &Bytes::new()).await.expect("tell the child");
    let end = guard("read after the peer died", r.read_frame()).await;
    assert!(end.is_err(), "a dead peer must fail the reader, got {end:?}");
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join").expect("child status");
    assert!(!status.success(), "the child was meant to abort");
}
