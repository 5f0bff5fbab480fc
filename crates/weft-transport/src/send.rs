//! The sending side of a direct edge: links to every peer of one target, a selection policy,
//! reconnects with backoff, a bounded in-flight window with Numaflow's `onFull` choices, and
//! resends of whatever a lost link had not acknowledged.
//!
//! # How a message travels
//!
//! [`Sender::send`] checks the message, waits for room in the in-flight window (or drops the
//! message under [`OnFull::DiscardLatest`]), assigns it to a link by the [`Selection`] policy
//! and returns [`Sent::Queued`] with an [`AckHandle`]: a future that resolves when the receiver's
//! handler succeeded. A caller that must acknowledge upstream only after downstream did (as
//! Numaflow's tracker does) awaits it.
//!
//! Each link has a writer (the link's queue, then one frame per message, the payload never
//! copied) and a reader (acks and nacks). An ack frees the message's room. A nack puts the
//! message back after [`SenderConfig::redeliver_delay`], to another link when there is one.
//! When a link fails, every message assigned to it and not acknowledged goes to the other live
//! links (or waits for one), the peer is reconnected with jittered exponential backoff, and the
//! peer source is asked afresh (a DNS answer may be stale). Receivers drop duplicates by id, so
//! a resend of a message whose ack was lost is safe.
//!
//! # Silent receivers
//!
//! A receiver speaks on every link at least every
//! [`ReceiverConfig::alive_interval`](crate::ReceiverConfig::alive_interval) (acks, nacks, or
//! an alive frame when it has nothing else). A link that has messages outstanding and heard
//! nothing for [`SenderConfig::silence_timeout`] is failed like a broken one: its messages go
//! to the other links and the peer is reconnected, with a backoff that keeps growing while the
//! peer stays silent. This catches what TCP does not: a receiver process that is stopped or
//! hung while its kernel still acknowledges the bytes. Its handlers may still finish the
//! messages it had, so those can be handled twice (once there, once by the receiver they moved
//! to): at least once, as with JetStream's `ackWait` redelivery.
//!
//! # Peers
//!
//! A supervisor task resolves the [`PeerSource`] when its answer expires (and, at most every
//! [`SenderConfig::min_resolve_interval`], after a connection failure). A new peer gets a link;
//! a removed peer's link takes no new messages, and is closed once everything assigned to it
//! was acknowledged (drained), so a peer set change loses nothing.
//!
//! # Watermark
//!
//! The sender's watermark is the highest [`Message::watermark`] it was given, or set with
//! [`Sender::set_watermark`]. Every message carries its own; when a link has nothing to send
//! and the watermark moved past what it last carried, it sends a watermark frame, so an idle
//! sender does not hold back its receivers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
// Message keys and sequence numbers are this sender's own counters: a fast non-keyed hash is
// enough (nothing a peer sends picks them).
use rustc_hash::FxHashMap;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::backend::{Backend, FrameReader, FrameWriter};
use crate::policy::{Backoff, Candidate, InFlightLimit, OnFull, Selection, pick};
use crate::protocol::{
    Control, DEFAULT_MAX_HEADER, DEFAULT_MAX_PAYLOAD, EncodeError, Message, NO_WATERMARK, check_message, decode,
    encode_data, encode_hello, encode_watermark,
};
use crate::resolve::PeerSource;

/// Sender settings.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    /// Who this sender is to its receivers: they take the minimum watermark over senders by
    /// this name. Unique per sending process and target; the default is
    /// `<HOSTNAME>-<pid>-<n>`.
    pub identity: String,
    /// How a link is picked for each message.
    pub selection: Selection,
    /// What `send` does when the in-flight window is full.
    pub on_full: OnFull,
    /// The in-flight window: messages and bytes not yet acknowledged.
    pub in_flight: InFlightLimit,
    /// Reconnect (and failed re-resolve) backoff.
    pub backoff: Backoff,
    /// The largest encoded header.
    pub max_header: usize,
    /// The largest payload.
    pub max_payload: usize,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// The shortest time between two resolutions of the peer source.
    pub min_resolve_interval: Duration,
    /// How long a nacked message waits before it is sent again.
    pub redeliver_delay: Duration,
    /// How long a link with messages outstanding may hear nothing from its receiver before it
    /// is failed and its messages go elsewhere; `None`: wait for ever. Keep it well above the
    /// receivers' [`ReceiverConfig::alive_interval`](crate::ReceiverConfig::alive_interval).
    /// Default 10 s.
    pub silence_timeout: Option<Duration>,
}

static SENDER_COUNT: AtomicU64 = AtomicU64::new(0);

/// `<HOSTNAME>-<pid>-<n>`: unique per sender in a pod.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "weft".to_string());
    let n = SENDER_COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{host}-{}-{n}", std::process::id())
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self {
            identity: default_identity(),
            selection: Selection::RoundRobin,
            on_full: OnFull::RetryUntilSuccess,
            in_flight: InFlightLimit::default(),
            backoff: Backoff::default(),
            max_header: DEFAULT_MAX_HEADER,
            max_payload: DEFAULT_MAX_PAYLOAD,
            connect_timeout: Duration::from_secs(5),
            min_resolve_interval: Duration::from_millis(500),
            redeliver_delay: Duration::from_millis(100),
            silence_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// Why a message was not sent or not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The header cannot be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The payload is over the configured limit.
    #[error("payload of {size} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
    /// The message alone is larger than the whole in-flight window.
    #[error(
        "message of {size} bytes can never fit the in-flight window of {limit} bytes; raise the window or split the message"
    )]
    LargerThanWindow { size: usize, limit: usize },
    /// The sender was dropped before the message was acknowledged.
    #[error("the sender was closed before the message was acknowledged")]
    Closed,
}

/// What became of a message given to [`Sender::send`].
#[derive(Debug)]
#[must_use = "a queued message's AckHandle says when it was handled downstream"]
pub enum Sent {
    /// Queued; the handle resolves when the receiver acknowledged it.
    Queued(AckHandle),
    /// Dropped because the window was full and the policy is [`OnFull::DiscardLatest`].
    Dropped,
}

impl Sent {
    /// Whether the message was dropped.
    pub fn is_dropped(&self) -> bool {
        matches!(self, Sent::Dropped)
    }

    /// Waits for the acknowledgement; `Ok(false)` when the message was dropped.
    pub async fn acked(self) -> Result<bool, SendError> {
        match self {
            Sent::Queued(h) => h.await.map(|()| true),
            Sent::Dropped => Ok(false),
        }
    }
}

/// Resolves when the message was acknowledged by a receiver whose handler succeeded.
#[derive(Debug)]
pub struct AckHandle {
    rx: oneshot::Receiver<Result<(), SendError>>,
}

impl Future for AckHandle {
    type Output = Result<(), SendError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(SendError::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One link as seen from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStats {
    /// The peer.
    pub peer: SocketAddr,
    /// Messages assigned to it and not acknowledged.
    pub outstanding: usize,
    /// Whether it takes new messages (its peer is in the peer set).
    pub open: bool,
}

/// Counters and state of a sender.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages in the window now (queued or sent, not acknowledged).
    pub in_flight: usize,
    /// Their bytes (payload plus header).
    pub in_flight_bytes: usize,
    /// The most bytes ever in the window.
    pub peak_in_flight_bytes: usize,
    /// Messages accepted by `send`.
    pub queued: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Messages dropped by [`OnFull::DiscardLatest`].
    pub dropped: u64,
    /// Messages written to a link that failed before acknowledging them, sent again.
    pub resent: u64,
    /// Nacks received (each a delivery again).
    pub nacked: u64,
    /// Connections opened.
    pub connects: u64,
    /// Connection attempts and links that failed.
    pub link_failures: u64,
    /// Links failed because their receiver was silent for [`SenderConfig::silence_timeout`]
    /// (counted in `link_failures` too).
    pub silent_links: u64,
    /// Resolutions of the peer source.
    pub resolutions: u64,
    /// The peer set now.
    pub peers: Vec<SocketAddr>,
    /// The connected links.
    pub links: Vec<LinkStats>,
}

/// Sends messages to one target. Cloning gives another handle to the same sender; when the last
/// handle is dropped its links close and unacknowledged messages fail with
/// [`SendError::Closed`].
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("identity", &self.inner.shared.config.identity)
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

struct Inner {
    shared: Arc<Shared>,
    supervisor: tokio::task::JoinHandle<()>,
    target: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.supervisor.abort();
        let acks: Vec<_> = {
            let mut st = self.shared.lock();
            st.closed = true;
            st.pending.drain().filter_map(|(_, mut p)| p.ack.take()).collect()
        };
        for ack in acks {
            let _ = ack.send(Err(SendError::Closed));
        }
        self.shared.room.notify_waiters();
        self.shared.changed.notify_waiters();
    }
}

struct Pending {
    message: Arc<Message>,
    size: usize,
    ack: Option<oneshot::Sender<Result<(), SendError>>>,
    /// The link it is assigned to.
    link: Option<u64>,
    /// The link that last had it (failed or nacked): avoided when reassigning.
    last_link: Option<u64>,
    /// Written to its link's backend (so a failure of that link means a resend).
    written: bool,
}

struct Link {
    id: u64,
    peer: SocketAddr,
    tx: mpsc::UnboundedSender<u64>,
    outstanding: usize,
    next_seq: u64,
    /// Sequence number on this link → message key.
    seqs: FxHashMap<u64, u64>,
    /// When the receiver last spoke, or when the link last went from nothing outstanding to
    /// something (silence only counts while there is something to hear about).
    last_heard: Instant,
}

#[derive(Default)]
struct State {
    next_key: u64,
    next_link: u64,
    pending: FxHashMap<u64, Pending>,
    unassigned: VecDeque<u64>,
    links: Vec<Link>,
    wanted: HashSet<SocketAddr>,
    cursor: usize,
    scratch: Vec<Candidate>,
    in_flight_bytes: usize,
    peak_in_flight_bytes: usize,
    closed: bool,
    queued: u64,
    acked: u64,
    dropped: u64,
    resent: u64,
    nacked: u64,
    connects: u64,
    link_failures: u64,
    silent_links: u64,
    resolutions: u64,
}

struct Shared {
    config: SenderConfig,
    state: Mutex<State>,
    /// Room was made in the window (or the sender closed).
    room: Notify,
    /// Acks arrived, a link came or went, or the peer set changed.
    changed: Notify,
    /// A connection failed: resolve again.
    resolve_now: Notify,
    watermark: watch::Sender<i64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data: a panic elsewhere while holding it leaves nothing half-updated that
        // matters more than stopping would.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Assigns waiting messages to links by the policy, as long as a link is open.
    fn dispatch(&mut self, policy: Selection) {
        if self.unassigned.is_empty() {
            return;
        }
        let mut cands = std::mem::take(&mut self.scratch);
        cands.clear();
        cands.extend(
            self.links.iter().map(|l| Candidate { open: self.wanted.contains(&l.peer), outstanding: l.outstanding }),
        );
        while let Some(&key) = self.unassigned.front() {
            let Some(p) = self.pending.get_mut(&key) else {
                self.unassigned.pop_front();
                continue;
            };
            let avoid = p.last_link.and_then(|id| self.links.iter().position(|l| l.id == id));
            let Some(i) = pick(policy, &cands, &mut self.cursor, avoid) else {
                break;
            };
            self.unassigned.pop_front();
            let link = &mut self.links[i];
            // The receiving end lives as long as the link is in `links`.
            if link.tx.send(key).is_ok() {
                p.link = Some(link.id);
                if link.outstanding == 0 {
                    link.last_heard = Instant::now();
                }
                link.outstanding += 1;
                cands[i].outstanding += 1;
            } else {
                self.unassigned.push_front(key);
                cands[i].open = false;
            }
        }
        self.scratch = cands;
    }

    /// Takes a link out and puts back every message it had not acknowledged.
    fn remove_link(&mut self, id: u64, policy: Selection) {
        let Some(pos) = self.links.iter().position(|l| l.id == id) else {
            return;
        };
        self.links.remove(pos);
        let mut keys: Vec<u64> = self.pending.iter().filter(|(_, p)| p.link == Some(id)).map(|(k, _)| *k).collect();
        keys.sort_unstable();
        for key in keys.iter().rev() {
            if let Some(p) = self.pending.get_mut(key) {
                p.link = None;
                p.last_link = Some(id);
                if p.written {
                    p.written = false;
                    self.resent += 1;
                }
            }
            self.unassigned.push_front(*key);
        }
        self.dispatch(policy);
    }
}

impl Sender {
    /// Starts a sender to the peers `source` gives, over `backend`. Must be called inside a
    /// tokio runtime; the sender's tasks run until the last handle is dropped.
    pub fn new<B: Backend, S: PeerSource>(backend: B, source: S, config: SenderConfig) -> Self {
        let (watermark, _) = watch::channel(NO_WATERMARK);
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State::default()),
            room: Notify::new(),
            changed: Notify::new(),
            resolve_now: Notify::new(),
            watermark,
        });
        let target = source.target();
        let supervisor = tokio::spawn(supervise(shared.clone(), Arc::new(backend), source));
        Self { inner: Arc::new(Inner { shared, supervisor, target }) }
    }

    /// This sender's identity.
    pub fn identity(&self) -> &str {
        &self.inner.shared.config.identity
    }

    /// Queues `message` for one of the peers. Returns once it is in the in-flight window
    /// (waiting for room under [`OnFull::RetryUntilSuccess`]) or dropped (under
    /// [`OnFull::DiscardLatest`] when the window is full). Errors: a message that cannot be
    /// encoded, or can never fit, or a closed sender.
    pub async fn send(&self, message: Message) -> Result<Sent, SendError> {
        let shared = &self.inner.shared;
        let config = &shared.config;
        check_message(&message, config.max_header)?;
        if message.payload.len() > config.max_payload {
            return Err(SendError::PayloadTooLarge { size: message.payload.len(), limit: config.max_payload });
        }
        let size = message.header_len() + message.payload.len();
        if size > config.in_flight.bytes {
            return Err(SendError::LargerThanWindow { size, limit: config.in_flight.bytes });
        }
        self.set_watermark(message.watermark);
        let message = Arc::new(message);
        loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut st = shared.lock();
                if st.closed {
                    return Err(SendError::Closed);
                }
                if config.in_flight.fits(st.pending.len(), st.in_flight_bytes, size) {
                    let key = st.next_key;
                    st.next_key += 1;
                    let (tx, rx) = oneshot::channel();
                    st.pending.insert(
                        key,
                        Pending { message, size, ack: Some(tx), link: None, last_link: None, written: false },
                    );
                    st.in_flight_bytes += size;
                    st.peak_in_flight_bytes = st.peak_in_flight_bytes.max(st.in_flight_bytes);
                    st.queued += 1;
                    st.unassigned.push_back(key);
                    st.dispatch(config.selection);
                    return Ok(Sent::Queued(AckHandle { rx }));
                }
                if config.on_full == OnFull::DiscardLatest {
                    st.dropped += 1;
                    return Ok(Sent::Dropped);
                }
            }
            room.await;
        }
    }

    /// Whether the in-flight window has no room for another message now: what `send` would
    /// wait on, or drop under [`OnFull::DiscardLatest`] (Numaflow's `ISBWriter::is_full`).
    pub fn is_full(&self) -> bool {
        let shared = &self.inner.shared;
        let st = shared.lock();
        !shared.config.in_flight.fits(st.pending.len(), st.in_flight_bytes, 1)
    }

    /// Raises the sender's watermark (it never goes back); idle links pass it on.
    pub fn set_watermark(&self, watermark: i64) {
        self.inner.shared.watermark.send_if_modified(|w| {
            if watermark > *w {
                *w = watermark;
                true
            } else {
                false
            }
        });
    }

    /// The sender's watermark.
    pub fn watermark(&self) -> i64 {
        *self.inner.shared.watermark.borrow()
    }

    /// Waits until every queued message was acknowledged.
    pub async fn flush(&self) {
        let shared = &self.inner.shared;
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let st = shared.lock();
                if st.pending.is_empty() || st.closed {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Waits until at least `n` links are connected and open (messages sent before go to the
    /// links already up). Returns at once when the sender is closed.
    pub async fn wait_for_links(&self, n: usize) {
        let shared = &self.inner.shared;
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let st = shared.lock();
                let open = st.links.iter().filter(|l| st.wanted.contains(&l.peer)).count();
                if open >= n || st.closed {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Counters and links now.
    pub fn stats(&self) -> SenderStats {
        let st = self.inner.shared.lock();
        let mut peers: Vec<_> = st.wanted.iter().copied().collect();
        peers.sort();
        SenderStats {
            in_flight: st.pending.len(),
            in_flight_bytes: st.in_flight_bytes,
            peak_in_flight_bytes: st.peak_in_flight_bytes,
            queued: st.queued,
            acked: st.acked,
            dropped: st.dropped,
            resent: st.resent,
            nacked: st.nacked,
            connects: st.connects,
            link_failures: st.link_failures,
            silent_links: st.silent_links,
            resolutions: st.resolutions,
            peers,
            links: st
                .links
                .iter()
                .map(|l| LinkStats { peer: l.peer, outstanding: l.outstanding, open: st.wanted.contains(&l.peer) })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Supervisor: the peer set

async fn supervise<B: Backend, S: PeerSource>(shared: Arc<Shared>, backend: Arc<B>, source: S) {
    let target = source.target();
    let mut tasks: JoinSet<SocketAddr> = JoinSet::new();
    // The peer each task serves, also when the task ends abnormally (a panic carries no result).
    let mut running: HashMap<tokio::task::Id, SocketAddr> = HashMap::new();
    let mut failures: u32 = 0;
    let mut invalidate = false;
    loop {
        if invalidate {
            source.invalidate();
        }
        let resolved_at = Instant::now();
        let next = match source.resolve().await {
            Ok(set) => {
                failures = 0;
                let changed = {
                    let mut st = shared.lock();
                    st.resolutions += 1;
                    let wanted: HashSet<SocketAddr> = set.addrs.iter().copied().collect();
                    let changed = wanted != st.wanted;
                    st.wanted = wanted;
                    st.dispatch(shared.config.selection);
                    changed
                };
                if changed {
                    tracing::info!(%target, peers = ?set.addrs, "peer set");
                }
                for addr in &set.addrs {
                    if !running.values().any(|a| a == addr) {
                        let task = tasks.spawn(run_peer(shared.clone(), backend.clone(), *addr));
                        running.insert(task.id(), *addr);
                    }
                }
                shared.changed.notify_waiters();
                set.valid_until
            }
            Err(e) => {
                tracing::warn!(%target, error = %e, "resolving peers failed; keeping the current ones");
                let delay = shared.config.backoff.delay(failures, rand::random());
                failures = failures.saturating_add(1);
                Some(Instant::now() + delay)
            }
        };
        let earliest = resolved_at + shared.config.min_resolve_interval;
        let deadline = next.map(|n| n.max(earliest));
        loop {
            let expiry = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = expiry => {
                    invalidate = false;
                    break;
                }
                _ = shared.resolve_now.notified() => {
                    tokio::time::sleep_until(earliest.into()).await;
                    invalidate = true;
                    break;
                }
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    let id = match &done {
                        Ok((id, _)) => *id,
                        Err(e) => {
                            tracing::error!(%target, error = %e, "a peer task ended abnormally");
                            e.id()
                        }
                    };
                    let Some(addr) = running.remove(&id) else { continue };
                    if done.is_err() {
                        // A bug, not a network failure: serve the peer again from the next
                        // resolution (rate-limited), not at once in a loop.
                        shared.resolve_now.notify_one();
                        continue;
                    }
                    // Removed and wanted again while it was draining: serve it anew.
                    if shared.lock().wanted.contains(&addr) {
                        let task = tasks.spawn(run_peer(shared.clone(), backend.clone(), addr));
                        running.insert(task.id(), addr);
                    }
                }
            }
        }
    }
}

fn is_wanted(shared: &Shared, addr: SocketAddr) -> bool {
    shared.lock().wanted.contains(&addr)
}

/// Keeps a link to `addr` while it is wanted: connect, serve, reconnect with backoff. Returns
/// once the peer is no longer wanted and its link (if any) drained.
async fn run_peer<B: Backend>(shared: Arc<Shared>, backend: Arc<B>, addr: SocketAddr) -> SocketAddr {
    let mut attempt: u32 = 0;
    loop {
        if !is_wanted(&shared, addr) {
            return addr;
        }
        let connected = tokio::time::timeout(shared.config.connect_timeout, backend.connect(addr)).await;
        match connected {
            Ok(Ok((writer, reader))) => match run_link(&shared, addr, writer, reader).await {
                LinkEnd::Drained => return addr,
                LinkEnd::Failed(e) => {
                    // It connected and worked: reconnect at once.
                    attempt = 0;
                    tracing::warn!(peer = %addr, error = %e, "link failed; its unacknowledged messages go elsewhere");
                    shared.lock().link_failures += 1;
                    shared.resolve_now.notify_one();
                }
                LinkEnd::Silent(silence) => {
                    // Connecting to a stopped process succeeds (its kernel accepts): keep the
                    // backoff growing so its links do not keep taking messages.
                    tracing::warn!(peer = %addr, ?silence, "the receiver said nothing with messages outstanding; its messages go elsewhere");
                    let mut st = shared.lock();
                    st.link_failures += 1;
                    st.silent_links += 1;
                }
            },
            Ok(Err(e)) => {
                tracing::debug!(peer = %addr, error = %e, "connecting failed");
                shared.lock().link_failures += 1;
                shared.resolve_now.notify_one();
            }
            Err(_) => {
                tracing::debug!(peer = %addr, "connecting timed out");
                shared.lock().link_failures += 1;
                shared.resolve_now.notify_one();
            }
        }
        let delay = shared.config.backoff.delay(attempt, rand::random());
        attempt = attempt.saturating_add(1);
        // Back off, but stop early once the peer is no longer wanted.
        let unwanted = async {
            loop {
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if !is_wanted(&shared, addr) {
                    return;
                }
                changed.await;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = unwanted => {}
        }
    }
}

enum LinkEnd {
    Drained,
    Failed(io::Error),
    /// The receiver said nothing for this long with messages outstanding.
    Silent(Duration),
}

async fn run_link<W: FrameWriter, R: FrameReader>(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    mut writer: W,
    mut reader: R,
) -> LinkEnd {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = {
        let mut st = shared.lock();
        let id = st.next_link;
        st.next_link += 1;
        st.connects += 1;
        st.links.push(Link {
            id,
            peer,
            tx,
            outstanding: 0,
            next_seq: 0,
            seqs: FxHashMap::default(),
            last_heard: Instant::now(),
        });
        st.dispatch(shared.config.selection);
        id
    };
    tracing::debug!(%peer, link = id, "link up");
    shared.changed.notify_waiters();
    let mut wm = shared.watermark.subscribe();
    let end = tokio::select! {
        r = write_loop(shared, id, &mut writer, &mut rx, &mut wm) => LinkEnd::Failed(
            r.err().unwrap_or_else(|| io::Error::other("the link's writer stopped"))),
        r = read_loop(shared, id, &mut reader) => LinkEnd::Failed(
            r.err().unwrap_or_else(|| io::Error::other("the link's reader stopped"))),
        () = drained(shared, id, peer) => LinkEnd::Drained,
        silence = silent(shared, id) => LinkEnd::Silent(silence),
    };
    shared.lock().remove_link(id, shared.config.selection);
    shared.changed.notify_waiters();
    if matches!(end, LinkEnd::Drained) {
        tracing::info!(%peer, "peer left the peer set; its link drained and closed");
    }
    end
}

/// Resolves once the peer is no longer wanted and the link has nothing outstanding.
async fn drained(shared: &Shared, id: u64, peer: SocketAddr) {
    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let st = shared.lock();
            let outstanding = st.links.iter().find(|l| l.id == id).map_or(0, |l| l.outstanding);
            if !st.wanted.contains(&peer) && outstanding == 0 {
                return;
            }
        }
        changed.await;
    }
}

/// Resolves when link `id` has had messages outstanding and heard nothing from its receiver for
/// [`SenderConfig::silence_timeout`]; never when that is `None`.
async fn silent(shared: &Shared, id: u64) -> Duration {
    let Some(limit) = shared.config.silence_timeout else {
        return std::future::pending().await;
    };
    loop {
        let now = Instant::now();
        let deadline = match shared.lock().links.iter().find(|l| l.id == id) {
            // Nothing to hear about: look again in a while (dispatch restarts the clock when
            // something is assigned).
            Some(link) if link.outstanding == 0 => now + limit,
            Some(link) => {
                let silence = now.saturating_duration_since(link.last_heard);
                if silence >= limit {
                    return silence;
                }
                link.last_heard + limit
            }
            // Not registered (yet, or any more): the link's other arms decide.
            None => now + limit,
        };
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// Notes that link `id`'s receiver spoke.
fn heard(links: &mut [Link], id: u64) -> Option<&mut Link> {
    let link = links.iter_mut().find(|l| l.id == id)?;
    link.last_heard = Instant::now();
    Some(link)
}

/// Messages gathered into one `write_frames` call at most.
const BATCH_MESSAGES: usize = 64;
/// Payload bytes after which a batch takes no more messages (large messages go one by one).
const BATCH_BYTES: usize = 256 * 1024;

/// Takes the messages in `keys` that are still assigned to link `id`, gives each the link's
/// next sequence number, and appends them to `batch`.
fn claim(shared: &Shared, id: u64, keys: &[u64], batch: &mut Vec<(u64, Arc<Message>)>) {
    let mut guard = shared.lock();
    let st = &mut *guard;
    let Some(link) = st.links.iter_mut().find(|l| l.id == id) else {
        return;
    };
    for key in keys {
        match st.pending.get_mut(key) {
            Some(p) if p.link == Some(id) => {
                let seq = link.next_seq;
                link.next_seq += 1;
                link.seqs.insert(seq, *key);
                p.written = true;
                batch.push((seq, p.message.clone()));
            }
            // Acknowledged meanwhile, or moved to another link.
            _ => {}
        }
    }
}

async fn write_loop<W: FrameWriter>(
    shared: &Shared,
    id: u64,
    writer: &mut W,
    queue: &mut mpsc::UnboundedReceiver<u64>,
    watermark: &mut watch::Receiver<i64>,
) -> io::Result<()> {
    let config = &shared.config;
    let empty = Bytes::new();
    let mut buf = BytesMut::with_capacity(4096);
    let mut keys = Vec::with_capacity(BATCH_MESSAGES);
    let mut batch: Vec<(u64, Arc<Message>)> = Vec::with_capacity(BATCH_MESSAGES);
    let mut ends = Vec::with_capacity(BATCH_MESSAGES);
    let mut carried = *watermark.borrow_and_update();
    encode_hello(&mut buf, &config.identity, carried).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    writer.write_frame(&buf, &empty).await?;
    loop {
        tokio::select! {
            biased;
            key = queue.recv() => {
                let Some(key) = key else { return Ok(()) };
                // This message and whatever else queued up meanwhile, within the batch bounds.
                keys.clear();
                keys.push(key);
                while keys.len() < BATCH_MESSAGES {
                    match queue.try_recv() {
                        Ok(k) => keys.push(k),
                        Err(_) => break,
                    }
                }
                batch.clear();
                claim(shared, id, &keys, &mut batch);
                let mut at = 0;
                while at < batch.len() {
                    // Headers of one write, back to back in `buf`.
                    buf.clear();
                    ends.clear();
                    let mut bytes = 0;
                    let mut n = 0;
                    for (seq, message) in &batch[at..] {
                        if n > 0 && bytes >= BATCH_BYTES {
                            break;
                        }
                        encode_data(&mut buf, *seq, message, config.max_header)
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                        ends.push(buf.len());
                        bytes += message.payload.len();
                        n += 1;
                    }
                    let mut frames = Vec::with_capacity(n);
                    let mut start = 0;
                    for ((_, message), end) in batch[at..at + n].iter().zip(&ends) {
                        frames.push((&buf[start..*end], &message.payload));
                        start = *end;
                    }
                    writer.write_frames(&frames).await?;
                    for (_, message) in &batch[at..at + n] {
                        carried = carried.max(message.watermark);
                    }
                    at += n;
                }
            }
            changed = watermark.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let now = *watermark.borrow_and_update();
                if now > carried {
                    buf.clear();
                    encode_watermark(&mut buf, now);
                    writer.write_frame(&buf, &empty).await?;
                    carried = now;
                }
            }
        }
    }
}

async fn read_loop<R: FrameReader>(shared: &Arc<Shared>, id: u64, reader: &mut R) -> io::Result<()> {
    loop {
        let Some(frame) = reader.read_frame().await? else {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the receiver closed the link"));
        };
        let control =
            decode(&frame.header, frame.payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match control {
            Control::Ack { seqs } => on_ack(shared, id, &seqs),
            Control::Nack { seqs, reason } => on_nack(shared, id, &seqs, &reason),
            Control::Alive => {
                heard(&mut shared.lock().links, id);
            }
            other => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a receiver sent {other}")));
            }
        }
    }
}

fn on_ack(shared: &Shared, id: u64, seqs: &[u64]) {
    let mut acks = Vec::with_capacity(seqs.len());
    {
        let mut guard = shared.lock();
        let st = &mut *guard;
        let Some(link) = heard(&mut st.links, id) else {
            return;
        };
        for seq in seqs {
            let Some(key) = link.seqs.remove(seq) else {
                continue;
            };
            let Some(mut p) = st.pending.remove(&key) else {
                continue;
            };
            link.outstanding = link.outstanding.saturating_sub(1);
            st.in_flight_bytes -= p.size;
            st.acked += 1;
            if let Some(ack) = p.ack.take() {
                acks.push(ack);
            }
        }
    }
    for ack in acks {
        let _ = ack.send(Ok(()));
    }
    shared.room.notify_waiters();
    shared.changed.notify_waiters();
}

fn on_nack(shared: &Arc<Shared>, id: u64, seqs: &[u64], reason: &str) {
    let mut keys = Vec::new();
    {
        let mut guard = shared.lock();
        let st = &mut *guard;
        let Some(link) = heard(&mut st.links, id) else {
            return;
        };
        for seq in seqs {
            let Some(key) = link.seqs.remove(seq) else {
                continue;
            };
            if let Some(p) = st.pending.get_mut(&key) {
                link.outstanding = link.outstanding.saturating_sub(1);
                p.link = None;
                p.last_link = Some(id);
                p.written = false;
                st.nacked += 1;
                keys.push(key);
            }
        }
    }
    tracing::debug!(count = keys.len(), %reason, "handler failed downstream; delivering again");
    shared.changed.notify_waiters();
    if keys.is_empty() {
        return;
    }
    let delay = shared.config.redeliver_delay;
    let requeue = move |shared: &Shared| {
        let mut st = shared.lock();
        for key in keys {
            if st.pending.contains_key(&key) {
                st.unassigned.push_back(key);
            }
        }
        st.dispatch(shared.config.selection);
    };
    if delay.is_zero() {
        requeue(shared);
    } else {
        // A weak hold: a pending redelivery does not keep a dropped sender's state alive.
        let weak = Arc::downgrade(shared);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(shared) = weak.upgrade() {
                requeue(&shared);
            }
        });
    }
}
