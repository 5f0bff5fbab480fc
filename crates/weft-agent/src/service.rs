//! The resource manager as a long-running service: build the state from the checkpoint, pick the
//! enforcement mode, and run it until shutdown.
//!
//! Modes (`--mode`):
//! - `nri`: register with the runtime's NRI socket and enforce synchronously; reconnect with
//!   backoff whenever the runtime drops us (each new session Synchronizes and corrects what ran
//!   without weft). A periodic reconcile releases pods the kubelet no longer has and sends
//!   `UpdateContainers` for containers whose settings moved or whose cgroup drifted; a container
//!   started after the shared pool moved wakes it at once (only the push, not the rest).
//! - `bypass`: poll the kubelet's pod list and write cgroup files (see [`crate::bypass`]).
//! - `auto`: NRI when the socket answers, else bypass; keep probing the socket every period and
//!   switch to NRI for good when it appears (Katalyst decides once at start; a node whose
//!   containerd gains NRI later should not need an agent restart).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio_util::sync::CancellationToken;
use weft_nri::plugin::{self, PluginOptions, RuntimeHandle, SessionState, SocketSource};
use weft_topology::CpuLayout;

use crate::agent::{Manager, PodCatalog, StateStore};
use crate::bypass::Bypass;
use crate::cgroup::{CgroupEnforcer, CgroupHierarchy, CgroupLayout, CgroupVersion, ContainerCgroup};
use crate::checkpoint::Checkpoint;
use crate::kubelet::PodSource;
use crate::nri::{NriHandler, Translation, reconcile_once};
use crate::orm::{OrmConfig, ResourceManager};
use crate::pod::DeviceLocator;

/// The longest the NRI reconcile waits for the kubelet's pod list (or the period, when longer).
const KUBELET_LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Enforcement mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// NRI plugin.
    Nri,
    /// kubelet polling + cgroup files.
    Bypass,
    /// NRI when available, bypass until then.
    Auto,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "nri" => Ok(Mode::Nri),
            "bypass" => Ok(Mode::Bypass),
            "auto" => Ok(Mode::Auto),
            other => Err(format!("unknown mode '{other}' (nri, bypass or auto)")),
        }
    }
}

/// Everything the service needs.
pub struct ServiceConfig {
    /// Enforcement mode.
    pub mode: Mode,
    /// This node's CPUs.
    pub layout: CpuLayout,
    /// Resource-manager policy.
    pub orm: OrmConfig,
    /// Device NUMA lookup.
    pub locator: Arc<dyn DeviceLocator>,
    /// Checkpoint file.
    pub checkpoint: PathBuf,
    /// NRI plugin identity and socket.
    pub nri: PluginOptions,
    /// The kubelet's pod list (required for bypass and auto; optional for nri).
    pub kubelet: Option<Arc<dyn PodSource>>,
    /// cgroup hierarchy (bypass writes, drift reads in NRI mode); `None` when not mounted.
    pub cgroups: Option<CgroupHierarchy>,
    /// Container cgroup naming (bypass).
    pub cgroup_layout: CgroupLayout,
    /// Reconcile / poll period.
    pub period: Duration,
    /// Set while the resource manager enforces: an NRI session is synchronized, or the last bypass
    /// pass could list the kubelet's pods (the agent's `/readyz`).
    pub ready: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Why the service could not start or stopped.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// A setting is unusable.
    #[error("{0}")]
    Config(String),
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The NRI plugin failed for good.
    #[error("NRI plugin: {0}")]
    Nri(#[from] weft_nri::plugin::PluginError),
}

/// The manager, with the checkpoint's state when it fits this node. A corrupt checkpoint (moved
/// aside) or one that does not fit (CPUs gone, settings changed) starts empty: the first resync
/// rebuilds the allocations from what runs.
pub fn build_manager(cfg: &ServiceConfig, store: Arc<dyn StateStore>) -> Result<Arc<Manager>, ServiceError> {
    let fresh =
        || ResourceManager::new(cfg.layout.clone(), cfg.orm.clone()).map_err(|e| ServiceError::Config(e.to_string()));
    let rm = match store.load() {
        Ok(Some(state)) => {
            let pods = state.pods.len();
            match ResourceManager::restore(cfg.layout.clone(), cfg.orm.clone(), state) {
                Ok(rm) => {
                    tracing::info!(pods, "state restored from the checkpoint");
                    rm
                }
                Err(e) => {
                    tracing::warn!(error = %e, "checkpoint does not fit this node; starting empty and rebuilding");
                    fresh()?
                }
            }
        }
        Ok(None) => fresh()?,
        Err(e) if e.start_empty() => {
            tracing::warn!(error = %e, "starting empty and rebuilding");
            fresh()?
        }
        Err(e) => return Err(e.into()),
    };
    let catalog = Arc::new(PodCatalog::new(cfg.kubelet.clone()));
    Ok(Arc::new(Manager::new(rm, store, catalog, cfg.locator.clone())))
}

/// Run until `shutdown`.
pub async fn run(cfg: ServiceConfig, shutdown: CancellationToken) -> Result<(), ServiceError> {
    cfg.nri.validate()?;
    if matches!(cfg.mode, Mode::Bypass | Mode::Auto) && (cfg.kubelet.is_none() || cfg.cgroups.is_none()) {
        return Err(ServiceError::Config(
            "bypass and auto modes need the kubelet's pod list and a cgroup hierarchy".to_string(),
        ));
    }
    let store: Arc<dyn StateStore> = Arc::new(Checkpoint::new(&cfg.checkpoint));
    let manager = build_manager(&cfg, store)?;
    run_with(cfg, manager, shutdown).await
}

/// Run with a prepared manager (tests pass one over their own store).
pub async fn run_with(
    cfg: ServiceConfig,
    manager: Arc<Manager>,
    shutdown: CancellationToken,
) -> Result<(), ServiceError> {
    let enforcer: Option<Arc<dyn CgroupEnforcer>> =
        cfg.cgroups.clone().map(|h| Arc::new(crate::cgroup::CgroupWriter::new(h)) as Arc<dyn CgroupEnforcer>);
    let translation = Translation { unified: cfg.cgroups.as_ref().is_some_and(|h| h.version() == CgroupVersion::V2) };
    let use_nri = match cfg.mode {
        Mode::Nri => true,
        Mode::Bypass => false,
        Mode::Auto => probe_nri(&cfg.nri).await,
    };
    if !use_nri {
        tracing::info!(mode = ?cfg.mode, "enforcing by writing cgroup files (bypass)");
        let (Some(source), Some(hierarchy), Some(enforcer)) =
            (cfg.kubelet.clone(), cfg.cgroups.clone(), enforcer.clone())
        else {
            return Err(ServiceError::Config("bypass needs the kubelet and cgroups".into()));
        };
        let bypass = Bypass::new(manager.clone(), source, hierarchy, cfg.cgroup_layout.clone(), enforcer);
        let mut tick = tokio::time::interval(cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tick.tick() => {}
            }
            match bypass.pass().await {
                Ok(_) => {
                    cfg.ready.send_replace(true);
                }
                Err(e) => {
                    cfg.ready.send_replace(false);
                    tracing::warn!(error = %e, "bypass pass: kubelet pod list unavailable");
                }
            }
            if cfg.mode == Mode::Auto && probe_nri(&cfg.nri).await {
                tracing::info!("NRI socket answers: switching from bypass to NRI");
                break;
            }
        }
    }
    run_nri(&cfg, manager, translation, enforcer, shutdown).await
}

async fn probe_nri(opts: &PluginOptions) -> bool {
    match &opts.socket {
        SocketSource::Path(p) => plugin::probe(p).await,
        // Launched by the runtime: the socket is ours.
        SocketSource::Inherited | SocketSource::Fd(_) => true,
    }
}

async fn run_nri(
    cfg: &ServiceConfig,
    manager: Arc<Manager>,
    translation: Translation,
    enforcer: Option<Arc<dyn CgroupEnforcer>>,
    shutdown: CancellationToken,
) -> Result<(), ServiceError> {
    tracing::info!(plugin = %cfg.nri.full_name(), "enforcing through NRI");
    let handle = RuntimeHandle::new();
    let handler = Arc::new(NriHandler::new(manager.clone(), translation));
    let push = handler.push_signal();
    let readiness = {
        let mut sessions = handle.subscribe_sessions();
        let ready = cfg.ready.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let connected = matches!(*sessions.borrow_and_update(), SessionState::Connected { .. });
                ready.send_replace(connected);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    changed = sessions.changed() => if changed.is_err() { return },
                }
            }
        })
    };
    let reconcile = {
        let manager = manager.clone();
        let handle = handle.clone();
        let shutdown = shutdown.clone();
        let period = cfg.period;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let kicked = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => false,
                    _ = push.notified() => true,
                };
                if !handle.is_connected() {
                    continue;
                }
                if kicked {
                    // A container started after the shared pool moved: push now.
                    match reconcile_once(&manager, &handle, translation).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(updated = n, "shared pool moved: containers updated"),
                        Err(e) => tracing::warn!(error = %e, "pushing the shared pool: UpdateContainers failed"),
                    }
                    continue;
                }
                // Pods gone without a RemovePodSandbox (containerd relays none for pods that
                // lived through its restart): released by the kubelet's list.
                match tokio::time::timeout(period.max(KUBELET_LIST_TIMEOUT), manager.release_gone()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "reconcile: kubelet pod list unavailable"),
                    Err(_) => tracing::warn!("reconcile: kubelet pod list too slow"),
                }
                if let Some(enforcer) = &enforcer {
                    mark_drifted(&manager, enforcer.as_ref());
                }
                match reconcile_once(&manager, &handle, translation).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(updated = n, "reconcile: containers updated"),
                    Err(e) => tracing::warn!(error = %e, "reconcile: UpdateContainers failed"),
                }
            }
        })
    };
    let result = plugin::run(cfg.nri.clone(), handler, handle, shutdown.clone()).await;
    shutdown.cancel();
    let _ = reconcile.await;
    let _ = readiness.await;
    result.map_err(ServiceError::from)
}

/// Containers whose cgroup files drifted from what was enforced on them are marked for
/// re-application (the next reconcile sends them in `UpdateContainers`).
pub fn mark_drifted(manager: &Manager, enforcer: &dyn CgroupEnforcer) {
    for (id, c) in manager.containers() {
        let (Some(path), Some(applied)) = (&c.cgroups_path, &c.applied) else { continue };
        let Ok(cgroup) = ContainerCgroup::from_cgroups_path(path) else { continue };
        match enforcer.drift(&cgroup, applied) {
            Ok(d) if !d.is_empty() => {
                let what: Vec<String> = d.iter().map(ToString::to_string).collect();
                tracing::info!(container = %id, drift = %what.join("; "), "cgroup drifted");
                manager.forget_applied(&id);
            }
            _ => {}
        }
    }
}
