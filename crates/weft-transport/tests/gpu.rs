//! GPU memory payloads. One command runs all of it:
//!
//! ```text
//! cargo test -p weft-transport --features gpu --test gpu
//! ```
//!
//! The first tests need no GPU. The others need a CUDA driver and a device; without one they
//! skip through `weft_testkit::require`, whose allow-list names them (they are the tests to run
//! on a GPU machine; CI has none): IPC
//! between two processes (the second is this test binary, started again), and the staged path
//! over a real TCP link, both with data checks.
#![cfg(feature = "gpu")]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use weft_transport::gpu::{GpuCodec, GpuContext, GpuError, GpuPath, wire};
use weft_transport::{Backend, FrameListener, FrameReader, FrameWriter, TcpBackend};

/// A hang guard for every network step.
const DEADLINE: Duration = Duration::from_secs(60);
/// Set in the child process of the IPC test: the parent's listening address.
const CHILD_ENV: &str = "WEFT_GPU_IPC_TEST_PEER";

/// GPU 0, or `None` when there is no CUDA driver or GPU (a skip through `weft_testkit::require`;
/// these tests are in its allow-list, since CI has no GPU).
fn gpu() -> Option<GpuContext> {
    let probed = GpuContext::probe().map_err(|e| format!("a CUDA driver and a GPU ({e})"));
    weft_testkit::require_ok(probed).map(|_| GpuContext::new(0).expect("opening GPU 0"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed).collect()
}

async fn guard<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("{what}: no progress within {DEADLINE:?}"))
}

#[test]
fn probe_reports_a_missing_gpu_as_an_error_not_a_panic() {
    match GpuContext::probe() {
        Ok(n) => assert!(n > 0),
        Err(GpuError::Unavailable(why)) => assert!(!why.is_empty()),
        Err(e) => panic!("probe failed with an unexpected error: {e}"),
    }
}

#[test]
fn payload_descriptors_round_trip_and_reject_garbage() {
    let d = wire::IpcDescriptor { node: [1; 16], device: [2; 16], pid: 7, offset: 128, len: 519_168, handle: [3; 64] };
    let ipc = wire::encode_ipc(&d);
    assert_eq!(wire::decode(&ipc), Ok(wire::Descriptor::Ipc(d.clone())));
    let mut staged = wire::staged_prefix(3).to_vec();
    staged.extend_from_slice(b"abc");
    assert_eq!(wire::decode(&staged), Ok(wire::Descriptor::Staged { len: 3 }));
    assert!(wire::decode(b"hello, not a gpu payload").is_err());
    assert!(wire::decode(&staged[..66]).is_err());
    assert!(wire::check_same_node(&d, &[9; 16]).expect_err("foreign node").contains("another node"));
}

/// Device buffers of several sizes (one of them a 416×416×3 frame) go through pinned staging
/// and a real TCP link and arrive as new device buffers with the same bytes; part of each is
/// set with cuMemsetD8 before sending, the rest copied from the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_path_over_tcp_delivers_the_same_bytes() {
    let Some(ctx) = gpu() else {
        return;
    };
    let codec = GpuCodec::new(&ctx);
    let backend = TcpBackend::default();
    let mut listener = backend.bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (accepted, connected) = guard("link", async { tokio::join!(listener.accept(), backend.connect(addr)) }).await;
    let (_sw, mut reader, _) = accepted.expect("accept");
    let (mut writer, _cr) = connected.expect("connect");

    for (i, len) in [1usize, 4096, 416 * 416 * 3, 4 << 20].into_iter().enumerate() {
        let mut want = pattern(len, i as u8);
        let buf = ctx.from_host(&want).expect("upload");
        let half = len / 2;
        buf.slice(0..half).expect("slice").fill(0x5a).expect("memset");
        want[..half].fill(0x5a);

        let payload = codec.encode(&buf, GpuPath::Staged).expect("encode");
        assert_eq!(payload.len(), wire::STAGED_PREFIX + len);
        guard("write", writer.write_frame(b"staged", &payload)).await.expect("write");
        drop(payload);
        let frame = guard("read", reader.read_frame()).await.expect("read").expect("a frame");
        assert_eq!(&frame.header[..], b"staged");
        let got = codec.decode(&frame.payload).expect("decode");
        assert!(!got.is_imported());
        assert_ne!(got.device_ptr(), buf.device_ptr(), "staged means a new buffer");
        assert_eq!(got.len(), len);
        let host = got.to_host().expect("download");
        assert!(host == want, "{len}-byte buffer arrived with different bytes");
    }
    assert!(codec.staging_cached() > 0, "staging buffers go back to the pool once the frames are written");
}

/// Two processes on one GPU: the parent exports a device buffer by IPC handle over a TCP
/// link; the child opens it, checks the bytes, and writes into the first 4 KiB; the parent then
/// sees the child's write in its own buffer — the same memory, no copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipc_between_two_processes_shares_device_memory() {
    if let Ok(peer) = std::env::var(CHILD_ENV) {
        ipc_child(peer.parse().expect("parent address")).await;
        return;
    }
    let Some(ctx) = gpu() else {
        return;
    };
    const LEN: usize = 1 << 20;
    let codec = GpuCodec::new(&ctx);
    let want = pattern(LEN, 0x11);
    // A buffer in the middle of an allocation, to carry a non-zero offset.
    let whole = ctx.alloc(LEN + 8192).expect("alloc");
    whole.fill(0).expect("memset");
    let buf = whole.slice(4096..4096 + LEN).expect("slice");
    buf.copy_from_host(&want).expect("upload");

    let backend = TcpBackend::default();
    let mut listener = backend.bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new(exe)
        .args(["--exact", "ipc_between_two_processes_shares_device_memory", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child process");
    let (mut writer, mut reader, _) = guard("accept the child", listener.accept()).await.expect("accept");
    let payload = codec.encode(&buf, GpuPath::Ipc).expect("encode");
    assert_eq!(payload.len(), wire::IPC_LEN);
    guard("write", writer.write_frame(b"ipc", &payload)).await.expect("write");
    let answer = guard("the child's answer", reader.read_frame()).await.expect("read").expect("a frame");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.expect("join").expect("child output");
    let report = String::from_utf8_lossy(&answer.payload).into_owned();
    assert!(
        &answer.header[..] == b"done" && report == "ok" && out.status.success(),
        "the child reported {report:?}, exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The payload kept the allocation alive until now; the child wrote into it.
    let host = buf.to_host().expect("download");
    assert!(host[..4096].iter().all(|&b| b == 0xab), "the child's write is not visible");
    assert!(host[4096..] == want[4096..], "bytes the child did not write changed");
    let around = whole.to_host().expect("download");
    assert!(
        around[..4096].iter().chain(&around[4096 + LEN..]).all(|&b| b == 0),
        "the child wrote outside the buffer it was given"
    );
    drop(payload);
}

async fn ipc_child(parent: SocketAddr) {
    let backend = TcpBackend::default();
    let (mut writer, mut reader) = guard("connect", backend.connect(parent)).await.expect("connect to the parent");
    let frame = guard("read", reader.read_frame()).await.expect("read").expect("a frame");
    let outcome = (|| -> Result<(), String> {
        let ctx = GpuContext::new(0).map_err(|e| e.to_string())?;
        let codec = GpuCodec::new(&ctx);
        let buf = codec.decode(&frame.payload).map_err(|e| e.to_string())?;
        if !buf.is_imported() || buf.len() != 1 << 20 {
            return Err(format!("decoded {buf:?}, expected an imported 1 MiB buffer"));
        }
        let again = codec.decode(&frame.payload).map_err(|e| e.to_string())?;
        if again.device_ptr() != buf.device_ptr() || ctx.open_ipc_handles() != 1 {
            return Err("a second decode of the same handle did not reuse the mapping".into());
        }
        let host = buf.to_host().map_err(|e| e.to_string())?;
        if host != pattern(1 << 20, 0x11) {
            return Err("the opened buffer holds different bytes".into());
        }
        buf.slice(0..4096).and_then(|b| b.fill(0xab)).map_err(|e| e.to_string())?;
        drop((buf, again));
        if ctx.open_ipc_handles() != 0 {
            return Err("the IPC handle stayed open after its buffers were dropped".into());
        }
        Ok(())
    })();
    let report = match &outcome {
        Ok(()) => "ok".to_string(),
        Err(e) => e.clone(),
    };
    guard("answer", writer.write_frame(b"done", &Bytes::from(report))).await.expect("answer the parent");
    if let Err(e) = outcome {
        panic!("child: {e}");
    }
}

/// A descriptor naming another node is refused before CUDA is asked to open it.
#[test]
fn ipc_descriptor_from_another_node_is_refused() {
    let Some(ctx) = gpu() else {
        return;
    };
    let codec = GpuCodec::new(&ctx);
    let buf = ctx.from_host(&[1, 2, 3]).expect("upload");
    let payload = codec.encode(&buf, GpuPath::Ipc).expect("encode");
    let mut foreign = payload.to_vec();
    foreign[16] ^= 0xff;
    let err = codec.decode(&Bytes::from(foreign)).expect_err("foreign node");
    assert!(err.to_string().contains("another node"), "{err}");
}
