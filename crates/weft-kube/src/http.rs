//! The HTTP serving every weft server shares: the scheduler extender, the admission webhook and the
//! ops endpoint. One accept loop (axum-server over hyper), with the same protections everywhere:
//!
//! - **Header-read timeout** ([`ServeOptions::header_read_timeout`], default 10 s): an HTTP/1
//!   connection that has not sent a complete request head by then is closed. hyper starts this
//!   clock whenever it waits for a request head, so it also closes HTTP/1 keep-alive connections
//!   idle that long (the clients — kube-scheduler, the API server, the kubelet's probes —
//!   reconnect).
//! - **Idle timeout** ([`ServeOptions::idle_timeout`], default 30 s): a connection on which no
//!   byte moves either way for that long is closed, whatever the protocol — a client that
//!   connects and says nothing (before HTTP/1 or HTTP/2 is even known), or an idle HTTP/2
//!   connection. It must exceed every route's own request time, which all of weft's do.
//! - **TLS handshake timeout** (10 s, the acceptor's) for the HTTPS servers.
//! - **Connection cap** ([`ServeOptions::max_connections`], default 1,024): a connection beyond
//!   it is closed at once instead of being served.
//! - **Bounded shutdown** ([`ServeOptions::shutdown_grace`], default 10 s): once `shutdown`
//!   completes, the listener closes, idle connections close, requests in flight may finish, and
//!   whatever is still open after the grace is dropped — a slow client cannot hold a rolling
//!   update or a SIGTERM.
//!
//! Request bodies and per-request time are each server's own business (its routes know their
//! limits); [`request_timeout`] is the layer for routes that have no better answer than 503.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum_server::accept::Accept;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures::future::{Either, Ready, ready};
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};

/// Default of [`ServeOptions::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServeOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`ServeOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of [`ServeOptions::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Connection-level limits of a server; see the module docs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Time a connection has to send a complete request head (and the longest a keep-alive
    /// connection may sit idle).
    pub header_read_timeout: Duration,
    /// Time without a byte read or written after which a connection is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
    /// How long requests in flight may finish after shutdown starts.
    pub shutdown_grace: Duration,
    /// Counts connections refused by the cap (for metrics and tests); shared by clones.
    pub refused: Arc<AtomicU64>,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            refused: Arc::default(),
        }
    }
}

impl ServeOptions {
    /// Connections refused by the cap so far.
    pub fn refused_connections(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Serves `router` on `listener` (HTTPS when `tls` is given) until `shutdown` completes, then
/// shuts down within [`ServeOptions::shutdown_grace`].
pub async fn serve<F>(
    listener: TcpListener,
    router: Router,
    tls: Option<RustlsConfig>,
    opts: ServeOptions,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let handle = axum_server::Handle::<SocketAddr>::new();
    let h = handle.clone();
    let grace = opts.shutdown_grace;
    let stopper = tokio::spawn(async move {
        shutdown.await;
        h.graceful_shutdown(Some(grace));
    });
    let limit =
        ConnectionCap { handle: handle.clone(), max: opts.max_connections.max(1), refused: opts.refused.clone() };
    let mut server = axum_server::Server::<SocketAddr>::from_listener(listener).handle(handle);
    server.http_builder().http1().timer(TokioTimer::new()).header_read_timeout(opts.header_read_timeout);
    let app = router.into_make_service();
    let idle = IdleAcceptor(opts.idle_timeout);
    let served = match tls {
        Some(tls) => server.acceptor(limit.wrap(RustlsAcceptor::new(tls).acceptor(idle))).serve(app).await,
        None => server.acceptor(limit.wrap(idle)).serve(app).await,
    };
    stopper.abort();
    served
}

/// A layer answering 503 with `what did not finish within …` when a request (body read included)
/// takes longer than `timeout`.
pub fn request_timeout(router: Router, timeout: Duration, what: &'static str) -> Router {
    router.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| async move {
            match tokio::time::timeout(timeout, next.run(req)).await {
                Ok(response) => response,
                Err(_) => {
                    tracing::warn!(?timeout, what, "request timed out");
                    (StatusCode::SERVICE_UNAVAILABLE, format!("{what} did not finish within {timeout:?}\n"))
                        .into_response()
                }
            }
        },
    ))
}

/// Closes connections beyond the cap before any byte is read from them.
#[derive(Clone)]
struct ConnectionCap {
    handle: axum_server::Handle<SocketAddr>,
    max: usize,
    refused: Arc<AtomicU64>,
}

impl ConnectionCap {
    fn wrap<A>(self, inner: A) -> Capped<A> {
        Capped { cap: self, inner }
    }
}

#[derive(Clone)]
struct Capped<A> {
    cap: ConnectionCap,
    inner: A,
}

impl<I, S, A> Accept<I, S> for Capped<A>
where
    A: Accept<I, S>,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = Either<Ready<io::Result<(A::Stream, A::Service)>>, A::Future>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        // The count includes this connection (axum-server counts it before accepting).
        if self.cap.handle.connection_count() > self.cap.max {
            self.cap.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(max = self.cap.max, "connection refused: too many open connections");
            return Either::Left(ready(Err(io::Error::other("too many open connections"))));
        }
        Either::Right(self.inner.accept(stream, service))
    }
}

/// Wraps each accepted stream in an [`IdleStream`].
#[derive(Clone, Copy)]
struct IdleAcceptor(Duration);

impl<I, S> Accept<I, S> for IdleAcceptor {
    type Stream = IdleStream<I>;
    type Service = S;
    type Future = Ready<io::Result<(IdleStream<I>, S)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        ready(Ok((IdleStream::new(stream, self.0), service)))
    }
}

/// A stream that fails with `TimedOut` once no byte has moved either way for `idle`. The clock
/// is checked whenever the connection waits for input, so a connection waiting on its peer is
/// closed; one waiting on a handler is not (hyper reads only when it wants more).
struct IdleStream<S> {
    inner: S,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<S> IdleStream<S> {
    fn new(inner: S, idle: Duration) -> IdleStream<S> {
        IdleStream { inner, idle, timer: Box::pin(tokio::time::sleep(idle)) }
    }

    fn moved(&mut self) {
        self.timer.as_mut().reset(Instant::now() + self.idle);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.timer.as_mut().poll(cx).is_ready()
    }

    /// A write's outcome: bytes moved restart the idle clock; a write that cannot go on past it fails.
    fn after_write(&mut self, cx: &mut Context<'_>, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error(self.idle))),
            other => other,
        }
    }
}

fn idle_error(idle: Duration) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("no data for {idle:?}: connection closed"))
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(r)
            }
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(idle_error(this.idle))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, data);
        this.after_write(cx, written)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
