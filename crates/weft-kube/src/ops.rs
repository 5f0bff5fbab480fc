//! The operations endpoint every long-running weft component serves (`--ops-listen`, port 9090 in
//! the deploy manifests): `GET /healthz` (liveness), `GET /readyz` (readiness, from named checks)
//! and `GET /metrics` (Prometheus/OpenMetrics text).
//!
//! Metrics are [`prometheus_client`] metrics registered in one [`Registry`] with the `weft` prefix
//! before the server starts; components keep clones of their metric handles and update them.
//!
//! Readiness is the conjunction of named checks. `/readyz` answers 200 `ready` when all pass and 503
//! with one line per failing check otherwise (`?verbose` lists every check either way), so a probe
//! failure in `kubectl describe pod` says which part is not ready.

use std::fmt::Write as _;
use std::sync::{Arc, PoisonError, RwLock};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A readiness check: a name and a function that says whether that part is ready.
type Check = (String, Box<dyn Fn() -> bool + Send + Sync>);

/// Health, readiness and metrics of one process.
pub struct Ops {
    registry: RwLock<Registry>,
    checks: RwLock<Vec<Check>>,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks = self.checks.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Ops").field("checks", &checks.iter().map(|c| &c.0).collect::<Vec<_>>()).finish()
    }
}

/// A new, empty metric registry with weft's prefix (`weft_…`).
pub fn registry() -> Registry {
    Registry::with_prefix("weft")
}

impl Ops {
    /// Serve the metrics in `registry`; readiness starts with no checks (ready).
    pub fn new(registry: Registry) -> Arc<Ops> {
        Arc::new(Ops { registry: RwLock::new(registry), checks: RwLock::new(Vec::new()) })
    }

    /// Registers metrics after the endpoint was made (e.g. while it already serves); returns what
    /// `register` returns (typically the metric handles).
    pub fn register_metrics<T>(&self, register: impl FnOnce(&mut Registry) -> T) -> T {
        register(&mut self.registry.write().unwrap_or_else(PoisonError::into_inner))
    }

    /// Add a readiness check named `name`.
    pub fn add_readiness_check(&self, name: impl Into<String>, check: impl Fn() -> bool + Send + Sync + 'static) {
        let mut checks = self.checks.write().unwrap_or_else(PoisonError::into_inner);
        checks.push((name.into(), Box::new(check)));
    }

    /// Every check with its result, in the order they were added.
    pub fn readiness(&self) -> Vec<(String, bool)> {
        let checks = self.checks.read().unwrap_or_else(PoisonError::into_inner);
        checks.iter().map(|(name, f)| (name.clone(), f())).collect()
    }

    /// Whether every readiness check passes.
    pub fn is_ready(&self) -> bool {
        self.readiness().iter().all(|(_, ok)| *ok)
    }

    /// The metrics in Prometheus text exposition format (OpenMetrics 1.0).
    pub fn encode_metrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in a metric's encoder.
        if let Err(e) = encode(&mut out, &self.registry.read().unwrap_or_else(PoisonError::into_inner)) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }

    /// The routes: `/healthz`, `/readyz`, `/metrics`.
    pub fn router(self: &Arc<Ops>) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self.clone())
    }
}

async fn readyz(State(ops): State<Arc<Ops>>, RawQuery(query): RawQuery) -> Response {
    let verbose = query.is_some_and(|q| q.split('&').any(|p| p == "verbose" || p.starts_with("verbose=")));
    let results = ops.readiness();
    let ready = results.iter().all(|(_, ok)| *ok);
    let mut body = String::new();
    for (name, ok) in &results {
        if verbose || !ok {
            let _ = writeln!(body, "[{}] {name}", if *ok { "+" } else { "-" });
        }
    }
    if ready {
        body.push_str("ready\n");
        (StatusCode::OK, body).into_response()
    } else {
        body.push_str("not ready\n");
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], ops.encode_metrics()).into_response()
}

/// Serve `ops` on `listener` until `shutdown` completes, with the connection limits every weft
/// server has ([`crate::http`]).
pub async fn serve<F>(listener: TcpListener, ops: Arc<Ops>, shutdown: F) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "ops endpoint (healthz, readyz, metrics) listening");
    }
    crate::http::serve(listener, ops.router(), None, crate::http::ServeOptions::default(), shutdown).await
}

/// A token cancelled when the process gets SIGTERM (what the kubelet sends on pod deletion) or
/// SIGINT (Ctrl-C). Components stop accepting work, finish what runs, release leases and exit.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = async {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::warn!(error = %e, "cannot listen for SIGINT");
                std::future::pending::<()>().await;
            }
        };
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        // Cancel first, then log: logging must never stand between a signal and the shutdown.
        let signal = tokio::select! {
            () = ctrl_c => "SIGINT",
            () = term => "SIGTERM",
        };
        t.cancel();
        tracing::info!("{signal}: shutting down");
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn readiness_is_the_conjunction_of_checks() {
        let ops = Ops::new(registry());
        assert!(ops.is_ready(), "no checks: ready");
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        ops.add_readiness_check("caches", move || f.load(Ordering::Acquire));
        ops.add_readiness_check("always", || true);
        assert!(!ops.is_ready());
        assert_eq!(ops.readiness(), vec![("caches".to_string(), false), ("always".to_string(), true)]);
        flag.store(true, Ordering::Release);
        assert!(ops.is_ready());
    }

    #[test]
    fn metrics_are_encoded_with_the_weft_prefix() {
        let mut reg = registry();
        let c: Counter = Counter::default();
        reg.register("test_events", "Events seen", c.clone());
        c.inc_by(3);
        let ops = Ops::new(reg);
        let text = ops.encode_metrics();
        assert!(text.contains("# TYPE weft_test_events counter"), "{text}");
        assert!(text.contains("weft_test_events_total 3"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
