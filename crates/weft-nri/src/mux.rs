//! The NRI trunk multiplexer: both ttrpc directions over one stream.
//!
//! Every frame is an 8-byte header (connection id, then payload length, both big-endian u32)
//! followed by the payload. weft writes at most [`MAX_WRITE_PAYLOAD`] (4,096) bytes per frame and
//! splits longer writes, because the runtime's side cannot take more: Go ttrpc reads each
//! sub-connection through a 4,096-byte `bufio.Reader`, and upstream's mux connection fails a read
//! whose buffer is smaller than the frame with `ENOMEM` (`pkg/net/multiplex/mux.go`, `conn.Read`),
//! after which containerd closes the plugin. weft reads frames up to [`MAX_PAYLOAD`] (a ttrpc
//! header plus ttrpc's largest message), the most upstream's writer sends; [`Mux::with_read_limit`]
//! reads as a Go ttrpc peer does, for the test runtime. All frames of one write go out under one
//! lock, so frames of different sub-connections never interleave inside a frame. There is no
//! handshake: each side opens connection ids locally ([`PLUGIN_SERVICE_CONN`] carries the
//! `Plugin` service, [`RUNTIME_SERVICE_CONN`] the `Runtime` service). Frames for ids that are not
//! open are dropped. End of stream or an error on the trunk closes the whole mux: every
//! sub-connection then reads end of stream and fails writes.
//!
//! Sub-connections are [`tokio::io::DuplexStream`] halves bridged to the trunk by tasks, so they
//! can be handed to `ttrpc::r#async::transport::Socket::new`.
//!
//! Unlike upstream, a slow sub-connection reader applies back-pressure to the trunk instead of
//! closing the mux on a full queue (ttrpc's readers never stop reading, so this does not occur
//! in practice).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio_util::sync::CancellationToken;

/// A multiplexed connection id.
pub type ConnId = u32;

/// Connection carrying the `Plugin` service (the plugin serves, the runtime calls).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// Connection carrying the `Runtime` service (the runtime serves, the plugin calls).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Length of a frame header.
pub const HEADER_LEN: usize = 8;
/// Largest payload of one frame a reader accepts: a 10-byte ttrpc header plus ttrpc's 4 MiB
/// message limit (what upstream's writer may send).
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);
/// Largest payload weft writes in one frame: Go ttrpc's read buffer (`bufio.NewReader`'s default
/// size), the most a Go peer can take in one read without `ENOMEM`.
pub const MAX_WRITE_PAYLOAD: usize = 4096;

/// Buffer of each sub-connection's in-memory pipe.
const PIPE_CAPACITY: usize = 256 * 1024;

/// A sub-connection: read and write it like a socket.
pub type SubConn = DuplexStream;

/// Encodes a frame header.
pub fn encode_header(id: ConnId, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&id.to_be_bytes());
    h[4..8].copy_from_slice(&len.to_be_bytes());
    h
}

/// Decodes a frame header into (connection id, payload length).
pub fn decode_header(h: &[u8; HEADER_LEN]) -> (ConnId, u32) {
    let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    (id, len)
}

/// The frames a write of `data` on connection `id` produces, as (header, payload) pairs, each
/// payload at most [`MAX_WRITE_PAYLOAD`] bytes. An empty write produces no frame.
pub fn frames(id: ConnId, data: &[u8]) -> impl Iterator<Item = ([u8; HEADER_LEN], &[u8])> {
    data.chunks(MAX_WRITE_PAYLOAD).map(move |c| (encode_header(id, c.len() as u32), c))
}

/// The bytes a write of `data` on connection `id` puts on the trunk.
pub fn encode_frames(id: ConnId, data: &[u8]) -> Vec<u8> {
    let n = data.len().div_ceil(MAX_WRITE_PAYLOAD);
    let mut out = Vec::with_capacity(data.len() + n * HEADER_LEN);
    for (h, p) in frames(id, data) {
        out.extend_from_slice(&h);
        out.extend_from_slice(p);
    }
    out
}

type TrunkWriter = Pin<Box<dyn AsyncWrite + Send>>;
type TrunkReader = Pin<Box<dyn AsyncRead + Send>>;
type ConnWriter = Arc<tokio::sync::Mutex<WriteHalf<DuplexStream>>>;

struct Inner {
    writer: tokio::sync::Mutex<TrunkWriter>,
    reader: Mutex<Option<TrunkReader>>,
    conns: Mutex<HashMap<ConnId, ConnWriter>>,
    /// Bytes each sub-connection has put on the trunk so far.
    forwarded: Mutex<HashMap<ConnId, tokio::sync::watch::Sender<u64>>>,
    closed: CancellationToken,
    reason: Mutex<Option<String>>,
    read_limit: usize,
}

/// A multiplexer over one trunk stream. Cloning shares it.
#[derive(Clone)]
pub struct Mux {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").field("closed", &self.is_closed()).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mux {
    /// A mux over `trunk`. Reading starts with [`Mux::start`], so that the connections can be
    /// opened first (frames for ids not yet open would be dropped).
    pub fn new<T>(trunk: T) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        Mux::with_read_limit(trunk, MAX_PAYLOAD)
    }

    /// A mux that closes when a frame larger than `read_limit` arrives, as a Go ttrpc peer over
    /// upstream's mux does (its 4,096-byte read buffer: `ENOMEM`, then the connection is closed).
    pub fn with_read_limit<T>(trunk: T, read_limit: usize) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, w) = tokio::io::split(trunk);
        Mux {
            inner: Arc::new(Inner {
                writer: tokio::sync::Mutex::new(Box::pin(w)),
                reader: Mutex::new(Some(Box::pin(r))),
                conns: Mutex::new(HashMap::new()),
                forwarded: Mutex::new(HashMap::new()),
                closed: CancellationToken::new(),
                reason: Mutex::new(None),
                read_limit: read_limit.min(MAX_PAYLOAD),
            }),
        }
    }

    /// Opens connection `id` locally. Id 0 is reserved; an id can be open once at a time.
    /// Needs a tokio runtime (the bridge to the trunk is a task).
    pub fn open(&self, id: ConnId) -> io::Result<SubConn> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("mux needs a tokio runtime: {e}")))?;
        if id == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "mux connection id 0 is reserved"));
        }
        if self.is_closed() {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "mux is closed"));
        }
        let (user, ours) = tokio::io::duplex(PIPE_CAPACITY);
        let (our_read, our_write) = tokio::io::split(ours);
        {
            let mut conns = lock(&self.inner.conns);
            if conns.contains_key(&id) {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("mux connection {id} is already open")));
            }
            conns.insert(id, Arc::new(tokio::sync::Mutex::new(our_write)));
        }
        lock(&self.inner.forwarded).insert(id, tokio::sync::watch::Sender::new(0));
        rt.spawn(self.clone().pump_out(id, our_read));
        Ok(user)
    }

    /// Starts reading the trunk (once; later calls do nothing). Outside a tokio runtime the
    /// mux closes instead.
    pub fn start(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.close_with("started outside a tokio runtime");
            return;
        };
        if let Some(reader) = lock(&self.inner.reader).take() {
            rt.spawn(self.clone().pump_in(reader));
        }
    }

    /// Closes the mux: the trunk is shut down and every sub-connection ends.
    pub fn close(&self) {
        self.close_with("closed locally");
    }

    fn close_with(&self, reason: &str) {
        {
            let mut r = lock(&self.inner.reason);
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        if self.inner.closed.is_cancelled() {
            return;
        }
        tracing::debug!(reason, "closing NRI mux");
        self.inner.closed.cancel();
        // Dropping our pipe ends makes every sub-connection read end of stream.
        lock(&self.inner.conns).clear();
        drop(lock(&self.inner.reader).take());
        // Shut the trunk down so the peer reads end of stream (the lock may be held by a frame
        // write in progress, hence a task).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            rt.spawn(async move {
                let mut w = inner.writer.lock().await;
                let _ = w.shutdown().await;
            });
        }
    }

    /// Watches how many bytes sub-connection `id` has put on the trunk (`None` if it was never
    /// opened). What was written into the sub-connection before the count reached `n` is on the
    /// trunk, in order, ahead of anything any sub-connection writes afterwards.
    pub fn forwarded(&self, id: ConnId) -> Option<tokio::sync::watch::Receiver<u64>> {
        lock(&self.inner.forwarded).get(&id).map(tokio::sync::watch::Sender::subscribe)
    }

    /// Whether the mux is closed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Why the mux closed (`None` while open).
    pub fn close_reason(&self) -> Option<String> {
        lock(&self.inner.reason).clone()
    }

    /// Resolves when the mux is closed.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await
    }

    /// Writes `data` on connection `id`, split into frames of at most [`MAX_WRITE_PAYLOAD`]
    /// bytes, all written under the trunk lock at once.
    pub async fn write(&self, id: ConnId, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.is_closed() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "mux is closed"));
        }
        let bytes = encode_frames(id, data);
        let mut w = self.inner.writer.lock().await;
        let res = async {
            w.write_all(&bytes).await?;
            w.flush().await
        }
        .await;
        drop(w);
        if let Err(e) = res {
            self.close_with(&format!("trunk write failed: {e}"));
            return Err(e);
        }
        Ok(())
    }

    /// Moves what the user writes into its sub-connection onto the trunk.
    async fn pump_out(self, id: ConnId, mut from: ReadHalf<DuplexStream>) {
        let mut buf = vec![0u8; PIPE_CAPACITY];
        loop {
            let n = tokio::select! {
                _ = self.inner.closed.cancelled() => return,
                n = from.read(&mut buf) => n,
            };
            match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if self.write(id, &buf[..n]).await.is_err() {
                        return;
                    }
                    if let Some(f) = lock(&self.inner.forwarded).get(&id) {
                        f.send_modify(|total| *total += n as u64);
                    }
                }
            }
        }
        // The user dropped or shut down its end: frames for this id are dropped from now on.
        lock(&self.inner.conns).remove(&id);
    }

    /// Reads frames from the trunk and hands each payload to its sub-connection.
    async fn pump_in(self, mut reader: TrunkReader) {
        let reason = tokio::select! {
            _ = self.inner.closed.cancelled() => return,
            r = self.read_frames(&mut reader) => r,
        };
        self.close_with(&reason);
    }

    async fn read_frames(&self, reader: &mut TrunkReader) -> String {
        let mut header = [0u8; HEADER_LEN];
        loop {
            if let Err(e) = reader.read_exact(&mut header).await {
                return if e.kind() == io::ErrorKind::UnexpectedEof {
                    "trunk closed by peer".to_string()
                } else {
                    format!("trunk read failed: {e}")
                };
            }
            let (id, len) = decode_header(&header);
            let len = len as usize;
            let limit = self.inner.read_limit;
            if len > limit {
                return if limit < MAX_PAYLOAD {
                    format!(
                        "frame for connection {id} too large for the reader's {limit}-byte buffer ({len} bytes; \
                         ENOMEM in Go ttrpc over upstream's mux)"
                    )
                } else {
                    format!("frame for connection {id} too large ({len} > {MAX_PAYLOAD} bytes)")
                };
            }
            let mut payload = vec![0u8; len];
            if let Err(e) = reader.read_exact(&mut payload).await {
                return format!("trunk read failed in a frame: {e}");
            }
            let conn = lock(&self.inner.conns).get(&id).cloned();
            let Some(conn) = conn else {
                tracing::trace!(id, len, "dropping mux frame for a connection that is not open");
                continue;
            };
            let mut w = conn.lock().await;
            if w.write_all(&payload).await.is_err() {
                // The user dropped its end.
                drop(w);
                lock(&self.inner.conns).remove(&id);
            }
        }
    }
}
