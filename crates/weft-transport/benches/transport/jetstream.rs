//! The ISB path: one Numaflow buffer on a real `nats-server -js` (see `common/isb.rs` for the
//! stream and consumer settings). Each run gets a fresh buffer, deleted afterwards.
//!
//! - Writer: its own connection; publishes with `Nats-Msg-Id` = the sequence number, at most
//!   `window` publishes awaiting their ack; `finish` waits for every ack.
//! - Buffer full: Numaflow's writer stops writing while the buffer holds 80 % of max_msgs
//!   (`retryUntilSuccess`). The bench keeps the same bound as credits (published, not yet
//!   acked by the reader), also capped at [`MAX_OUTSTANDING_BYTES`] of payload so the 4 MiB runs do
//!   not fill the disk; credits come back the moment the reader acks (Numaflow polls the buffer's
//!   usage, so this is kinder to JetStream than Numaflow is).
//! - Reader: its own connection; pulls batches of 500 with a 1 s expiry, acks each message.
//!   A message counts as received before its ack is sent; the credit comes back after.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, anyhow};
use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::harness::{END, Link, Rx, Tx};
use crate::isb;

/// Payload bytes a writer may have in the buffer, unacked, besides the 80 % count bound.
pub const MAX_OUTSTANDING_BYTES: usize = 256 << 20;

static RUN: AtomicU64 = AtomicU64::new(0);

pub struct JetStreamLink {
    url: String,
    buffer: String,
    window: usize,
    credits: Arc<Semaphore>,
}

impl JetStreamLink {
    pub fn new(url: &str, size: usize, window: usize) -> Self {
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        JetStreamLink {
            url: url.to_string(),
            // Numaflow names a buffer <ns>-<pipeline>-<from>-<to>-<partition>.
            buffer: format!("bench-pipeline-in-out-{run}"),
            window,
            credits: Arc::new(Semaphore::new(Self::outstanding_limit(size))),
        }
    }

    /// The bound on published-but-unacked messages this run uses.
    pub fn outstanding_limit(size: usize) -> usize {
        let by_count = (isb::MAX_MSGS as f64 * isb::BUFFER_USAGE_LIMIT) as usize;
        by_count.min((MAX_OUTSTANDING_BYTES / size.max(1)).max(1))
    }
}

pub struct JsTx {
    publisher: isb::WindowedPublisher,
    credits: Arc<Semaphore>,
}

pub struct JsRx {
    reader: isb::BatchReader,
    credits: Arc<Semaphore>,
    // Keeps the reader's client alive.
    _js: async_nats::jetstream::Context,
}

impl Link for JetStreamLink {
    type Listening = (async_nats::jetstream::Context, async_nats::jetstream::consumer::PullConsumer);
    type Tx = JsTx;
    type Rx = JsRx;

    async fn listen(&self) -> anyhow::Result<(Self::Listening, String)> {
        let js = isb::connect(&self.url).await?;
        let consumer = isb::create_buffer(&js, &self.buffer).await?;
        Ok(((js, consumer), self.buffer.clone()))
    }

    async fn accept(&self, (js, consumer): Self::Listening) -> anyhow::Result<JsRx> {
        Ok(JsRx { reader: isb::BatchReader::new(consumer), credits: self.credits.clone(), _js: js })
    }

    async fn connect(&self, endpoint: &str) -> anyhow::Result<JsTx> {
        let js = isb::connect(&self.url).await?;
        Ok(JsTx { publisher: isb::WindowedPublisher::new(js, endpoint, self.window), credits: self.credits.clone() })
    }

    fn cleanup(&self) -> anyhow::Result<()> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().context("building a tokio runtime")?;
        rt.block_on(async {
            let js = isb::connect(&self.url).await?;
            js.delete_stream(&self.buffer).await.map_err(|e| anyhow!("deleting stream {}: {e}", self.buffer))?;
            Ok(())
        })
    }
}

impl Tx for JsTx {
    async fn send(&mut self, seq: u64, payload: &Bytes, _more: bool) -> anyhow::Result<()> {
        self.credits.acquire().await.context("the credit semaphore is closed")?.forget();
        let id = if seq == END { "end".to_string() } else { seq.to_string() };
        self.publisher.publish(&id, payload.clone()).await
    }

    async fn finish(&mut self) -> anyhow::Result<()> {
        self.publisher.flush().await?;
        if self.publisher.duplicates() != 0 {
            anyhow::bail!("{} publishes were reported duplicate; every id is unique", self.publisher.duplicates());
        }
        Ok(())
    }
}

impl Rx for JsRx {
    async fn recv(&mut self) -> anyhow::Result<u64> {
        let msg = self.reader.next().await?;
        let id = isb::message_id(&msg).ok_or_else(|| anyhow!("a message without Nats-Msg-Id"))?.to_string();
        let seq = if id == "end" {
            END
        } else {
            id.parse::<u64>().with_context(|| format!("message id {id:?} is not a sequence number"))?
        };
        isb::ack(&msg).await?;
        self.credits.add_permits(1);
        Ok(seq)
    }
}
