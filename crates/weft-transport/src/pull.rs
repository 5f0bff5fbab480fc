//! A receiver read in batches, in the shape of Numaflow's ISB reader (`ISBReader` in
//! numaflow-core: `fetch(max, timeout)`, `ack(offset)`, `nack(offset)`, `pending()`), for a UDF
//! that wants to take several messages at once: a model that infers a batch of frames on a GPU,
//! a sink that writes in bulk.
//!
//! Under it is a [`Receiver`] whose handler hands each message to a queue and waits for the
//! caller's verdict, so everything the receiver guarantees holds: a message is acknowledged to
//! its sender only after [`PullReceiver::ack`], a [`PullReceiver::nack`] sends it back to be
//! delivered again (to another receiver when there is one), duplicates are dropped by id, and
//! backpressure reaches the senders when the caller stops fetching.
//!
//! - **Read-ahead.** At most [`ReceiverConfig::concurrency`] messages are queued or fetched and
//!   not yet acknowledged; that is also the largest batch a fetch can return. Set it to at
//!   least the batch size you fetch.
//! - **Ack wait.** A message fetched and neither acked nor nacked within
//!   [`ReceiverConfig::handler_timeout`] is nacked for the caller and delivered again, like
//!   JetStream's `ackWait`; a late [`PullReceiver::ack`] then says so ([`PullError::Expired`]).
//!   There is no work-in-progress extension: set the timeout to the longest a batch may take.
//!   An expired offset is remembered while fewer than twice the concurrency are held; past
//!   that, a late ack says [`PullError::Unknown`].
//! - **Offsets** are this receiver's own counter, unique for its life; a redelivered message
//!   comes back under a new offset.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::protocol::Message;
use crate::recv::{Receiver, ReceiverConfig, lock};

/// A message taken by [`PullReceiver::fetch`], to be acked or nacked by its offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// This receiver's offset of the message.
    pub offset: u64,
    /// The message.
    pub message: Message,
}

/// Why an ack or nack did not apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// No message was fetched under this offset, or it was acked or nacked already.
    #[error("offset {0} is not a fetched message awaiting its ack (never fetched, or acked or nacked already)")]
    Unknown(u64),
    /// The message waited longer than the handler timeout: it was nacked and goes to its sender
    /// again; this ack or nack came too late to count.
    #[error("offset {0} waited past the handler timeout; it was nacked and is being delivered again")]
    Expired(u64),
}

type Verdict = Result<(), String>;

struct Delivery {
    message: Message,
    verdict: oneshot::Sender<Verdict>,
}

/// A [`Receiver`] read in batches. See the module documentation.
pub struct PullReceiver {
    receiver: Receiver,
    queue: tokio::sync::Mutex<mpsc::Receiver<Delivery>>,
    fetched: Mutex<HashMap<u64, oneshot::Sender<Verdict>>>,
    next_offset: AtomicU64,
    /// The receiver's concurrency: at most this many fetched messages can still be waiting.
    limit: usize,
}

impl std::fmt::Debug for PullReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullReceiver").field("receiver", &self.receiver).finish_non_exhaustive()
    }
}

impl PullReceiver {
    /// Binds `addr` on `backend`; messages wait for [`fetch`](Self::fetch). Must be called
    /// inside a tokio runtime.
    pub async fn bind<B: Backend>(backend: &B, addr: SocketAddr, config: ReceiverConfig) -> io::Result<Self> {
        // Every queued message holds a handler slot, so the queue never holds more than the
        // concurrency; the bound only keeps a misconfiguration from growing without limit.
        let limit = config.concurrency.max(1);
        let (tx, queue) = mpsc::channel::<Delivery>(limit);
        let handler = move |message: Message| {
            let tx = tx.clone();
            async move {
                let (verdict, wait) = oneshot::channel();
                tx.send(Delivery { message, verdict })
                    .await
                    .map_err(|_| "the pull receiver is closed; not fetched".to_string())?;
                wait.await.unwrap_or_else(|_| Err("the pull receiver dropped the message unacknowledged".to_string()))
            }
        };
        let receiver = Receiver::bind(backend, addr, config, handler).await?;
        Ok(Self {
            receiver,
            queue: tokio::sync::Mutex::new(queue),
            fetched: Mutex::new(HashMap::new()),
            next_offset: AtomicU64::new(0),
            limit,
        })
    }

    /// The receiver underneath: its address, counters and input watermark.
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// Up to `max` messages: waits up to `timeout` for the first, then takes those already
    /// waiting, without waiting more (as Numaflow's readers do). Empty when none came in time.
    /// Fetches run one at a time (a second waits for the first).
    pub async fn fetch(&self, max: usize, timeout: Duration) -> Vec<Fetched> {
        let mut queue = self.queue.lock().await;
        let mut batch = Vec::new();
        if max == 0 {
            return batch;
        }
        let Ok(Some(first)) = tokio::time::timeout(timeout, queue.recv()).await else {
            return batch;
        };
        let mut next = Some(first);
        while let Some(delivery) = next.take() {
            // A message whose handler was cancelled (timed out) while queued is already going
            // back to its sender: skip it.
            if !delivery.verdict.is_closed() {
                let offset = self.next_offset.fetch_add(1, Ordering::Relaxed);
                let mut fetched = self.lock_fetched();
                fetched.insert(offset, delivery.verdict);
                // Entries whose wait expired stay (a late ack says Expired) until they crowd
                // the map: at most `limit` can be live, so past twice that, drop the expired.
                if fetched.len() > 2 * self.limit {
                    fetched.retain(|_, v| !v.is_closed());
                }
                drop(fetched);
                batch.push(Fetched { offset, message: delivery.message });
            }
            if batch.len() < max {
                next = queue.try_recv().ok();
            }
        }
        batch
    }

    /// Acknowledges a fetched message: its sender hears the ack.
    pub fn ack(&self, offset: u64) -> Result<(), PullError> {
        self.settle(offset, Ok(()))
    }

    /// Gives a fetched message back: its sender delivers it again, to another receiver when
    /// there is one; `reason` goes to the sender's log.
    pub fn nack(&self, offset: u64, reason: &str) -> Result<(), PullError> {
        self.settle(offset, Err(reason.to_string()))
    }

    /// Messages received and waiting for a fetch.
    pub fn pending(&self) -> usize {
        self.queue.try_lock().map_or(0, |q| q.len())
    }

    /// Messages fetched and not yet acked or nacked (nor expired).
    pub fn in_flight(&self) -> usize {
        self.lock_fetched().values().filter(|v| !v.is_closed()).count()
    }

    /// Closes without handling anything twice: nacks what was fetched and not settled (so it
    /// goes to another receiver), nacks what is queued, then closes the receiver
    /// ([`Receiver::close`]: the acks already given go out before the links close).
    pub async fn close(self) {
        let unsettled: Vec<_> = self.lock_fetched().drain().map(|(_, v)| v).collect();
        for verdict in unsettled {
            let _ = verdict.send(Err("the pull receiver closed before it was acknowledged".to_string()));
        }
        {
            let mut queue = self.queue.lock().await;
            queue.close();
            while let Ok(delivery) = queue.try_recv() {
                let _ = delivery.verdict.send(Err("the pull receiver closed before it was fetched".to_string()));
            }
        }
        self.receiver.close().await;
    }

    fn settle(&self, offset: u64, verdict: Verdict) -> Result<(), PullError> {
        let waiting = self.lock_fetched().remove(&offset).ok_or(PullError::Unknown(offset))?;
        // The handler side is gone when it timed out (and nacked) meanwhile.
        waiting.send(verdict).map_err(|_| PullError::Expired(offset))
    }

    fn lock_fetched(&self) -> MutexGuard<'_, HashMap<u64, oneshot::Sender<Verdict>>> {
        lock(&self.fetched)
    }
}
