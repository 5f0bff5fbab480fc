//! Two backends as one: links go over the first where it reaches the peer, over the second
//! otherwise. The intended pair is shared memory then TCP, so a sender uses shared memory for
//! the peers on its own node and TCP for the rest, with one peer list from DNS:
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use weft_transport::fallback::Fallback;
//! use weft_transport::shm::ShmBackend;
//! use weft_transport::TcpBackend;
//! let backend = Fallback::new(ShmBackend::from_env(), TcpBackend::default());
//! # Ok(()) }
//! ```
//!
//! - `connect` tries the first backend; on any error (the shared-memory backend answers
//!   `NotFound` for a peer on another node) it connects with the second. If both fail, the error
//!   names both reasons.
//! - `bind` binds the second backend first (so port 0 becomes a real port), then the first on
//!   the same address, and accepts links from both. Each listener runs in its own task, so a
//!   half-done accept on one is never cut off by a link arriving on the other.

use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::{Backend, Frame, FrameListener, FrameReader, FrameWriter};

/// The first backend where it reaches the peer, the second otherwise.
#[derive(Clone, Debug)]
pub struct Fallback<A, B> {
    first: A,
    second: B,
}

impl<A: Backend, B: Backend> Fallback<A, B> {
    /// `first` where it reaches the peer, `second` otherwise.
    pub fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// The first backend.
    pub fn first(&self) -> &A {
        &self.first
    }

    /// The second backend.
    pub fn second(&self) -> &B {
        &self.second
    }
}

/// One half of a link over either backend.
#[derive(Debug)]
pub enum Either<L, R> {
    /// Over the first backend.
    First(L),
    /// Over the second backend.
    Second(R),
}

impl<L, R> Either<L, R> {
    /// Whether the link runs over the first backend.
    pub fn is_first(&self) -> bool {
        matches!(self, Either::First(_))
    }
}

impl<L: FrameWriter, R: FrameWriter> FrameWriter for Either<L, R> {
    async fn write_frame(&mut self, header: &[u8], payload: &Bytes) -> io::Result<()> {
        match self {
            Either::First(w) => w.write_frame(header, payload).await,
            Either::Second(w) => w.write_frame(header, payload).await,
        }
    }

    async fn write_frames(&mut self, frames: &[(&[u8], &Bytes)]) -> io::Result<()> {
        match self {
            Either::First(w) => w.write_frames(frames).await,
            Either::Second(w) => w.write_frames(frames).await,
        }
    }
}

impl<L: FrameReader, R: FrameReader> FrameReader for Either<L, R> {
    async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        match self {
            Either::First(r) => r.read_frame().await,
            Either::Second(r) => r.read_frame().await,
        }
    }
}

type Accepted<A, B> = io::Result<(
    Either<<A as Backend>::Writer, <B as Backend>::Writer>,
    Either<<A as Backend>::Reader, <B as Backend>::Reader>,
    SocketAddr,
)>;

/// Accepts links over both backends.
pub struct FallbackListener<A: Backend, B: Backend> {
    accepted: mpsc::Receiver<Accepted<A, B>>,
    local: SocketAddr,
    tasks: [JoinHandle<()>; 2],
}

impl<A: Backend, B: Backend> std::fmt::Debug for FallbackListener<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackListener").field("local", &self.local).finish_non_exhaustive()
    }
}

impl<A: Backend, B: Backend> Drop for FallbackListener<A, B> {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl<A: Backend, B: Backend> FrameListener for FallbackListener<A, B> {
    type Writer = Either<A::Writer, B::Writer>;
    type Reader = Either<A::Reader, B::Reader>;

    async fn accept(&mut self) -> Accepted<A, B> {
        match self.accepted.recv().await {
            Some(link) => link,
            None => Err(io::Error::other("both listeners stopped")),
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl<A: Backend, B: Backend> Backend for Fallback<A, B> {
    type Writer = Either<A::Writer, B::Writer>;
    type Reader = Either<A::Reader, B::Reader>;
    type Listener = FallbackListener<A, B>;

    fn name(&self) -> &'static str {
        "fallback"
    }

    async fn connect(&self, peer: SocketAddr) -> io::Result<(Self::Writer, Self::Reader)> {
        match self.first.connect(peer).await {
            Ok((w, r)) => Ok((Either::First(w), Either::First(r))),
            Err(first) => match self.second.connect(peer).await {
                Ok((w, r)) => Ok((Either::Second(w), Either::Second(r))),
                Err(second) => Err(io::Error::new(
                    second.kind(),
                    format!("{peer}: over {}: {first}; over {}: {second}", self.first.name(), self.second.name()),
                )),
            },
        }
    }

    async fn bind(&self, local: SocketAddr) -> io::Result<Self::Listener> {
        let mut second = self.second.bind(local).await?;
        let local = second.local_addr()?;
        let mut first = self.first.bind(local).await?;
        // A small queue: links wait in their listener's backlog rather than here.
        let (tx, accepted) = mpsc::channel(4);
        let tx2 = tx.clone();
        let a = tokio::spawn(async move {
            loop {
                let link = first.accept().await.map(|(w, r, p)| (Either::First(w), Either::First(r), p));
                if tx.send(link).await.is_err() {
                    return;
                }
            }
        });
        let b = tokio::spawn(async move {
            loop {
                let link = second.accept().await.map(|(w, r, p)| (Either::Second(w), Either::Second(r), p));
                if tx2.send(link).await.is_err() {
                    return;
                }
            }
        });
        Ok(FallbackListener { accepted, local, tasks: [a, b] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use crate::shm::ShmBackend;
    use crate::tcp::TcpBackend;

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().expect("addr")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_on_this_node_gets_shared_memory_and_others_get_tcp() {
        let node = tempfile::tempdir().expect("dir");
        let other_node = tempfile::tempdir().expect("dir");
        let backend = Fallback::new(ShmBackend::new(node.path()).ring_size(4 << 20), TcpBackend::default());
        let mut listener = backend.bind(local()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        assert_ne!(addr.port(), 0);

        // Same directory: shared memory.
        let (accepted, connected) = tokio::join!(listener.accept(), backend.connect(addr));
        let (sw, mut sr, _) = accepted.expect("accept");
        let (mut cw, _cr) = connected.expect("connect");
        assert!(cw.is_first() && sw.is_first(), "same node: shared memory");
        cw.write_frame(b"h", &Bytes::from_static(b"over shm")).await.expect("write");
        assert_eq!(sr.read_frame().await.expect("read").expect("frame").payload, Bytes::from_static(b"over shm"));

        // Another node's directory has no socket for this peer: TCP.
        let remote = Fallback::new(ShmBackend::new(other_node.path()), TcpBackend::default());
        let (accepted, connected) = tokio::join!(listener.accept(), remote.connect(addr));
        let (sw, mut sr, _) = accepted.expect("accept");
        let (mut cw, _cr) = connected.expect("connect");
        assert!(!cw.is_first() && !sw.is_first(), "other node: TCP");
        cw.write_frames(&[(b"a", &Bytes::from_static(b"1")), (b"b", &Bytes::from_static(b"2"))]).await.expect("write");
        for want in [&b"1"[..], b"2"] {
            assert_eq!(sr.read_frame().await.expect("read").expect("frame").payload, Bytes::from(want));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn when_both_fail_the_error_names_both() {
        let node = tempfile::tempdir().expect("dir");
        let backend = Fallback::new(ShmBackend::new(node.path()), TcpBackend::default());
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let Err(err) = backend.connect(closed).await else { panic!("connected to a closed port") };
        let text = err.to_string();
        assert!(text.contains("over shm") && text.contains("over tcp"), "{text}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_backend_conformance_suite() {
        let node = tempfile::tempdir().expect("dir");
        let shm_first = Fallback::new(ShmBackend::new(node.path()).ring_size(16 << 20), TcpBackend::default());
        conformance::run_all(&shm_first, local(), 8 << 20).await.expect("over shared memory");
    }
}
