//! The start-up and shutdown every long-running component shares (`scheduler-extender`,
//! `webhook`, `controller`, `agent`): the async runtime, SIGTERM/SIGINT turned into a shutdown
//! token, the ops endpoint (`/healthz`, `/readyz`, `/metrics`) served before the component's own
//! work starts, and an orderly end (shutdown cancelled, ops endpoint drained, one line on stderr).
//!
//! Nothing here may panic on a closed stderr: a component whose log reader went away must still
//! stop on SIGTERM, so messages go through [`note`], which ignores write errors.

use std::fmt::Display;
use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use weft_kube::ops::{self, Ops};

use crate::kube_args::OpsArgs;

/// What a component's work gets: its ops endpoint and the shutdown token.
pub struct Component {
    /// The ops endpoint, already serving: register metrics and readiness checks here.
    pub ops: Arc<Ops>,
    /// Cancelled on SIGTERM or SIGINT, or when the component's work ends.
    pub shutdown: CancellationToken,
    started: Arc<AtomicBool>,
}

impl Component {
    /// Marks the component started: `/readyz` reports not ready ("starting") until then, so the
    /// readiness checks the component adds are in place before anything reads them.
    pub fn started(&self) {
        self.started.store(true, Ordering::Release);
    }
}

/// Runs component `name`: starts the runtime and the ops endpoint on `ops_args`, runs `work`,
/// then shuts down. The result is `work`'s, or the ops endpoint's failure.
pub fn run<F, Fut>(name: &'static str, ops_args: &OpsArgs, work: F) -> anyhow::Result<()>
where
    F: FnOnce(Component) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    // Every TLS connection of a component (kube's client, reqwest, served certificates) uses ring;
    // as the process default it also serves code that builds a configuration without naming one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = ops::shutdown_on_signals();
        let ops = Ops::new(ops::registry());
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        ops.add_readiness_check("starting", move || s.load(Ordering::Acquire));
        let ops_task = ops_args.serve(ops.clone(), shutdown.clone()).await?;
        let result = work(Component { ops, shutdown: shutdown.clone(), started }).await;
        shutdown.cancel();
        let served = ops_task.await.context("ops endpoint task")?.context("serving the ops endpoint");
        note(format_args!("weft {name} stopped"));
        result.and(served)
    })
}

/// Writes one line to stderr, ignoring errors (a closed stderr must not stop a component).
pub fn note(message: impl Display) {
    let _ = writeln!(std::io::stderr(), "{message}");
}
