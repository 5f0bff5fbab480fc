//! Test support shared by weft's crates (never a dependency of a shipped one): topologies and
//! Kubernetes objects as kube-scheduler sends them, a harness for controllers under test
//! ([`controller`]), checks of recorded API requests against the deploy RBAC ([`rbac`]), and a
//! test-only Numaflow ([`numaflow`]: its pipeline and vertex controllers over the fake API server),
//! and the one way a test skips when what it needs is missing ([`require`], [`skip`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod controller;
pub mod netns;
pub mod numaflow;
pub mod process;
pub mod rbac;
pub mod skip;

pub use skip::{require, require_ok};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use weft_record::TOPOLOGY_ANNOTATION;
use weft_topology::model::uniform_node;
use weft_topology::{NodeTopology, PairLink, PcieRelation, inventory};

/// 8× A100 SXM on NVSwitch: every pair NV12.
pub fn a100_nvswitch(name: &str) -> NodeTopology {
    let mut t = uniform_node(name, 8, PairLink { pcie: None, nvlinks: 12 });
    t.infer_generations();
    t
}

/// DGX-1 V100 hybrid cube-mesh as NVML reports it (go-gpuallocator's reference node, both relations
/// per pair), named `name`.
pub fn dgx1_v100(name: &str) -> NodeTopology {
    let mut t = weft_topology::reference::dgx1_volta();
    t.name = Some(name.to_string());
    t
}

/// Four PCIe GPUs on two switches (GPU0–1 on one, GPU2–3 on the other; `PIX` within a switch,
/// `SYS` across) and two NICs, NIC0 beside GPU0–1 and NIC1 beside GPU2–3 with relation `nic` to
/// their GPUs (`PIX`: under the same switch; `NODE`: hanging off the CPU), `SYS` to the others.
/// Each NIC offers `vfs_per_nic` VFs of physnet `fabric`: NIC0's at `0000:0c:00.<2+i>`, NIC1's at
/// `0000:8c:00.<2+i>`.
pub fn two_switches(name: &str, nic: PcieRelation, vfs_per_nic: usize) -> NodeTopology {
    let n = nic.token();
    let text = format!(
        "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\n\
         GPU0\t X \tPIX\tSYS\tSYS\t{n}\tSYS\n\
         GPU1\tPIX\t X \tSYS\tSYS\t{n}\tSYS\n\
         GPU2\tSYS\tSYS\t X \tPIX\tSYS\t{n}\n\
         GPU3\tSYS\tSYS\tPIX\t X \tSYS\t{n}\n\
         NIC0\t{n}\t{n}\tSYS\tSYS\t X \tSYS\n\
         NIC1\tSYS\tSYS\t{n}\t{n}\tSYS\t X \n"
    );
    let mut node = weft_topology::parse_node(&text, name).unwrap();
    node.name = Some(name.to_string());
    let nics: Vec<String> = node.nics.iter().map(|n| n.name.clone()).collect();
    let mut vfs = Vec::new();
    for (k, bus) in [(0, "0c"), (1, "8c")] {
        for f in 0..vfs_per_nic {
            vfs.push(weft_topology::Vf {
                pci_address: format!("0000:{bus}:00.{}", f + 2),
                nic: nics[k].clone(),
                physnet: Some("fabric".into()),
            });
        }
    }
    node.set_vfs(vfs).unwrap();
    node
}

/// 8 PCIe GPUs, no NVLink: pairs behind one switch are PIX, same socket PHB, across sockets SYS.
pub fn pcie_only(name: &str, gpus: usize) -> NodeTopology {
    let mut t = uniform_node(name, gpus, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 });
    let half = gpus / 2;
    for a in 0..gpus {
        for b in (a + 1)..gpus {
            let same_socket = (a < half) == (b < half);
            let rel = if a / 2 == b / 2 {
                PcieRelation::Pix
            } else if same_socket {
                PcieRelation::Phb
            } else {
                PcieRelation::Sys
            };
            t.set_link(a, b, PairLink { pcie: Some(rel), nvlinks: 0 });
        }
    }
    t
}

/// Every pair SYS: the worst connected node.
pub fn sys_only(name: &str, gpus: usize) -> NodeTopology {
    uniform_node(name, gpus, PairLink { pcie: Some(PcieRelation::Sys), nvlinks: 0 })
}

/// A Node object as kube-scheduler holds it: full status, camelCase, with the topology annotation
/// when `topology` is given.
pub fn node_json(name: &str, topology: Option<&NodeTopology>, gpus: usize) -> Value {
    let mut annotations = json!({
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true"
    });
    if let Some(t) = topology {
        annotations[TOPOLOGY_ANNOTATION] = Value::String(inventory::to_json(t));
    }
    json!({
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "resourceVersion": "1001",
            "creationTimestamp": "2026-01-05T10:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
            "annotations": annotations,
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-01-05T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056426052Ki", "nvidia.com/gpu": gpus.to_string(), "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "1046426052Ki", "nvidia.com/gpu": gpus.to_string(), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-05T10:05:00Z",
                "lastTransitionTime": "2026-01-05T10:00:00Z", "reason": "KubeletReady",
                "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1.0",
                "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.13",
                "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64"},
            "images": [{"names": ["nvcr.io/nvidia/pytorch@sha256:abc", "nvcr.io/nvidia/pytorch:24.01-py3"],
                "sizeBytes": 9_000_000_000u64}]
        }
    })
}

/// A Node object (typed).
pub fn node(name: &str, topology: Option<&NodeTopology>, gpus: usize) -> Node {
    serde_json::from_value(node_json(name, topology, gpus)).unwrap()
}

/// A pending pod as kube-scheduler sends it: no apiVersion/kind, `gpus` GPUs as a limit (and the
/// request the API server defaults from it).
pub fn pending_pod_json(name: &str, gpus: u32) -> Value {
    json!({
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": format!("uid-{name}"),
            "resourceVersion": "5005",
            "creationTimestamp": "2026-01-05T11:00:00Z",
            "labels": {"app": "trainer"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j1",
                "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [{
                "name": "trainer",
                "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                "command": ["torchrun", "train.py"],
                "resources": {
                    "limits": {"nvidia.com/gpu": gpus.to_string(), "cpu": "8"},
                    "requests": {"nvidia.com/gpu": gpus.to_string(), "cpu": "8", "memory": "64Gi"}
                },
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {"phase": "Pending", "qosClass": "Burstable",
            "conditions": [{"type": "PodScheduled", "status": "False", "lastProbeTime": null,
                "lastTransitionTime": "2026-01-05T11:00:00Z", "reason": "Unschedulable"}]}
    })
}

/// A running pod bound to `node` holding `gpus` GPUs, optionally annotated with its GPU ids.
pub fn bound_pod(name: &str, node: &str, gpus: u32, ids: Option<&str>, created: &str) -> Pod {
    let mut v = pending_pod_json(name, gpus);
    v["spec"]["nodeName"] = json!(node);
    v["metadata"]["creationTimestamp"] = json!(created);
    v["status"] = json!({"phase": "Running"});
    if let Some(ids) = ids {
        v["metadata"]["annotations"][weft_record::GPU_IDS_ANNOTATION] = json!(ids);
    }
    serde_json::from_value(v).unwrap()
}

/// A request body for `nodeCacheCapable: false` (objects in `Nodes`).
pub fn args_with_nodes(pod: Value, nodes: Vec<Value>) -> Value {
    json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": null})
}

/// A request body for `nodeCacheCapable: true` (names in `NodeNames`).
pub fn args_with_names(pod: Value, names: &[&str]) -> Value {
    json!({"Pod": pod, "Nodes": null, "NodeNames": names})
}
