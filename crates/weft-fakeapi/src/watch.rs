//! WATCH: a chunked stream of newline-delimited JSON watch events.
//!
//! Every watch is a cursor into the server's event history. A spawned task replays the history
//! after the cursor (filtered by namespace and selectors), then waits for the next write, a
//! bookmark tick, the `timeoutSeconds` deadline, the client going away, or `drop_watches()`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::ops;
use crate::registry::ResourceSpec;
use crate::selectors::Filter;
use crate::server::{BoxBody, Shared};
use crate::store::EventType;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// Synthetic `ADDED` events for every current object first (resourceVersion unset or `0`, or
    /// `sendInitialEvents=true`); with `end_bookmark`, then a bookmark annotated
    /// `k8s.io/initial-events-end: "true"`.
    Current { end_bookmark: bool },
    /// Events after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
#[derive(Debug, Clone)]
pub(crate) struct WatchRequest {
    pub(crate) spec: ResourceSpec,
    pub(crate) filter: Filter,
    pub(crate) start: WatchStart,
    pub(crate) bookmarks: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) metadata_only: bool,
}

type Chunk = Result<Frame<Bytes>, io::Error>;

/// Renders one watch event line.
pub(crate) fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// The single `ERROR` event a watch gets when its resourceVersion is too old.
pub(crate) fn expired_line(requested: u64, oldest: u64) -> Bytes {
    let status = ApiError::expired(format!("too old resource version: {requested} ({oldest})")).to_status();
    event_line("ERROR", &status)
}

/// Starts the watch task and returns the response body it feeds.
pub(crate) fn start(shared: Arc<Shared>, req: WatchRequest) -> BoxBody {
    let (tx, mut rx) = mpsc::channel::<Chunk>(64);
    tokio::spawn(run(shared, req, tx));
    StreamBody::new(futures::stream::poll_fn(move |cx| rx.poll_recv(cx))).boxed()
}

/// Counts the watch as open while alive.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.write(|st| st.open_watches += 1);
        Self(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.write(|st| st.open_watches = st.open_watches.saturating_sub(1));
    }
}

struct Sender<'a> {
    tx: &'a mpsc::Sender<Chunk>,
    spec: &'a ResourceSpec,
    metadata_only: bool,
}

impl Sender<'_> {
    /// Sends one line; `false` once the client is gone.
    async fn line(&self, bytes: Bytes) -> bool {
        self.tx.send(Ok(Frame::data(bytes))).await.is_ok()
    }

    async fn event(&self, kind: EventType, obj: &Value) -> bool {
        let shown = ops::present(self.spec, obj);
        let shown = if self.metadata_only { crate::http::partial_metadata(&shown) } else { shown };
        self.line(event_line(kind.as_str(), &shown)).await
    }

    async fn bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let (kind, api_version) = if self.metadata_only {
            ("PartialObjectMetadata".to_owned(), "meta.k8s.io/v1".to_owned())
        } else {
            (self.spec.kind.clone(), self.spec.api_version())
        };
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        self.line(event_line("BOOKMARK", &json!({ "kind": kind, "apiVersion": api_version, "metadata": metadata })))
            .await
    }
}

async fn run(shared: Arc<Shared>, req: WatchRequest, tx: mpsc::Sender<Chunk>) {
    // Subscribe before counting the watch as open, so a test that waits for `open_watches()` and
    // then calls `drop_watches()`/`send_bookmarks()` cannot slip in between.
    let mut rv_rx = shared.subscribe_rv();
    let mut drop_rx = shared.subscribe_drops();
    let mut bookmark_rx = shared.subscribe_bookmarks();
    let _open = OpenGuard::new(&shared);
    let out = Sender { tx: &tx, spec: &req.spec, metadata_only: req.metadata_only };
    let gr = req.spec.group_resource();

    let (initial, mut cursor) = {
        let st = shared.lock();
        match req.start {
            WatchStart::Current { .. } => {
                (st.list(&gr, &req.filter, None).into_iter().cloned().collect::<Vec<_>>(), st.rv())
            }
            WatchStart::After(rv) => (Vec::new(), rv),
        }
    };
    for obj in &initial {
        if !out.event(EventType::Added, obj).await {
            return;
        }
    }
    if req.start == (WatchStart::Current { end_bookmark: true }) && !out.bookmark(cursor, true).await {
        return;
    }

    let deadline = req.timeout.map(|t| Instant::now() + t);
    let interval = shared.config.bookmark_interval.max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut want_bookmark = false;
    loop {
        let batch = shared.lock().events_since(&gr, &req.filter, cursor);
        match batch {
            Err(gone) => {
                let _ = out.line(expired_line(gone.requested, gone.oldest)).await;
                return;
            }
            Ok((events, seen)) => {
                for (kind, obj) in &events {
                    if !out.event(*kind, obj).await {
                        return;
                    }
                }
                cursor = seen;
            }
        }
        if want_bookmark && req.bookmarks && !out.bookmark(cursor, false).await {
            return;
        }
        want_bookmark = false;
        tokio::select! {
            biased;
            _ = drop_rx.changed() => {
                // An error frame makes hyper abort the connection mid-body, like a dropped TCP link.
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch dropped by the fake API server"))).await;
                return;
            }
            () = until(deadline) => return,
            () = tx.closed() => return,
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = bookmark_rx.changed() => want_bookmark = true,
            _ = ticker.tick() => want_bookmark = true,
        }
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
