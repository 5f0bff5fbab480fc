//! VF health in production: every `interval` the node's SR-IOV functions are read again from
//! sysfs and each plugin takes its VFs' health from that read ([`SriovPlugin::refresh`]): a VF is
//! Unhealthy while its PF's link is down or it is gone from sysfs, and healthy again when that
//! ends. Only changes reach the kubelet.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use weft_topology::discover::{SriovInventory, SysfsRoot, read_sriov};

use crate::plugin::SriovPlugin;

/// Reads the SR-IOV functions under `root` (off the async workers).
pub async fn read(root: &SysfsRoot) -> Result<SriovInventory, String> {
    let root = root.clone();
    let (inventory, notes) = tokio::task::spawn_blocking(move || {
        let mut notes = Vec::new();
        (read_sriov(&root, &mut notes), notes)
    })
    .await
    .map_err(|e| format!("reading the SR-IOV functions: {e}"))?;
    for note in notes {
        tracing::debug!(%note, "SR-IOV health read");
    }
    Ok(inventory)
}

/// Polls sysfs under `root` every `interval` until `shutdown`, refreshing every plugin from one
/// read (the plugins of all the node's physnets together).
pub async fn watch_health(
    plugins: Vec<Arc<SriovPlugin>>,
    root: SysfsRoot,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        match read(&root).await {
            Ok(now) => {
                for p in &plugins {
                    p.refresh(&now);
                }
            }
            Err(e) => tracing::warn!(error = %e, "VF health not refreshed"),
        }
    }
}
