//! weft-gpu-plugin: weft's GPU device plugin, on the shared device-plugin framework
//! (`weft-deviceplugin`). The node half of the loop from decision to container:
//!
//! 1. the scheduler extender records the pod's GPU set (`weft.io/gpu-decision`, `weft.io/gpu-ids`);
//! 2. the kubelet asks this plugin which GPUs to give each container (GetPreferredAllocation); the
//!    plugin finds the pod the call is for ([`handshake`]) and answers its decision when it fits
//!    the GPUs the kubelet offers, else weft's exact best-effort set ([`choice`]);
//! 3. Allocate tells the container its GPUs as the NVIDIA container toolkit expects ([`plugin`]);
//! 4. the write-back ([`writeback`]) sets `weft.io/gpu-ids` to what the kubelet's PodResources
//!    says each pod really got.
//!
//! GPU health comes from NVML events ([`health`], feature `nvml`).

pub mod choice;
pub mod health;
pub mod inventory;
pub mod plugin;
pub mod writeback;

pub use inventory::{GpuDevice, GpuInventory};
pub use plugin::{DeviceListStrategy, GpuPlugin, GpuPluginConfig};
