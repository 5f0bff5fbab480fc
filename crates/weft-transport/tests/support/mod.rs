//! Helpers shared by the transport's integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use weft_transport::resolve::ResolveError;
use weft_transport::{Backoff, Message, PeerSet, PeerSource, Receiver, ReceiverConfig, SenderConfig, TcpBackend};

/// The hang guard for every wait: far longer than any of these tests needs.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Waits until `cond` holds, checking every few milliseconds; panics naming `what` after
/// [`DEADLINE`]. This is a hang guard, not a timing assertion.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(tokio::time::Instant::now() < give_up, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Awaits `f` with the hang guard.
pub async fn guard<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, f).await {
        Ok(v) => v,
        Err(_) => panic!("gave up waiting for {what}"),
    }
}

/// Counts how often each id reached a handler.
#[derive(Clone, Default)]
pub struct Recorder {
    seen: Arc<Mutex<HashMap<String, usize>>>,
    order: Arc<Mutex<Vec<Message>>>,
}

impl Recorder {
    pub fn record(&self, m: Message) {
        *self.seen.lock().expect("lock").entry(m.id.clone()).or_default() += 1;
        self.order.lock().expect("lock").push(m);
    }

    /// Distinct ids seen.
    pub fn distinct(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    /// Handler calls in all.
    pub fn calls(&self) -> usize {
        self.seen.lock().expect("lock").values().sum()
    }

    pub fn count(&self, id: &str) -> usize {
        self.seen.lock().expect("lock").get(id).copied().unwrap_or(0)
    }

    pub fn counts(&self) -> HashMap<String, usize> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn messages(&self) -> Vec<Message> {
        self.order.lock().expect("lock").clone()
    }

    /// A handler that records and succeeds.
    pub fn handler(&self) -> impl Fn(Message) -> std::future::Ready<Result<(), String>> + Send + Sync + 'static {
        let rec = self.clone();
        move |m| {
            rec.record(m);
            std::future::ready(Ok(()))
        }
    }
}

/// A peer source whose set the test changes; counts resolutions and invalidations.
#[derive(Clone, Default)]
pub struct SwitchPeers {
    inner: Arc<Mutex<SwitchState>>,
}

#[derive(Default)]
struct SwitchState {
    addrs: Vec<SocketAddr>,
    resolutions: usize,
    invalidations: usize,
    refresh: Option<Duration>,
}

impl SwitchPeers {
    /// A source answering `addrs`, valid for `refresh` (None: until a failure).
    pub fn new(addrs: Vec<SocketAddr>, refresh: Option<Duration>) -> Self {
        let s = Self::default();
        {
            let mut st = s.inner.lock().expect("lock");
            st.addrs = addrs;
            st.refresh = refresh;
        }
        s
    }

    pub fn set(&self, addrs: Vec<SocketAddr>) {
        self.inner.lock().expect("lock").addrs = addrs;
    }

    pub fn resolutions(&self) -> usize {
        self.inner.lock().expect("lock").resolutions
    }

    pub fn invalidations(&self) -> usize {
        self.inner.lock().expect("lock").invalidations
    }
}

impl PeerSource for SwitchPeers {
    fn target(&self) -> String {
        "switchable test peers".into()
    }

    async fn resolve(&self) -> Result<PeerSet, ResolveError> {
        let mut st = self.inner.lock().expect("lock");
        st.resolutions += 1;
        let until = st.refresh.map(|d| std::time::Instant::now() + d);
        Ok(PeerSet::new(st.addrs.clone(), until))
    }

    fn invalidate(&self) {
        self.inner.lock().expect("lock").invalidations += 1;
    }
}

/// A sender that reconnects, re-resolves and redelivers within milliseconds, so tests of those
/// paths do not wait on the production defaults.
pub fn fast_config() -> SenderConfig {
    SenderConfig {
        backoff: Backoff { initial: Duration::from_millis(5), max: Duration::from_millis(100), jitter: 0.5 },
        redeliver_delay: Duration::from_millis(1),
        min_resolve_interval: Duration::from_millis(10),
        ..SenderConfig::default()
    }
}

/// A message with id `id` and `len` bytes of payload derived from the id.
pub fn msg(id: impl Into<String>, len: usize) -> Message {
    let id = id.into();
    let seed = id.bytes().fold(0u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    Message::new(id, (0..len).map(|i| seed.wrapping_add(i as u8)).collect::<Vec<u8>>())
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

/// A receiver on loopback whose handler records every message and succeeds.
pub async fn recording_receiver(rec: &Recorder) -> Receiver {
    Receiver::bind(&TcpBackend::default(), loopback(), ReceiverConfig::default(), rec.handler()).await.expect("bind")
}

/// A gate handlers wait at until the test opens it (all at once).
#[derive(Clone)]
pub struct Gate(watch::Sender<bool>);

impl Gate {
    pub fn closed() -> Self {
        Self(watch::channel(false).0)
    }
    pub fn open(&self) {
        self.0.send_replace(true);
    }
    pub async fn pass(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A receiver on loopback with `config` whose handler records each message, then waits at
/// `gate`.
pub async fn gated_receiver(rec: &Recorder, gate: &Gate, config: ReceiverConfig) -> Receiver {
    let (rec, gate) = (rec.clone(), gate.clone());
    Receiver::bind(&TcpBackend::default(), loopback(), config, move |m: Message| {
        let (rec, gate) = (rec.clone(), gate.clone());
        async move {
            rec.record(m);
            gate.pass().await;
            Ok::<(), String>(())
        }
    })
    .await
    .expect("bind")
}

/// A receiver on loopback whose handler records each message, then takes a permit from
/// `permits`: each permit the test adds lets one handler finish.
pub async fn permit_gated_receiver(rec: &Recorder, permits: &Arc<Semaphore>) -> Receiver {
    let (rec, permits) = (rec.clone(), permits.clone());
    Receiver::bind(&TcpBackend::default(), loopback(), ReceiverConfig::default(), move |m: Message| {
        let (rec, permits) = (rec.clone(), permits.clone());
        async move {
            rec.record(m);
            permits.acquire().await.map_err(|e| e.to_string())?.forget();
            Ok::<(), String>(())
        }
    })
    .await
    .expect("bind")
}
