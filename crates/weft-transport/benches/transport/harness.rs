//! The measuring harness every path runs under, so all paths are measured the same way.
//!
//! A path is a [`Link`]: a receiving side that listens and accepts, and a sending side that
//! connects. Each side runs on its own OS thread with its own single-threaded tokio runtime (the
//! box has two cores: one sender, one receiver; a broker such as nats-server competes with both).
//! Every message carries its sequence number (in the frame header, or the message id), and the
//! receiver checks that each arrives once, and in order where the path promises order: a path
//! that loses, duplicates or reorders a message fails the run instead of reporting a number.
//! After the data the sender sends one end marker; the arrival of the last message (the end
//! marker, or on an unordered path whichever came last) closes the measurement.
//!
//! - Throughput: the sender sends back to back for the duration; throughput is the data messages
//!   over the time from the first send to the end marker's arrival.
//! - Latency: the sender sends open loop at a fixed rate (message `i` is due at `start + i/rate`;
//!   it waits by sleeping for long gaps and spinning for short ones, so it keeps one core busy);
//!   the receiver records arrival minus due time, which counts queueing behind a late sender
//!   (no coordinated omission). A message whose successor is already due is sent with `more`
//!   set, so a path that gathers writes (as the throughput runs let it) can catch up.

use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;

/// The end marker's sequence number.
pub const END: u64 = u64::MAX;

/// How long a receiver waits for the next message before it calls the run broken (a hang guard
/// for a sender that died, not a timing assertion).
const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// A data path under test.
pub(crate) trait Link: Sync {
    type Listening;
    type Tx: Tx;
    type Rx: Rx;
    /// Opens the receiving side; returns what the sender connects to.
    async fn listen(&self) -> anyhow::Result<(Self::Listening, String)>;
    /// Completes the receiving side (runs while the sender connects).
    async fn accept(&self, listening: Self::Listening) -> anyhow::Result<Self::Rx>;
    /// Opens the sending side to `endpoint`.
    async fn connect(&self, endpoint: &str) -> anyhow::Result<Self::Tx>;
    /// Whether messages arrive in the order they were sent (checked when so).
    fn ordered(&self) -> bool {
        true
    }
    /// Removes what the run left behind (after both sides are done).
    fn cleanup(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

pub(crate) trait Tx {
    /// Sends message `seq` with `payload`. `more`: another message follows right away (a path
    /// may hold this one back to write several at once); when false, it goes out now.
    async fn send(&mut self, seq: u64, payload: &Bytes, more: bool) -> anyhow::Result<()>;
    /// Waits until everything sent is delivered to the path (flushed, acknowledged).
    async fn finish(&mut self) -> anyhow::Result<()>;
    /// What the sending side knows of its state, for an error report.
    fn state(&self) -> String {
        String::new()
    }
}

pub(crate) trait Rx {
    /// The next message's sequence number, once the message is fully received (and, where the
    /// path has acks, acknowledged).
    async fn recv(&mut self) -> anyhow::Result<u64>;
}

/// One throughput measurement.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    pub size: usize,
    pub messages: u64,
    pub elapsed: Duration,
}

impl Throughput {
    pub fn bytes_per_s(&self) -> f64 {
        (self.messages as f64 * self.size as f64) / self.elapsed.as_secs_f64()
    }
    pub fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

/// One latency measurement.
pub struct Latency {
    pub rate: f64,
    pub messages: u64,
    /// Arrival minus due time.
    pub hist: Histogram<u64>,
    /// How late the sender started each send (its own pacing limit): when this is large, the
    /// sender could not keep the rate and the latencies say more about it than about the path.
    pub sender_lag: Histogram<u64>,
}

enum Mode {
    Flat(Duration),
    Paced { rate: f64, duration: Duration },
}

impl Mode {
    fn duration(&self) -> Duration {
        match *self {
            Mode::Flat(d) | Mode::Paced { duration: d, .. } => d,
        }
    }
}

pub(crate) fn throughput<L: Link>(link: &L, size: usize, duration: Duration) -> anyhow::Result<Throughput> {
    let (sent, rx) = run(link, size, Mode::Flat(duration))?;
    Ok(Throughput { size, messages: sent.messages, elapsed: rx.end.saturating_duration_since(sent.start) })
}

pub(crate) fn latency<L: Link>(link: &L, size: usize, rate: f64, duration: Duration) -> anyhow::Result<Latency> {
    if !(rate.is_finite() && rate > 0.0) {
        bail!("latency run needs a positive message rate, got {rate}");
    }
    let (sent, rx) = run(link, size, Mode::Paced { rate, duration })?;
    let hist = rx.hist.ok_or_else(|| anyhow!("receiver recorded no latencies"))?;
    let sender_lag = sent.lag.ok_or_else(|| anyhow!("sender recorded no lag"))?;
    Ok(Latency { rate, messages: sent.messages, hist, sender_lag })
}

struct Sent {
    start: Instant,
    messages: u64,
    lag: Option<Histogram<u64>>,
}

struct Received {
    end: Instant,
    hist: Option<Histogram<u64>>,
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 ns .. 60 s, three significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).context("creating the latency histogram")
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("building a tokio runtime")
}

/// Payload bytes: a pattern, so nothing is all zeros.
pub fn payload(size: usize) -> Bytes {
    Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

fn run<L: Link>(link: &L, size: usize, mode: Mode) -> anyhow::Result<(Sent, Received)> {
    let start_cell: OnceLock<Instant> = OnceLock::new();
    let sent_cell: OnceLock<u64> = OnceLock::new();
    let ordered = link.ordered();
    let payload = payload(size);
    let (ep_tx, ep_rx) = mpsc::channel::<String>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    // The sender's "finished" (every message acknowledged): the receiving side stays up until
    // then, so the acks of the last messages still go out.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let linger = mode.duration() + IDLE_LIMIT;
    let paced = match mode {
        Mode::Flat(_) => None,
        Mode::Paced { rate, .. } => Some(rate),
    };
    let result = std::thread::scope(|s| {
        let start_cell = &start_cell;
        let sent_cell = &sent_cell;
        let receiver = s.spawn(move || -> anyhow::Result<(u64, Received)> {
            let rt = runtime()?;
            // Clients (async-nats) spawn from their destructors: drop everything in the runtime.
            let _in_runtime = rt.enter();
            let (listening, endpoint) = rt.block_on(link.listen()).context("receiver: listen")?;
            ep_tx.send(endpoint).map_err(|_| anyhow!("receiver: the sender thread is gone"))?;
            let mut rx = rt
                .block_on(async {
                    tokio::time::timeout(IDLE_LIMIT, link.accept(listening))
                        .await
                        .map_err(|_| anyhow!("no sender connected within {IDLE_LIMIT:?}"))?
                })
                .context("receiver: accept")?;
            // The sender may start once this side is ready; its failure to send is seen below
            // as the idle limit or a closed link.
            let _ = ready_tx.send(());
            rt.block_on(async {
                let received = receive(&mut rx, start_cell, sent_cell, ordered, paced).await;
                // Runs the receiving side's tasks until the sender is done (or gone).
                let _ = tokio::time::timeout(linger, done_rx).await;
                received
            })
        });
        let sender = s.spawn(move || -> anyhow::Result<Sent> {
            let rt = runtime()?;
            let _in_runtime = rt.enter();
            let endpoint = ep_rx.recv().map_err(|_| anyhow!("sender: the receiver failed before listening"))?;
            let mut tx = rt
                .block_on(async {
                    tokio::time::timeout(IDLE_LIMIT, link.connect(&endpoint))
                        .await
                        .map_err(|_| anyhow!("no connection within {IDLE_LIMIT:?}"))?
                })
                .with_context(|| format!("sender: connect to {endpoint}"))?;
            ready_rx.recv().map_err(|_| anyhow!("sender: the receiver failed before it was ready"))?;
            let start = Instant::now();
            let _ = start_cell.set(start);
            // A hang guard: the sending phase plus the idle limit for delivering the rest.
            let limit = mode.duration() + IDLE_LIMIT;
            let (messages, lag) = rt.block_on(async {
                match tokio::time::timeout(limit, send(&mut tx, &payload, start, &mode, sent_cell)).await {
                    Ok(sent) => sent,
                    Err(_) => Err(anyhow!(
                        "sender: stuck, not done {limit:?} after the start ({}); its state: {}",
                        sent_cell.get().map_or("still sending".to_string(), |n| format!(
                            "sent {n} messages and the end marker, waiting in finish"
                        )),
                        tx.state()
                    )),
                }
            })?;
            let _ = done_tx.send(());
            drop(tx);
            Ok(Sent { start, messages, lag })
        });
        let sent = sender.join().map_err(|_| anyhow!("the sender thread panicked"))?;
        let received = receiver.join().map_err(|_| anyhow!("the receiver thread panicked"))?;
        let (sent, (count, received)) = match (sent, received) {
            (Ok(s), Ok(r)) => (s, r),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
            (Err(s), Err(r)) => bail!("{s:#}; and {r:#}"),
        };
        if count != sent.messages {
            bail!("the receiver got {count} messages, the sender sent {}", sent.messages);
        }
        Ok((sent, received))
    });
    let cleanup = link.cleanup();
    let out = result?;
    cleanup?;
    Ok(out)
}

async fn send<T: Tx>(
    tx: &mut T,
    payload: &Bytes,
    start: Instant,
    mode: &Mode,
    sent_cell: &OnceLock<u64>,
) -> anyhow::Result<(u64, Option<Histogram<u64>>)> {
    let mut seq = 0u64;
    let mut lag = None;
    match *mode {
        Mode::Flat(duration) => {
            while start.elapsed() < duration {
                // Back to back: another message is always ready.
                tx.send(seq, payload, true).await.with_context(|| format!("sender: message {seq}"))?;
                seq += 1;
            }
        }
        Mode::Paced { rate, duration } => {
            let lag = lag.insert(new_histogram()?);
            let end = start + duration;
            loop {
                let due = start + Duration::from_secs_f64(seq as f64 / rate);
                if due >= end {
                    break;
                }
                wait_until(due).await;
                let late = Instant::now().saturating_duration_since(due).as_nanos();
                lag.record(u64::try_from(late).unwrap_or(u64::MAX).clamp(1, lag.high()))
                    .with_context(|| format!("recording sender lag {late} ns"))?;
                // Behind schedule, the next message is already due: a path may gather them, as a
                // batching writer does with what is queued.
                let more = start + Duration::from_secs_f64((seq + 1) as f64 / rate) <= Instant::now();
                tx.send(seq, payload, more).await.with_context(|| format!("sender: message {seq}"))?;
                if !more {
                    // Let the runtime's other tasks (a client's writer) put the message on its way.
                    tokio::task::yield_now().await;
                }
                seq += 1;
            }
        }
    }
    let _ = sent_cell.set(seq);
    tx.send(END, payload, false).await.context("sender: the end marker")?;
    tx.finish().await.context("sender: finish")?;
    Ok((seq, lag))
}

/// Waits until `due`: a timer for long gaps; for gaps under 2 ms, where the timer is too coarse,
/// it spins, yielding to the runtime (which keeps a client's connection task running) and to the
/// OS scheduler, and for the last 20 µs it spins without syscalls.
async fn wait_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        let left = due - now;
        if left > Duration::from_millis(2) {
            tokio::time::sleep(left - Duration::from_millis(1)).await;
        } else if left > Duration::from_micros(20) {
            tokio::task::yield_now().await;
            // Let another thread have the core meanwhile (the box may be oversubscribed).
            std::thread::yield_now();
        } else {
            // Short gaps: no syscalls, so a high rate is kept.
            std::hint::spin_loop();
        }
    }
}

async fn receive<R: Rx>(
    rx: &mut R,
    start: &OnceLock<Instant>,
    sent: &OnceLock<u64>,
    ordered: bool,
    paced: Option<f64>,
) -> anyhow::Result<(u64, Received)> {
    let mut hist = match paced {
        Some(_) => Some(new_histogram()?),
        None => None,
    };
    let mut seen = SeqSet::default();
    let mut count = 0u64;
    let mut end_seen = false;
    loop {
        let seq = tokio::time::timeout(IDLE_LIMIT, rx.recv())
            .await
            .map_err(|_| anyhow!("receiver: nothing arrived for {IDLE_LIMIT:?} after {count} messages"))?
            .with_context(|| format!("receiver: after {count} messages"))?;
        let now = Instant::now();
        if seq == END {
            if end_seen {
                bail!("receiver: the end marker arrived twice");
            }
            end_seen = true;
        } else {
            if ordered && seq != count {
                bail!("receiver: got message {seq} where {count} was due (lost, duplicated or reordered)");
            }
            if !seen.insert(seq)? {
                bail!("receiver: message {seq} arrived twice");
            }
            count += 1;
            if let (Some(rate), Some(hist)) = (paced, hist.as_mut()) {
                let start =
                    start.get().ok_or_else(|| anyhow!("receiver: a message arrived before the sender started"))?;
                let due = *start + Duration::from_secs_f64(seq as f64 / rate);
                let ns = now.saturating_duration_since(due).as_nanos();
                let ns = u64::try_from(ns).unwrap_or(u64::MAX).clamp(1, hist.high());
                hist.record(ns).with_context(|| format!("recording latency {ns} ns"))?;
            }
        }
        if end_seen {
            let sent = *sent.get().ok_or_else(|| anyhow!("receiver: the end marker came before the sender's count"))?;
            if count == sent {
                return Ok((count, Received { end: now, hist }));
            }
            if ordered || count > sent {
                bail!("receiver: {count} messages arrived, the sender sent {sent}");
            }
        }
    }
}

/// Which sequence numbers arrived: a bitset.
#[derive(Default)]
struct SeqSet {
    words: Vec<u64>,
}

impl SeqSet {
    /// Marks `seq`; false when it was already marked.
    fn insert(&mut self, seq: u64) -> anyhow::Result<bool> {
        if seq >= 1 << 32 {
            bail!("receiver: sequence number {seq} is beyond anything this bench sends");
        }
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let was = self.words[word] & (1 << bit) != 0;
        self.words[word] |= 1 << bit;
        Ok(!was)
    }
}

/// memcpy: copies of `size` bytes into a preallocated buffer for `duration`, single threaded.
pub fn memcpy(size: usize, duration: Duration) -> Throughput {
    let src = payload(size);
    let mut dst = vec![0u8; size];
    let start = Instant::now();
    let mut copies = 0u64;
    // Check the clock every few copies so small copies are not dominated by reading it.
    let batch = (1 << 20) / size.max(1) + 1;
    while start.elapsed() < duration {
        for _ in 0..batch {
            dst.copy_from_slice(std::hint::black_box(&src[..]));
            std::hint::black_box(&mut dst);
        }
        copies += batch as u64;
    }
    Throughput { size, messages: copies, elapsed: start.elapsed() }
}

/// What the machine takes from running threads: one thread per core reads the clock in a loop
/// and counts the gaps between two reads that are longer than `threshold` (the thread was not
/// running: the hypervisor or other work had the core). A message in flight during such a pause
/// waits it out, so the share of time lost in pauses longer than a latency target bounds the
/// quantile at which any path on this machine can meet it.
#[derive(Clone, Debug)]
pub(crate) struct Pauses {
    pub threads: usize,
    pub duration: Duration,
    pub threshold: Duration,
    /// Pauses longer than `threshold`, over all threads.
    pub count: u64,
    /// Their total, over all threads.
    pub lost: Duration,
    /// The longest.
    pub largest: Duration,
}

impl Pauses {
    /// The share of each thread's time lost in pauses longer than the threshold.
    pub(crate) fn fraction(&self) -> f64 {
        self.lost.as_secs_f64() / (self.threads as f64 * self.duration.as_secs_f64())
    }

    /// About the share of messages a pause makes late at `load` (a fraction of the path's
    /// maximum rate), for a path whose sender and receiver are two of these threads: a message
    /// waits out a pause of either (the threads' shares add up), and the backlog a pause leaves
    /// drains at the spare rate, which adds `load / (1 - load)` of the pause again.
    pub(crate) fn late_share(&self, load: f64) -> f64 {
        let either_end = self.fraction() * self.threads as f64;
        (either_end / (1.0 - load.min(0.99))).min(1.0)
    }
}

pub(crate) fn pauses(threads: usize, duration: Duration, threshold: Duration) -> Pauses {
    let per_thread: Vec<(u64, Duration, Duration)> = std::thread::scope(|s| {
        let spinners: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let start = Instant::now();
                    let (mut last, mut count, mut lost, mut largest) = (start, 0u64, Duration::ZERO, Duration::ZERO);
                    while last - start < duration {
                        let now = Instant::now();
                        let gap = now - last;
                        if gap > threshold {
                            count += 1;
                            lost += gap;
                            largest = largest.max(gap);
                        }
                        last = now;
                    }
                    (count, lost, largest)
                })
            })
            .collect();
        spinners.into_iter().map(|h| h.join().unwrap_or((0, Duration::ZERO, Duration::ZERO))).collect()
    });
    Pauses {
        threads,
        duration,
        threshold,
        count: per_thread.iter().map(|p| p.0).sum(),
        lost: per_thread.iter().map(|p| p.1).sum(),
        largest: per_thread.iter().map(|p| p.2).max().unwrap_or_default(),
    }
}
