//! The VFs the scheduler already gave a pod through DRA. A pod on a NumaNetwork holds a
//! ResourceClaim for weft's NIC driver (docs/nic-dra.md); kube-scheduler's DRA plugin allocates
//! the claim's VF and writes it into the claim's `status.allocation` in PreBind, which runs before
//! the extender's bind. Bind reads those VFs and passes them to the joint decision as fixed
//! ([`weft_net::joint::decide`]), so among equally good GPU sets the pod gets the one beside its NIC.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use weft_net::nic_claim::{DRIVER, device_name};
use weft_topology::NodeTopology;

/// The names of the ResourceClaims `pod` uses: those it names directly and those generated from
/// its templates (recorded in `status.resourceClaimStatuses` by the resource-claim controller).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let direct =
        pod.spec.iter().flat_map(|s| s.resource_claims.iter().flatten()).filter_map(|c| c.resource_claim_name.clone());
    let generated = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.clone());
    let mut names: Vec<String> = direct.chain(generated).collect();
    names.sort();
    names.dedup();
    names
}

/// The PCI addresses of the VFs weft's NIC driver was allocated on `node` in `claims`, among the
/// VFs `topology` publishes (a device the topology does not know is left out: it cannot be near
/// anything the extender can name).
pub fn allocated_vfs(claims: &[ResourceClaim], node: &str, topology: &NodeTopology) -> Vec<String> {
    let mut out: Vec<String> = claims
        .iter()
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == DRIVER && r.pool == node)
        .filter_map(|r| topology.vfs().iter().find(|v| device_name(&v.pci_address) == r.device))
        .map(|v| v.pci_address.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_topology::{Vf, parse_node};

    fn topology() -> NodeTopology {
        let text = "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n";
        let mut node = parse_node(text, "n1").unwrap();
        let nic = node.nics[0].name.clone();
        let vfs = ["0000:0c:00.2", "0000:0c:00.3"].map(|a| Vf {
            pci_address: a.into(),
            nic: nic.clone(),
            physnet: Some("fabric".into()),
        });
        node.set_vfs(vfs.to_vec()).unwrap();
        node
    }

    fn claim(results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "weft-nic"}}]}},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    #[test]
    fn claim_names_cover_direct_and_generated_claims() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "a", "resourceClaimName": "shared"},
                {"name": "b", "resourceClaimTemplateName": "fast-rct"}]},
            "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x7k2"}]}
        }))
        .unwrap();
        assert_eq!(claim_names(&pod), ["p-b-x7k2", "shared"]);
        assert!(claim_names(&Pod::default()).is_empty());
    }

    #[test]
    fn only_weft_nic_devices_in_the_nodes_pool_that_the_node_publishes() {
        let t = topology();
        let claims = [
            claim(json!([
                {"request": "nic", "driver": "nic.weft.io", "pool": "n1", "device": "vf-0000-0c-00-3"},
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "vf-0000-0c-00-2"},
                {"request": "nic", "driver": "nic.weft.io", "pool": "n2", "device": "vf-0000-0c-00-2"},
                {"request": "nic", "driver": "nic.weft.io", "pool": "n1", "device": "vf-0000-ff-00-1"}
            ])),
            ResourceClaim::default(),
        ];
        assert_eq!(allocated_vfs(&claims, "n1", &t), ["0000:0c:00.3"]);
        assert!(allocated_vfs(&claims, "n3", &t).is_empty());
    }
}
