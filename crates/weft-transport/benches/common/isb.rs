//! The ISB baseline: a real `nats-server -js` child process and one inter-step buffer laid out the
//! way Numaflow lays it out, shared by the side-by-side bench (`benches/transport.rs`) and its
//! test (`tests/isb_jetstream.rs`).
//!
//! The settings are Numaflow's defaults for a JetStream ISB service (`bufferConfig`) and what its
//! ISB service creates for one buffer (`pkg/isbsvc/jetstream_service.go`): a stream named after
//! the buffer whose only subject is that name, Interest retention, discard old, 30000 messages,
//! 168 h, no byte limit, file storage, a 60 s duplicate window; a durable pull consumer of the same
//! name with deliver all, explicit acks, 60 s ack wait and 20000 acks pending, filtered on the
//! subject. Replicas is 1 here (one server) where Numaflow's default is 3.
//!
//! Writers publish with the `Nats-Msg-Id` header (the message id) so the server drops a resend
//! inside the duplicate window, and bound the publishes awaiting their ack; readers pull batches
//! (Numaflow: 500 messages or 1 s; here also at most [`READ_MAX_BYTES`]) and ack each message.

use std::fs;
use std::future::IntoFuture;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// Numaflow's stream defaults (`bufferConfig.stream`).
pub const MAX_MSGS: i64 = 30_000;
pub const MAX_AGE: Duration = Duration::from_secs(168 * 3600);
pub const MAX_BYTES: i64 = -1;
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(60);
/// Numaflow's consumer defaults (`bufferConfig.consumer`).
pub const ACK_WAIT: Duration = Duration::from_secs(60);
pub const MAX_ACK_PENDING: i64 = 20_000;
/// Numaflow's read defaults (`limits.readBatchSize`, `limits.readTimeout`).
pub const READ_BATCH: usize = 500;
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// The byte cap on one pull batch (not a Numaflow setting). nats-server cuts off a client with
/// more than `max_pending` (64 MB by default) queued towards it as a slow consumer, dropping what
/// was queued; the dropped messages come back only after `ack_wait` (60 s). 500 messages of
/// 512 KiB or more exceed that, so the batch is capped at half of it.
pub const READ_MAX_BYTES: usize = 32 << 20;
/// Numaflow's `limits.bufferUsageLimit`: a writer treats the buffer as full at 80 % of max_msgs.
pub const BUFFER_USAGE_LIMIT: f64 = 0.8;
/// The server's max_payload for the bench, raised so a 4 MiB message fits. Numaflow's (and
/// nats-server's) default is 1 MiB.
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;
pub const NUMAFLOW_DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

/// How long the helpers wait for the server to come up before giving up (a hang guard).
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Where nats-server is: `$NATS_SERVER`, else `nats-server` on `PATH`, else Debian's
/// `/usr/sbin/nats-server` (not on a normal user's `PATH`).
pub fn find_nats_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let on_path =
        std::env::var_os("PATH").map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>()).unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|p| p.is_file())
}

/// A `nats-server -js` child on a free loopback port with its store in a temp dir; killed and
/// reaped on drop.
pub struct NatsServer {
    child: Child,
    url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts `binary` with JetStream, `max_payload` [`MAX_PAYLOAD`] and a random loopback port,
    /// and waits until it has written its ports file (it does so once it accepts clients).
    pub fn start(binary: &Path) -> anyhow::Result<Self> {
        let dir =
            tempfile::Builder::new().prefix("weft-isb-").tempdir().context("creating the nats-server temp dir")?;
        let store = dir.path().join("jetstream");
        let config = dir.path().join("nats.conf");
        // `port: -1` makes the server pick a free port; it reports it in the ports file.
        let conf = format!(
            "host: 127.0.0.1\nport: -1\nmax_payload: {MAX_PAYLOAD}\n\
             jetstream {{\n  store_dir: {store:?}\n}}\n",
        );
        fs::write(&config, conf).with_context(|| format!("writing {}", config.display()))?;
        let log_path = dir.path().join("nats-server.log");
        let log = fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let log_err = log.try_clone().context("duplicating the log file handle")?;
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .arg("--ports_file_dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut server = NatsServer { child, url: String::new(), log: log_path.clone(), _dir: dir };
        let exe =
            binary.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "nats-server".to_string());
        let ports = server._dir.path().join(format!("{exe}_{}.ports", server.child.id()));
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = server.child.try_wait().context("polling nats-server")? {
                bail!(
                    "nats-server ({}) exited with {status} before it was ready; its log:\n{}",
                    binary.display(),
                    read_tail(&log_path)
                );
            }
            if let Ok(text) = fs::read_to_string(&ports)
                && let Some(url) = client_url(&text)
            {
                server.url = url;
                return Ok(server);
            }
            if Instant::now() > deadline {
                bail!(
                    "nats-server ({}) wrote no ports file {} within {START_DEADLINE:?}; its log:\n{}",
                    binary.display(),
                    ports.display(),
                    read_tail(&log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last few KiB of the server's log.
    pub fn log_tail(&self) -> String {
        read_tail(&self.log)
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `nats://` URL in a ports file (`{"nats":["nats://127.0.0.1:4222"],...}`).
fn client_url(ports_file: &str) -> Option<String> {
    let start = ports_file.find("nats://")?;
    let rest = &ports_file[start..];
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

fn read_tail(path: &Path) -> String {
    let mut text = String::new();
    match fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text)) {
        Ok(_) => {
            let cut = text.len().saturating_sub(4000);
            let cut = (cut..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
            text[cut..].to_string()
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Connects a client. The server's max_payload comes from its INFO; the client checks against it.
pub async fn connect(url: &str) -> anyhow::Result<Context> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .with_context(|| format!("connecting to nats-server at {url}"))?;
    Ok(jetstream::new(client))
}

/// The stream Numaflow creates for buffer `name` (replicas 1: one server).
pub fn numaflow_stream_config(name: &str) -> stream::Config {
    stream::Config {
        name: name.to_string(),
        subjects: vec![name.to_string()],
        retention: RetentionPolicy::Interest,
        discard: DiscardPolicy::Old,
        max_messages: MAX_MSGS,
        max_age: MAX_AGE,
        max_bytes: MAX_BYTES,
        storage: StorageType::File,
        num_replicas: 1,
        duplicate_window: DUPLICATE_WINDOW,
        ..Default::default()
    }
}

/// The consumer Numaflow creates for buffer `name`.
pub fn numaflow_consumer_config(name: &str) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(name.to_string()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_ack_pending: MAX_ACK_PENDING,
        filter_subject: name.to_string(),
        ..Default::default()
    }
}

/// Creates buffer `name` (stream, then its consumer) as Numaflow does.
pub async fn create_buffer(js: &Context, name: &str) -> anyhow::Result<PullConsumer> {
    let stream =
        js.create_stream(numaflow_stream_config(name)).await.with_context(|| format!("creating stream {name}"))?;
    stream
        .create_consumer(numaflow_consumer_config(name))
        .await
        .with_context(|| format!("creating consumer {name} on stream {name}"))
}

/// Publishes to one buffer with at most `window` publishes awaiting their ack (Numaflow bounds
/// its publish-ack futures with a semaphore the same way). Counts acks and duplicates.
pub struct WindowedPublisher {
    js: Context,
    subject: String,
    window: usize,
    pending: FuturesUnordered<<PublishAckFuture as IntoFuture>::IntoFuture>,
    acked: u64,
    duplicates: u64,
}

impl WindowedPublisher {
    pub fn new(js: Context, subject: &str, window: usize) -> Self {
        WindowedPublisher {
            js,
            subject: subject.to_string(),
            window: window.max(1),
            pending: FuturesUnordered::new(),
            acked: 0,
            duplicates: 0,
        }
    }

    /// Publishes `payload` with `Nats-Msg-Id: id`, first waiting for an ack if the window is full.
    pub async fn publish(&mut self, id: &str, payload: Bytes) -> anyhow::Result<()> {
        while self.pending.len() >= self.window {
            self.settle_one().await?;
        }
        let ack = self
            .js
            .send_publish(self.subject.clone(), PublishMessage::build().payload(payload).message_id(id))
            .await
            .with_context(|| format!("publishing message {id} to {}", self.subject))?;
        self.pending.push(ack.into_future());
        Ok(())
    }

    /// Waits for every outstanding publish ack.
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        while !self.pending.is_empty() {
            self.settle_one().await?;
        }
        Ok(())
    }

    async fn settle_one(&mut self) -> anyhow::Result<()> {
        if let Some(ack) = self.pending.next().await {
            let ack = ack.with_context(|| format!("publish ack from {}", self.subject))?;
            self.acked += 1;
            if ack.duplicate {
                self.duplicates += 1;
            }
        }
        Ok(())
    }

    /// Publishes acknowledged by the server so far (duplicates included).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Acks that reported the message as a duplicate (dropped by the server's dedup).
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }
}

/// A reader's pull loop state: the current batch request (Numaflow: 500 messages or 1 s; here
/// also at most [`READ_MAX_BYTES`]).
pub struct BatchReader {
    consumer: PullConsumer,
    batch: Option<consumer::pull::Batch>,
    batch_size: usize,
    /// Messages the current batch delivered so far.
    in_batch: usize,
}

impl BatchReader {
    pub fn new(consumer: PullConsumer) -> Self {
        BatchReader { consumer, batch: None, batch_size: READ_BATCH, in_batch: 0 }
    }

    /// The next message, requesting a new batch when the current one is done. Waits until one
    /// arrives.
    pub async fn next(&mut self) -> anyhow::Result<jetstream::Message> {
        loop {
            if let Some(batch) = self.batch.as_mut() {
                match batch.next().await {
                    Some(Ok(msg)) => {
                        self.in_batch += 1;
                        return Ok(msg);
                    }
                    // The server ends a byte-capped batch with status 409 "Message Size Exceeds
                    // MaxBytes" when the next message does not fit what is left of the cap;
                    // async-nats reports statuses only as text. A batch that delivered nothing
                    // means one message is over the whole cap: a real error.
                    Some(Err(e)) if self.in_batch > 0 && e.to_string().contains("Message Size Exceeds MaxBytes") => {
                        self.batch = None;
                    }
                    Some(Err(e)) => {
                        return Err(anyhow::anyhow!("pulling from the consumer: {e}"));
                    }
                    None => self.batch = None,
                }
            }
            let batch = self
                .consumer
                .batch()
                .max_messages(self.batch_size)
                .max_bytes(READ_MAX_BYTES)
                .expires(READ_TIMEOUT)
                .messages()
                .await
                .map_err(|e| anyhow::anyhow!("requesting a batch of {}: {e}", self.batch_size))?;
            self.batch = Some(batch);
            self.in_batch = 0;
        }
    }
}

/// The `Nats-Msg-Id` of a received message.
pub fn message_id(msg: &jetstream::Message) -> Option<&str> {
    msg.headers.as_ref()?.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.as_str())
}

/// Acks one message (Numaflow acks each message after the downstream write).
pub async fn ack(msg: &jetstream::Message) -> anyhow::Result<()> {
    msg.ack().await.map_err(|e| anyhow::anyhow!("acking a message: {e}"))
}
