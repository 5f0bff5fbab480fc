//! weft-net: the network model of weft's secondary NICs (seed 002, Kuryr SR-IOV). Pure.
//!
//! - [`config`]: physnets in the seed's terms (`physical_device_mappings` with VF ranges,
//!   `default_physnet_subnets`), validated with errors that name the entry.
//! - [`choice`]: which VFs a pod gets: the ones nearest its GPUs (same PCIe switch, then root,
//!   then NUMA node), spread over PFs.
//! - [`joint`]: one decision for a pod's GPUs and VFs on a node (best-effort GPUs; VFs nearest
//!   them; among equally good GPU sets, the one beside free VFs), and its node score.
//! - [`nic_claim`]: the opaque configuration of a NIC claim for weft's NIC DRA driver.
//! - [`vif`]: the multi-VIF record on the pod (interface name → VIF) and its Multus
//!   `network-status` form.
//!
//! The node's SR-IOV inventory (PFs, VFs, PCIe place, NUMA, RDMA, link) is part of the node model
//! and is read from sysfs by `weft_topology::discover::read_sriov`.

pub mod choice;
pub mod config;
pub mod joint;
pub mod nic_claim;
pub mod vif;
