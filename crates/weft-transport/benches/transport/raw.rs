//! The raw socket limit: a plain tokio `TcpStream` (TCP_NODELAY) on loopback carrying
//! length-prefixed messages, no protocol. A message is a frame built once
//! (`[len u32][seq u64][payload]`, only the sequence number rewritten). While more messages follow
//! at once (the throughput runs), small frames are gathered into one write of up to [`BATCH`]
//! bytes, as any batching writer would; a frame of [`BATCH`] or more, or one with nothing right
//! behind it (the latency runs), is written by itself. The receiver reads every message fully into
//! a reused buffer.

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use anyhow::{Context as _, bail};

use crate::harness::{Link, Rx, Tx};

const HEADER: usize = 4 + 8;
/// The most bytes of small frames gathered into one write.
pub const BATCH: usize = 256 * 1024;

pub struct RawTcp;

pub struct RawTx {
    stream: TcpStream,
    frame: Vec<u8>,
    batch: Vec<u8>,
}

pub struct RawRx {
    stream: BufReader<TcpStream>,
    buf: Vec<u8>,
}

impl Link for RawTcp {
    type Listening = TcpListener;
    type Tx = RawTx;
    type Rx = RawRx;

    async fn listen(&self) -> anyhow::Result<(TcpListener, String)> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("binding 127.0.0.1:0")?;
        let addr = listener.local_addr().context("listener address")?;
        Ok((listener, addr.to_string()))
    }

    async fn accept(&self, listening: TcpListener) -> anyhow::Result<RawRx> {
        let (stream, _) = listening.accept().await.context("accepting")?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        Ok(RawRx { stream: BufReader::with_capacity(256 * 1024, stream), buf: Vec::new() })
    }

    async fn connect(&self, endpoint: &str) -> anyhow::Result<RawTx> {
        let stream = TcpStream::connect(endpoint).await.with_context(|| format!("connecting to {endpoint}"))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        Ok(RawTx { stream, frame: Vec::new(), batch: Vec::with_capacity(BATCH) })
    }
}

impl RawTx {
    async fn write_batch(&mut self) -> anyhow::Result<()> {
        if !self.batch.is_empty() {
            self.stream.write_all(&self.batch).await?;
            self.batch.clear();
        }
        Ok(())
    }
}

impl Tx for RawTx {
    async fn send(&mut self, seq: u64, payload: &Bytes, more: bool) -> anyhow::Result<()> {
        if self.frame.len() != HEADER + payload.len() {
            let len = u32::try_from(payload.len())
                .with_context(|| format!("a {} byte payload does not fit the u32 length prefix", payload.len()))?;
            self.frame.clear();
            self.frame.extend_from_slice(&len.to_le_bytes());
            self.frame.extend_from_slice(&seq.to_le_bytes());
            self.frame.extend_from_slice(payload);
        }
        self.frame[4..HEADER].copy_from_slice(&seq.to_le_bytes());
        if self.frame.len() >= BATCH {
            self.write_batch().await?;
            self.stream.write_all(&self.frame).await?;
            return Ok(());
        }
        self.batch.extend_from_slice(&self.frame);
        if !more || self.batch.len() >= BATCH {
            self.write_batch().await?;
        }
        Ok(())
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        self.write_batch().await?;
        self.stream.flush().await?;
        self.stream.shutdown().await?;
        Ok(())
    }
}

impl Rx for RawRx {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        let mut header = [0u8; HEADER];
        self.stream.read_exact(&mut header).await.context("reading a message header")?;
        let (len, seq) = header.split_at(4);
        let len = u32::from_le_bytes(len.try_into()?) as usize;
        let seq = u64::from_le_bytes(seq.try_into()?);
        if len > 64 << 20 {
            bail!("message {seq} claims {len} bytes, more than this bench sends");
        }
        self.buf.resize(len, 0);
        self.stream
            .read_exact(&mut self.buf[..len])
            .await
            .with_context(|| format!("reading the {len} byte payload of message {seq}"))?;
        Ok(seq)
    }
}
