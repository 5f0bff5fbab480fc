//! weft-nic-dra: weft's NIC DRA driver (`nic.weft.io`), run by `weft agent --nic-dra`.
//!
//! The node half of a NumaNetwork's second NIC (docs/nic-dra.md):
//!
//! 1. the node's SR-IOV VFs of its physnets are published as ResourceSlices, one pool named after
//!    the node, with attributes claims select and align on (PCI address, `pcieRoot`, NUMA node,
//!    physnet, PF, RDMA, link speed, VF index): [`inventory`], [`slices`];
//! 2. the kubelet finds the driver through its registration socket and calls
//!    NodePrepareResources on the DRA socket ([`server`]); for each claim the driver reads the
//!    ResourceClaim, takes the VF the scheduler allocated, allocates the address cluster-wide
//!    (`NetworkAddress` objects, `weft_ipam::network_address`), records the claim in its
//!    checkpoint and sets the VF's VLAN through its PF ([`driver`], [`claim`], [`checkpoint`],
//!    [`vlan`]); NodeUnprepareResources undoes it;
//! 3. the NRI half moves the prepared VF into the pod's network namespace at RunPodSandbox
//!    ([`attach`]) and writes `networkData` on the claim ([`status`]), reading what was prepared
//!    through [`prepared::PodNics`] (the checkpoint: [`NicDriver::pod_nics`]).
//!
//! **The scheduler's VF is honoured.** The DRA scheduler allocated the device and accounts for
//! it; preparing a different VF would leave the allocated one idle while handing out one the
//! scheduler still counts as free (a double booking). So the driver never swaps. When weft's
//! scheduler extender recorded a GPU decision on the pod (`weft.io/gpu-decision`) and the node's
//! topology is known, the driver judges with `weft_net::choice` whether the VF is among the free
//! VFs nearest those GPUs ([`align`]) and records it as [`prepared::PreparedNic::aligned`] (and
//! logs why when it is not), so the status writer can report the NIC–GPU alignment. Aligning the
//! choice itself is the claim's job: a `matchAttribute: resource.kubernetes.io/pcieRoot`
//! constraint between the GPU and NIC requests.
//!
//! The kubelet APIs are weft's own definitions (`proto/dra_v1.proto`,
//! `proto/pluginregistration_v1.proto`), written from the APIs' published facts and compiled with
//! protox, so no protoc is needed.

pub mod align;
pub mod attach;
pub mod checkpoint;
pub mod claim;
pub mod driver;
pub mod inventory;
pub mod prepared;
pub mod server;
pub mod slices;
pub mod status;
pub mod vlan;

/// The generated messages and services: `dra` (the kubelet's DRA plugin API v1, package
/// `k8s.io.kubelet.pkg.apis.dra.v1`) and `registration` (plugin registration v1, package
/// `pluginregistration`), servers and clients (the test kubelet uses the clients).
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod api {
    /// DRA plugin API v1.
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// Plugin registration API v1.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

pub use checkpoint::Checkpoint;
pub use driver::NicDriver;
pub use inventory::{NicDevice, NicInventory};
pub use server::{ServeOptions, Serving, start};
pub use vlan::{PfVlan, VfVlan};
pub use weft_net::nic_claim::device_name;
