//! GPU health from NVML events: a critical XID error or a double-bit ECC error marks the GPU
//! unhealthy, and ListAndWatch tells the kubelet, which stops handing it out. XIDs an application
//! causes on its own GPU (13 graphics engine exception, 31 memory page fault, 43 channel stopped,
//! 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout) leave the GPU
//! healthy, as in NVIDIA's device plugin. A GPU stays unhealthy until the plugin restarts.
//!
//! The NVML watcher is built with the `nvml` feature; without NVML the GPUs stay healthy.

/// XIDs caused by an application rather than by the GPU.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Whether a critical XID event (`None`: NVML could not say which XID) makes the GPU unhealthy.
pub fn xid_makes_unhealthy(xid: Option<u64>) -> bool {
    xid.is_none_or(|x| !APPLICATION_XIDS.contains(&x))
}

#[cfg(feature = "nvml")]
pub use watcher::watch_nvml;

#[cfg(feature = "nvml")]
mod watcher {
    use std::sync::Arc;

    use nvml_wrapper::Nvml;
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    use tokio_util::sync::CancellationToken;

    use super::xid_makes_unhealthy;
    use crate::plugin::GpuPlugin;

    /// Watches NVML events on a blocking thread until `shutdown` and marks GPUs unhealthy.
    /// Returns an error when NVML cannot be loaded or no GPU accepts event registration.
    pub fn watch_nvml(plugin: Arc<GpuPlugin>, shutdown: CancellationToken) -> Result<(), String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML: {e}"))?;
        std::thread::Builder::new()
            .name("weft-gpu-health".into())
            .spawn(move || {
                if let Err(e) = run(&nvml, &plugin, &shutdown) {
                    tracing::warn!(error = %e, "GPU health events unavailable: GPUs stay healthy");
                }
            })
            .map_err(|e| format!("starting the GPU health thread: {e}"))?;
        Ok(())
    }

    fn run(nvml: &Nvml, plugin: &GpuPlugin, shutdown: &CancellationToken) -> Result<(), String> {
        let mut set = nvml.create_event_set().map_err(|e| format!("NVML event set: {e}"))?;
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut registered = 0;
        for gpu in plugin.inventory().devices() {
            let index = u32::try_from(gpu.index).unwrap_or(u32::MAX);
            let device = nvml.device_by_index(index).map_err(|e| format!("NVML GPU {index}: {e}"))?;
            // Not every GPU reports ECC events: register what it supports (a failed registration
            // releases the whole set, so none is attempted blind).
            let events = device.supported_event_types().map_err(|e| format!("NVML GPU {index}: {e}"))? & wanted;
            if events.is_empty() {
                tracing::warn!(gpu = index, "the GPU reports no XID or ECC events");
                continue;
            }
            set = device.register_events(events, set).map_err(|e| format!("NVML GPU {index}: {}", e.error))?;
            registered += 1;
        }
        if registered == 0 {
            return Err("no GPU accepts NVML event registration".into());
        }
        tracing::info!(gpus = registered, "watching NVML health events");
        while !shutdown.is_cancelled() {
            let event = match set.wait(1000) {
                Ok(e) => e,
                Err(NvmlError::Timeout) => continue,
                Err(e) => return Err(format!("NVML event wait: {e}")),
            };
            let xid = match event.event_data {
                Some(XidError::Value(v)) => Some(v),
                _ => None,
            };
            let critical = event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) || xid_makes_unhealthy(xid);
            let uuid = event.device.uuid().ok();
            let index = plugin.inventory().devices().iter().find(|d| Some(&d.id) == uuid.as_ref()).map(|d| d.index);
            tracing::warn!(?uuid, ?xid, events = ?event.event_type, critical, "NVML event");
            if let (true, Some(index)) = (critical, index) {
                plugin.set_health(index, false);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_leave_the_gpu_healthy_others_do_not() {
        for xid in APPLICATION_XIDS {
            assert!(!xid_makes_unhealthy(Some(xid)), "XID {xid}");
        }
        assert!(xid_makes_unhealthy(Some(79)), "79: the GPU fell off the bus");
        assert!(xid_makes_unhealthy(Some(48)), "48: double-bit ECC");
        assert!(xid_makes_unhealthy(None), "an XID NVML cannot name");
    }
}
