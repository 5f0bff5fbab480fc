//! The TCP backend, the default data path: one TCP connection per link, `TCP_NODELAY` on.
//!
//! # Framing on the stream
//!
//! Each direction of a connection starts with the 8-byte preamble `WEFTTCP1`, so a peer that is
//! not a weft transport endpoint is refused with a clear error rather than misread. Then frames
//! follow, each as
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 4 | header length (`u32`, little-endian) |
//! | 4 | 8 | payload length (`u64`, little-endian) |
//! | 12 | h | header (the protocol's, [`crate::protocol`]) |
//! | 12+h | p | payload |
//!
//! # Copies
//!
//! The writer puts the 12-byte prefix and the header into one small reused buffer and writes it
//! together with the caller's payload in one vectored write (`writev`); the payload is never
//! copied in user space. [`FrameWriter::write_frames`] gathers many frames (up to 256) into one
//! `writev`, so a queue of small messages costs one system call, not one each. The reader keeps a small read buffer for prefixes, headers and small
//! payloads (split off it without a copy); a payload of at least [`DIRECT_READ_MIN`] bytes is read
//! from the socket straight into its own buffer of the announced length, so the kernel's copy is
//! the only one (apart from the few bytes that arrived with the header). That buffer's
//! allocation is reused for the next large payload once the previous one was dropped.
//!
//! Lengths over the configured limits ([`TcpConfig::max_header`], [`TcpConfig::max_payload`]) are
//! refused on both sides with an error naming the size, the limit and the peer.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::backend::{Backend, Frame, FrameListener, FrameReader, FrameWriter};
use crate::protocol::{DEFAULT_MAX_HEADER, DEFAULT_MAX_PAYLOAD};

/// The bytes each direction of a connection starts with.
pub const PREAMBLE: &[u8; 8] = b"WEFTTCP1";
/// Bytes before each frame's header: header length (`u32`) and payload length (`u64`).
pub const PREFIX_LEN: usize = 12;
/// Payloads at least this large are read straight from the socket into their own buffer.
pub const DIRECT_READ_MIN: usize = 16 * 1024;
/// The read buffer's initial size (prefixes, headers and small payloads).
const READ_BUF: usize = 64 * 1024;

/// Settings of the TCP backend.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// The largest header accepted or written.
    pub max_header: usize,
    /// The largest payload accepted or written.
    pub max_payload: usize,
    /// `TCP_NODELAY` (on by default: frames are written whole, Nagle only adds latency).
    pub nodelay: bool,
    /// `SO_SNDBUF`; `None` leaves the kernel's autotuning on.
    pub send_buffer: Option<usize>,
    /// `SO_RCVBUF`; `None` leaves the kernel's autotuning on.
    pub recv_buffer: Option<usize>,
    /// How long `connect` waits for the peer.
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            max_header: DEFAULT_MAX_HEADER,
            max_payload: DEFAULT_MAX_PAYLOAD,
            nodelay: true,
            send_buffer: None,
            recv_buffer: None,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The TCP backend.
#[derive(Clone, Debug, Default)]
pub struct TcpBackend {
    config: TcpConfig,
}

impl TcpBackend {
    /// A backend with these settings.
    pub fn new(config: TcpConfig) -> Self {
        Self { config }
    }

    /// The settings.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    fn tune(&self, stream: &TcpStream) -> io::Result<()> {
        stream.set_nodelay(self.config.nodelay)?;
        let sock = SockRef::from(stream);
        if let Some(n) = self.config.send_buffer {
            sock.set_send_buffer_size(n)?;
        }
        if let Some(n) = self.config.recv_buffer {
            sock.set_recv_buffer_size(n)?;
        }
        Ok(())
    }

    fn split(&self, stream: TcpStream, peer: SocketAddr) -> (TcpWriter, TcpReader) {
        let (read, write) = stream.into_split();
        (
            TcpWriter {
                stream: write,
                peer,
                head: BytesMut::with_capacity(PREFIX_LEN + 256),
                preamble_sent: false,
                max_header: self.config.max_header,
                max_payload: self.config.max_payload,
            },
            TcpReader {
                stream: read,
                peer,
                buf: BytesMut::with_capacity(READ_BUF),
                pool: BufferPool::default(),
                preamble_seen: false,
                max_header: self.config.max_header,
                max_payload: self.config.max_payload,
            },
        )
    }
}

impl Backend for TcpBackend {
    type Writer = TcpWriter;
    type Reader = TcpReader;
    type Listener = TcpFrameListener;

    fn name(&self) -> &'static str {
        "tcp"
    }

    async fn connect(&self, peer: SocketAddr) -> io::Result<(TcpWriter, TcpReader)> {
        let socket = if peer.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        // Buffer sizes must be set before connecting to take part in the window negotiation.
        if let Some(n) = self.config.send_buffer {
            socket.set_send_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        if let Some(n) = self.config.recv_buffer {
            socket.set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        let stream = match tokio::time::timeout(self.config.connect_timeout, socket.connect(peer)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(io::Error::new(e.kind(), format!("connecting to {peer}: {e}")));
            }
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {peer}: no answer within {:?}", self.config.connect_timeout),
                ));
            }
        };
        self.tune(&stream)?;
        Ok(self.split(stream, peer))
    }

    async fn bind(&self, local: SocketAddr) -> io::Result<TcpFrameListener> {
        let socket = if local.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        if let Some(n) = self.config.recv_buffer {
            // Inherited by accepted sockets, so it applies before the handshake.
            socket.set_recv_buffer_size(u32::try_from(n).unwrap_or(u32::MAX))?;
        }
        socket.bind(local).map_err(|e| io::Error::new(e.kind(), format!("binding {local}: {e}")))?;
        let listener = socket.listen(1024)?;
        Ok(TcpFrameListener { listener, backend: self.clone() })
    }
}

/// Accepts TCP links.
#[derive(Debug)]
pub struct TcpFrameListener {
    listener: TcpListener,
    backend: TcpBackend,
}

impl FrameListener for TcpFrameListener {
    type Writer = TcpWriter;
    type Reader = TcpReader;

    async fn accept(&mut self) -> io::Result<(TcpWriter, TcpReader, SocketAddr)> {
        let (stream, peer) = self.listener.accept().await?;
        self.backend.tune(&stream)?;
        let (w, r) = self.backend.split(stream, peer);
        Ok((w, r, peer))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// The sending half of a TCP link.
#[derive(Debug)]
pub struct TcpWriter {
    stream: OwnedWriteHalf,
    peer: SocketAddr,
    head: BytesMut,
    preamble_sent: bool,
    max_header: usize,
    max_payload: usize,
}

impl TcpWriter {
    fn check(&self, header: &[u8], payload: &Bytes) -> io::Result<()> {
        if header.len() > self.max_header {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "frame header of {} bytes to {} is over the limit of {} bytes",
                    header.len(),
                    self.peer,
                    self.max_header
                ),
            ));
        }
        if payload.len() > self.max_payload {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "payload of {} bytes to {} is over the limit of {} bytes",
                    payload.len(),
                    self.peer,
                    self.max_payload
                ),
            ));
        }
        Ok(())
    }

    /// Appends the preamble (first frame only), the prefix and the header to `self.head`.
    fn put_head(&mut self, header: &[u8], payload_len: usize) {
        if !self.preamble_sent {
            self.head.put_slice(PREAMBLE);
            self.preamble_sent = true;
        }
        self.head.put_u32_le(header.len() as u32);
        self.head.put_u64_le(payload_len as u64);
        self.head.put_slice(header);
    }
}

/// Frames gathered into one `writev` at most: two slices each, far below `IOV_MAX` (1024).
const MAX_GATHER: usize = 256;

impl FrameWriter for TcpWriter {
    async fn write_frame(&mut self, header: &[u8], payload: &Bytes) -> io::Result<()> {
        self.check(header, payload)?;
        self.head.clear();
        self.put_head(header, payload.len());
        // One vectored write of prefix+header and payload (tokio's `write_all_buf` uses
        // `writev` over the chain's two chunks); the payload is only referenced.
        let mut chain = Buf::chain(&self.head[..], &payload[..]);
        self.stream.write_all_buf(&mut chain).await
    }

    async fn write_frames(&mut self, frames: &[(&[u8], &Bytes)]) -> io::Result<()> {
        for chunk in frames.chunks(MAX_GATHER) {
            for (header, payload) in chunk {
                self.check(header, payload)?;
            }
            // All prefixes and headers in one buffer, then one slice list alternating
            // prefix+header and payload, written with as few `writev` calls as the socket takes.
            self.head.clear();
            let mut ends = Vec::with_capacity(chunk.len());
            for (header, payload) in chunk {
                self.put_head(header, payload.len());
                ends.push(self.head.len());
            }
            let Self { stream, head, .. } = self;
            let mut slices = Vec::with_capacity(2 * chunk.len());
            let mut start = 0;
            for ((_, payload), end) in chunk.iter().zip(ends) {
                slices.push(IoSlice::new(&head[start..end]));
                if !payload.is_empty() {
                    slices.push(IoSlice::new(payload));
                }
                start = end;
            }
            let mut bufs = &mut slices[..];
            while !bufs.is_empty() {
                let n = stream.write_vectored(bufs).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("link to {} accepted no more bytes", self.peer),
                    ));
                }
                IoSlice::advance_slices(&mut bufs, n);
            }
        }
        Ok(())
    }
}

/// The receiving half of a TCP link.
#[derive(Debug)]
pub struct TcpReader {
    stream: OwnedReadHalf,
    peer: SocketAddr,
    buf: BytesMut,
    /// Allocations of earlier large payloads, for reuse.
    pool: BufferPool,
    preamble_seen: bool,
    max_header: usize,
    max_payload: usize,
}

impl TcpReader {
    /// Reads until the buffer holds `n` bytes. `Ok(false)`: the peer closed before any byte of
    /// this unit arrived (only allowed when `clean_eof_ok`).
    async fn fill(&mut self, n: usize, what: &str, clean_eof_ok: bool) -> io::Result<bool> {
        while self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
            let read = self.stream.read_buf(&mut self.buf).await?;
            if read == 0 {
                if self.buf.is_empty() && clean_eof_ok {
                    return Ok(false);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("link from {} closed in the middle of {what} ({} of {n} bytes)", self.peer, self.buf.len()),
                ));
            }
        }
        Ok(true)
    }

    fn invalid(&self, why: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("link from {}: {why}", self.peer))
    }
}

impl FrameReader for TcpReader {
    async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        if !self.preamble_seen {
            if !self.fill(PREAMBLE.len(), "the preamble", true).await? {
                return Ok(None);
            }
            if &self.buf[..PREAMBLE.len()] != PREAMBLE {
                return Err(self.invalid(format!(
                    "not a weft transport peer: the stream starts with {:?}, expected {:?}",
                    String::from_utf8_lossy(&self.buf[..PREAMBLE.len()]),
                    String::from_utf8_lossy(PREAMBLE)
                )));
            }
            self.buf.advance(PREAMBLE.len());
            self.preamble_seen = true;
        }
        if !self.fill(PREFIX_LEN, "a frame prefix", true).await? {
            return Ok(None);
        }
        let mut prefix = &self.buf[..PREFIX_LEN];
        let header_len = prefix.get_u32_le() as usize;
        let payload_len = prefix.get_u64_le();
        if header_len > self.max_header {
            return Err(self.invalid(format!(
                "frame header of {header_len} bytes is over the limit of {} bytes",
                self.max_header
            )));
        }
        if payload_len > self.max_payload as u64 {
            return Err(
                self.invalid(format!("payload of {payload_len} bytes is over the limit of {} bytes", self.max_payload))
            );
        }
        let payload_len = payload_len as usize;
        if payload_len < DIRECT_READ_MIN {
            // Small frame: prefix, header and payload from the read buffer.
            self.fill(PREFIX_LEN + header_len + payload_len, "a frame", false).await?;
            self.buf.advance(PREFIX_LEN);
            let header = self.buf.split_to(header_len).freeze();
            let payload = self.buf.split_to(payload_len).freeze();
            return Ok(Some(Frame { header, payload }));
        }
        self.fill(PREFIX_LEN + header_len, "a frame header", false).await?;
        self.buf.advance(PREFIX_LEN);
        let header = self.buf.split_to(header_len).freeze();
        // Large payload: whatever already arrived, then the rest straight from the socket into
        // the payload buffer (see `BufferPool`: no fresh pages to fault in for each message).
        let mut payload = self.pool.take(payload_len);
        let allocation = payload.capacity();
        let have = self.buf.len().min(payload_len);
        payload.extend_from_slice(&self.buf[..have]);
        self.buf.advance(have);
        while payload.len() < payload_len {
            let want = (payload_len - payload.len()) as u64;
            let read = (&mut self.stream).take(want).read_buf(&mut payload).await?;
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "link from {} closed in the middle of a payload ({} of {payload_len} bytes)",
                        self.peer,
                        payload.len()
                    ),
                ));
            }
        }
        let frozen = payload.split().freeze();
        self.pool.give_back(payload, allocation);
        let payload = frozen;
        Ok(Some(Frame { header, payload }))
    }
}

/// Large payload buffers kept for reuse. A payload handed out is a view of its allocation; the
/// pool keeps an empty view of it and reuses the allocation (`BytesMut::try_reclaim`) once every
/// clone of the payload was dropped. Fresh allocations of this size come from `mmap` or a
/// trimmed heap, and faulting their pages in cost about a tenth of the CPU of a 512 KiB stream;
/// reuse avoids that. Bounded: at most [`POOL_ENTRIES`] allocations and [`POOL_BYTES`] bytes are
/// held, oldest given up first, so memory stays bounded whatever payloads a handler keeps.
#[derive(Debug, Default)]
struct BufferPool {
    /// Empty views and the size of the allocation behind each, oldest first.
    entries: Vec<(BytesMut, usize)>,
    bytes: usize,
}

/// Allocations the pool holds at most.
const POOL_ENTRIES: usize = 8;
/// Bytes the pool holds at most (larger payloads are not pooled).
const POOL_BYTES: usize = 32 * 1024 * 1024;

impl BufferPool {
    /// An empty buffer with room for `len` bytes: a reclaimed allocation, or a new one.
    fn take(&mut self, len: usize) -> BytesMut {
        if let Some(i) = self.entries.iter_mut().position(|(b, _)| b.try_reclaim(len)) {
            let (buf, size) = self.entries.remove(i);
            self.bytes -= size;
            return buf;
        }
        BytesMut::with_capacity(len)
    }

    /// Keeps `buf` (emptied by `split`) whose allocation holds about `size` bytes.
    fn give_back(&mut self, buf: BytesMut, size: usize) {
        if size > POOL_BYTES {
            return;
        }
        while !self.entries.is_empty() && (self.entries.len() >= POOL_ENTRIES || self.bytes + size > POOL_BYTES) {
            let (_, old) = self.entries.remove(0);
            self.bytes -= old;
        }
        self.entries.push((buf, size));
        self.bytes += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    fn small() -> TcpBackend {
        TcpBackend::new(TcpConfig { max_payload: 8 * 1024 * 1024, ..TcpConfig::default() })
    }

    #[tokio::test]
    async fn passes_the_backend_conformance_suite() {
        conformance::run_all(&small(), "127.0.0.1:0".parse().expect("addr"), 8 * 1024 * 1024)
            .await
            .expect("conformance");
    }

    #[tokio::test]
    async fn a_partial_frame_then_close_is_an_error_not_a_clean_end() {
        conformance::abrupt_close(&small(), "127.0.0.1:0".parse().expect("addr"), |addr| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let mut bytes = PREAMBLE.to_vec();
            bytes.extend_from_slice(&10u32.to_le_bytes());
            bytes.extend_from_slice(&100u64.to_le_bytes());
            bytes.extend_from_slice(b"half");
            s.write_all(&bytes).await.expect("write");
        })
        .await
        .expect("abrupt close");
    }

    #[tokio::test]
    async fn oversized_lengths_are_refused_with_the_limit() {
        let backend = TcpBackend::new(TcpConfig { max_payload: 1000, max_header: 100, ..TcpConfig::default() });
        let mut listener = backend.bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let mut bytes = PREAMBLE.to_vec();
            bytes.extend_from_slice(&10u32.to_le_bytes());
            bytes.extend_from_slice(&5000u64.to_le_bytes());
            s.write_all(&bytes).await.expect("write");
            s
        });
        let (_w, mut r, _) = listener.accept().await.expect("accept");
        let err = r.read_frame().await.expect_err("too large");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("payload of 5000 bytes is over the limit of 1000 bytes"), "{err}");
        drop(client.await.expect("client"));

        // The writer refuses too, before anything goes on the wire.
        let (mut w, _r) = backend.connect(addr).await.expect("connect");
        let err = w.write_frame(b"h", &Bytes::from(vec![0u8; 1001])).await.expect_err("too large");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = w.write_frame(&[0u8; 101], &Bytes::new()).await.expect_err("header too large");
        assert!(err.to_string().contains("over the limit of 100"), "{err}");
    }

    #[tokio::test]
    async fn a_peer_that_is_not_weft_is_refused_by_its_preamble() {
        let backend = small();
        let mut listener = backend.bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
            s
        });
        let (_w, mut r, _) = listener.accept().await.expect("accept");
        let err = r.read_frame().await.expect_err("not weft");
        assert!(err.to_string().contains("not a weft transport peer"), "{err}");
        drop(client.await.expect("client"));
    }

    #[tokio::test]
    async fn connecting_to_a_closed_port_names_the_peer() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr")
        };
        let err = small().connect(addr).await.expect_err("refused");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[test]
    fn the_pool_reuses_an_allocation_once_its_payload_is_dropped() {
        let mut pool = BufferPool::default();
        let mut a = pool.take(100_000);
        let size = a.capacity();
        a.extend_from_slice(&[1u8; 100_000]);
        let first = a.split().freeze();
        let ptr = first.as_ptr();
        pool.give_back(a, size);
        // Still held: a new allocation, the held payload untouched.
        let mut b = pool.take(100_000);
        assert_ne!(b.as_ptr(), ptr);
        b.extend_from_slice(&[2u8; 100_000]);
        let second = b.split().freeze();
        pool.give_back(b, size);
        assert!(first.iter().all(|x| *x == 1) && second.iter().all(|x| *x == 2));
        // Dropped: the same allocation again.
        drop(first);
        let c = pool.take(100_000);
        assert_eq!(c.as_ptr(), ptr);
        drop(second);
    }

    #[test]
    fn the_pool_holds_a_bounded_number_of_bytes() {
        let mut pool = BufferPool::default();
        let mut held = Vec::new();
        for _ in 0..20 {
            let mut b = pool.take(5 * 1024 * 1024);
            let size = b.capacity();
            b.resize(5 * 1024 * 1024, 0);
            held.push(b.split().freeze());
            pool.give_back(b, size);
            assert!(pool.entries.len() <= POOL_ENTRIES && pool.bytes <= POOL_BYTES);
        }
        // Larger than the whole pool: not kept.
        let mut huge = pool.take(POOL_BYTES + 1);
        let size = huge.capacity();
        huge.resize(POOL_BYTES + 1, 0);
        let _frozen = huge.split().freeze();
        let before = pool.entries.len();
        pool.give_back(huge, size);
        assert_eq!(pool.entries.len(), before);
    }

    #[tokio::test]
    async fn socket_buffer_sizes_are_applied() {
        let backend = TcpBackend::new(TcpConfig {
            send_buffer: Some(1 << 20),
            recv_buffer: Some(1 << 20),
            ..TcpConfig::default()
        });
        conformance::frames_in_order(&backend, "127.0.0.1:0".parse().expect("addr")).await.expect("frames");
    }
}
