//! The weft paths, each backend at two levels:
//!
//! - frames ([`FrameLink`]): the [`Backend`] seam alone (`src/backend.rs`): one link, the sender
//!   writes frames whose header is the sequence number (8 bytes) and whose payload is the
//!   message, the receiver reads every frame whole. What the backend itself costs.
//! - messages ([`MsgLink`]): the library as a UDF uses it: a [`Sender`] (default settings:
//!   round robin, retry until success, 512 messages / 256 MiB in flight) to one [`Receiver`]
//!   (default settings: 64 handlers at once, dedup window) whose handler passes the message on;
//!   every message is acknowledged after its handler returned. A message counts as received when
//!   the handler has it. Handlers run concurrently, so the order is not checked, only that every
//!   message arrives once.

use std::net::SocketAddr;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use tokio::sync::mpsc;
use weft_transport::shm::ShmBackend;
use weft_transport::{
    Backend, FrameListener, FrameReader, FrameWriter, Message, Receiver, ReceiverConfig, Sender, SenderConfig, Sent,
    StaticPeers, TcpBackend,
};

use crate::Entry;
use crate::harness::{END, Link, Rx, Tx};

/// Frame-level adapter over any backend.
pub struct FrameLink<B> {
    backend: B,
    local: SocketAddr,
}

impl<B: Backend> FrameLink<B> {
    /// Binds the receiving side on `local` (port 0: any free port).
    pub fn new(backend: B, local: SocketAddr) -> Self {
        FrameLink { backend, local }
    }
}

pub struct FrameTx<W, R> {
    writer: W,
    // The link's other half, kept open for the run.
    _reader: R,
}

pub struct FrameRx<W, R> {
    reader: R,
    _writer: W,
}

impl<B: Backend> Link for FrameLink<B> {
    type Listening = B::Listener;
    type Tx = FrameTx<B::Writer, B::Reader>;
    type Rx = FrameRx<B::Writer, B::Reader>;

    async fn listen(&self) -> anyhow::Result<(B::Listener, String)> {
        let listener = self
            .backend
            .bind(self.local)
            .await
            .with_context(|| format!("{}: binding {}", self.backend.name(), self.local))?;
        let addr = listener.local_addr().with_context(|| format!("{}: listener address", self.backend.name()))?;
        Ok((listener, addr.to_string()))
    }

    async fn accept(&self, mut listening: B::Listener) -> anyhow::Result<Self::Rx> {
        let (writer, reader, _peer) =
            listening.accept().await.with_context(|| format!("{}: accepting", self.backend.name()))?;
        Ok(FrameRx { reader, _writer: writer })
    }

    async fn connect(&self, endpoint: &str) -> anyhow::Result<Self::Tx> {
        let peer: SocketAddr = endpoint.parse().with_context(|| format!("listener address {endpoint:?}"))?;
        let (writer, reader) = self
            .backend
            .connect(peer)
            .await
            .with_context(|| format!("{}: connecting to {peer}", self.backend.name()))?;
        Ok(FrameTx { writer, _reader: reader })
    }
}

impl<W: FrameWriter, R: FrameReader> Tx for FrameTx<W, R> {
    async fn send(&mut self, seq: u64, payload: &Bytes, _more: bool) -> anyhow::Result<()> {
        self.writer.write_frame(&seq.to_le_bytes(), payload).await?;
        Ok(())
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        // write_frame returns once the frame is handed to the link whole; nothing is buffered
        // above it.
        Ok(())
    }
}

impl<W: FrameWriter, R: FrameReader> Rx for FrameRx<W, R> {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        let frame = self.reader.read_frame().await?.ok_or_else(|| anyhow!("the link closed before the end marker"))?;
        let Ok(header) = <[u8; 8]>::try_from(&frame.header[..]) else {
            bail!("a frame header of {} bytes, the bench writes 8", frame.header.len());
        };
        Ok(u64::from_le_bytes(header))
    }
}

/// Message-level adapter: a [`Sender`] to a [`Receiver`] over backend `B`.
pub struct MsgLink<B> {
    backend: B,
    local: SocketAddr,
}

impl<B: Backend + Clone> MsgLink<B> {
    pub fn new(backend: B, local: SocketAddr) -> Self {
        MsgLink { backend, local }
    }
}

pub struct MsgTx {
    sender: Sender,
}

pub struct MsgRx {
    delivered: mpsc::Receiver<u64>,
    receiver: Receiver,
}

/// How many handed-over messages may wait for the harness (the handlers block beyond it, which
/// is the receiver's backpressure).
const DELIVERED_QUEUE: usize = 4096;

fn message_id(seq: u64) -> String {
    if seq == END { "end".to_string() } else { seq.to_string() }
}

fn parse_id(id: &str) -> Result<u64, String> {
    if id == "end" {
        return Ok(END);
    }
    id.parse().map_err(|_| format!("message id {id:?} is not a sequence number"))
}

impl<B: Backend + Clone> Link for MsgLink<B> {
    type Listening = (Receiver, mpsc::Receiver<u64>);
    type Tx = MsgTx;
    type Rx = MsgRx;

    fn ordered(&self) -> bool {
        false
    }

    async fn listen(&self) -> anyhow::Result<(Self::Listening, String)> {
        let (tx, rx) = mpsc::channel(DELIVERED_QUEUE);
        let handler = move |m: Message| {
            let tx = tx.clone();
            async move {
                let seq = parse_id(&m.id)?;
                drop(m);
                tx.send(seq).await.map_err(|_| "the bench stopped reading".to_string())
            }
        };
        let receiver = Receiver::bind(&self.backend, self.local, ReceiverConfig::default(), handler)
            .await
            .with_context(|| format!("{}: receiver on {}", self.backend.name(), self.local))?;
        let addr = receiver.local_addr();
        Ok(((receiver, rx), addr.to_string()))
    }

    async fn accept(&self, (receiver, delivered): Self::Listening) -> anyhow::Result<MsgRx> {
        // The receiver accepts links by itself.
        Ok(MsgRx { delivered, receiver })
    }

    async fn connect(&self, endpoint: &str) -> anyhow::Result<MsgTx> {
        let peer: SocketAddr = endpoint.parse().with_context(|| format!("receiver address {endpoint:?}"))?;
        let sender = Sender::new(self.backend.clone(), StaticPeers::new([peer]), SenderConfig::default());
        Ok(MsgTx { sender })
    }
}

impl Tx for MsgTx {
    async fn send(&mut self, seq: u64, payload: &Bytes, _more: bool) -> anyhow::Result<()> {
        match self.sender.send(Message::new(message_id(seq), payload.clone())).await? {
            // The ack is awaited in bulk by `finish`.
            Sent::Queued(_ack) => Ok(()),
            Sent::Dropped => bail!("dropped although the sender retries until success"),
        }
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        self.sender.flush().await;
        let stats = self.sender.stats();
        if stats.acked != stats.queued {
            bail!("{} messages queued, {} acknowledged", stats.queued, stats.acked);
        }
        Ok(())
    }

    fn state(&self) -> String {
        format!("{:?}", self.sender.stats())
    }
}

impl Rx for MsgRx {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        self.delivered
            .recv()
            .await
            .ok_or_else(|| anyhow!("the receiver stopped handing messages over (stats: {:?})", self.receiver.stats()))
    }
}

/// The "tcp-frames" path: weft's TCP backend alone.
pub(crate) fn tcp_frames() -> Entry<'static> {
    Entry::link(|_| Ok(FrameLink::new(TcpBackend::default(), loopback())))
}

/// The "tcp" path: Sender to Receiver over weft's TCP backend.
pub(crate) fn tcp() -> Entry<'static> {
    Entry::link(|_| Ok(MsgLink::new(TcpBackend::default(), loopback())))
}

/// The "shm-frames" path: weft's shared-memory backend alone, meeting in a temp directory.
pub(crate) fn shm_frames() -> Entry<'static> {
    match shm_dir() {
        Ok(dir) => Entry::link(move |_| Ok(FrameLink::new(ShmBackend::new(dir.path()), loopback()))),
        Err(e) => Entry::Failed(format!("{e:#}")),
    }
}

/// The "shm" path: Sender to Receiver over weft's shared-memory backend.
pub(crate) fn shm() -> Entry<'static> {
    match shm_dir() {
        Ok(dir) => Entry::link(move |_| Ok(MsgLink::new(ShmBackend::new(dir.path()), loopback()))),
        Err(e) => Entry::Failed(format!("{e:#}")),
    }
}

/// The rendezvous directory of the shared-memory runs (both sides are this process).
fn shm_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("weft-shm-").tempdir().context("creating the shm rendezvous directory")
}

/// The loopback address with any free port.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
