//! What a ResourceClaim asks of this driver on this node: the devices the scheduler allocated from
//! this node's pool, each with the NIC configuration that applies to its request. Pure.

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use weft_net::nic_claim::{DRIVER, NicConfig};

use crate::inventory::{NicDevice, NicInventory};

/// `source` of a configuration that came from the claim itself.
pub const FROM_CLAIM: &str = "FromClaim";
/// `source` of a configuration that came from the DeviceClass.
pub const FROM_CLASS: &str = "FromClass";

/// One device of the claim to prepare here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned<'a> {
    /// The request it serves (`<request>/<subrequest>` for a `firstAvailable` alternative).
    pub request: String,
    /// The VF.
    pub device: &'a NicDevice,
    /// Its configuration.
    pub config: NicConfig,
}

/// Whether a configuration whose `requests` are `requests` applies to `request`: an empty list
/// applies to every request; a parent request's name applies to its subrequests.
fn applies(requests: Option<&[String]>, request: &str) -> bool {
    let parent = request.split_once('/').map_or(request, |(p, _)| p);
    match requests {
        None | Some([]) => true,
        Some(list) => list.iter().any(|r| r == request || r == parent),
    }
}

/// The opaque parameters of this driver that apply to `request`: the claim's own configuration
/// wins over the DeviceClass's (as in the DRA API: a claim refines its class), and among several
/// of one source the later one wins.
pub fn config_for<'a>(configs: &'a [DeviceAllocationConfiguration], request: &str) -> Option<&'a serde_json::Value> {
    let ours = |c: &&'a DeviceAllocationConfiguration| {
        c.opaque.as_ref().is_some_and(|o| o.driver == DRIVER) && applies(c.requests.as_deref(), request)
    };
    let last_of = |source: &str| configs.iter().rev().filter(ours).find(|c| c.source == source);
    last_of(FROM_CLAIM).or_else(|| last_of(FROM_CLASS)).and_then(|c| c.opaque.as_ref()).map(|o| &o.parameters.0)
}

/// The `namespace/name` of a claim, for messages.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The devices of this driver the scheduler allocated to `claim` in pool `node`, each mapped to
/// its VF in `inventory` and given the configuration of its request. An error says what is wrong
/// (not allocated, nothing of this driver, a device of another pool or one this node does not
/// have, no or a bad configuration).
pub fn plan<'a>(claim: &ResourceClaim, node: &str, inventory: &'a NicInventory) -> Result<Vec<Planned<'a>>, String> {
    let key = claim_key(claim);
    let Some(devices) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref())
    else {
        return Err(format!("ResourceClaim {key} is not allocated"));
    };
    let configs = devices.config.as_deref().unwrap_or_default();
    let mut planned = Vec::new();
    for r in devices.results.iter().flatten().filter(|r| r.driver == DRIVER) {
        if r.pool != node {
            return Err(format!(
                "ResourceClaim {key}: device {} of request {} is in pool {}, not in this node's pool {node}",
                r.device, r.request, r.pool
            ));
        }
        let device = inventory.device(&r.device).ok_or_else(|| {
            format!(
                "ResourceClaim {key}: device {} of request {} is not a VF this driver offers on node {node}",
                r.device, r.request
            )
        })?;
        let parameters = config_for(configs, &r.request).ok_or_else(|| {
            format!(
                "ResourceClaim {key}: no opaque configuration of driver {DRIVER} applies to request {} (a NicConfig names the network and its range)",
                r.request
            )
        })?;
        let config =
            NicConfig::parse(parameters).map_err(|e| format!("ResourceClaim {key}, request {}: {e}", r.request))?;
        planned.push(Planned { request: r.request.clone(), device, config });
    }
    if planned.is_empty() {
        return Err(format!("ResourceClaim {key} has no device of driver {DRIVER} allocated"));
    }
    Ok(planned)
}

/// The pods `claim` is reserved for: (name, UID).
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<(String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| (r.name.clone(), r.uid.clone()))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, OpaqueDeviceConfiguration,
        ResourceClaimConsumerReference, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    fn nic_config(network: &str) -> serde_json::Value {
        json!({"apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": network, "ipRange": "10.0.0.0/24"})
    }

    fn config(
        source: &str,
        requests: &[&str],
        driver: &str,
        params: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: (!requests.is_empty()).then(|| requests.iter().map(ToString::to_string).collect()),
            opaque: Some(OpaqueDeviceConfiguration { driver: driver.into(), parameters: RawExtension(params) }),
        }
    }

    fn inventory() -> NicInventory {
        let d = NicDevice {
            name: "vf-0000-3b-00-2".into(),
            pci_address: "0000:3b:00.2".into(),
            pf_pci_address: "0000:3b:00.0".into(),
            pf_netdev: Some("ens1f0".into()),
            vf_index: 0,
            physnet: "fabric".into(),
            numa_node: Some(0),
            pcie_root: Some("pci0000:3a".into()),
            rdma: false,
            link_speed_mbps: None,
        };
        NicInventory::new([d], &mut Vec::new())
    }

    fn claim(results: Vec<(&str, &str, &str, &str)>, configs: Vec<DeviceAllocationConfiguration>) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some("ns".into());
        c.metadata.name = Some("c1".into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .into_iter()
                            .map(|(request, driver, pool, device)| DeviceRequestAllocationResult {
                                request: request.into(),
                                driver: driver.into(),
                                pool: pool.into(),
                                device: device.into(),
                                ..DeviceRequestAllocationResult::default()
                            })
                            .collect(),
                    ),
                    config: Some(configs),
                }),
                ..AllocationResult::default()
            }),
            reserved_for: Some(vec![
                ResourceClaimConsumerReference {
                    resource: "pods".into(),
                    name: "p".into(),
                    uid: "u".into(),
                    api_group: None,
                },
                ResourceClaimConsumerReference {
                    resource: "jobs".into(),
                    name: "j".into(),
                    uid: "x".into(),
                    api_group: Some("batch".into()),
                },
            ]),
            ..ResourceClaimStatus::default()
        });
        c
    }

    #[test]
    fn the_claims_own_config_wins_and_requests_select() {
        let configs = vec![
            config(FROM_CLASS, &[], DRIVER, nic_config("class")),
            config(FROM_CLAIM, &["nic"], DRIVER, nic_config("claim")),
            config(FROM_CLAIM, &["other"], DRIVER, nic_config("other")),
            config(FROM_CLAIM, &[], "dra.net", json!({"interface": {}})),
        ];
        assert_eq!(config_for(&configs, "nic").unwrap()["network"], "claim");
        assert_eq!(config_for(&configs, "nic/fast").unwrap()["network"], "claim", "a parent request's config");
        assert_eq!(config_for(&configs, "gpu").unwrap()["network"], "class");
        assert!(config_for(&configs[3..], "nic").is_none(), "another driver's config is not ours");
    }

    #[test]
    fn a_plan_maps_devices_and_names_what_is_wrong() {
        let inv = inventory();
        let ok = claim(
            vec![("nic", DRIVER, "n1", "vf-0000-3b-00-2"), ("gpu", "gpu.example.com", "n1", "gpu-0")],
            vec![config(FROM_CLASS, &[], DRIVER, nic_config("net-a"))],
        );
        let p = plan(&ok, "n1", &inv).unwrap();
        assert_eq!(p.len(), 1, "other drivers' devices are not ours");
        assert_eq!((p[0].request.as_str(), p[0].device.vf_index, p[0].config.network.as_str()), ("nic", 0, "net-a"));
        assert_eq!(reserved_pods(&ok), [("p".to_string(), "u".to_string())]);

        let e = plan(&ok, "n2", &inv).unwrap_err();
        assert!(e.contains("pool n1, not in this node's pool n2"), "{e}");
        let unknown =
            claim(vec![("nic", DRIVER, "n1", "vf-9")], vec![config(FROM_CLASS, &[], DRIVER, nic_config("a"))]);
        assert!(plan(&unknown, "n1", &inv).unwrap_err().contains("vf-9 of request nic is not a VF"));
        let bare = claim(vec![("nic", DRIVER, "n1", "vf-0000-3b-00-2")], vec![]);
        assert!(plan(&bare, "n1", &inv).unwrap_err().contains("no opaque configuration of driver nic.weft.io"));
        let mut bad = nic_config("a");
        bad["vlanTag"] = json!(7);
        let typo = claim(vec![("nic", DRIVER, "n1", "vf-0000-3b-00-2")], vec![config(FROM_CLAIM, &[], DRIVER, bad)]);
        let e = plan(&typo, "n1", &inv).unwrap_err();
        assert!(e.contains("ResourceClaim ns/c1, request nic") && e.contains("vlanTag"), "{e}");
        let none = claim(vec![("gpu", "gpu.example.com", "n1", "gpu-0")], vec![]);
        assert!(plan(&none, "n1", &inv).unwrap_err().contains("no device of driver nic.weft.io"));
        let mut pending = ok.clone();
        pending.status = None;
        assert!(plan(&pending, "n1", &inv).unwrap_err().contains("is not allocated"));
    }
}
