//! The seam every data path sits behind: a backend moves opaque frames (a header and a payload)
//! between two endpoints, in order, over one established link. What the frames mean (messages,
//! acks, watermarks) is the protocol's business above this trait, so TCP, shared memory, RDMA
//! verbs and GPU memory carry exactly the same protocol.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use bytes::Bytes;

/// One frame as received: the encoded header and the payload. A backend may hand out a payload
/// that borrows its own buffers (shared memory, a registered RDMA region) through
/// [`Bytes::from_owner`]; the buffer goes back to the backend when the last clone is dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub header: Bytes,
    pub payload: Bytes,
}

/// The sending half of a link.
pub trait FrameWriter: Send + 'static {
    /// Writes one frame, header then payload, as one unit: the peer reads it whole or not at all.
    fn write_frame(&mut self, header: &[u8], payload: &Bytes) -> impl Future<Output = io::Result<()>> + Send;

    /// Writes several frames in order, each as one unit, as `write_frame` would one by one
    /// (the default does exactly that). A backend that can gather them into fewer operations
    /// overrides it: TCP writes them all with one `writev`. Senders use it for whatever queued
    /// up while the previous write ran, so small messages do not cost a system call each.
    fn write_frames(&mut self, frames: &[(&[u8], &Bytes)]) -> impl Future<Output = io::Result<()>> + Send {
        async move {
            for (header, payload) in frames {
                self.write_frame(header, payload).await?;
            }
            Ok(())
        }
    }
}

/// The receiving half of a link.
pub trait FrameReader: Send + 'static {
    /// The next frame, or `None` when the peer closed the link cleanly between frames.
    fn read_frame(&mut self) -> impl Future<Output = io::Result<Option<Frame>>> + Send;
}

/// Accepts links on a bound local address.
pub trait FrameListener: Send + 'static {
    type Writer: FrameWriter;
    type Reader: FrameReader;
    /// The next link: its two halves and the peer's address.
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Writer, Self::Reader, SocketAddr)>> + Send;
    /// The address the listener is bound to (with the real port when bound to port 0).
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// A data path: how to open links to a peer and how to accept them.
pub trait Backend: Send + Sync + 'static {
    type Writer: FrameWriter;
    type Reader: FrameReader;
    type Listener: FrameListener<Writer = Self::Writer, Reader = Self::Reader>;
    /// A short name for logs, metrics and benchmarks ("tcp", "shm", ...).
    fn name(&self) -> &'static str;
    /// Opens a link to the peer listening on `peer`.
    fn connect(&self, peer: SocketAddr) -> impl Future<Output = io::Result<(Self::Writer, Self::Reader)>> + Send;
    /// Binds a listener on `local`.
    fn bind(&self, local: SocketAddr) -> impl Future<Output = io::Result<Self::Listener>> + Send;
}

/// How many link setups an accepting listener runs at once (see [`Setups`]); past it, it stops
/// accepting until one finishes.
pub(crate) const MAX_SETUPS: usize = 64;

/// A listener's raw connections, before any link setup.
pub(crate) trait Acceptor: Send + 'static {
    type Conn: Send + 'static;
    fn accept_conn(&mut self) -> impl Future<Output = io::Result<Self::Conn>> + Send;
}

impl Acceptor for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    async fn accept_conn(&mut self) -> io::Result<Self::Conn> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Acceptor for tokio::net::TcpListener {
    type Conn = (tokio::net::TcpStream, SocketAddr);
    async fn accept_conn(&mut self) -> io::Result<Self::Conn> {
        self.accept().await
    }
}

/// An accept error that concerns one connection's link setup (a bad or late handshake, no
/// device), not the listener: the listener goes on, and the next accept may succeed. Its text
/// is the setup's error, naming the peer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupFailed(pub io::Error);

/// Whether an accept error is one connection's failed setup ([`SetupFailed`]) rather than the
/// listener's own (out of descriptors and the like).
pub fn is_setup_failure(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<SetupFailed>())
}

/// Link setups (handshakes) of accepted connections, run side by side in a task of their own:
/// a peer that connects and then says nothing holds up its own link only, not the links of
/// the peers behind it. Finished links come out of [`Setups::next`] in the order they finish;
/// a setup that fails comes out as a [`SetupFailed`] error (the listener goes on), and an
/// error of the listener itself is passed on. Dropping it stops accepting and drops the setups
/// under way.
pub(crate) struct Setups<L> {
    links: tokio::sync::mpsc::Receiver<io::Result<L>>,
    task: tokio::task::JoinHandle<()>,
}

impl<L: Send + 'static> Setups<L> {
    /// Accepts on `acceptor` and runs `setup` on each connection; `what` names the listener in
    /// logs.
    pub(crate) fn start<A, S, F>(mut acceptor: A, setup: S, what: String) -> Self
    where
        A: Acceptor,
        S: Fn(A::Conn) -> F + Send + 'static,
        F: Future<Output = io::Result<L>> + Send + 'static,
    {
        let (tx, links) = tokio::sync::mpsc::channel(16);
        let task = tokio::spawn(async move {
            let mut pending = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    conn = acceptor.accept_conn(), if pending.len() < MAX_SETUPS => match conn {
                        Ok(conn) => {
                            pending.spawn(setup(conn));
                        }
                        Err(e) => {
                            if tx.send(Err(e)).await.is_err() {
                                return;
                            }
                        }
                    },
                    Some(done) = pending.join_next(), if !pending.is_empty() => match done {
                        Ok(Ok(link)) => {
                            if tx.send(Ok(link)).await.is_err() {
                                return;
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(listener = %what, error = %e, "link setup failed; refused");
                            if tx.send(Err(io::Error::new(e.kind(), SetupFailed(e)))).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::error!(listener = %what, error = %e, "a link setup task ended abnormally"),
                    },
                    () = tx.closed() => return,
                }
            }
        });
        Self { links, task }
    }

    /// The next link that finished its setup, or the listener's error.
    pub(crate) async fn next(&mut self) -> io::Result<L> {
        match self.links.recv().await {
            Some(link) => link,
            None => Err(io::Error::other("the listener's accept task stopped")),
        }
    }
}

impl<L> Drop for Setups<L> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
