//! The real NVML binding (`nvml` feature): `nvml-wrapper` 0.13, which loads `libnvidia-ml.so.1` at run
//! time. Only the calls [`NvmlLike`] needs; all logic lives in `gpu.rs` and runs against the fake too.

use std::os::raw::c_ulong;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enum_wrappers::nv_link::IntDeviceType;
use nvml_wrapper::error::NvmlError;

use crate::cpuset::{CpuSet, MAX_CPU};
use crate::error::TopologyError;

use super::gpu::{NvlinkRemote, NvmlDeviceInfo, NvmlLike, NvmlTopologyLevel, RemoteDeviceType};

/// Words of the CPU affinity mask asked for: 64 × 64 = 4096 CPUs.
const AFFINITY_WORDS: usize = 64;

fn nvml_err(what: &str, e: NvmlError) -> TopologyError {
    TopologyError::Nvml(format!("{what}: {e}"))
}

/// NVML loaded from the driver's library.
pub struct NvmlLib {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLib").finish_non_exhaustive()
    }
}

impl NvmlLib {
    /// Load `libnvidia-ml.so.1` and initialise NVML. Fails when the library or the driver is missing.
    pub fn open() -> Result<NvmlLib, TopologyError> {
        Nvml::init().map(|nvml| NvmlLib { nvml }).map_err(|e| nvml_err("init", e))
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, TopologyError> {
        self.nvml.device_by_index(index).map_err(|e| nvml_err(&format!("GPU{index}"), e))
    }
}

fn mask_to_cpuset(words: &[c_ulong]) -> CpuSet {
    let bits = c_ulong::BITS as usize;
    let mut set = CpuSet::new();
    for (w, word) in words.iter().enumerate() {
        for b in 0..bits {
            let cpu = w * bits + b;
            if (word >> b) & 1 == 1
                && let Ok(cpu) = u32::try_from(cpu)
                && cpu <= MAX_CPU
            {
                set.insert(cpu);
            }
        }
    }
    set
}

impl NvmlLike for NvmlLib {
    fn driver_version(&self) -> Result<String, TopologyError> {
        self.nvml.sys_driver_version().map_err(|e| nvml_err("driver version", e))
    }

    fn device_count(&self) -> Result<u32, TopologyError> {
        self.nvml.device_count().map_err(|e| nvml_err("device count", e))
    }

    fn device_uuid(&self, index: u32) -> Result<String, TopologyError> {
        self.device(index)?.uuid().map_err(|e| nvml_err(&format!("GPU{index} uuid"), e))
    }

    fn device_info(&self, index: u32) -> Result<NvmlDeviceInfo, TopologyError> {
        let dev = self.device(index)?;
        let uuid = dev.uuid().map_err(|e| nvml_err(&format!("GPU{index} uuid"), e))?;
        let pci = dev.pci_info().map_err(|e| nvml_err(&format!("GPU{index} PCI info"), e))?;
        Ok(NvmlDeviceInfo {
            uuid,
            name: dev.name().ok(),
            pci_bus_id: pci.bus_id,
            pci_device_id: Some(pci.pci_device_id),
            numa_node: dev.numa_node_id().ok(),
            cpu_affinity: dev.cpu_affinity(AFFINITY_WORDS).ok().map(|m| mask_to_cpuset(&m)),
            max_pcie_link_gen: dev.max_pcie_link_gen().ok(),
            max_pcie_link_width: dev.max_pcie_link_width().ok(),
        })
    }

    fn common_ancestor(&self, a: u32, b: u32) -> Result<NvmlTopologyLevel, TopologyError> {
        let (da, db) = (self.device(a)?, self.device(b)?);
        let level = da.topology_common_ancestor(db).map_err(|e| nvml_err(&format!("GPU{a}-GPU{b} topology"), e))?;
        Ok(match level {
            TopologyLevel::Internal => NvmlTopologyLevel::Internal,
            TopologyLevel::Single => NvmlTopologyLevel::Single,
            TopologyLevel::Multiple => NvmlTopologyLevel::Multiple,
            TopologyLevel::HostBridge => NvmlTopologyLevel::HostBridge,
            TopologyLevel::Node => NvmlTopologyLevel::Node,
            TopologyLevel::System => NvmlTopologyLevel::System,
        })
    }

    fn nvlink_remote(&self, index: u32, link: u32) -> Result<Option<NvlinkRemote>, TopologyError> {
        let dev = self.device(index)?;
        let nv = dev.link_wrapper_for(link);
        match nv.is_active() {
            Ok(true) => {}
            // No such port, or a GPU without NVLink.
            Ok(false) | Err(NvmlError::NotSupported | NvmlError::InvalidArg) => return Ok(None),
            Err(e) => return Err(nvml_err(&format!("GPU{index} NVLink {link} state"), e)),
        }
        let pci = nv.remote_pci_info().map_err(|e| nvml_err(&format!("GPU{index} NVLink {link} remote PCI"), e))?;
        // nvml-wrapper 0.13 passes NVML a temporary here and so always returns `Unknown`; the mapping is
        // kept for a fixed release, and `classify_remote` falls back to the remote PCI vendor.
        let device_type = match nv.remote_device_type(link) {
            Ok(IntDeviceType::Gpu) => RemoteDeviceType::Gpu,
            Ok(IntDeviceType::Switch) => RemoteDeviceType::Switch,
            Ok(IntDeviceType::Ibmnpu) => RemoteDeviceType::IbmNpu,
            Ok(IntDeviceType::Unknown) | Err(_) => RemoteDeviceType::Unknown,
        };
        Ok(Some(NvlinkRemote { pci_bus_id: pci.bus_id, pci_device_id: Some(pci.pci_device_id), device_type }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_mask_bits_become_cpus() {
        let words: [c_ulong; 2] = [0b1011, 1];
        let set = mask_to_cpuset(&words);
        assert_eq!(set.to_string(), format!("0-1,3,{}", c_ulong::BITS));
    }
}
