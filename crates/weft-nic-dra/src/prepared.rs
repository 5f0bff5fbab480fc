//! What NodePrepareResources decided for one NIC of a claim, shared by the DRA side (which writes
//! it to the checkpoint) and the NRI side (which attaches it when the pod's sandbox starts).

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// A ResourceClaim, as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// One prepared NIC: the claim and request it serves, the VF, and its configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedNic {
    /// The claim.
    pub claim: ClaimRef,
    /// The request name in the claim.
    pub request: String,
    /// The ResourceSlice pool the device is in.
    pub pool: String,
    /// The device's name in the ResourceSlice.
    pub device: String,
    /// UIDs of the pods the claim is reserved for (`status.reservedFor`).
    pub pod_uids: Vec<String>,
    /// The VF's PCI address.
    pub vf_pci: String,
    /// The PF's netdev name.
    pub pf: String,
    /// The VF's index on its PF.
    pub vf_index: u32,
    /// The NumaNetwork the address comes from.
    pub network: String,
    /// The address with the network's prefix length, e.g. `192.168.10.5/24`.
    pub address: IpNet,
    /// VLAN set on the VF through the PF; `None`: untagged.
    pub vlan: Option<u16>,
    /// The interface name asked for in the pod; `None`: the first free `netN`.
    pub interface_name: Option<String>,
    /// MTU asked for; `None`: the VF's own.
    pub mtu: Option<u32>,
    /// Whether the VF is among the free VFs nearest the GPUs weft's scheduler decision gave the
    /// pod (`weft.io/gpu-decision`); `None` when the pod has no decision for this node (or the
    /// node's topology is unknown). The driver never swaps the scheduler's VF for a nearer one:
    /// this only reports how well the two decisions agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aligned: Option<bool>,
}

/// The prepared NICs of a pod, by pod UID: what the NRI hooks read.
pub trait PodNics: Send + Sync {
    /// Every NIC prepared for claims reserved for `pod_uid`, in a stable order (claim, request).
    fn nics_for_pod(&self, pod_uid: &str) -> Vec<PreparedNic>;
}
