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
