//! Running a controller under test: a hang guard, fast settings, and a handle to stop it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_kube::controller::{ControllerMetrics, Settings};

/// How long a test waits for anything before it fails as hung (not a timing assertion: a
/// passing test never comes near it).
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Awaits `f`, failing the test with `what` if it hangs past [`HANG_GUARD`].
pub async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Controller settings for tests: no debounce, short backoff.
pub fn fast_settings(name: &'static str) -> Settings {
    Settings {
        debounce: Duration::ZERO,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        ..Settings::new(name)
    }
}

/// A controller under test: its metrics, and a handle that stops it and waits until it returned.
pub struct Running {
    pub metrics: ControllerMetrics,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the controller and waits until it returned.
    pub async fn stop(self) {
        self.stop.cancel();
        guard("the controller to stop", self.task).await.unwrap();
    }

    /// Waits until at least `n` reconciles finished in all.
    pub async fn reconciled(&self, n: u64) {
        let mut rx = self.metrics.finished();
        guard("reconciles", rx.wait_for(|c| *c >= n)).await.unwrap();
    }
}
