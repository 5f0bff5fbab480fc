//! Chained mode: which VFs the kubelet gave a pod, from its PodResources API (`List`). The VF
//! device plugin's device IDs are the VFs' PCI addresses (as sriov-network-device-plugin's).

use std::path::Path;
use std::time::Duration;

use weft_deviceplugin::podresources::{PodResourcesClient, devices_of};
use weft_topology::discover::normalize_pci_bus_id;

use crate::error::{CniError, code};

/// How long the kubelet gets to answer.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The PCI addresses of `resource` held by any container of pod `namespace/name`, sorted and
/// without repeats. An unreachable kubelet is "try again later" (code 11).
pub async fn pod_devices(socket: &Path, namespace: &str, name: &str, resource: &str) -> Result<Vec<String>, CniError> {
    let client = PodResourcesClient::new(socket);
    let pods = match tokio::time::timeout(LIST_TIMEOUT, client.list()).await {
        Ok(Ok(pods)) => pods,
        Ok(Err(e)) => {
            return Err(CniError::new(
                code::TRY_AGAIN,
                format!("asking the kubelet for {namespace}/{name}'s devices: {e}"),
            ));
        }
        Err(_) => {
            return Err(CniError::new(
                code::TRY_AGAIN,
                format!(
                    "the kubelet's PodResources on {} did not answer in {}s",
                    socket.display(),
                    LIST_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    let mut out = Vec::new();
    for (key, ids) in devices_of(&pods, resource) {
        if key.namespace != namespace || key.pod != name {
            continue;
        }
        for id in ids {
            let pci = normalize_pci_bus_id(&id).ok_or_else(|| {
                CniError::new(
                    code::POD_RESOURCES,
                    format!("device '{id}' of {resource} held by {namespace}/{name} is not a PCI address"),
                )
            })?;
            out.push(pci);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}
