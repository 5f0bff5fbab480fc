//! weft-sriov-plugin: weft's SR-IOV VF device plugin, on the shared device-plugin framework
//! (`weft-deviceplugin`). One plugin per physnet, serving `sriov.weft.io/<physnet>`; the node half
//! of the loop from decision to container for VFs:
//!
//! 1. the agent reads the node's SR-IOV functions and maps them onto the physnets
//!    ([`VfInventory::per_physnet`]), and places the node's GPUs in the PCI tree
//!    ([`inventory::gpu_places`]);
//! 2. the scheduler extender records the pod's VFs by physnet (`weft.io/gpu-decision`'s `vfs`)
//!    and its GPUs (`weft.io/gpu-ids`);
//! 3. the kubelet asks each physnet's plugin which VFs to give a container (GetPreferredAllocation);
//!    the plugin finds the pod the call is for (the shared handshake) and answers the VFs its
//!    decision records when they fit what the kubelet offers, else the VFs nearest the pod's GPUs
//!    ([`choice`]);
//! 4. Allocate tells the container its VFs as sriov-network-device-plugin does
//!    (`PCIDEVICE_SRIOV_WEFT_IO_<PHYSNET>` and its `_INFO`) and gives RDMA-capable VFs their
//!    device nodes ([`plugin`]);
//! 5. the write-back ([`writeback`]) sets `weft.io/vf-ids` to what the kubelet's PodResources says
//!    each pod really got, every physnet in one write.
//!
//! A VF is Unhealthy while its PF's link is down or it is gone from sysfs ([`health`]). What
//! weft-cni made of each VF in the pod (interface, MAC, IPs, VLAN) is published on the pod as
//! `weft.io/vifs` and Multus' network-status ([`vifs`]).

pub mod choice;
pub mod error;
pub mod health;
pub mod inventory;
pub mod plugin;
pub mod vifs;
pub mod writeback;

pub use error::SriovError;
pub use inventory::{GpuPlace, VfDevice, VfInventory, gpu_places};
pub use plugin::SriovPlugin;
pub use writeback::SriovPlugins;
