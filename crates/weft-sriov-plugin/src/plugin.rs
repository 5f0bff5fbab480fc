//! weft's VF device plugin for one physnet: the [`DeviceSource`] the framework serves under
//! `sriov.weft.io/<physnet>`.
//!
//! - Devices: the physnet's VFs ([`VfInventory`]), each Unhealthy while its PF's link is down or
//!   it is gone from sysfs ([`SriovPlugin::refresh`], polled by [`crate::health`]).
//! - GetPreferredAllocation: finds the pod the call belongs to (the shared handshake) and answers
//!   the VFs its recorded decision has for this physnet when they fit, else the VFs nearest the
//!   GPUs the pod holds (`weft.io/gpu-ids`, placed by the node's GPU table) ([`crate::choice`]).
//! - Allocate: sriov-network-device-plugin's environment (`PCIDEVICE_<RESOURCE>` with the PCI
//!   addresses, `PCIDEVICE_<RESOURCE>_INFO` with each VF's facts), which Multus and the CNI read,
//!   and the RDMA device nodes of RDMA-capable VFs; records which container got which VFs, so the
//!   write-back ([`crate::writeback`]) can be told at once.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::watch;
use tonic::Status;
use weft_deviceplugin::accounting::{Accounting, Attributed};
use weft_deviceplugin::handshake::{NodePods, Recorded};
use weft_deviceplugin::podresources::AssignedDevices;
use weft_deviceplugin::{DeviceSource, api};
use weft_net::config::resource_name;
use weft_record::decision::{GPU_DECISION_ANNOTATION, GpuDecision};
use weft_record::usage::{GPU_IDS_ANNOTATION, parse_gpu_ids};
use weft_topology::discover::SriovInventory;

use crate::choice::{Basis, pick};
use crate::error::SriovError;
use crate::inventory::{GpuPlace, VfDevice, VfInventory, places_of};

/// The VFs `weft.io/gpu-decision` records for `physnet` on `node`: none when the decision is for
/// this node but names no VFs of the physnet.
pub fn recorded_vfs(pod: &Pod, node: &str, physnet: &str) -> Recorded<Vec<String>> {
    let Some(value) = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_DECISION_ANNOTATION)) else {
        return Recorded::None;
    };
    let decision = match GpuDecision::from_annotation(value) {
        Ok(d) => d,
        Err(e) => return Recorded::Unreadable(e),
    };
    if decision.node != node {
        return Recorded::OtherNode(decision.node);
    }
    decision.vfs.get(physnet).map_or(Recorded::None, |vfs| Recorded::ForThisNode(vfs.clone()))
}

/// The GPUs the pod holds, from its `weft.io/gpu-ids` (none when absent or unreadable).
pub fn held_gpus(pod: &Pod) -> Vec<usize> {
    let value = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_IDS_ANNOTATION));
    match value.map(|v| parse_gpu_ids(v)) {
        Some(Ok(gpus)) => gpus,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the pod's GPUs are unreadable: VFs are chosen without them");
            Vec::new()
        }
        None => Vec::new(),
    }
}

/// The environment variable with a resource's PCI addresses, as sriov-network-device-plugin names
/// it: `PCIDEVICE_` and the resource name upper-cased, `.` and `/` (and `-`, which environment
/// names avoid) as `_`: `sriov.weft.io/gpu-fabric` → `PCIDEVICE_SRIOV_WEFT_IO_GPU_FABRIC`.
pub fn env_name(resource: &str) -> String {
    let name: String =
        resource.chars().map(|c| if matches!(c, '.' | '/' | '-') { '_' } else { c.to_ascii_uppercase() }).collect();
    format!("PCIDEVICE_{name}")
}

/// The environment variable with each allocated VF's facts as JSON (sriov-network-device-plugin's
/// `PCIDEVICE_<RESOURCE>_INFO`).
pub fn info_env_name(resource: &str) -> String {
    format!("{}_INFO", env_name(resource))
}

/// Where RDMA devices' character devices are, on the host and in the container.
pub const RDMA_DEV_DIR: &str = "/dev/infiniband";
/// The RDMA connection manager's device, which RDMA containers use to set up connections. It exists
/// only while the kernel module `rdma_ucm` is loaded, so it is given only where the host has it
/// ([`rdma_cm_present`]): a device node the host lacks would fail the container's creation.
pub const RDMA_CM: &str = "/dev/infiniband/rdma_cm";

/// Whether the host has [`RDMA_CM`]: `rdma_ucm` registers it as the misc device `rdma_cm`, which
/// sysfs shows as `sys/class/misc/rdma_cm` (read under `root`, since the agent sees the host's
/// sysfs, not its /dev).
pub fn rdma_cm_present(root: &weft_topology::discover::SysfsRoot) -> bool {
    root.join("sys/class/misc/rdma_cm").exists()
}

/// The VF plugin of one physnet.
pub struct SriovPlugin {
    physnet: String,
    node: String,
    resource: String,
    inventory: VfInventory,
    gpus: Vec<GpuPlace>,
    rdma_cm: bool,
    accounting: Accounting<Vec<String>, String>,
    devices: watch::Sender<Vec<api::Device>>,
}

impl SriovPlugin {
    /// The plugin of `physnet` on node `node` for its VFs `vfs`, choosing near the GPUs of the
    /// node's GPU table `gpus` ([`crate::inventory::gpu_places`]), finding pods through `pods` and
    /// served containers through `assigned`. A VF starts healthy unless its PF's link was down
    /// when `vfs` was read.
    pub fn new(
        physnet: &str,
        node: &str,
        vfs: VfInventory,
        gpus: Vec<GpuPlace>,
        pods: Arc<dyn NodePods>,
        assigned: Arc<dyn AssignedDevices>,
    ) -> SriovPlugin {
        let resource = resource_name(physnet);
        let devices = watch::Sender::new(vfs.api_devices(&vfs.unhealthy(None)));
        SriovPlugin {
            physnet: physnet.to_string(),
            node: node.to_string(),
            accounting: Accounting::new(resource.clone(), pods, assigned),
            resource,
            inventory: vfs,
            gpus,
            rdma_cm: true,
            devices,
        }
    }

    /// Whether RDMA containers get [`RDMA_CM`] (on by default; the agent says whether the host has
    /// it, [`rdma_cm_present`]).
    pub fn with_rdma_cm(mut self, present: bool) -> SriovPlugin {
        self.rdma_cm = present;
        self
    }

    /// The physnet.
    pub fn physnet(&self) -> &str {
        &self.physnet
    }

    /// The resource, `sriov.weft.io/<physnet>`.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The VFs.
    pub fn inventory(&self) -> &VfInventory {
        &self.inventory
    }

    /// Takes the VFs' health from `now`, a fresh read of the node's SR-IOV functions: a VF is
    /// Unhealthy while its PF's link is down or it is gone from sysfs. A change (only a change)
    /// goes to every ListAndWatch stream; returns whether there was one.
    pub fn refresh(&self, now: &SriovInventory) -> bool {
        let unhealthy = self.inventory.unhealthy(Some(now));
        let list = self.inventory.api_devices(&unhealthy);
        self.devices.send_if_modified(|current| {
            if *current == list {
                return false;
            }
            for (old, new) in current.iter().zip(&list).filter(|(o, n)| o.health != n.health) {
                match unhealthy.get(&new.id) {
                    Some(why) => tracing::warn!(resource = %self.resource, vf = %new.id, %why, "VF unhealthy"),
                    None => {
                        tracing::info!(resource = %self.resource, vf = %new.id, was = %old.health, "VF healthy again")
                    }
                }
            }
            *current = list;
            true
        })
    }

    /// What the plugin handed out to which container, with the kubelet's pod list and
    /// PodResources (the write-back's view of it).
    pub fn accounting(&self) -> &Accounting<Vec<String>, String> {
        &self.accounting
    }

    fn decision(&self) -> impl Fn(&Pod) -> Recorded<Vec<String>> + '_ {
        |p| recorded_vfs(p, &self.node, &self.physnet)
    }

    fn known(&self) -> impl Fn(&[String]) -> Vec<String> + '_ {
        |ids| ids.iter().filter(|id| self.inventory.get(id).is_some()).cloned().collect()
    }

    fn ids(&self, ids: &[String]) -> Result<Vec<String>, SriovError> {
        self.inventory.lookup(&self.resource, ids)?;
        Ok(ids.to_vec())
    }

    fn response(&self, vfs: &[&VfDevice]) -> api::ContainerAllocateResponse {
        let mut response = api::ContainerAllocateResponse::default();
        let addresses: Vec<&str> = vfs.iter().map(|v| v.pci_address.as_str()).collect();
        response.envs.insert(env_name(&self.resource), addresses.join(","));
        let mut info = serde_json::Map::new();
        for vf in vfs {
            let mut facts = json!({"generic": {"deviceID": vf.pci_address}});
            if let Some(rdma) = &vf.rdma_device {
                let mut r = json!({"rdma_dev": rdma});
                if let Some(uverbs) = &vf.uverbs {
                    r["uverbs"] = json!(format!("{RDMA_DEV_DIR}/{uverbs}"));
                    push_device(&mut response, &format!("{RDMA_DEV_DIR}/{uverbs}"));
                }
                if self.rdma_cm {
                    r["rdma_cm"] = json!(RDMA_CM);
                    push_device(&mut response, RDMA_CM);
                }
                facts["rdma"] = r;
            }
            info.insert(vf.pci_address.clone(), facts);
        }
        response.envs.insert(info_env_name(&self.resource), serde_json::Value::Object(info).to_string());
        response
    }
}

/// Adds the device node `path` (the same path in the container), once.
fn push_device(response: &mut api::ContainerAllocateResponse, path: &str) {
    if !response.devices.iter().any(|d| d.host_path == path) {
        response.devices.push(api::DeviceSpec {
            container_path: path.to_string(),
            host_path: path.to_string(),
            permissions: "rw".to_string(),
        });
    }
}

#[async_trait]
impl DeviceSource for SriovPlugin {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn options(&self) -> api::DevicePluginOptions {
        api::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
    }

    fn devices(&self) -> watch::Receiver<Vec<api::Device>> {
        self.devices.subscribe()
    }

    async fn preferred_allocation(
        &self,
        request: &api::ContainerPreferredAllocationRequest,
    ) -> Result<Vec<String>, Status> {
        let available = self.ids(&request.available_device_i_ds)?;
        let required = self.ids(&request.must_include_device_i_ds)?;
        let size = usize::try_from(request.allocation_size)
            .map_err(|_| SriovError::NegativeSize { resource: self.resource.clone(), size: request.allocation_size })?;
        let candidates = self.accounting.candidates(self.decision(), self.known()).await;
        let found = self.accounting.attribute(&candidates, size);
        let held = found.as_ref().map(|a| a.held.as_slice()).unwrap_or_default();
        let decided = found.as_ref().and_then(|a| a.pod.decision.for_this_node(&a.pod.label())).map(Vec::as_slice);
        let gpus = found.as_ref().and_then(|a| candidates.pod(&a.pod.uid)).map(held_gpus).unwrap_or_default();
        let near = places_of(&self.gpus, &gpus);
        let (vfs, basis) = pick(&self.inventory, &available, &required, size, decided, held, &near)
            .map_err(|source| SriovError::Choice { resource: self.resource.clone(), source })?;
        let pod = found.as_ref().map(Attributed::label);
        match &basis {
            Basis::Decision => {
                tracing::info!(resource = %self.resource, pod = ?pod, ?vfs, "preferred allocation: the recorded decision")
            }
            Basis::Nearest(why) => tracing::info!(
                resource = %self.resource, pod = ?pod, ?vfs, ?gpus, %why,
                "preferred allocation: the VFs nearest the pod's GPUs"
            ),
        }
        self.accounting.expect(found.as_ref(), size);
        Ok(vfs)
    }

    async fn allocate(
        &self,
        request: &api::ContainerAllocateRequest,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let vfs = self.inventory.lookup(&self.resource, &request.devices_ids)?;
        let response = self.response(&vfs);
        let ids = request.devices_ids.clone();
        let found = self.accounting.allocating(ids.len(), self.decision(), self.known()).await;
        match &found {
            Some((pod, c)) => tracing::info!(
                resource = %self.resource, pod = %pod.label(), container = %pod.containers[*c].name, vfs = ?ids,
                "allocated"
            ),
            None => tracing::info!(
                resource = %self.resource, vfs = ?ids,
                "allocated to a container no pending pod matches; the write-back will name it"
            ),
        }
        self.accounting.record(found, ids);
        Ok(response)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use weft_topology::discover::{FakeSriovTree, read_sriov};

    #[test]
    fn rdma_cm_is_given_only_where_the_host_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:03:00.0", &["0000:00:01.0"], "ens1f0", 0).rdma("mlx5_0");
        tree.vf("0000:03:00.0", 0, "0000:03:00.2", None).rdma("mlx5_2").uverbs("uverbs2");
        let root = tree.root();
        assert!(!rdma_cm_present(&root));
        let mut notes = Vec::new();
        let inventory = read_sriov(&root, &mut notes);
        let pf = &inventory.pfs[0];
        let vfs = VfInventory::new(&[(pf, &pf.vfs[0])]).unwrap();
        let pods: Arc<dyn NodePods> = Arc::new(|| Ok(Vec::new()));
        let assigned: Arc<dyn AssignedDevices> =
            Arc::new(weft_deviceplugin::podresources::PodResourcesClient::new(dir.path().join("none.sock")));
        let plugin = SriovPlugin::new("f", "n", vfs, Vec::new(), pods, assigned).with_rdma_cm(rdma_cm_present(&root));
        let vf = plugin.inventory().get("0000:03:00.2").unwrap();
        let paths =
            |r: &api::ContainerAllocateResponse| r.devices.iter().map(|d| d.host_path.clone()).collect::<Vec<_>>();
        let without = plugin.response(&[vf]);
        assert_eq!(paths(&without), ["/dev/infiniband/uverbs2"]);
        assert!(!without.envs[&info_env_name("sriov.weft.io/f")].contains("rdma_cm"));
        std::fs::create_dir_all(dir.path().join("sys/class/misc/rdma_cm")).unwrap();
        assert!(rdma_cm_present(&root));
        let plugin = plugin.with_rdma_cm(rdma_cm_present(&root));
        let vf = plugin.inventory().get("0000:03:00.2").unwrap();
        assert_eq!(paths(&plugin.response(&[vf])), ["/dev/infiniband/uverbs2", RDMA_CM]);
    }

    #[test]
    fn env_names_follow_sriov_network_device_plugin() {
        // Upstream: "PCIDEVICE_" + prefix + "_" + resource name, upper-cased, '.' as '_'.
        assert_eq!(env_name("intel.com/intel_sriov_netdevice"), "PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE");
        assert_eq!(env_name("sriov.weft.io/gpu-fabric"), "PCIDEVICE_SRIOV_WEFT_IO_GPU_FABRIC");
        assert_eq!(info_env_name("sriov.weft.io/physnet2"), "PCIDEVICE_SRIOV_WEFT_IO_PHYSNET2_INFO");
    }
}
