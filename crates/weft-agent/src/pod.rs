//! What the resource manager needs to know about a pod: its QoS class, its containers' CPU and
//! memory requests and limits, and where its devices sit (NUMA nodes of its GPUs and NICs).
//!
//! Built from the kubelet's `v1.Pod` ([`PodSpec::from_pod`]); device locality is resolved from the
//! annotations weft's other parts write ([`DeviceLocator`]).

use std::collections::BTreeMap;

/// Kubernetes QoS class, computed the way the kubelet does (`GetPodQOS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QosClass {
    /// Every container has CPU and memory limits equal to its requests.
    Guaranteed,
    /// Some request or limit set, not Guaranteed.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

/// Whether a container runs before the app containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ContainerKind {
    /// A regular init container: runs to completion before the app containers start.
    Init,
    /// A restartable init container (`restartPolicy: Always`, "sidecar"): runs alongside the app.
    Sidecar,
    /// An app container.
    App,
}

/// One container's resources, normalised: CPU in millicores, memory in bytes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerSpec {
    /// Container name (unique within the pod).
    pub name: String,
    /// Init, sidecar or app.
    pub kind: ContainerKind,
    /// CPU request, millicores (0 when unset).
    pub cpu_request_milli: u64,
    /// CPU limit, millicores.
    pub cpu_limit_milli: Option<u64>,
    /// Memory request, bytes (0 when unset).
    pub memory_request: u64,
    /// Memory limit, bytes.
    pub memory_limit: Option<u64>,
}

/// A pod as the resource manager sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodSpec {
    /// Kubernetes pod UID (NRI's `PodSandbox.uid`).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// QoS class.
    pub qos: QosClass,
    /// Init and sidecar containers in spec order, then app containers in spec order.
    pub containers: Vec<ContainerSpec>,
    /// The pod's annotations (device locality and per-pod options are read from here).
    pub annotations: BTreeMap<String, String>,
}

/// Where one device the pod holds sits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodDevice {
    /// What it is.
    pub kind: DeviceKind,
    /// Its id: the GPU index for GPUs, the PCI address for NICs.
    pub id: String,
    /// NUMA node, where known.
    pub numa: Option<u32>,
    /// Network interface name in the pod (NICs from the network-status annotation).
    pub interface: Option<String>,
    /// RDMA device name (`mlx5_3`), where the NIC has one.
    pub rdma_device: Option<String>,
}

/// Kind of device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DeviceKind {
    /// A GPU (from `weft.io/gpu-ids`).
    Gpu,
    /// A NIC / SR-IOV VF (from the network-status annotation's PCI device info).
    Nic,
}

/// Resolves device ids to NUMA nodes and RDMA names (sysfs in production, a table in tests).
pub trait DeviceLocator: Send + Sync {
    /// NUMA node of GPU `index`.
    fn gpu_numa(&self, index: u32) -> Option<u32>;
    /// NUMA node of the PCI device at `address` (`0000:3b:02.1`).
    fn pci_numa(&self, address: &str) -> Option<u32>;
    /// RDMA device name of the PCI device at `address`.
    fn pci_rdma_device(&self, address: &str) -> Option<String>;
}
