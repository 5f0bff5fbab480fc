//! An in-memory [`NvmlLike`] for tests and simulations: GPUs, their topology levels and NVLink ports
//! are set up with builder calls, and failures can be injected per GPU, pair or port.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use crate::error::TopologyError;

use super::gpu::{NVLINK_MAX_LINKS, NvlinkRemote, NvmlDeviceInfo, NvmlLike, NvmlTopologyLevel, RemoteDeviceType};

/// A fake NVML. Pairs without a level set fail `common_ancestor`, like a GPU that fell off the bus.
#[derive(Debug, Default)]
pub struct FakeNvml {
    /// `driver_version()`; `None` makes the call fail.
    pub driver_version: Option<String>,
    /// GPUs by index.
    pub devices: Vec<NvmlDeviceInfo>,
    /// Common-ancestor level per unordered pair `(low, high)`.
    pub levels: BTreeMap<(u32, u32), NvmlTopologyLevel>,
    /// Active NVLink ports: `(gpu, port)` → far end.
    pub ports: BTreeMap<(u32, u32), NvlinkRemote>,
    /// GPUs whose `device_info` fails.
    pub failing_devices: BTreeSet<u32>,
    /// Ports whose query fails.
    pub failing_ports: BTreeSet<(u32, u32)>,
    nvlink_calls: Cell<u64>,
}

/// PCI id (device `0x20b0`, vendor NVIDIA) the fake gives its GPUs.
pub const FAKE_GPU_PCI_ID: u32 = 0x20b0_10de;
/// PCI id (device `0x1af1`, vendor NVIDIA) of the fake's NVSwitches.
pub const FAKE_NVSWITCH_PCI_ID: u32 = 0x1af1_10de;

impl FakeNvml {
    /// A fake with a driver and no GPUs.
    pub fn new(driver_version: &str) -> FakeNvml {
        FakeNvml { driver_version: Some(driver_version.to_string()), ..FakeNvml::default() }
    }

    /// Add a GPU with a UUID derived from its index, `name` and bus id `bus` (NVML form is fine).
    pub fn gpu(mut self, name: &str, bus: &str) -> FakeNvml {
        let index = self.devices.len();
        self.devices.push(NvmlDeviceInfo {
            uuid: format!("GPU-fake-{index:04}"),
            name: Some(name.to_string()),
            pci_bus_id: bus.to_string(),
            pci_device_id: Some(FAKE_GPU_PCI_ID),
            ..NvmlDeviceInfo::default()
        });
        self
    }

    /// Set the common-ancestor level of every pair not yet set.
    pub fn all_levels(mut self, level: NvmlTopologyLevel) -> FakeNvml {
        let n = self.devices.len() as u32;
        for a in 0..n {
            for b in (a + 1)..n {
                self.levels.entry((a, b)).or_insert(level);
            }
        }
        self
    }

    /// Set the common-ancestor level of one pair.
    pub fn level(mut self, a: u32, b: u32, level: NvmlTopologyLevel) -> FakeNvml {
        self.levels.insert((a.min(b), a.max(b)), level);
        self
    }

    fn next_free_port(&self, gpu: u32) -> u32 {
        (0..NVLINK_MAX_LINKS).find(|p| !self.ports.contains_key(&(gpu, *p))).unwrap_or(NVLINK_MAX_LINKS)
    }

    /// Join GPUs `a` and `b` with `count` direct NVLinks (the next free ports on both sides).
    pub fn nvlinks(mut self, a: u32, b: u32, count: u32) -> FakeNvml {
        for _ in 0..count {
            for (from, to) in [(a, b), (b, a)] {
                let port = self.next_free_port(from);
                let bus = self.devices.get(to as usize).map(|d| d.pci_bus_id.clone()).unwrap_or_default();
                let remote = NvlinkRemote {
                    pci_bus_id: bus,
                    pci_device_id: Some(FAKE_GPU_PCI_ID),
                    device_type: RemoteDeviceType::Gpu,
                };
                self.ports.insert((from, port), remote);
            }
        }
        self
    }

    /// Connect GPU `gpu` to the NVSwitch at `switch_bus` with `count` links, the remote reported as
    /// `device_type` (`Unknown` models nvml-wrapper 0.13, which never reports the type).
    pub fn switch_links(mut self, gpu: u32, switch_bus: &str, count: u32, device_type: RemoteDeviceType) -> FakeNvml {
        for _ in 0..count {
            let port = self.next_free_port(gpu);
            let remote = NvlinkRemote {
                pci_bus_id: switch_bus.to_string(),
                pci_device_id: Some(FAKE_NVSWITCH_PCI_ID),
                device_type,
            };
            self.ports.insert((gpu, port), remote);
        }
        self
    }

    /// How many `nvlink_remote` calls were made (to check that a cache hit makes none).
    pub fn nvlink_calls(&self) -> u64 {
        self.nvlink_calls.get()
    }

    fn info(&self, index: u32) -> Result<&NvmlDeviceInfo, TopologyError> {
        self.devices.get(index as usize).ok_or_else(|| TopologyError::Nvml(format!("GPU{index}: Invalid argument")))
    }
}

impl NvmlLike for FakeNvml {
    fn driver_version(&self) -> Result<String, TopologyError> {
        self.driver_version.clone().ok_or_else(|| TopologyError::Nvml("driver version: Not supported".into()))
    }

    fn device_count(&self) -> Result<u32, TopologyError> {
        Ok(self.devices.len() as u32)
    }

    fn device_uuid(&self, index: u32) -> Result<String, TopologyError> {
        Ok(self.info(index)?.uuid.clone())
    }

    fn device_info(&self, index: u32) -> Result<NvmlDeviceInfo, TopologyError> {
        if self.failing_devices.contains(&index) {
            return Err(TopologyError::Nvml(format!("GPU{index}: GPU is lost")));
        }
        Ok(self.info(index)?.clone())
    }

    fn common_ancestor(&self, a: u32, b: u32) -> Result<NvmlTopologyLevel, TopologyError> {
        self.levels
            .get(&(a.min(b), a.max(b)))
            .copied()
            .ok_or_else(|| TopologyError::Nvml(format!("GPU{a}-GPU{b} topology: Unknown error")))
    }

    fn nvlink_remote(&self, index: u32, link: u32) -> Result<Option<NvlinkRemote>, TopologyError> {
        self.nvlink_calls.set(self.nvlink_calls.get() + 1);
        if self.failing_ports.contains(&(index, link)) {
            return Err(TopologyError::Nvml(format!("GPU{index} NVLink {link} state: Unknown error")));
        }
        self.info(index)?;
        Ok(self.ports.get(&(index, link)).cloned())
    }
}
