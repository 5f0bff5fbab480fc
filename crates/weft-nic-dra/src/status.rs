//! The ResourceClaim status the driver writes once a VF is in its pod: for each of the claim's
//! devices of this driver, the `status.devices[]` entry (driver `nic.weft.io`, pool, device) with
//! `networkData` (`interfaceName`, `ips` in CIDR form, `hardwareAddress`) and the conditions
//! `Ready` and `NetworkReady`, as dranet writes them (reference §1, §6).
//!
//! The write is one server-side apply per claim on the `resourceclaims/status` subresource, field
//! manager [`FIELD_MANAGER`], forced. The applied configuration holds only this driver's entries
//! of that claim: the API server merges `status.devices` by its keys (driver, pool, device,
//! shareID), so other drivers' entries stay, and an apply that leaves out an entry this manager
//! applied before removes it; so every device of the claim goes into the one apply. The claim's
//! UID is in the body: a claim deleted and created again under the same name is refused (422),
//! not written.
//!
//! [`ClaimStatus`] is the seam: [`KubeClaimStatus`] talks to the API server; tests give the
//! hook a recording fake.

use async_trait::async_trait;
use ipnet::IpNet;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::prepared::ClaimRef;

/// The driver's name, in `status.devices[].driver`.
pub const DRIVER: &str = "nic.weft.io";
/// The field manager of the status apply.
pub const FIELD_MANAGER: &str = "nic.weft.io";
/// Condition: the VF is in the pod under its interface name and up.
pub const CONDITION_READY: &str = "Ready";
/// Condition: the VF has its address in the pod.
pub const CONDITION_NETWORK_READY: &str = "NetworkReady";

/// One device of a claim as the pod has it: what goes into its `status.devices[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNetwork {
    /// The ResourceSlice pool.
    pub pool: String,
    /// The device's name in the ResourceSlice.
    pub device: String,
    /// The VF's PCI address (for the condition messages).
    pub vf_pci: String,
    /// Its interface name in the pod.
    pub interface_name: String,
    /// Its addresses, with their prefix lengths.
    pub ips: Vec<IpNet>,
    /// Its MAC in the pod.
    pub hardware_address: Option<String>,
    /// When it was attached (the conditions' `lastTransitionTime`, so a repeated write is the
    /// same write).
    pub since: Timestamp,
}

fn condition(kind: &str, reason: &str, message: String, since: Timestamp) -> Condition {
    Condition {
        type_: kind.to_string(),
        status: "True".to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Time(since),
        observed_generation: None,
    }
}

/// The `status.devices[]` entry of `d`.
pub fn device_status(d: &DeviceNetwork) -> AllocatedDeviceStatus {
    let ips: Vec<String> = d.ips.iter().map(ToString::to_string).collect();
    let ready = condition(
        CONDITION_READY,
        "VFAttached",
        format!("VF {} is {} in the pod's network namespace, up", d.vf_pci, d.interface_name),
        d.since,
    );
    let network = condition(
        CONDITION_NETWORK_READY,
        "AddressConfigured",
        format!("{} has {}", d.interface_name, if ips.is_empty() { "no address".to_string() } else { ips.join(", ") }),
        d.since,
    );
    AllocatedDeviceStatus {
        driver: DRIVER.to_string(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        conditions: Some(vec![ready, network]),
        network_data: Some(NetworkDeviceData {
            interface_name: Some(d.interface_name.clone()),
            ips: Some(ips),
            hardware_address: d.hardware_address.clone(),
        }),
        data: None,
        share_id: None,
    }
}

/// The server-side apply body for `claim`: its name, namespace and UID, and `status.devices` with
/// exactly the entries of `devices` (this driver's, nobody else's).
pub fn apply_body(claim: &ClaimRef, devices: &[DeviceNetwork]) -> Value {
    let entries: Vec<AllocatedDeviceStatus> = devices.iter().map(device_status).collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": entries},
    })
}

/// A failed status write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "writing the status of ResourceClaim {claim} (server-side apply of resourceclaims/status as {FIELD_MANAGER}): {message}"
)]
pub struct StatusError {
    /// `namespace/name`.
    pub claim: String,
    /// What went wrong.
    pub message: String,
    /// Whether trying again cannot help (the claim is gone, or is another claim now).
    pub permanent: bool,
}

/// Writes the devices' network status on a claim.
#[async_trait]
pub trait ClaimStatus: Send + Sync {
    /// Apply `devices` (every device of this driver in `claim`) as the claim's status entries of
    /// this driver.
    async fn publish(&self, claim: &ClaimRef, devices: &[DeviceNetwork]) -> Result<(), StatusError>;
}

/// The API server, through kube.
#[derive(Clone)]
pub struct KubeClaimStatus {
    client: kube::Client,
}

impl KubeClaimStatus {
    /// Writes through `client` (it needs `patch` on `resourceclaims/status`).
    pub fn new(client: kube::Client) -> KubeClaimStatus {
        KubeClaimStatus { client }
    }
}

impl std::fmt::Debug for KubeClaimStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaimStatus").finish_non_exhaustive()
    }
}

#[async_trait]
impl ClaimStatus for KubeClaimStatus {
    async fn publish(&self, claim: &ClaimRef, devices: &[DeviceNetwork]) -> Result<(), StatusError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let body = apply_body(claim, devices);
        match api.patch_status(&claim.name, &params, &Patch::Apply(&body)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let permanent = match &e {
                    kube::Error::Api(s) => matches!(s.code, 400 | 404 | 422),
                    _ => false,
                };
                Err(StatusError {
                    claim: format!("{}/{}", claim.namespace, claim.name),
                    message: e.to_string(),
                    permanent,
                })
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_body_holds_only_this_drivers_entries_with_network_data_and_conditions() {
        let claim = ClaimRef { namespace: "ml".into(), name: "c1".into(), uid: "u-1".into() };
        let since: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let d = DeviceNetwork {
            pool: "node-a".into(),
            device: "vf-0000-3b-00-2".into(),
            vf_pci: "0000:3b:00.2".into(),
            interface_name: "net1".into(),
            ips: vec!["192.168.10.5/24".parse().unwrap()],
            hardware_address: Some("02:00:00:aa:bb:cc".into()),
            since,
        };
        let body = apply_body(&claim, std::slice::from_ref(&d));
        assert_eq!(body["metadata"], json!({"name": "c1", "namespace": "ml", "uid": "u-1"}));
        assert!(body.get("spec").is_none(), "a status apply carries no spec");
        let devices = body["status"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1);
        let e = &devices[0];
        assert_eq!(e["driver"], "nic.weft.io");
        assert_eq!((e["pool"].as_str(), e["device"].as_str()), (Some("node-a"), Some("vf-0000-3b-00-2")));
        assert_eq!(
            e["networkData"],
            json!({"interfaceName": "net1", "ips": ["192.168.10.5/24"], "hardwareAddress": "02:00:00:aa:bb:cc"})
        );
        let kinds: Vec<(&str, &str)> = e["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
            .collect();
        assert_eq!(kinds, [("Ready", "True"), ("NetworkReady", "True")]);
        assert_eq!(e["conditions"][0]["lastTransitionTime"], "2026-01-02T03:04:05Z");
        // The same device, written again, is the same body.
        assert_eq!(apply_body(&claim, &[d]), body);
    }
}
