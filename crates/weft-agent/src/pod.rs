//! What the resource manager needs to know about a pod: its QoS class, its containers' CPU and
//! memory requests and limits, and where its devices sit (NUMA nodes of its GPUs and NICs).
//!
//! Built from the kubelet's `v1.Pod` ([`PodSpec::from_pod`]); device locality is resolved from the
//! annotations weft's other parts write ([`pod_devices`], through a [`DeviceLocator`]:
//! [`SysfsLocator`] on a node).
//!
//! Normalisation in [`PodSpec::from_pod`]:
//! - Quantities are parsed exactly as Kubernetes writes them (`2`, `500m`, `1.5`, `4Gi`, `1G`,
//!   `129e6`) and rounded up the way `Quantity.MilliValue()` / `Value()` do: CPU to millicores,
//!   memory to bytes.
//! - A request left unset where a limit is set takes the limit (the API server's defaulting), so a
//!   pod built by hand reads like one from the API.
//! - The QoS class is the pod's `status.qosClass` when set (as kubelet's `GetPodQOS`), else computed
//!   as `ComputePodQOS` does: over app and init containers (sidecars included), only CPU and memory,
//!   only non-zero quantities, sums of requests compared with sums of limits; pod-level resources
//!   (`spec.resources`), when set, decide instead.
//! - Init containers with `restartPolicy: Always` are sidecars.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use thiserror::Error;
use weft_topology::NodeTopology;
use weft_topology::discover::{SysfsRoot, normalize_pci_bus_id, read_pci_device};

/// Annotation listing the GPU indices the pod holds (`0,1,4,5`).
pub const GPU_IDS_ANNOTATION: &str = "weft.io/gpu-ids";
/// Multus' network-status annotation (a JSON list; entries with PCI device info are NICs).
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

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
    /// The pod sets pod-level resources (`spec.resources`). kubelet's static CPU manager gives such
    /// pods no exclusive CPUs; neither does weft.
    #[serde(default)]
    pub pod_level_resources: bool,
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

/// Why a pod's spec or annotations could not be read. Every variant names the pod (`namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PodError {
    /// A field the resource manager needs is absent.
    #[error("pod {pod}: {field} is missing")]
    Missing {
        /// `namespace/name` (as much of it as is known).
        pod: String,
        /// The field (`metadata.uid`, `spec`).
        field: String,
    },
    /// A resource quantity that does not parse or is out of range.
    #[error("pod {pod}, container {container}: {field} '{value}': {why}")]
    Quantity {
        /// `namespace/name`.
        pod: String,
        /// Container name, or `(pod)` for pod-level resources.
        container: String,
        /// The field (`resources.limits.cpu`).
        field: String,
        /// The quantity as written.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// An annotation that does not parse.
    #[error("pod {pod}: annotation {annotation}: {why}")]
    Annotation {
        /// `namespace/name`.
        pod: String,
        /// The annotation key.
        annotation: String,
        /// What is wrong with it.
        why: String,
    },
}

/// CPU quantity in millicores, rounded up as `Quantity.MilliValue()` does.
fn parse_cpu_milli(s: &str) -> Result<u64, String> {
    weft_resources::milli_value(s).map_err(|e| e.to_string())
}

/// Memory quantity in bytes, rounded up as `Quantity.Value()` does.
fn parse_bytes(s: &str) -> Result<u64, String> {
    weft_resources::value(s).map_err(|e| e.to_string())
}

/// CPU and memory of one `ResourceRequirements`, normalised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Resources {
    cpu_request: Option<u64>,
    cpu_limit: Option<u64>,
    memory_request: Option<u64>,
    memory_limit: Option<u64>,
}

fn read_resources(
    pod: &str,
    container: &str,
    field_prefix: &str,
    r: Option<&ResourceRequirements>,
) -> Result<Resources, PodError> {
    let get = |map: Option<&BTreeMap<String, Quantity>>,
               kind: &str,
               name: &str,
               parse: fn(&str) -> Result<u64, String>|
     -> Result<Option<u64>, PodError> {
        let Some(q) = map.and_then(|m| m.get(name)) else { return Ok(None) };
        parse(&q.0).map(Some).map_err(|why| PodError::Quantity {
            pod: pod.to_string(),
            container: container.to_string(),
            field: format!("{field_prefix}resources.{kind}.{name}"),
            value: q.0.clone(),
            why,
        })
    };
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    let cpu_limit = get(limits, "limits", "cpu", parse_cpu_milli)?;
    let memory_limit = get(limits, "limits", "memory", parse_bytes)?;
    // The API server defaults an unset request to the limit.
    let cpu_request = get(requests, "requests", "cpu", parse_cpu_milli)?.or(cpu_limit);
    let memory_request = get(requests, "requests", "memory", parse_bytes)?.or(memory_limit);
    Ok(Resources { cpu_request, cpu_limit, memory_request, memory_limit })
}

fn container_spec(pod: &str, c: &Container, kind: ContainerKind) -> Result<ContainerSpec, PodError> {
    let r = read_resources(pod, &c.name, "", c.resources.as_ref())?;
    Ok(ContainerSpec {
        name: c.name.clone(),
        kind,
        cpu_request_milli: r.cpu_request.unwrap_or(0),
        cpu_limit_milli: r.cpu_limit,
        memory_request: r.memory_request.unwrap_or(0),
        memory_limit: r.memory_limit,
    })
}

/// The QoS class from requests and limits summed over `resources`, as kubelet's `ComputePodQOS`:
/// only non-zero quantities count; Guaranteed needs every entry to limit both CPU and memory and the
/// summed requests to equal the summed limits; nothing at all is BestEffort.
fn qos_of(resources: &[Resources]) -> QosClass {
    let mut req_cpu: Option<u128> = None;
    let mut req_mem: Option<u128> = None;
    let mut lim_cpu: Option<u128> = None;
    let mut lim_mem: Option<u128> = None;
    let mut guaranteed = true;
    let add = |acc: &mut Option<u128>, v: Option<u64>| -> bool {
        match v {
            Some(v) if v > 0 => {
                *acc = Some(acc.unwrap_or(0) + u128::from(v));
                true
            }
            _ => false,
        }
    };
    for r in resources {
        add(&mut req_cpu, r.cpu_request);
        add(&mut req_mem, r.memory_request);
        let has_cpu_limit = add(&mut lim_cpu, r.cpu_limit);
        let has_mem_limit = add(&mut lim_mem, r.memory_limit);
        if !(has_cpu_limit && has_mem_limit) {
            guaranteed = false;
        }
    }
    if req_cpu.is_none() && req_mem.is_none() && lim_cpu.is_none() && lim_mem.is_none() {
        return QosClass::BestEffort;
    }
    let matches = |req: Option<u128>, lim: Option<u128>| req.is_none() || req == lim;
    let same_names = req_cpu.is_some() == lim_cpu.is_some() && req_mem.is_some() == lim_mem.is_some();
    if guaranteed && matches(req_cpu, lim_cpu) && matches(req_mem, lim_mem) && same_names {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The QoS class of `containers` (normalised), computed as kubelet's `ComputePodQOS` does without
/// pod-level resources. Used by [`PodSpec::from_pod`]; public for callers that build specs by hand.
pub fn compute_qos(containers: &[ContainerSpec]) -> QosClass {
    let resources: Vec<Resources> = containers
        .iter()
        .map(|c| Resources {
            cpu_request: Some(c.cpu_request_milli),
            cpu_limit: c.cpu_limit_milli,
            memory_request: Some(c.memory_request),
            memory_limit: c.memory_limit,
        })
        .collect();
    qos_of(&resources)
}

impl PodSpec {
    /// `namespace/name`, for messages.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// A pod known only from the runtime (no spec from the kubelet): no containers, BestEffort, so it
    /// runs in the shared pool; its annotations still give its devices.
    pub fn unknown(uid: &str, namespace: &str, name: &str, annotations: BTreeMap<String, String>) -> PodSpec {
        PodSpec {
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            qos: QosClass::BestEffort,
            containers: Vec::new(),
            annotations,
            pod_level_resources: false,
        }
    }

    /// The resource manager's view of a kubelet `v1.Pod`. Needs `metadata.uid`, `metadata.name` and
    /// `spec`; a missing namespace reads as `default`. See the module docs for the normalisation.
    pub fn from_pod(pod: &Pod) -> Result<PodSpec, PodError> {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_string());
        let label = format!("{namespace}/{}", meta.name.as_deref().unwrap_or("<unnamed>"));
        let missing = |field: &str| PodError::Missing { pod: label.clone(), field: field.to_string() };
        let name = meta.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| missing("metadata.name"))?;
        let uid = meta.uid.clone().filter(|u| !u.is_empty()).ok_or_else(|| missing("metadata.uid"))?;
        let spec = pod.spec.as_ref().ok_or_else(|| missing("spec"))?;

        let mut containers = Vec::new();
        for c in spec.init_containers.iter().flatten() {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            containers.push(container_spec(&label, c, kind)?);
        }
        for c in &spec.containers {
            containers.push(container_spec(&label, c, ContainerKind::App)?);
        }

        let pod_level = read_resources(&label, "(pod)", "spec.", spec.resources.as_ref())?;
        let pod_level_resources = pod_level != Resources::default();
        let status_qos = pod.status.as_ref().and_then(|s| s.qos_class.as_deref()).and_then(|q| match q {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        });
        let qos = match status_qos {
            Some(q) => q,
            None if pod_level_resources => qos_of(&[pod_level]),
            None => compute_qos(&containers),
        };
        Ok(PodSpec {
            uid,
            namespace,
            name,
            qos,
            containers,
            annotations: meta.annotations.clone().unwrap_or_default(),
            pod_level_resources,
        })
    }
}

/// The devices pod `spec` holds, from its annotations: GPUs from `weft.io/gpu-ids` (comma-separated
/// indices, duplicates ignored, in the order given), then NICs from
/// `k8s.v1.cni.cncf.io/network-status` (entries with `device-info.pci.pci-address`; `interface` is
/// the pod-side name; `device-info.pci.rdma-device` names the RDMA device, else `locator` does).
/// NUMA nodes come from `locator`. Absent annotations mean no such devices; malformed ones are errors
/// naming the pod and the annotation.
pub fn pod_devices(spec: &PodSpec, locator: &dyn DeviceLocator) -> Result<Vec<PodDevice>, PodError> {
    let mut out = Vec::new();
    let bad = |annotation: &str, why: String| PodError::Annotation {
        pod: spec.label(),
        annotation: annotation.to_string(),
        why,
    };
    if let Some(ids) = spec.annotations.get(GPU_IDS_ANNOTATION) {
        let mut seen = BTreeSet::new();
        for part in ids.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let index: u32 = part
                .parse()
                .map_err(|_| bad(GPU_IDS_ANNOTATION, format!("'{part}' is not a GPU index (in '{ids}')")))?;
            if seen.insert(index) {
                out.push(PodDevice {
                    kind: DeviceKind::Gpu,
                    id: index.to_string(),
                    numa: locator.gpu_numa(index),
                    interface: None,
                    rdma_device: None,
                });
            }
        }
    }
    if let Some(status) = spec.annotations.get(NETWORK_STATUS_ANNOTATION) {
        let value: serde_json::Value =
            serde_json::from_str(status).map_err(|e| bad(NETWORK_STATUS_ANNOTATION, format!("not JSON: {e}")))?;
        let entries = value
            .as_array()
            .ok_or_else(|| bad(NETWORK_STATUS_ANNOTATION, "not a JSON list of networks".to_string()))?;
        let mut seen = BTreeSet::new();
        for (i, entry) in entries.iter().enumerate() {
            let pci = entry.get("device-info").and_then(|d| d.get("pci"));
            let Some(address) = pci.and_then(|p| p.get("pci-address")) else { continue };
            let address = address
                .as_str()
                .ok_or_else(|| bad(NETWORK_STATUS_ANNOTATION, format!("entry {i}: pci-address is not a string")))?;
            let interface = json_text(entry.get("interface")).map(str::to_string);
            if !seen.insert(address.to_string()) {
                continue;
            }
            let rdma_device = json_text(pci.and_then(|p| p.get("rdma-device")))
                .map(str::to_string)
                .or_else(|| locator.pci_rdma_device(address));
            out.push(PodDevice {
                kind: DeviceKind::Nic,
                id: address.to_string(),
                numa: locator.pci_numa(address),
                interface,
                rdma_device,
            });
        }
    }
    Ok(out)
}

/// A non-empty JSON string value.
fn json_text(v: Option<&serde_json::Value>) -> Option<&str> {
    v.and_then(|v| v.as_str()).filter(|s| !s.is_empty())
}

/// The production [`DeviceLocator`]: GPU NUMA nodes from the discovered [`NodeTopology`] (the GPU
/// whose `index` matches), PCI facts from sysfs (`sys/bus/pci/devices/<addr>/numa_node`, `-1` =
/// unknown; `…/infiniband/<name>`).
#[derive(Clone, Debug)]
pub struct SysfsLocator {
    root: SysfsRoot,
    gpu_numa: BTreeMap<u32, Option<u32>>,
}

impl SysfsLocator {
    /// A locator over the host tree at `root` and the GPUs of `topology`.
    pub fn new(root: SysfsRoot, topology: &NodeTopology) -> SysfsLocator {
        let gpu_numa = topology.gpus.iter().map(|g| (g.index, g.numa_node)).collect();
        SysfsLocator { root, gpu_numa }
    }
}

impl DeviceLocator for SysfsLocator {
    fn gpu_numa(&self, index: u32) -> Option<u32> {
        self.gpu_numa.get(&index).copied().flatten()
    }

    fn pci_numa(&self, address: &str) -> Option<u32> {
        let mut notes = Vec::new();
        let numa = read_pci_device(&self.root, address, &mut notes).numa_node;
        for note in notes {
            tracing::debug!(note, address, "PCI device NUMA node");
        }
        numa
    }

    fn pci_rdma_device(&self, address: &str) -> Option<String> {
        let bus = normalize_pci_bus_id(address)?;
        let dir = self.root.join(&format!("sys/bus/pci/devices/{bus}/infiniband"));
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.into_iter().next()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn ctr(name: &str, requests: serde_json::Value, limits: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "resources": {"requests": requests, "limits": limits}})
    }

    fn base(containers: Vec<serde_json::Value>, init: Vec<serde_json::Value>) -> serde_json::Value {
        json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "annotations": {"a": "b"}},
            "spec": {"containers": containers, "initContainers": init}
        })
    }

    #[test]
    fn guaranteed_pod_with_limits_only_and_a_sidecar() {
        let p = pod(base(
            vec![ctr("main", json!({}), json!({"cpu": "4", "memory": "8Gi"}))],
            vec![
                json!({"name": "proxy", "restartPolicy": "Always",
                       "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}),
                ctr("setup", json!({"cpu": "500m", "memory": "1Gi"}), json!({"cpu": "500m", "memory": "1Gi"})),
            ],
        ));
        let s = PodSpec::from_pod(&p).unwrap();
        assert_eq!(s.qos, QosClass::Guaranteed);
        assert_eq!((s.uid.as_str(), s.label().as_str()), ("u-1", "ml/train"));
        assert_eq!(s.annotations.get("a").map(String::as_str), Some("b"));
        let kinds: Vec<(&str, ContainerKind)> = s.containers.iter().map(|c| (c.name.as_str(), c.kind)).collect();
        assert_eq!(
            kinds,
            [("proxy", ContainerKind::Sidecar), ("setup", ContainerKind::Init), ("main", ContainerKind::App)]
        );
        let main = &s.containers[2];
        assert_eq!((main.cpu_request_milli, main.cpu_limit_milli), (4000, Some(4000)));
        assert_eq!((main.memory_request, main.memory_limit), (8 << 30, Some(8 << 30)));
        assert!(!s.pod_level_resources);
    }

    #[test]
    fn qos_follows_kubelet() {
        let g = json!({"cpu": "2", "memory": "1Gi"});
        // An init container without limits makes a Guaranteed-looking pod Burstable.
        let p = pod(base(vec![ctr("m", g.clone(), g.clone())], vec![ctr("i", json!({"cpu": "100m"}), json!({}))]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::Burstable);
        // Requests below limits: Burstable.
        let p = pod(base(vec![ctr("m", json!({"cpu": "1", "memory": "1Gi"}), g.clone())], vec![]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::Burstable);
        // Only a memory limit: Burstable.
        let p = pod(base(vec![ctr("m", json!({}), json!({"memory": "1Gi"}))], vec![]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::Burstable);
        // Nothing, or only zero quantities or other resources: BestEffort.
        let p = pod(base(vec![json!({"name": "m"})], vec![]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::BestEffort);
        let p = pod(base(vec![ctr("m", json!({"cpu": "0", "ephemeral-storage": "1Gi"}), json!({}))], vec![]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::BestEffort);
        // Two Guaranteed containers.
        let p = pod(base(vec![ctr("a", g.clone(), g.clone()), ctr("b", json!({}), g.clone())], vec![]));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::Guaranteed);
        // Same values written differently compare equal.
        let p = pod(base(
            vec![ctr("a", json!({"cpu": "1000m", "memory": "1073741824"}), json!({"cpu": "1", "memory": "1Gi"}))],
            vec![],
        ));
        assert_eq!(PodSpec::from_pod(&p).unwrap().qos, QosClass::Guaranteed);
        // status.qosClass wins, as GetPodQOS.
        let mut v = base(vec![json!({"name": "m"})], vec![]);
        v["status"] = json!({"qosClass": "Burstable"});
        assert_eq!(PodSpec::from_pod(&pod(v)).unwrap().qos, QosClass::Burstable);
        // Pod-level resources decide when set.
        let mut v = base(vec![json!({"name": "m"})], vec![]);
        v["spec"]["resources"] = json!({"limits": {"cpu": "2", "memory": "1Gi"}});
        let s = PodSpec::from_pod(&pod(v)).unwrap();
        assert_eq!(s.qos, QosClass::Guaranteed);
        assert!(s.pod_level_resources);
    }

    #[test]
    fn errors_name_pod_container_and_field() {
        let p = pod(base(vec![ctr("main", json!({"cpu": "lots"}), json!({}))], vec![]));
        let e = PodSpec::from_pod(&p).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("ml/train")
                && text.contains("main")
                && text.contains("resources.requests.cpu")
                && text.contains("'lots'"),
            "{text}"
        );
        let p = pod(json!({"metadata": {"name": "x", "namespace": "ns"}, "spec": {"containers": []}}));
        let text = PodSpec::from_pod(&p).unwrap_err().to_string();
        assert!(text.contains("ns/x") && text.contains("metadata.uid"), "{text}");
        let p = pod(json!({"metadata": {"name": "x", "uid": "u"}}));
        let text = PodSpec::from_pod(&p).unwrap_err().to_string();
        assert!(text.contains("default/x") && text.contains("spec"), "{text}");
        let mut v = base(vec![json!({"name": "m"})], vec![]);
        v["spec"]["resources"] = json!({"limits": {"memory": "-1"}});
        let text = PodSpec::from_pod(&pod(v)).unwrap_err().to_string();
        assert!(text.contains("spec.resources.limits.memory") && text.contains("(pod)"), "{text}");
    }

    #[test]
    fn compute_qos_over_hand_built_specs() {
        let c = |req: u64, lim: Option<u64>| ContainerSpec {
            name: "c".into(),
            kind: ContainerKind::App,
            cpu_request_milli: req,
            cpu_limit_milli: lim,
            memory_request: 10,
            memory_limit: Some(10),
        };
        assert_eq!(compute_qos(&[c(1000, Some(1000))]), QosClass::Guaranteed);
        assert_eq!(compute_qos(&[c(500, Some(1000))]), QosClass::Burstable);
        assert_eq!(compute_qos(&[c(500, None)]), QosClass::Burstable);
        assert_eq!(compute_qos(&[]), QosClass::BestEffort);
    }

    struct Table;
    impl DeviceLocator for Table {
        fn gpu_numa(&self, index: u32) -> Option<u32> {
            (index < 8).then_some(index / 4)
        }
        fn pci_numa(&self, address: &str) -> Option<u32> {
            (address == "0000:3b:00.2").then_some(0)
        }
        fn pci_rdma_device(&self, address: &str) -> Option<String> {
            (address == "0000:3b:00.2").then(|| "mlx5_7".to_string())
        }
    }

    fn annotated(pairs: &[(&str, &str)]) -> PodSpec {
        let ann = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        PodSpec::unknown("u", "ns", "p", ann)
    }

    #[test]
    fn devices_from_annotations() {
        let status = json!([
            {"name": "cbr0", "interface": "eth0", "ips": ["10.0.0.5"], "default": true},
            {"name": "ns/rdma-a", "interface": "net1",
             "device-info": {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.2"}}},
            {"name": "ns/rdma-b", "interface": "net2",
             "device-info": {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:d8:00.4", "rdma-device": "mlx5_11"}}}
        ])
        .to_string();
        let spec = annotated(&[(GPU_IDS_ANNOTATION, " 0, 1,1,5 "), (NETWORK_STATUS_ANNOTATION, &status)]);
        let devs = pod_devices(&spec, &Table).unwrap();
        type Row<'a> = (DeviceKind, &'a str, Option<u32>, Option<&'a str>, Option<&'a str>);
        let summary: Vec<Row<'_>> = devs
            .iter()
            .map(|d| (d.kind, d.id.as_str(), d.numa, d.interface.as_deref(), d.rdma_device.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                (DeviceKind::Gpu, "0", Some(0), None, None),
                (DeviceKind::Gpu, "1", Some(0), None, None),
                (DeviceKind::Gpu, "5", Some(1), None, None),
                (DeviceKind::Nic, "0000:3b:00.2", Some(0), Some("net1"), Some("mlx5_7")),
                (DeviceKind::Nic, "0000:d8:00.4", None, Some("net2"), Some("mlx5_11")),
            ]
        );
        assert!(pod_devices(&annotated(&[]), &Table).unwrap().is_empty());
        assert!(pod_devices(&annotated(&[(GPU_IDS_ANNOTATION, "")]), &Table).unwrap().is_empty());
    }

    #[test]
    fn malformed_annotations_name_the_pod_and_annotation() {
        let e = pod_devices(&annotated(&[(GPU_IDS_ANNOTATION, "0,gpu1")]), &Table).unwrap_err().to_string();
        assert!(e.contains("ns/p") && e.contains(GPU_IDS_ANNOTATION) && e.contains("'gpu1'"), "{e}");
        let e = pod_devices(&annotated(&[(NETWORK_STATUS_ANNOTATION, "[{")]), &Table).unwrap_err().to_string();
        assert!(e.contains(NETWORK_STATUS_ANNOTATION) && e.contains("not JSON"), "{e}");
        let e = pod_devices(&annotated(&[(NETWORK_STATUS_ANNOTATION, "{}")]), &Table).unwrap_err().to_string();
        assert!(e.contains("list"), "{e}");
        let bad = json!([{"device-info": {"pci": {"pci-address": 7}}}]).to_string();
        let e = pod_devices(&annotated(&[(NETWORK_STATUS_ANNOTATION, &bad)]), &Table).unwrap_err().to_string();
        assert!(e.contains("entry 0"), "{e}");
    }

    #[test]
    fn sysfs_locator_reads_numa_and_rdma() {
        use weft_topology::{Gpu, PairLink};
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("sys/bus/pci/devices/0000:3b:00.2");
        std::fs::create_dir_all(dev.join("infiniband/mlx5_3")).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        let other = tmp.path().join("sys/bus/pci/devices/0000:5e:00.0");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("numa_node"), "-1\n").unwrap();
        let mut g0 = Gpu::with_index(0);
        g0.numa_node = Some(1);
        let topo = NodeTopology::new(None, vec![g0, Gpu::with_index(1)], vec![], vec![PairLink::default(); 4], vec![])
            .unwrap();
        let loc = SysfsLocator::new(SysfsRoot::new(tmp.path()), &topo);
        assert_eq!(loc.gpu_numa(0), Some(1));
        assert_eq!(loc.gpu_numa(1), None);
        assert_eq!(loc.gpu_numa(9), None);
        assert_eq!(loc.pci_numa("0000:3b:00.2"), Some(1));
        assert_eq!(loc.pci_numa("3b:00.2"), Some(1), "short bus ids are normalised");
        assert_eq!(loc.pci_numa("0000:5e:00.0"), None, "-1 is unknown");
        assert_eq!(loc.pci_numa("0000:99:00.0"), None);
        assert_eq!(loc.pci_numa("nonsense"), None);
        assert_eq!(loc.pci_rdma_device("0000:3b:00.2").as_deref(), Some("mlx5_3"));
        assert_eq!(loc.pci_rdma_device("0000:5e:00.0"), None);
    }
}
