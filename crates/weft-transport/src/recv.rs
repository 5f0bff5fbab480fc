//! The receiving side of a direct edge: a listener that accepts links from upstream senders and
//! hands each message to the user's handler.
//!
//! - **Concurrency.** At most [`ReceiverConfig::concurrency`] handlers run at once, over all
//!   links. When all are busy the link readers stop reading, the backend's buffers fill, and the
//!   senders' in-flight bounds apply (their `onFull` choice decides what happens upstream).
//! - **Acknowledgement.** A message is acknowledged only after its handler returned `Ok`; a
//!   handler error is sent back as a nack and the sender delivers the message again (after
//!   [`crate::SenderConfig::redeliver_delay`], to another receiver when there is one). Acks are
//!   batched: whatever is ready when the link's writer wakes goes in one frame.
//! - **Hung handlers.** A handler that has not finished after
//!   [`ReceiverConfig::handler_timeout`] (default 5 minutes) is cancelled (its future is
//!   dropped) and the message is nacked, so the sender delivers it again instead of waiting on
//!   it for ever. Work the handler spawned elsewhere is not stopped.
//! - **Liveness.** A link on which the receiver wrote nothing for
//!   [`ReceiverConfig::alive_interval`] gets an alive frame, so a sender can tell a slow receiver
//!   from a hung or stopped one ([`crate::SenderConfig::silence_timeout`]).
//! - **Duplicates.** Ids are remembered in a [`DedupWindow`]: a message whose id is done is
//!   acknowledged again without running the handler; one whose handler is still running waits
//!   for that outcome. The window keeps [`ReceiverConfig::dedup_capacity`] done ids for at most
//!   [`ReceiverConfig::dedup_ttl`] (defaults: 262144 ids, 60 s, JetStream's duplicate window);
//!   a duplicate that arrives after its id was forgotten runs the handler again.
//! - **Watermark.** Each sender introduces itself (hello) and carries its watermark in every
//!   message and, when idle, in watermark frames. The input watermark is the minimum over the
//!   upstream senders, never going back ([`input_watermark`]). A sender counts while it has a
//!   link, and for [`ReceiverConfig::sender_linger`] after its last link closed (a reconnecting
//!   sender keeps its place; a sender that is gone stops holding the watermark back).

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;

use crate::backend::{Backend, FrameListener, FrameReader, FrameWriter, is_setup_failure};
use crate::policy::{DedupWindow, Seen, input_watermark};
use crate::protocol::{Control, Message, NO_WATERMARK, decode, encode_ack, encode_alive, encode_nack};

/// The port receivers listen on unless configured, and the port [`crate::DnsPeers`] connects to
/// when DNS names none (A/AAAA answers, or SRV port 0).
pub const DEFAULT_PORT: u16 = 7470;
/// Environment variable with the address to listen on: `ip` (port [`DEFAULT_PORT`]) or
/// `ip:port`. It should be the pod's address on the second NIC. Unset: all addresses
/// (`0.0.0.0:7470`), which includes the second NIC.
pub const LISTEN_ENV: &str = "WEFT_TRANSPORT_LISTEN";

/// What the receiver calls for each message. Any `Fn(Message) -> impl Future<Output =
/// Result<(), E>>` closure is one.
pub trait Handler: Send + Sync + 'static {
    /// The handler's error; its text goes back to the sender in the nack.
    type Error: Display + Send;
    /// Handles one message; `Ok` acknowledges it to the sender.
    fn handle(&self, message: Message) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

impl<F, Fut, E> Handler for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Display + Send,
{
    type Error = E;
    fn handle(&self, message: Message) -> impl Future<Output = Result<(), E>> + Send {
        self(message)
    }
}

/// Receiver settings.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// Handlers running at once, over all links.
    pub concurrency: usize,
    /// Done ids remembered for deduplication.
    pub dedup_capacity: usize,
    /// How long a done id is remembered.
    pub dedup_ttl: Duration,
    /// How long a sender without links still counts for the watermark.
    pub sender_linger: Duration,
    /// How long a handler may run before it is cancelled and its message nacked; `None`: no
    /// limit. Default 5 minutes.
    pub handler_timeout: Option<Duration>,
    /// How long a link may go without a frame from this receiver before it sends an alive
    /// frame. Keep it well under the senders' [`crate::SenderConfig::silence_timeout`].
    /// Default 2 s.
    pub alive_interval: Duration,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            concurrency: 64,
            dedup_capacity: 262_144,
            dedup_ttl: Duration::from_secs(60),
            sender_linger: Duration::from_secs(10),
            handler_timeout: Some(Duration::from_secs(300)),
            alive_interval: Duration::from_secs(2),
        }
    }
}

/// Counters of a receiver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Data frames received (duplicates included).
    pub received: u64,
    /// Handlers that returned `Ok`.
    pub handled: u64,
    /// Handlers that returned an error (nacked).
    pub failed: u64,
    /// Handlers cancelled after [`ReceiverConfig::handler_timeout`] (nacked).
    pub timed_out: u64,
    /// Duplicates acknowledged without running the handler.
    pub duplicates: u64,
    /// Links accepted so far.
    pub links_accepted: u64,
    /// Links open now.
    pub links_open: u64,
}

/// A running receiver. Dropping it stops accepting and closes its links; handlers already
/// running finish.
pub struct Receiver {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

struct UpstreamSender {
    watermark: i64,
    links: usize,
    /// Bumped each time the last link closes, so a linger timer knows whether it is stale.
    generation: u64,
}

struct Shared {
    config: ReceiverConfig,
    semaphore: Arc<Semaphore>,
    dedup: Mutex<DedupWindow>,
    finished: Notify,
    /// Set by [`Receiver::close`]: links stop reading and drain.
    closing: watch::Sender<bool>,
    upstream: Mutex<HashMap<String, UpstreamSender>>,
    watermark: watch::Sender<i64>,
    received: AtomicU64,
    handled: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    duplicates: AtomicU64,
    links_accepted: AtomicU64,
    links_open: AtomicU64,
}

/// Locks `m`, going on with the data after a panic elsewhere (the receiver and the pull reader).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resolves once [`Receiver::close`] was called. (The watch's `Ref` is dropped inside, so the
/// future holds no lock guard and stays `Send`.)
async fn closed(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

enum Reply {
    Ack(u64),
    Nack(u64, String),
}

impl Receiver {
    /// Binds `addr` on `backend` and starts accepting links; each message goes to `handler`.
    /// Must be called inside a tokio runtime.
    pub async fn bind<B: Backend, H: Handler>(
        backend: &B,
        addr: SocketAddr,
        config: ReceiverConfig,
        handler: H,
    ) -> io::Result<Self> {
        if config.concurrency == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "receiver concurrency must be at least 1"));
        }
        if config.alive_interval.is_zero() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "receiver alive_interval must be above zero"));
        }
        if config.handler_timeout.is_some_and(|t| t.is_zero()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "receiver handler_timeout must be above zero (None for no limit)",
            ));
        }
        let listener = backend.bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (watermark, _) = watch::channel(NO_WATERMARK);
        let shared = Arc::new(Shared {
            semaphore: Arc::new(Semaphore::new(config.concurrency)),
            dedup: Mutex::new(DedupWindow::new(config.dedup_capacity, config.dedup_ttl)),
            finished: Notify::new(),
            closing: watch::channel(false).0,
            upstream: Mutex::new(HashMap::new()),
            watermark,
            received: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            links_accepted: AtomicU64::new(0),
            links_open: AtomicU64::new(0),
            config,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), Arc::new(handler), backend.name()));
        tracing::info!(%local_addr, backend = backend.name(), "weft-transport receiver listening");
        Ok(Self { shared, local_addr, accept })
    }

    /// Like [`bind`](Self::bind), on the address in [`LISTEN_ENV`] ([`listen_addr_from_env`]).
    pub async fn from_env<B: Backend, H: Handler>(backend: &B, config: ReceiverConfig, handler: H) -> io::Result<Self> {
        let addr = listen_addr_from_env().map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        Self::bind(backend, addr, config, handler).await
    }

    /// The address the receiver listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The input watermark now: the minimum over upstream senders; [`NO_WATERMARK`] until every
    /// sender has one.
    pub fn watermark(&self) -> i64 {
        *self.shared.watermark.borrow()
    }

    /// A watch of the input watermark, to wait for it to advance.
    pub fn watch_watermark(&self) -> watch::Receiver<i64> {
        self.shared.watermark.subscribe()
    }

    /// The upstream senders counted for the watermark and their watermarks, sorted by name.
    pub fn upstream(&self) -> Vec<(String, i64)> {
        let mut v: Vec<_> = lock(&self.shared.upstream).iter().map(|(k, s)| (k.clone(), s.watermark)).collect();
        v.sort();
        v
    }

    /// The counters now.
    pub fn stats(&self) -> ReceiverStats {
        let s = &self.shared;
        ReceiverStats {
            received: s.received.load(Ordering::Relaxed),
            handled: s.handled.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
            duplicates: s.duplicates.load(Ordering::Relaxed),
            links_accepted: s.links_accepted.load(Ordering::Relaxed),
            links_open: s.links_open.load(Ordering::Relaxed),
        }
    }

    /// Closes the receiver without handling anything twice: stops accepting and stops reading
    /// the links, lets the running handlers finish (each bounded by
    /// [`ReceiverConfig::handler_timeout`]), sends their acks and nacks, then closes the links.
    /// Messages read but not yet handed to a handler, and those still in flight, are not
    /// acknowledged: their senders send them again elsewhere when the link closes.
    pub async fn close(mut self) {
        self.shared.closing.send_replace(true);
        if let Err(e) = (&mut self.accept).await {
            tracing::error!(error = %e, "the receiver's accept task ended abnormally");
        }
        let n = u32::try_from(self.shared.config.concurrency).unwrap_or(u32::MAX);
        // Every permit back means no handler runs.
        let _all = self.shared.semaphore.acquire_many(n).await;
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The listen address from [`LISTEN_ENV`]: `ip`, `ip:port` or `[ipv6]:port`; all addresses on
/// [`DEFAULT_PORT`] when unset or empty.
pub fn listen_addr_from_env() -> Result<SocketAddr, String> {
    match std::env::var(LISTEN_ENV) {
        Ok(v) if !v.trim().is_empty() => parse_listen_addr(&v),
        _ => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT)),
    }
}

/// `ip` (port [`DEFAULT_PORT`]), `ip:port` or `[ipv6]:port`.
pub fn parse_listen_addr(value: &str) -> Result<SocketAddr, String> {
    let v = value.trim();
    if let Ok(addr) = v.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    Err(format!(
        "{LISTEN_ENV}='{value}' is not an IP address or ip:port (e.g. 192.168.10.7 or 192.168.10.7:{DEFAULT_PORT})"
    ))
}

async fn accept_loop<L: FrameListener, H: Handler>(
    mut listener: L,
    shared: Arc<Shared>,
    handler: Arc<H>,
    backend: &'static str,
) {
    let mut links = JoinSet::new();
    let mut closing = shared.closing.subscribe();
    loop {
        tokio::select! {
            () = closed(&mut closing) => {
                // Stop accepting; let the links drain.
                drop(listener);
                while links.join_next().await.is_some() {}
                return;
            }
            accepted = listener.accept() => match accepted {
                Ok((writer, reader, peer)) => {
                    shared.links_accepted.fetch_add(1, Ordering::Relaxed);
                    links.spawn(serve_link(writer, reader, peer, shared.clone(), handler.clone()));
                }
                Err(e) if is_setup_failure(&e) => {
                    tracing::warn!(backend, error = %e, "a link's setup failed; refused");
                }
                Err(e) => {
                    tracing::warn!(backend, error = %e, "accepting a link failed");
                    // Out of descriptors and the like: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = links.join_next(), if !links.is_empty() => {}
        }
    }
}

/// Counts a sender for the watermark while a link of its is open.
struct UpstreamGuard {
    shared: Arc<Shared>,
    sender: String,
}

impl Drop for UpstreamGuard {
    fn drop(&mut self) {
        let linger = self.shared.config.sender_linger;
        let generation = {
            let mut up = lock(&self.shared.upstream);
            let Some(s) = up.get_mut(&self.sender) else {
                return;
            };
            s.links = s.links.saturating_sub(1);
            if s.links > 0 {
                return;
            }
            s.generation += 1;
            if linger.is_zero() {
                up.remove(&self.sender);
                drop(up);
                self.shared.recompute_watermark();
                return;
            }
            s.generation
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        let sender = self.sender.clone();
        rt.spawn(async move {
            tokio::time::sleep(linger).await;
            let removed = {
                let mut up = lock(&shared.upstream);
                match up.get(&sender) {
                    Some(s) if s.links == 0 && s.generation == generation => {
                        up.remove(&sender);
                        true
                    }
                    _ => false,
                }
            };
            if removed {
                tracing::debug!(%sender, "upstream sender gone; no longer counted for the watermark");
                shared.recompute_watermark();
            }
        });
    }
}

impl Shared {
    fn register(self: &Arc<Self>, sender: &str, watermark: i64) -> UpstreamGuard {
        {
            let mut up = lock(&self.upstream);
            let s = up.entry(sender.to_string()).or_insert(UpstreamSender { watermark, links: 0, generation: 0 });
            s.links += 1;
            s.watermark = s.watermark.max(watermark);
        }
        self.recompute_watermark();
        UpstreamGuard { shared: self.clone(), sender: sender.to_string() }
    }

    fn observe(&self, sender: &str, watermark: i64) {
        let advanced = {
            let mut up = lock(&self.upstream);
            match up.get_mut(sender) {
                Some(s) if watermark > s.watermark => {
                    s.watermark = watermark;
                    true
                }
                _ => false,
            }
        };
        if advanced {
            self.recompute_watermark();
        }
    }

    fn recompute_watermark(&self) {
        let up = lock(&self.upstream);
        self.watermark.send_if_modified(|current| {
            let next = input_watermark(*current, up.values().map(|s| s.watermark));
            let changed = next != *current;
            *current = next;
            changed
        });
    }

    fn begin(&self, id: &str) -> Seen {
        lock(&self.dedup).begin(id, Instant::now())
    }

    fn finish(&self, id: &str, ok: bool) {
        lock(&self.dedup).finish(id, ok, Instant::now());
        self.finished.notify_waiters();
    }
}

/// An id marked in progress. Dropped without [`InProgress::finish`] (the link died before the
/// handler started, or the handler task was aborted or panicked), it forgets the id, so a
/// resend is not left waiting for ever on an id nobody is handling.
struct InProgress {
    shared: Arc<Shared>,
    id: Option<String>,
}

impl InProgress {
    fn new(shared: &Arc<Shared>, id: &str) -> Self {
        Self { shared: shared.clone(), id: Some(id.to_string()) }
    }

    fn finish(mut self, ok: bool) {
        if let Some(id) = self.id.take() {
            self.shared.finish(&id, ok);
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.finish(&id, false);
        }
    }
}

async fn run_handler<H: Handler>(
    shared: Arc<Shared>,
    handler: Arc<H>,
    message: Message,
    seq: u64,
    replies: mpsc::UnboundedSender<Reply>,
    progress: InProgress,
    permit: OwnedSemaphorePermit,
) {
    let run = handler.handle(message);
    let result = match shared.config.handler_timeout {
        Some(limit) => tokio::time::timeout(limit, run).await.map_err(|_| limit),
        None => Ok(run.await),
    };
    drop(permit);
    match result {
        Ok(Ok(())) => {
            progress.finish(true);
            shared.handled.fetch_add(1, Ordering::Relaxed);
            let _ = replies.send(Reply::Ack(seq));
        }
        Ok(Err(e)) => {
            progress.finish(false);
            shared.failed.fetch_add(1, Ordering::Relaxed);
            let _ = replies.send(Reply::Nack(seq, e.to_string()));
        }
        Err(limit) => {
            progress.finish(false);
            shared.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?limit, "a handler did not finish in time; cancelled, the message goes back to its sender");
            let _ = replies.send(Reply::Nack(seq, format!("the handler did not finish within {limit:?}")));
        }
    }
}

/// A duplicate of a message whose handler is running: wait for its outcome, then acknowledge
/// (it succeeded) or run the handler (it failed and the id was forgotten).
async fn await_outcome<H: Handler>(
    shared: Arc<Shared>,
    handler: Arc<H>,
    message: Message,
    seq: u64,
    replies: mpsc::UnboundedSender<Reply>,
) {
    loop {
        let finished = shared.finished.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        match shared.begin(&message.id) {
            Seen::Done => {
                shared.duplicates.fetch_add(1, Ordering::Relaxed);
                let _ = replies.send(Reply::Ack(seq));
                return;
            }
            Seen::New => break,
            Seen::InProgress => finished.await,
        }
    }
    let progress = InProgress::new(&shared, &message.id);
    let Ok(permit) = shared.semaphore.clone().acquire_owned().await else {
        return;
    };
    run_handler(shared, handler, message, seq, replies, progress, permit).await;
}

fn invalid(peer: SocketAddr, why: impl Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("link from {peer}: {why}"))
}

async fn read_loop<R: FrameReader, H: Handler>(
    reader: &mut R,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    handler: &Arc<H>,
    replies: mpsc::UnboundedSender<Reply>,
) -> io::Result<ReadEnd> {
    let mut sender: Option<UpstreamGuard> = None;
    let mut closing = shared.closing.subscribe();
    loop {
        let frame = tokio::select! {
            frame = reader.read_frame() => frame?,
            () = closed(&mut closing) => return Ok(ReadEnd::Closing),
        };
        let Some(frame) = frame else {
            return Ok(ReadEnd::Closed);
        };
        let control = decode(&frame.header, frame.payload).map_err(|e| invalid(peer, e))?;
        match control {
            Control::Hello { sender: name, watermark } => {
                if sender.is_some() {
                    return Err(invalid(peer, "a second hello on one link"));
                }
                tracing::debug!(%peer, sender = %name, "upstream sender connected");
                sender = Some(shared.register(&name, watermark));
            }
            Control::Data { seq, message } => {
                let Some(from) = &sender else {
                    return Err(invalid(peer, "data before the sender's hello"));
                };
                shared.received.fetch_add(1, Ordering::Relaxed);
                shared.observe(&from.sender, message.watermark);
                match shared.begin(&message.id) {
                    Seen::Done => {
                        shared.duplicates.fetch_add(1, Ordering::Relaxed);
                        let _ = replies.send(Reply::Ack(seq));
                    }
                    Seen::New => {
                        // From here the id is in progress; if this link dies before the
                        // handler starts, the guard forgets it again.
                        let progress = InProgress::new(shared, &message.id);
                        // Waiting here for a free handler is the backpressure: the link is
                        // not read while all handlers are busy.
                        let permit = tokio::select! {
                            permit = shared.semaphore.clone().acquire_owned() => permit,
                            // Never handed to a handler: the guard forgets the id, and the
                            // sender sends the message again when the link closes.
                            () = closed(&mut closing) => return Ok(ReadEnd::Closing),
                        };
                        let Ok(permit) = permit else {
                            return Ok(ReadEnd::Closed);
                        };
                        tokio::spawn(run_handler(
                            shared.clone(),
                            handler.clone(),
                            message,
                            seq,
                            replies.clone(),
                            progress,
                            permit,
                        ));
                    }
                    Seen::InProgress => {
                        tokio::spawn(await_outcome(shared.clone(), handler.clone(), message, seq, replies.clone()));
                    }
                }
            }
            Control::Watermark { watermark } => {
                let Some(from) = &sender else {
                    return Err(invalid(peer, "a watermark before the sender's hello"));
                };
                shared.observe(&from.sender, watermark);
            }
            other @ (Control::Ack { .. } | Control::Nack { .. } | Control::Alive) => {
                return Err(invalid(peer, format!("a sender sent {other}")));
            }
        }
    }
}

/// Writes acks and nacks, batching whatever is ready into one ack frame, and an alive frame
/// when it wrote nothing for `alive`.
async fn reply_loop<W: FrameWriter>(
    writer: &mut W,
    replies: &mut mpsc::UnboundedReceiver<Reply>,
    alive: Duration,
) -> io::Result<()> {
    const BATCH: usize = 4096;
    let mut buf = BytesMut::with_capacity(64);
    let mut acks = Vec::with_capacity(64);
    let mut nacks = Vec::new();
    let empty = Bytes::new();
    loop {
        let Ok(first) = tokio::time::timeout(alive, replies.recv()).await else {
            buf.clear();
            encode_alive(&mut buf);
            writer.write_frame(&buf, &empty).await?;
            continue;
        };
        let Some(first) = first else {
            break;
        };
        let mut next = Some(first);
        while let Some(reply) = next.take() {
            match reply {
                Reply::Ack(seq) => acks.push(seq),
                Reply::Nack(seq, why) => nacks.push((seq, why)),
            }
            if acks.len() < BATCH {
                next = replies.try_recv().ok();
            }
        }
        if !acks.is_empty() {
            buf.clear();
            encode_ack(&mut buf, &acks).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            writer.write_frame(&buf, &empty).await?;
            acks.clear();
        }
        for (seq, why) in nacks.drain(..) {
            buf.clear();
            encode_nack(&mut buf, &[seq], &why).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            writer.write_frame(&buf, &empty).await?;
        }
    }
    Ok(())
}

async fn serve_link<W: FrameWriter, R: FrameReader, H: Handler>(
    mut writer: W,
    mut reader: R,
    peer: SocketAddr,
    shared: Arc<Shared>,
    handler: Arc<H>,
) {
    shared.links_open.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reading = read_loop(&mut reader, peer, &shared, &handler, tx);
    let replying = reply_loop(&mut writer, &mut rx, shared.config.alive_interval);
    tokio::pin!(reading, replying);
    let mut draining = false;
    let outcome = loop {
        tokio::select! {
            r = &mut reading, if !draining => match r {
                // Closing: the reader dropped its reply handle; the replies of the running
                // handlers still go out, and the writer ends once the last handler's did.
                Ok(ReadEnd::Closing) => draining = true,
                Ok(ReadEnd::Closed) => break Ok(()),
                Err(e) => break Err(e),
            },
            r = &mut replying => break r,
        }
    };
    shared.links_open.fetch_sub(1, Ordering::Relaxed);
    match outcome {
        Ok(()) if draining => tracing::debug!(%peer, "link drained and closed"),
        Ok(()) => tracing::debug!(%peer, "link closed"),
        Err(e) => tracing::warn!(%peer, error = %e, "link failed"),
    }
}

/// Why a link's reader stopped without an error.
enum ReadEnd {
    /// The sender closed the link.
    Closed,
    /// The receiver is closing: no more frames are read.
    Closing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_with_the_default_port() {
        assert_eq!(parse_listen_addr("192.168.10.7"), Ok("192.168.10.7:7470".parse().expect("addr")));
        assert_eq!(parse_listen_addr(" 10.0.0.1:9000 "), Ok("10.0.0.1:9000".parse().expect("addr")));
        assert_eq!(parse_listen_addr("[fd00::7]:7000"), Ok("[fd00::7]:7000".parse().expect("addr")));
        assert_eq!(parse_listen_addr("fd00::7"), Ok("[fd00::7]:7470".parse().expect("addr")));
        let err = parse_listen_addr("net1").expect_err("not an address");
        assert!(err.contains(LISTEN_ENV) && err.contains("net1"), "{err}");
    }
}
