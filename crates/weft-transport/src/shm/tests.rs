//! Unit tests that reach inside the rings: a faulty peer's counters and records, malformed
//! hellos. The behaviour through the public API is in `tests/shm.rs`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::backend::{FrameReader, FrameWriter};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A connected link: (connector's writer, connector's reader, listener's writer, listener's reader).
async fn pair(backend: &ShmBackend) -> (ShmWriter, ShmReader, ShmWriter, ShmReader) {
    let mut listener = backend.bind(addr(7000)).await.expect("bind");
    let accept = tokio::spawn(async move { listener.accept().await.map(|(w, r, _)| (w, r)) });
    let (cw, cr) = backend.connect(addr(7000)).await.expect("connect");
    let (lw, lr) = accept.await.expect("join").expect("accept");
    (cw, cr, lw, lr)
}

fn assert_corrupt(err: io::Error, what: &str) {
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("shm link from 0.0.0.0:0 ("), "names the link: {msg}");
    assert!(msg.contains(what), "says {what:?}: {msg}");
}

/// Writes a raw 16-byte record header at ring offset `off` of `region`.
fn raw_record(region: &Region, off: usize, tag: &[u8; 4], header_len: u32, payload_len: u64) {
    let mut rec = [0u8; 16];
    rec[..4].copy_from_slice(tag);
    rec[4..8].copy_from_slice(&header_len.to_le_bytes());
    rec[8..].copy_from_slice(&payload_len.to_le_bytes());
    assert!(region.write(off, &[&rec]));
}

#[tokio::test]
async fn a_faulty_writers_counters_break_the_reader_with_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    for (head, what) in [(65u64, "head 65"), (64 * 1024 + 64, "head 65600")] {
        let (cw, _cr, _lw, mut lr) = pair(&backend).await;
        raw_record(cw.region(), 0, b"FRM1", 0, 0);
        cw.region().head().store(head, Ordering::Release);
        assert_corrupt(lr.read_frame().await.expect_err("corrupt head"), what);
        // The half stays broken.
        assert_corrupt(lr.read_frame().await.expect_err("still broken"), what);
    }
    // A head that moves backwards.
    let (mut cw, _cr, _lw, mut lr) = pair(&backend).await;
    cw.write_frame(b"h", &Bytes::from_static(b"p")).await.expect("write");
    lr.read_frame().await.expect("read").expect("frame");
    cw.region().head().store(0, Ordering::Release);
    assert_corrupt(lr.read_frame().await.expect_err("backwards"), "previously 128");
}

#[tokio::test]
async fn a_faulty_writers_records_break_the_reader_with_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    let cases: [(&[u8; 4], u32, u64, u64, &str); 5] = [
        (b"JUNK", 0, 0, 64, "unknown record tag"),
        (b"FRM1", 0, 1 << 20, 64, "payload of 1048576 bytes"),
        (b"FRM1", 0, u64::MAX - 8, 64, "payload of 18446744073709551607"),
        (b"FRM1", u32::MAX, 0, 64, "header of 4294967295"),
        // Fits the ring but runs past what was published.
        (b"FRM1", 0, 100, 64, "published data (head 64)"),
    ];
    for (tag, header_len, payload_len, head, what) in cases {
        let (cw, _cr, _lw, mut lr) = pair(&backend).await;
        raw_record(cw.region(), 0, tag, header_len, payload_len);
        cw.region().head().store(head, Ordering::Release);
        assert_corrupt(lr.read_frame().await.expect_err(what), what);
    }
    // A skip marker at offset 0 runs to the ring's end, past a head of 64.
    let (cw, _cr, _lw, mut lr) = pair(&backend).await;
    raw_record(cw.region(), 0, b"SKP1", 0, 0);
    cw.region().head().store(64, Ordering::Release);
    assert_corrupt(lr.read_frame().await.expect_err("skip"), "skip marker at ring offset 0");
}

#[tokio::test]
async fn a_faulty_readers_tail_breaks_the_writer_with_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    let (_cw, _cr, mut lw, lr) = pair(&backend).await;
    // The listener writes, the connector reads: make the connector's tail run ahead of head.
    lw.write_frame(b"", &Bytes::from_static(b"x")).await.expect("write");
    drop(lr);
    _cr.region().tail().store(4096, Ordering::Release);
    let err = lw.write_frame(b"", &Bytes::from_static(b"y")).await.expect_err("tail ahead");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("tail 4096"), "{err}");
}

/// Sends a raw hello (and descriptors) to a listener and returns its answer.
async fn raw_hello(path: &std::path::Path, hello: [u8; HELLO_LEN], fds: Option<[OwnedFd; 2]>) -> (u8, String) {
    let mut s = UnixStream::connect(path).await.expect("connect");
    match fds {
        Some([a, b]) => send_with_fds(&mut s, &hello, [a.as_fd(), b.as_fd()]).await.expect("send"),
        None => s.write_all(&hello).await.expect("send"),
    }
    let mut head = [0u8; 11];
    s.read_exact(&mut head).await.expect("reply");
    assert_eq!(&head[..8], REPLY_MAGIC);
    let mut reason = vec![0u8; u16::from_le_bytes([head[9], head[10]]) as usize];
    s.read_exact(&mut reason).await.expect("reason");
    (head[8], String::from_utf8(reason).expect("utf-8"))
}

#[tokio::test]
async fn malformed_hellos_are_refused_with_a_reason_and_the_listener_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path());
    let mut listener = backend.bind(addr(7001)).await.expect("bind");
    let path = listener.socket_path().to_path_buf();
    // Each refused hello is an accept error marked as one link's failure; the listener goes on.
    let accept = tokio::spawn(async move {
        let mut refused = 0;
        loop {
            match listener.accept().await {
                Ok((_, _, peer)) => return Ok::<_, std::io::Error>((peer, refused)),
                Err(e) if crate::backend::is_setup_failure(&e) => refused += 1,
                Err(e) => return Err(e),
            }
        }
    });

    let mut bad_magic = encode_hello(None);
    bad_magic[0] = b'X';
    let (status, reason) = raw_hello(&path, bad_magic, None).await;
    assert_eq!((status, reason.as_str()), (1, "not a weft shm hello (bad magic)"));

    let mut bad_version = encode_hello(None);
    bad_version[8] = 9;
    let (status, reason) = raw_hello(&path, bad_version, None).await;
    assert_eq!(status, 1);
    assert!(reason.contains("version 9"), "{reason}");

    let (status, reason) = raw_hello(&path, encode_hello(None), None).await;
    assert_eq!((status, reason.as_str()), (1, "hello carried 0 descriptors, expected 2 rings"));

    // Rings that are not sealed memfds.
    let plain = || {
        let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, 8192).expect("truncate");
        fd
    };
    let (status, reason) = raw_hello(&path, encode_hello(None), Some([plain(), plain()])).await;
    assert_eq!(status, 1);
    assert!(reason.starts_with("first ring:") && reason.contains("shrinking"), "{reason}");

    // A good ring and a used one.
    let (_a, good) = Region::create(8192).expect("ring");
    let (b, used) = Region::create(8192).expect("ring");
    b.head().store(64, Ordering::Release);
    let (status, reason) = raw_hello(&path, encode_hello(None), Some([good, used])).await;
    assert_eq!(status, 1);
    assert!(reason.starts_with("second ring:") && reason.contains("not fresh"), "{reason}");

    // Still accepting: a proper peer gets through, with the address it declared.
    let me = SocketAddr::from(([10, 0, 0, 9], 1234));
    let (_w, _r) = backend.clone().local_addr(me).connect(addr(7001)).await.expect("connect");
    assert_eq!(accept.await.expect("join").expect("accept"), (me, 5), "five refusals, then the peer");
}

#[test]
fn hello_round_trips_addresses() {
    let v6: SocketAddr = "[fd00::1:2]:9".parse().expect("v6");
    for a in [Some(SocketAddr::from(([10, 1, 2, 3], 7000))), Some(v6), None] {
        let (_x, f1) = Region::create(4096).expect("ring");
        let (_y, f2) = Region::create(4096).expect("ring");
        let (peer, _, _) = check_hello(&encode_hello(a), vec![f1, f2], 1 << 20).expect("hello");
        assert_eq!(peer, a.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_backend_conformance_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ring = 16 << 20;
    let backend = ShmBackend::new(dir.path()).ring_size(ring);
    // The largest payload: the ring less one record header with a short frame header.
    crate::conformance::run_all(&backend, addr(0), ring - 64).await.expect("conformance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_dying_mid_frame_is_an_error_not_a_clean_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = ShmBackend::new(dir.path()).ring_size(64 * 1024);
    let client = backend.clone();
    crate::conformance::abrupt_close(&backend, addr(0), move |at| async move {
        let (w, r) = client.connect(at).await.expect("connect");
        // Half a frame: the record header and some payload copied, the head not yet published.
        raw_record(w.region(), 0, b"FRM1", 4, 1000);
        assert!(w.region().write(16, &[b"half", &[7u8; 300]]));
        w.die(r);
    })
    .await
    .expect("abrupt close");
}
