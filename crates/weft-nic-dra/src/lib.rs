//! weft-nic-dra: weft's NIC DRA driver (`nic.weft.io`), run by `weft agent`.
//!
//! Under construction (issue #15). Modules:
//! - [`prepared`]: what NodePrepareResources decided for a claim ([`prepared::PreparedNic`]) and
//!   how the NRI side looks it up by pod ([`prepared::PodNics`]);
//! - [`attach`]: the NRI RunPodSandbox/StopPodSandbox hooks that move the VF into the pod;
//! - [`status`]: `networkData` on the ResourceClaim status.

pub mod attach;
pub mod prepared;
pub mod status;
