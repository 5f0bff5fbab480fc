//! The shared-memory backend through its public API: frames in order, sizes, wrap-around,
//! leases and backpressure, closing and peer death (a real child process killed), rendezvous
//! errors, and two real processes exchanging frames.
//!
//! Child processes are this test binary itself, started with `WEFT_SHM_TEST_ROLE` set and
//! running the ignored test `child_peer`.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use weft_transport::shm::{ShmBackend, ShmConfig, ShmReader, ShmWriter};
use weft_transport::{Backend, FrameListener, FrameReader, FrameWriter};

/// Hang guard for whole tests: generous, never a timing assertion.
const GUARD: Duration = Duration::from_secs(120);

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Pseudo-random bytes that test payloads are cut from (xorshift; built once per process).
static PATTERN: std::sync::LazyLock<Bytes> = std::sync::LazyLock::new(|| {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = Vec::with_capacity((17 << 20) + 8);
    while v.len() < (17 << 20) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.into()
});

/// Payload `seq` of a test stream: its length varies with `seq` (up to `max`) and it is cut
/// from the pattern at an offset that depends on `seq`, so a frame delivered twice, out of
/// order or torn shows.
fn payload(seq: u64, max: usize) -> Bytes {
    let len = (seq.wrapping_mul(2_654_435_761) % (max as u64 + 1)) as usize;
    let at = (seq % 4093) as usize;
    PATTERN.slice(at..at + len)
}

fn header(seq: u64) -> Vec<u8> {
    // Header lengths vary too (8..=40 bytes).
    let mut h = seq.to_le_bytes().to_vec();
    h.resize(8 + (seq % 33) as usize, 0xAB);
    h
}

fn check(frame: &weft_transport::Frame, seq: u64, max: usize) {
    assert_eq!(frame.header, Bytes::from(header(seq)), "header of frame {seq}");
    let want = payload(seq, max);
    assert_eq!(frame.payload.len(), want.len(), "payload length of frame {seq}");
    assert!(frame.payload == want, "payload bytes of frame {seq}");
}

async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f).await.expect("test hung")
}

/// (connector's writer, connector's reader, listener's writer, listener's reader)
async fn pair(backend: &ShmBackend, port: u16) -> (ShmWriter, ShmReader, ShmWriter, ShmReader) {
    let mut listener = backend.bind(addr(port)).await.expect("bind");
    let accept = tokio::spawn(async move { listener.accept().await.map(|(w, r, _)| (w, r)) });
    let (cw, cr) = backend.connect(addr(port)).await.expect("connect");
    let (lw, lr) = accept.await.expect("join").expect("accept");
    (cw, cr, lw, lr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_arrive_in_order_both_ways() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(1 << 20);
    let (mut cw, mut cr, mut lw, mut lr) = pair(&backend, 7000).await;
    const N: u64 = 3000;
    const MAX: usize = 20_000;
    guard(async {
        let there = tokio::spawn(async move {
            for seq in 0..N {
                cw.write_frame(&header(seq), &payload(seq, MAX)).await.expect("write");
            }
        });
        let back = tokio::spawn(async move {
            for seq in 0..N {
                lw.write_frame(&header(seq), &payload(seq, 100)).await.expect("write back");
            }
        });
        for seq in 0..N {
            let f = lr.read_frame().await.expect("read").expect("frame");
            check(&f, seq, MAX);
            let f = cr.read_frame().await.expect("read back").expect("frame back");
            check(&f, seq, 100);
        }
        there.await.expect("writer");
        back.await.expect("writer back");
        // Writers dropped: both readers end cleanly.
        assert!(lr.read_frame().await.expect("end").is_none());
        assert!(cr.read_frame().await.expect("end back").is_none());
    })
    .await;
}

#[tokio::test]
async fn empty_payloads_and_empty_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    let (mut cw, _cr, _lw, mut lr) = pair(&backend, 7000).await;
    let cases: [(&[u8], Bytes); 4] = [
        (b"", Bytes::new()),
        (b"header only", Bytes::new()),
        (b"", Bytes::from_static(b"payload only")),
        (b"both", Bytes::from_static(b"x")),
    ];
    for (h, p) in &cases {
        cw.write_frame(h, p).await.expect("write");
    }
    for (h, p) in &cases {
        let f = lr.read_frame().await.expect("read").expect("frame");
        assert_eq!((&f.header[..], &f.payload), (*h, p));
    }
    // Every frame has been dropped: the ring is empty again.
    assert_eq!(lr.ring_state().in_use, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frames_up_to_the_ring_size_and_no_larger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(16 << 20);
    let (mut cw, _cr, _lw, mut lr) = pair(&backend, 7000).await;
    // 4 MiB frames, and one taking the whole ring (64 bytes of record header).
    let sizes = [4 << 20, 4 << 20, 1, 4 << 20, (16 << 20) - 64, 3 << 20, (16 << 20) - 64];
    guard(async {
        let writer = tokio::spawn(async move {
            for (seq, len) in sizes.into_iter().enumerate() {
                cw.write_frame(&[seq as u8], &PATTERN.slice(seq..seq + len)).await.expect("write");
            }
            cw
        });
        for (seq, len) in sizes.into_iter().enumerate() {
            let f = lr.read_frame().await.expect("read").expect("frame");
            assert_eq!(&f.header[..], &[seq as u8]);
            assert_eq!(f.payload.len(), len);
            assert!(f.payload == PATTERN.slice(seq..seq + len), "payload of frame {seq}");
        }
        let mut cw = writer.await.expect("writer");
        // One byte more than the ring can hold is refused, naming the sizes.
        let too_big = Bytes::from(vec![0u8; (16 << 20) - 63]);
        let err = cw.write_frame(b"", &too_big).await.expect_err("larger than the ring");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let msg = err.to_string();
        assert!(msg.contains("16777153 bytes") && msg.contains("ring of 16777216 bytes"), "{msg}");
        assert!(msg.contains("shm link to 127.0.0.1:7000"), "{msg}");
        // And the link still works.
        cw.write_frame(b"after", &Bytes::from_static(b"ok")).await.expect("write after");
        let f = lr.read_frame().await.expect("read").expect("frame");
        assert_eq!(&f.header[..], b"after");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ring_wraps_around_many_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = 16 * 1024;
    let backend = ShmBackend::new(dir.path()).ring_size(ring);
    let (mut cw, _cr, _lw, mut lr) = pair(&backend, 7000).await;
    const N: u64 = 20_000;
    const MAX: usize = 6000;
    let total: usize = (0..N).map(|s| payload(s, MAX).len()).sum();
    assert!(total > 200 * ring, "the stream laps the ring at least 200 times");
    guard(async {
        let writer = tokio::spawn(async move {
            for seq in 0..N {
                cw.write_frame(&header(seq), &payload(seq, MAX)).await.expect("write");
            }
        });
        // Keep a few payloads alive at a time, dropped out of order, so space comes back in
        // bursts and out of order.
        let mut held = Vec::new();
        for seq in 0..N {
            let f = lr.read_frame().await.expect("read").expect("frame");
            check(&f, seq, MAX);
            held.push(f.payload);
            if held.len() == 2 {
                held.swap(0, 1);
                held.clear();
            }
        }
        drop(held);
        writer.await.expect("writer");
        assert!(lr.read_frame().await.expect("end").is_none());
    })
    .await;
}

/// Waits (hang guard only) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + GUARD;
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_payload_stays_intact_while_the_writer_waits_for_space() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = 64 * 1024;
    let backend = ShmBackend::new(dir.path()).ring_size(ring);
    let (mut cw, _cr, _lw, mut lr) = pair(&backend, 7000).await;
    // Each frame takes 64 + 8192 bytes of ring: 7 fit in 64 KiB.
    let frame = |seq: u64| Bytes::from(vec![seq as u8; 8192]);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    guard(async {
        let writer = tokio::spawn(async move {
            for seq in 0..40u64 {
                cw.write_frame(&seq.to_le_bytes(), &frame(seq)).await.expect("write");
                done_tx.send(seq).expect("report");
            }
        });
        let first = lr.read_frame().await.expect("read").expect("frame").payload;
        // Frame 0's lease pins the ring: the writer fills it and waits.
        until("the writer waits for space", || lr.ring_state().writer_waiting).await;
        for seq in 1..7 {
            let f = lr.read_frame().await.expect("read").expect("frame");
            assert_eq!(f.payload, frame(seq));
        }
        let mut written = Vec::new();
        while let Ok(seq) = done_rx.try_recv() {
            written.push(seq);
        }
        assert_eq!(written, (0..7).collect::<Vec<_>>(), "7 frames fit; the 8th write waits");
        let state = lr.ring_state();
        assert!(state.writer_waiting, "{state:?}");
        // 7 records and the skip marker at the end: leases dropped after a held one free nothing.
        assert_eq!(state.in_use, ring as u64, "{state:?}");
        // Frame 0 is untouched, though the writer has wanted its space all along.
        assert_eq!(first, frame(0));
        drop(first);
        for seq in 7..40u64 {
            let f = lr.read_frame().await.expect("read").expect("frame");
            assert_eq!((&f.header[..], &f.payload), (&seq.to_le_bytes()[..], &frame(seq)));
        }
        writer.await.expect("writer");
    })
    .await;
}

#[tokio::test]
async fn space_comes_back_over_the_released_prefix_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    let (mut cw, _cr, _lw, mut lr) = pair(&backend, 7000).await;
    for seq in 0..4u8 {
        cw.write_frame(&[seq], &Bytes::from(vec![seq; 1000])).await.expect("write");
    }
    let rec = 64 + 1024; // record header + padded payload
    let mut p: Vec<Bytes> = Vec::new();
    for _ in 0..4 {
        p.push(lr.read_frame().await.expect("read").expect("frame").payload);
    }
    assert_eq!(lr.ring_state().in_use, 4 * rec);
    let clone_of_2 = p[2].clone();
    let [a, b, c, d]: [Bytes; 4] = p.try_into().expect("four");
    drop(d);
    drop(b);
    assert_eq!(lr.ring_state().in_use, 4 * rec, "0 is still held");
    drop(a);
    assert_eq!(lr.ring_state().in_use, 2 * rec, "0 and 1 given back, 2 held, 3 behind it");
    drop(c);
    assert_eq!(lr.ring_state().in_use, 2 * rec, "a clone of 2 is still alive");
    assert!(clone_of_2.iter().all(|b| *b == 2));
    drop(clone_of_2);
    assert_eq!(lr.ring_state().in_use, 0);
    // A payload outlives the reader, the writer and the link.
    cw.write_frame(b"", &Bytes::from_static(b"kept")).await.expect("write");
    let kept = lr.read_frame().await.expect("read").expect("frame").payload;
    drop((cw, lr));
    assert_eq!(&kept[..], b"kept");
}

#[tokio::test]
async fn closing_one_half_is_seen_by_the_peer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    guard(async {
        // Writer dropped with frames in the ring: they are read, then the end.
        let (mut cw, mut cr, mut lw, mut lr) = pair(&backend, 7000).await;
        cw.write_frame(b"1", &Bytes::from_static(b"a")).await.expect("write");
        cw.write_frame(b"2", &Bytes::new()).await.expect("write");
        drop(cw);
        assert_eq!(&lr.read_frame().await.expect("read").expect("1").header[..], b"1");
        assert_eq!(&lr.read_frame().await.expect("read").expect("2").header[..], b"2");
        assert!(lr.read_frame().await.expect("end").is_none());
        assert!(lr.read_frame().await.expect("still the end").is_none());
        // The other direction still works (acks flow back after the data stops).
        lw.write_frame(b"ack", &Bytes::new()).await.expect("ack");
        assert_eq!(&cr.read_frame().await.expect("read").expect("ack").header[..], b"ack");
        // Reader dropped: the peer's writer fails.
        drop(cr);
        let err = lw.write_frame(b"x", &Bytes::new()).await.expect_err("reader gone");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert!(err.to_string().contains("closed its reader"), "{err}");
        // A blocked writer is released by the reader going away too.
        let (mut cw, _cr, _lw, lr) = pair(&backend, 7001).await;
        let big = Bytes::from(vec![0u8; 60 * 1024]);
        cw.write_frame(b"", &big).await.expect("fills the ring");
        let blocked = tokio::spawn(async move { cw.write_frame(b"", &big).await });
        until("the writer waits for space", || lr.ring_state().writer_waiting).await;
        drop(lr);
        let err = blocked.await.expect("join").expect_err("reader gone");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_that_never_says_hello_does_not_hold_up_the_next_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The handshake may take an hour: only handshakes run side by side let the second link in.
    let backend = ShmBackend::with_config(ShmConfig {
        dir: dir.path().into(),
        ring_size: 64 * 1024,
        handshake_timeout: Duration::from_secs(3600),
        ..ShmConfig::default()
    });
    let mut listener = backend.bind(addr(7100)).await.expect("bind");
    let _silent = tokio::net::UnixStream::connect(listener.socket_path()).await.expect("silent connect");
    let (a, c) = guard(async { tokio::join!(listener.accept(), backend.connect(addr(7100))) }).await;
    let (mut sw, _sr, _) = a.expect("accept");
    let (_cw, mut cr) = c.expect("connect");
    sw.write_frame(&header(1), &payload(1, 100)).await.expect("write");
    check(&cr.read_frame().await.expect("read").expect("frame"), 1, 100);
}

#[tokio::test]
async fn rendezvous_errors_are_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path());
    // No socket: NotFound, naming the path (the caller falls back to TCP).
    assert!(!backend.reaches(addr(7000)));
    let err = backend.connect(addr(7000)).await.err().expect("no listener");
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains(&format!("{}/127.0.0.1_7000.sock", dir.path().display())), "{err}");

    // A listener: reachable; a second bind on the same address is refused.
    let listener = backend.bind(addr(7000)).await.expect("bind");
    assert!(backend.reaches(addr(7000)));
    assert_eq!(listener.local_addr().expect("addr"), addr(7000));
    let err = backend.bind(addr(7000)).await.err().expect("in use");
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    assert!(err.to_string().contains("live listener"), "{err}");
    drop(listener);
    assert!(!backend.reaches(addr(7000)), "the listener removes its socket");

    // A leftover socket (its listener died without cleaning up): connect says NotFound, a new
    // listener replaces it.
    let path = dir.path().join("127.0.0.1_7000.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).expect("leftover"));
    assert!(backend.reaches(addr(7000)));
    let err = backend.connect(addr(7000)).await.err().expect("leftover");
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("left over"), "{err}");
    let mut listener = backend.bind(addr(7000)).await.expect("bind over the leftover");
    let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
    backend.connect(addr(7000)).await.expect("connect");
    accept.await.expect("join").expect("accept");

    // Port 0 picks a free port, as TCP would.
    let listener = backend.bind(addr(0)).await.expect("bind port 0");
    let bound = listener.local_addr().expect("addr");
    assert_ne!(bound.port(), 0);
    assert!(backend.reaches(bound));

    // Bad ring sizes, on either side, name the problem.
    let err = backend.clone().ring_size(5000).connect(bound).await.err().expect("bad size");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("ring size 5000 bytes"), "{err}");
    let small =
        ShmBackend::with_config(ShmConfig { dir: dir.path().into(), max_ring_size: 1 << 20, ..ShmConfig::default() });
    let mut listener = small.bind(addr(7002)).await.expect("bind");
    let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
    let err = backend.clone().ring_size(2 << 20).connect(addr(7002)).await.err().expect("too big");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    assert!(err.to_string().contains("exceeds the limit of 1048576 bytes"), "{err}");
    accept.abort();

    // A directory too deep for a unix socket path.
    let deep = dir.path().join("d".repeat(120));
    let err = ShmBackend::new(&deep).bind(addr(7000)).await.err().expect("too long");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("unix sockets allow at most 107"), "{err}");
}

// ---- Two processes --------------------------------------------------------------------------

const ROLE_ENV: &str = "WEFT_SHM_TEST_ROLE";
const DIR_ENV: &str = "WEFT_SHM_TEST_DIR";
const ADDR_ENV: &str = "WEFT_SHM_TEST_ADDR";
const ECHO_N: u64 = 2000;
const ECHO_MAX: usize = 100_000;
const STREAM_MAX: usize = 200_000;

fn spawn_child(role: &str, dir: &Path, peer: SocketAddr) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_peer", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .env(ADDR_ENV, peer.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

/// The child's side, run in a separate process by the tests below; does nothing when run
/// directly.
#[test]
#[ignore = "run as a child process by the two-process tests"]
fn child_peer() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let dir = std::env::var(DIR_ENV).expect("dir");
    let peer: SocketAddr = std::env::var(ADDR_ENV).expect("addr").parse().expect("addr");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let backend = ShmBackend::new(dir).ring_size(1 << 20).local_addr(addr(4242));
        let (mut w, mut r) = backend.connect(peer).await.expect("connect");
        match role.as_str() {
            // Sends ECHO_N frames, checks the parent's acks, then closes.
            "echo" => {
                let sender = tokio::spawn(async move {
                    for seq in 0..ECHO_N {
                        w.write_frame(&header(seq), &payload(seq, ECHO_MAX)).await.expect("write");
                    }
                });
                for seq in 0..ECHO_N {
                    let ack = r.read_frame().await.expect("read ack").expect("ack");
                    assert_eq!(&ack.header[..], &seq.to_le_bytes(), "ack {seq}");
                    assert_eq!(ack.payload.len() as u64, payload(seq, ECHO_MAX).len() as u64);
                }
                sender.await.expect("sender");
                assert!(r.read_frame().await.expect("end").is_none());
            }
            // Sends frames until killed.
            "stream" => {
                for seq in 0.. {
                    w.write_frame(&header(seq), &payload(seq, STREAM_MAX)).await.expect("write");
                }
            }
            other => panic!("unknown role {other}"),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exchange_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path());
    let mut listener = backend.bind(addr(7000)).await.expect("bind");
    let mut child = spawn_child("echo", dir.path(), addr(7000));
    guard(async {
        let (mut w, mut r, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer, addr(4242), "the child's declared address");
        for seq in 0..ECHO_N {
            let f = r.read_frame().await.expect("read").expect("frame");
            check(&f, seq, ECHO_MAX);
            // The ack carries the payload length back as a payload of that many bytes.
            let ack = Bytes::from(vec![0u8; f.payload.len()]);
            w.write_frame(&seq.to_le_bytes(), &ack).await.expect("ack");
        }
        assert!(r.read_frame().await.expect("end").is_none(), "the child closed cleanly");
        drop(w);
    })
    .await;
    let status = tokio::task::spawn_blocking(move || child.wait()).await.expect("join").expect("wait");
    assert!(status.success(), "child failed: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_peer_leaves_whole_frames_then_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path());
    let mut listener = backend.bind(addr(7000)).await.expect("bind");
    let mut child = spawn_child("stream", dir.path(), addr(7000));
    guard(async {
        let (mut w, mut r, _) = listener.accept().await.expect("accept");
        // Read while the child streams (its 1 MiB ring fills, so it is mostly mid-write or
        // waiting for space), then kill it.
        let mut seq = 0;
        while seq < 300 {
            let f = r.read_frame().await.expect("read").expect("frame");
            check(&f, seq, STREAM_MAX);
            seq += 1;
        }
        child.kill().expect("kill");
        child.wait().expect("wait");
        // Whatever it published is whole and in order; then the reader fails: no clean end.
        let err = loop {
            match r.read_frame().await {
                Ok(Some(f)) => {
                    check(&f, seq, STREAM_MAX);
                    seq += 1;
                }
                Ok(None) => panic!("a killed peer must not look like a clean close"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        assert!(err.to_string().contains("the peer is gone"), "{err}");
        assert!(r.read_frame().await.is_err(), "stays failed");
        let err = w.write_frame(b"x", &Bytes::new()).await.expect_err("peer gone");
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    })
    .await;
}

// ---- Micro-measure ----------------------------------------------------------------------------

const MEASURE_SIZE: usize = 4 << 20;
const MEASURE_WARM: usize = 32;
const MEASURE_N: usize = 400;

/// Time to receive `MEASURE_N` frames of 4 MiB over one link of `backend` (after a warm-up that
/// also faults in a shared-memory ring's pages); the reader drops each payload.
async fn measure_backend<B: Backend>(backend: &B, local: SocketAddr) -> Duration {
    let mut listener = backend.bind(local).await.expect("bind");
    let at = listener.local_addr().expect("addr");
    let (accepted, connected) = tokio::join!(listener.accept(), backend.connect(at));
    let (_sw, mut sr, _) = accepted.expect("accept");
    let (mut cw, _cr) = connected.expect("connect");
    let data = PATTERN.slice(0..MEASURE_SIZE);
    let writer = tokio::spawn(async move {
        for _ in 0..MEASURE_WARM + MEASURE_N {
            cw.write_frame(b"0123456789abcdef", &data).await.expect("write");
        }
    });
    let mut start = Instant::now();
    for i in 0..MEASURE_WARM + MEASURE_N {
        if i == MEASURE_WARM {
            start = Instant::now();
        }
        let f = sr.read_frame().await.expect("read").expect("frame");
        assert_eq!(f.payload.len(), MEASURE_SIZE);
    }
    let took = start.elapsed();
    writer.await.expect("writer");
    took
}

/// The same over a plain loopback TCP stream: a 16-byte header and the payload written with
/// `write_all`, read with `read_exact` into a reused buffer (TCP's best case: no allocation).
async fn measure_raw_tcp() -> Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let at = tcp.local_addr().expect("addr");
    let data = PATTERN.slice(0..MEASURE_SIZE);
    let writer = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(at).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        for _ in 0..MEASURE_WARM + MEASURE_N {
            s.write_all(&[0u8; 16]).await.expect("write");
            s.write_all(&data).await.expect("write");
        }
    });
    let (mut s, _) = tcp.accept().await.expect("accept");
    let mut buf = vec![0u8; MEASURE_SIZE];
    let mut head = [0u8; 16];
    let mut start = Instant::now();
    for i in 0..MEASURE_WARM + MEASURE_N {
        if i == MEASURE_WARM {
            start = Instant::now();
        }
        s.read_exact(&mut head).await.expect("read");
        s.read_exact(&mut buf).await.expect("read");
    }
    let took = start.elapsed();
    writer.await.expect("writer");
    took
}

/// 4 MiB frames: shared memory against weft's TCP backend and a plain loopback TCP stream, in
/// one process on one runtime. Prints numbers; asserts nothing about them. Run with
/// `cargo test --release -p weft-transport --test shm -- --ignored --nocapture measure_4mib`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn measure_4mib_shm_vs_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shm = measure_backend(&ShmBackend::new(dir.path()), addr(0)).await;
    let tcp = measure_backend(&weft_transport::TcpBackend::new(weft_transport::TcpConfig::default()), addr(0)).await;
    let raw = measure_raw_tcp().await;
    let line = |name: &str, d: Duration| {
        println!(
            "{name:>14}: {:6.2} GB/s {:6.0} us/frame  (shm is {:.2}x this)",
            (MEASURE_N * MEASURE_SIZE) as f64 / d.as_secs_f64() / 1e9,
            d.as_secs_f64() * 1e6 / MEASURE_N as f64,
            d.as_secs_f64() / shm.as_secs_f64()
        )
    };
    println!("4 MiB frames x {MEASURE_N}, loopback, one process:");
    line("weft shm", shm);
    line("weft tcp", tcp);
    line("raw tcp stream", raw);
}
