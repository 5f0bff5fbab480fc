//! Checks every [`Backend`] must pass, for the backends' own tests: frames arrive whole and in
//! order, empty headers and payloads work, the largest frame the backend allows goes through,
//! both directions run at once, a clean close reads as `None`, a peer that is gone makes the
//! writer fail, and a peer that dies in the middle of a frame makes the reader fail.
//!
//! Each check binds a listener on `local` (port 0 is fine: the listener's real address is used),
//! opens one link, and returns `Err` with what went wrong instead of panicking, so a caller
//! writes `conformance::run_all(&backend, addr, max).await.expect("conformance")`. Every wait
//! has a generous deadline ([`DEADLINE`]) so a broken backend fails instead of hanging.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::{Backend, Frame, FrameListener, FrameReader, FrameWriter};

/// How long any single step may take before the check fails as hung.
pub const DEADLINE: Duration = Duration::from_secs(30);

type Link<B> = (<B as Backend>::Writer, <B as Backend>::Reader, <B as Backend>::Writer, <B as Backend>::Reader);

async fn guard<T>(what: &str, f: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(DEADLINE, f).await.map_err(|_| format!("{what}: no progress within {DEADLINE:?}"))
}

/// Binds on `local` and opens one link: (client writer, client reader, server writer, server
/// reader), plus the listener so it lives as long as the caller wants.
async fn link<B: Backend>(backend: &B, local: SocketAddr) -> Result<(Link<B>, B::Listener), String> {
    let mut listener = guard("bind", backend.bind(local)).await?.map_err(|e| format!("bind {local}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    let (accepted, connected) =
        guard("connect/accept", async { tokio::join!(listener.accept(), backend.connect(addr)) }).await?;
    let (sw, sr, _) = accepted.map_err(|e| format!("accept: {e}"))?;
    let (cw, cr) = connected.map_err(|e| format!("connect {addr}: {e}"))?;
    Ok(((cw, cr, sw, sr), listener))
}

fn payload(i: usize, len: usize) -> Bytes {
    Bytes::from((0..len).map(|j| (i * 31 + j) as u8).collect::<Vec<u8>>())
}

async fn expect_frame<R: FrameReader>(reader: &mut R, what: &str, want: &Frame) -> Result<(), String> {
    match guard(what, reader.read_frame()).await? {
        Ok(Some(f)) if f == *want => Ok(()),
        Ok(Some(f)) => Err(format!(
            "{what}: got header {} bytes / payload {} bytes, expected {} / {}, or the contents differ",
            f.header.len(),
            f.payload.len(),
            want.header.len(),
            want.payload.len()
        )),
        Ok(None) => Err(format!("{what}: link closed early")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Writes `frames` one by one in a task of its own, so the caller can read them meanwhile; the
/// task gives the writer back, keeping the link open until it is joined.
fn spawn_writer<W: FrameWriter>(mut writer: W, frames: Vec<Frame>) -> tokio::task::JoinHandle<io::Result<W>> {
    tokio::spawn(async move {
        for f in &frames {
            writer.write_frame(&f.header, &f.payload).await?;
        }
        Ok(writer)
    })
}

/// Waits for a writer task; a failed write or a failed task is the error.
async fn writer_done<W>(writer: tokio::task::JoinHandle<io::Result<W>>) -> Result<(), String> {
    guard("writer", writer).await?.map_err(|e| format!("writer task: {e}"))?.map_err(|e| format!("write: {e}"))?;
    Ok(())
}

/// Runs every check that needs nothing backend-specific; `largest_payload` is the biggest
/// payload the backend is configured to carry.
pub async fn run_all<B: Backend>(backend: &B, local: SocketAddr, largest_payload: usize) -> Result<(), String> {
    frames_in_order(backend, local).await?;
    gathered_frames_in_order(backend, local).await?;
    held_payloads_stay_intact(backend, local).await?;
    empty_frames(backend, local).await?;
    largest_frame(backend, local, largest_payload).await?;
    both_directions_at_once(backend, local).await?;
    clean_close_reads_none(backend, local).await?;
    writer_fails_when_peer_is_gone(backend, local).await?;
    Ok(())
}

/// 1000 frames of varied sizes arrive whole and in order.
pub async fn frames_in_order<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((cw, _cr, _sw, mut sr), _l) = link(backend, local).await?;
    let sizes = [0usize, 1, 100, 4096, 70_000, 3];
    let frames: Vec<Frame> = (0..1000)
        .map(|i| Frame { header: Bytes::from(format!("header {i}")), payload: payload(i, sizes[i % sizes.len()]) })
        .collect();
    let writer = spawn_writer(cw, frames.clone());
    for (i, f) in frames.iter().enumerate() {
        expect_frame(&mut sr, &format!("frame {i}"), f).await?;
    }
    writer_done(writer).await
}

/// 600 frames given to `write_frames` in batches of 1 to 300 (mixed sizes, empty payloads
/// among them) arrive whole and in order.
pub async fn gathered_frames_in_order<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((mut cw, _cr, _sw, mut sr), _l) = link(backend, local).await?;
    let sizes = [0usize, 10, 1000, 20_000, 0, 300_000, 7];
    let frames: Vec<Frame> = (0..600)
        .map(|i| Frame { header: Bytes::from(format!("gathered {i}")), payload: payload(i, sizes[i % sizes.len()]) })
        .collect();
    let sent = frames.clone();
    let writer = tokio::spawn(async move {
        let mut at = 0;
        for batch in [1usize, 2, 300, 17, 200, 80] {
            let refs: Vec<(&[u8], &Bytes)> = sent[at..at + batch].iter().map(|f| (&f.header[..], &f.payload)).collect();
            cw.write_frames(&refs).await?;
            at += batch;
        }
        Ok::<_, io::Error>(cw)
    });
    for (i, f) in frames.iter().enumerate() {
        expect_frame(&mut sr, &format!("gathered frame {i}"), f).await?;
    }
    writer_done(writer).await
}

/// Payloads kept by the reader's caller while later frames are read (as handlers keep them)
/// are not overwritten by the backend's buffer reuse. At most about 1.2 MB is held at once, so a
/// backend whose payloads lease a bounded ring passes with a ring of 2 MiB or more.
pub async fn held_payloads_stay_intact<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((cw, _cr, _sw, mut sr), _l) = link(backend, local).await?;
    let frames: Vec<Frame> =
        (0..30).map(|i| Frame { header: Bytes::from(format!("held {i}")), payload: payload(i, 40_000 + i) }).collect();
    let writer = spawn_writer(cw, frames.clone());
    let mut held = Vec::new();
    for i in 0..frames.len() {
        match guard("read", sr.read_frame()).await? {
            Ok(Some(f)) => held.push(f),
            Ok(None) => return Err(format!("held frame {i}: link closed early")),
            Err(e) => return Err(format!("held frame {i}: {e}")),
        }
        // Drop every third one at once, so reuse and holding mix.
        if i % 3 == 0 {
            held.pop();
            held.push(Frame::default());
        }
    }
    for (i, (got, want)) in held.iter().zip(&frames).enumerate() {
        if i % 3 != 0 && got != want {
            return Err(format!("held frame {i} changed after later frames were read"));
        }
    }
    writer_done(writer).await
}

/// `count` frames cycling through `sizes` (headers `f0`, `f1`, ...), written in a task while the
/// caller's reader takes them: each arrives whole and in order. Through a small ring this laps
/// it many times under the backend's flow control (a backend-specific check: the caller opens
/// the link with the ring it wants to test).
pub async fn many_frames_in_order<W: FrameWriter, R: FrameReader>(
    mut writer: W,
    reader: &mut R,
    sizes: &[usize],
    count: usize,
) -> Result<(), String> {
    let frame = {
        let sizes = sizes.to_vec();
        move |i: usize| Frame { header: Bytes::from(format!("f{i}")), payload: payload(i, sizes[i % sizes.len()]) }
    };
    let make = frame.clone();
    let writer = tokio::spawn(async move {
        for i in 0..count {
            let f = make(i);
            writer.write_frame(&f.header, &f.payload).await?;
        }
        Ok(writer)
    });
    for i in 0..count {
        expect_frame(reader, &format!("frame {i}"), &frame(i)).await?;
    }
    writer_done(writer).await
}

/// A payload the reader keeps while five more frames of `size` pass is not overwritten; once it
/// is dropped, 200 more pass (the space it held comes back). For backends whose payloads lease
/// a bounded ring: the caller opens the link with a ring of a few times `size`.
pub async fn held_payload_then_released<W: FrameWriter, R: FrameReader>(
    mut writer: W,
    reader: &mut R,
    size: usize,
) -> Result<(), String> {
    let kept = Frame { header: Bytes::from_static(b"held"), payload: payload(1000, size) };
    guard("write", writer.write_frame(&kept.header, &kept.payload)).await?.map_err(|e| format!("write: {e}"))?;
    let held = match guard("read", reader.read_frame()).await? {
        Ok(Some(f)) => f.payload,
        Ok(None) => return Err("held frame: link closed early".into()),
        Err(e) => return Err(format!("held frame: {e}")),
    };
    for i in 0..5 {
        let f = Frame { header: Bytes::from_static(b"x"), payload: payload(i, size) };
        guard("write", writer.write_frame(&f.header, &f.payload)).await?.map_err(|e| format!("write: {e}"))?;
        expect_frame(reader, &format!("frame {i} beside the held one"), &f).await?;
    }
    if held != kept.payload {
        return Err("the held payload changed while later frames passed".into());
    }
    drop(held);
    let after: Vec<Frame> =
        (0..200).map(|i| Frame { header: Bytes::from_static(b"y"), payload: payload(i, size) }).collect();
    let writer = spawn_writer(writer, after.clone());
    for (i, f) in after.iter().enumerate() {
        expect_frame(reader, &format!("frame {i} after the release"), f).await?;
    }
    writer_done(writer).await
}

/// Frames with an empty header, an empty payload, or both.
pub async fn empty_frames<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((mut cw, _cr, _sw, mut sr), _l) = link(backend, local).await?;
    let frames = [
        Frame::default(),
        Frame { header: Bytes::from_static(b"h"), payload: Bytes::new() },
        Frame { header: Bytes::new(), payload: Bytes::from_static(b"p") },
        Frame::default(),
    ];
    for f in &frames {
        guard("write", cw.write_frame(&f.header, &f.payload)).await?.map_err(|e| format!("write: {e}"))?;
    }
    for (i, f) in frames.iter().enumerate() {
        expect_frame(&mut sr, &format!("empty frame {i}"), f).await?;
    }
    Ok(())
}

/// A frame with a payload of exactly `size` bytes, twice, and a small one after it.
pub async fn largest_frame<B: Backend>(backend: &B, local: SocketAddr, size: usize) -> Result<(), String> {
    let ((cw, _cr, _sw, mut sr), _l) = link(backend, local).await?;
    let frames = vec![
        Frame { header: Bytes::from_static(b"big"), payload: payload(1, size) },
        Frame { header: Bytes::from_static(b"big again"), payload: payload(2, size) },
        Frame { header: Bytes::from_static(b"small"), payload: payload(3, 10) },
    ];
    let writer = spawn_writer(cw, frames.clone());
    for (i, f) in frames.iter().enumerate() {
        expect_frame(&mut sr, &format!("large frame {i} ({size} bytes)"), f).await?;
    }
    writer_done(writer).await
}

/// Both ends write and read at the same time, each half in its own task.
pub async fn both_directions_at_once<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((cw, cr, sw, sr), _l) = link(backend, local).await?;
    async fn pump<W: FrameWriter>(mut w: W, tag: &'static str) -> io::Result<W> {
        for i in 0..300 {
            w.write_frame(format!("{tag} {i}").as_bytes(), &payload(i, 20_000)).await?;
        }
        Ok(w)
    }
    async fn drain<R: FrameReader>(mut r: R, tag: &'static str) -> Result<R, String> {
        for i in 0..300 {
            let want = Frame { header: Bytes::from(format!("{tag} {i}")), payload: payload(i, 20_000) };
            expect_frame(&mut r, &format!("{tag} frame {i}"), &want).await?;
        }
        Ok(r)
    }
    let a = tokio::spawn(pump(cw, "up"));
    let b = tokio::spawn(pump(sw, "down"));
    let c = tokio::spawn(drain(sr, "up"));
    let d = tokio::spawn(drain(cr, "down"));
    for (name, h) in [("up writer", a), ("down writer", b)] {
        guard(name, h).await?.map_err(|e| format!("{name}: {e}"))?.map_err(|e| format!("{name}: {e}"))?;
    }
    for (name, h) in [("up reader", c), ("down reader", d)] {
        guard(name, h).await?.map_err(|e| format!("{name}: {e}"))??;
    }
    Ok(())
}

/// After the peer drops its writer (and reader) between frames, the reader gets the frames
/// sent, then `None`, and `None` again.
pub async fn clean_close_reads_none<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((mut cw, cr, _sw, mut sr), _l) = link(backend, local).await?;
    let f = Frame { header: Bytes::from_static(b"last"), payload: payload(0, 5000) };
    guard("write", cw.write_frame(&f.header, &f.payload)).await?.map_err(|e| format!("write: {e}"))?;
    drop(cw);
    drop(cr);
    expect_frame(&mut sr, "last frame before close", &f).await?;
    for attempt in ["first", "second"] {
        match guard("read after close", sr.read_frame()).await? {
            Ok(None) => {}
            Ok(Some(_)) => return Err(format!("{attempt} read after close: a frame")),
            Err(e) => return Err(format!("{attempt} read after a clean close: error {e}")),
        }
    }
    Ok(())
}

/// After the peer dropped both halves, writing fails within a bounded number of frames (a
/// backend may buffer some) instead of succeeding forever or hanging.
pub async fn writer_fails_when_peer_is_gone<B: Backend>(backend: &B, local: SocketAddr) -> Result<(), String> {
    let ((mut cw, mut cr, sw, sr), listener) = link(backend, local).await?;
    drop((sw, sr, listener));
    // The peer's close is seen by the reader first on stream backends; wait for it so the
    // writer's failure does not depend on timing.
    match guard("read after peer close", cr.read_frame()).await? {
        Ok(None) | Err(_) => {}
        Ok(Some(_)) => return Err("a frame arrived from a peer that sent none".into()),
    }
    let chunk = payload(0, 64 * 1024);
    for _ in 0..10_000 {
        match guard("write to a gone peer", cw.write_frame(b"x", &chunk)).await? {
            Ok(()) => {}
            Err(_) => return Ok(()),
        }
    }
    Err("10000 frames of 64 KiB written to a peer that is gone, all without an error".into())
}

/// A peer that dies in the middle of a frame: `inject` gets the listener's address and must
/// open a link to it, send part of a frame in the backend's own encoding, and drop it. The
/// reader must return an error, not `None` and not a frame.
pub async fn abrupt_close<B, F, Fut>(backend: &B, local: SocketAddr, inject: F) -> Result<(), String>
where
    B: Backend,
    F: FnOnce(SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut listener = guard("bind", backend.bind(local)).await?.map_err(|e| format!("bind {local}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    let injected = tokio::spawn(inject(addr));
    let (_sw, mut sr, _) = guard("accept", listener.accept()).await?.map_err(|e| format!("accept: {e}"))?;
    guard("inject", injected).await?.map_err(|e| format!("inject: {e}"))?;
    match guard("read a partial frame", sr.read_frame()).await? {
        Err(_) => Ok(()),
        Ok(None) => Err("a frame cut in the middle read as a clean close".into()),
        Ok(Some(_)) => Err("a frame cut in the middle read as a whole frame".into()),
    }
}
