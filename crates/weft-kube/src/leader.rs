//! Leader election for weft's Deployments over a `coordination.k8s.io/v1` Lease.
//!
//! The Lease protocol is kube-lease-manager's (holder identity, renew time, lease duration, grace
//! before expiry to renew). On top of it, [`run_as_leader`] gives the shape every weft Deployment
//! uses: replicas wait as standbys; the holder runs the work; on shutdown the holder stops its work,
//! then releases the Lease so a standby takes over at once instead of after the lease expires; if
//! the holder *loses* the Lease (it could not renew in time), its work is stopped and
//! [`LeaderError::Lost`] is returned so the process exits and restarts as a standby — two replicas
//! must never both act as leader.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerError, LeaseParams};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

/// Why leader election stopped.
#[derive(Debug, Error)]
pub enum LeaderError {
    /// The settings cannot work.
    #[error("leader election: {0}")]
    BadConfig(String),
    /// The Lease could not be created or read.
    #[error("leader election on lease {namespace}/{name}: {source}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Why.
        #[source]
        source: LeaseManagerError,
    },
    /// This replica held the Lease and lost it; its work was stopped.
    #[error("lost the leader lease {namespace}/{name}; stopped work so another replica can lead")]
    Lost {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
    },
}

/// Which Lease to hold and for how long.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Lease name (e.g. `weft-controller`).
    pub lease_name: String,
    /// Lease namespace (the Deployment's namespace).
    pub namespace: String,
    /// This replica's identity (its pod name); unique among replicas.
    pub identity: String,
    /// How long the Lease is valid after the last renewal.
    pub lease_duration: Duration,
    /// How long before expiry the holder renews (also the clock skew tolerated between nodes).
    pub renew_grace: Duration,
}

impl LeaderConfig {
    /// Defaults as client-go's leader election: 15 s lease, renewed 5 s before it expires.
    pub fn new(lease_name: &str, namespace: &str, identity: &str) -> LeaderConfig {
        LeaderConfig {
            lease_name: lease_name.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_grace: Duration::from_secs(5),
        }
    }

    fn params(&self) -> Result<LeaseParams, LeaderError> {
        let (duration, grace) = (self.lease_duration.as_secs(), self.renew_grace.as_secs());
        if self.identity.is_empty() {
            return Err(LeaderError::BadConfig("the identity is empty (set POD_NAME or --leader-identity)".into()));
        }
        if self.lease_name.is_empty() || self.namespace.is_empty() {
            return Err(LeaderError::BadConfig("the lease name and namespace must not be empty".into()));
        }
        // LeaseParams::new panics on these; check first so bad flags get an error, not a panic.
        if duration == 0 || grace == 0 || grace >= duration {
            return Err(LeaderError::BadConfig(format!(
                "lease duration ({duration} s) and renew grace ({grace} s) must be whole seconds with 0 < grace < duration"
            )));
        }
        let field_manager = format!("weft-leader-{}", self.identity);
        if field_manager.len() > 128 {
            return Err(LeaderError::BadConfig(format!("identity '{}' is too long", self.identity)));
        }
        Ok(LeaseParams::new(self.identity.clone(), duration, grace).with_field_manager(field_manager))
    }
}

/// `weft_leader{}`: 1 while this replica holds the Lease.
pub fn register_leader_gauge(registry: &mut Registry) -> Gauge {
    let g = Gauge::default();
    registry.register("leader", "1 while this replica holds the leader Lease, else 0", g.clone());
    g
}

/// Wait for the Lease, then run `work` until `shutdown` is cancelled, `work` returns, or the Lease is
/// lost. `work` gets a token that is cancelled when it must stop; it should return promptly then.
///
/// Returns `Ok` after a shutdown or after `work` finished (the Lease is released), and
/// [`LeaderError::Lost`] when leadership was lost.
pub async fn run_as_leader<F, Fut>(
    client: Client,
    cfg: &LeaderConfig,
    is_leader: Gauge,
    shutdown: CancellationToken,
    work: F,
) -> Result<(), LeaderError>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let params = cfg.params()?;
    let lease_err =
        |source| LeaderError::Lease { namespace: cfg.namespace.clone(), name: cfg.lease_name.clone(), source };
    let manager = LeaseManager::new(client, &cfg.lease_name, &cfg.namespace, params, LeaseCreateMode::AutoCreate)
        .await
        .map_err(lease_err)?;
    let (mut leading, lease_task) = manager.watch().await;
    tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "waiting to become leader");

    // Standby until the Lease is ours or we are told to stop.
    let became_leader = tokio::select! {
        () = shutdown.cancelled() => false,
        r = leading.wait_for(|l| *l) => r.is_ok(),
    };
    if !became_leader {
        return release(leading, lease_task, cfg).await;
    }
    tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "became leader");
    is_leader.set(1);

    let stop_work = CancellationToken::new();
    let mut work = tokio::spawn(work(stop_work.clone()));
    let lost = tokio::select! {
        () = shutdown.cancelled() => false,
        _ = &mut work => false,
        r = leading.wait_for(|l| !*l) => { let _ = r; true }
    };
    stop_work.cancel();
    if let Err(e) = (&mut work).await
        && e.is_panic()
    {
        tracing::error!(error = %e, "leader work panicked");
    }
    is_leader.set(0);
    if lost {
        tracing::error!(lease = %cfg.lease_name, identity = %cfg.identity, "lost leadership");
        drop(leading);
        lease_task.abort();
        return Err(LeaderError::Lost { namespace: cfg.namespace.clone(), name: cfg.lease_name.clone() });
    }
    release(leading, lease_task, cfg).await
}

/// Stop watching and let the lease manager release the Lease (it does so when its receiver goes).
async fn release(
    leading: tokio::sync::watch::Receiver<bool>,
    lease_task: tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    cfg: &LeaderConfig,
) -> Result<(), LeaderError> {
    drop(leading);
    match lease_task.await {
        Ok(Ok(_)) => {
            tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "released the lease");
            Ok(())
        }
        Ok(Err(source)) => {
            Err(LeaderError::Lease { namespace: cfg.namespace.clone(), name: cfg.lease_name.clone(), source })
        }
        Err(e) => {
            tracing::warn!(error = %e, "lease task ended abnormally");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_durations_are_errors_not_panics() {
        let mut cfg = LeaderConfig::new("l", "ns", "me");
        assert!(cfg.params().is_ok());
        cfg.renew_grace = cfg.lease_duration;
        assert!(matches!(cfg.params(), Err(LeaderError::BadConfig(_))));
        cfg.renew_grace = Duration::from_millis(500);
        assert!(matches!(cfg.params(), Err(LeaderError::BadConfig(_))), "sub-second grace rounds to 0");
        let cfg = LeaderConfig::new("l", "ns", "");
        assert!(matches!(cfg.params(), Err(LeaderError::BadConfig(_))));
    }
}
