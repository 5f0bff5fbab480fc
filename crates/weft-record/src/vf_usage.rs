//! The SR-IOV VFs a pod asks for and which VFs the pods on a node hold: the VF half of
//! [`crate::usage`], by the same rules (the record first, then a replay of unrecorded pods through
//! the choice weft's VF device plugin makes).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use weft_net::choice::{choose, topology_candidates};
use weft_net::config::{RESOURCE_PREFIX, physnet_of_resource, resource_name};
use weft_resources::{RequestError, pod_request};
use weft_topology::NodeTopology;

use crate::usage::{GpuUsage, PodRef, holds_devices};

/// Pod annotation with the VFs a pod holds, by physnet, as JSON
/// (`{"fabric":["0000:0c:00.2"]}`): written when the extender binds the pod, rewritten by the node
/// with what the kubelet really gave its containers.
pub const VF_IDS_ANNOTATION: &str = "weft.io/vf-ids";

/// VFs by physnet (PCI addresses).
pub type VfIds = BTreeMap<String, Vec<String>>;

/// Read a [`VF_IDS_ANNOTATION`] value; the error names what is wrong.
pub fn parse_vf_ids(value: &str) -> Result<VfIds, String> {
    let ids: VfIds = serde_json::from_str(value).map_err(|e| format!("{VF_IDS_ANNOTATION}: {e}"))?;
    for (physnet, vfs) in &ids {
        for (i, vf) in vfs.iter().enumerate() {
            if vfs[..i].contains(vf) {
                return Err(format!("{VF_IDS_ANNOTATION}: physnet '{physnet}' lists VF {vf} twice"));
            }
        }
    }
    Ok(ids)
}

/// Render a [`VF_IDS_ANNOTATION`] value.
pub fn format_vf_ids(ids: &VfIds) -> String {
    // A map of strings always serialises.
    serde_json::to_string(ids).unwrap_or_default()
}

/// How many VFs of each physnet a pod asks for (`sriov.weft.io/<physnet>`, counted as the kubelet
/// counts: app containers summed, init containers by their peak). Physnets it asks none of are
/// left out.
pub fn pod_vf_requests(pod: &Pod) -> Result<BTreeMap<String, u64>, RequestError> {
    let mut names = BTreeSet::new();
    if let Some(spec) = &pod.spec {
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            let Some(r) = &c.resources else { continue };
            for map in [&r.limits, &r.requests].into_iter().flatten() {
                names.extend(map.keys().filter(|k| k.starts_with(RESOURCE_PREFIX)).cloned());
            }
        }
    }
    let mut out = BTreeMap::new();
    for name in names {
        let Some(physnet) = physnet_of_resource(&name) else { continue };
        let n = pod_request(pod, &resource_name(physnet))?;
        if n > 0 {
            out.insert(physnet.to_string(), n);
        }
    }
    Ok(out)
}

/// The VFs in use on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VfUsage {
    /// PCI addresses of the VFs in use.
    pub used: BTreeSet<String>,
    /// Inconsistencies found (each says what was assumed instead), in the order met.
    pub issues: Vec<String>,
}

impl VfUsage {
    /// How many VFs of `physnet` are free on `node`.
    pub fn free_count(&self, node: &NodeTopology, physnet: &str) -> usize {
        node.vfs()
            .iter()
            .filter(|v| v.physnet.as_deref() == Some(physnet) && !self.used.contains(&v.pci_address))
            .count()
    }
}

/// The VFs held by `pods`, the pods bound to `node` (terminal pods skipped); `gpus` is the node's
/// GPU accounting, which tells the GPUs each pod holds.
///
/// 1. A pod's [`VF_IDS_ANNOTATION`] lists exactly the VFs it holds (addresses the node does not
///    publish are reported and ignored).
/// 2. A pod that asks for VFs of a physnet its record does not list is replayed in creation order
///    (then namespace, name): it gets the VFs weft's device plugin would choose, nearest its GPUs.
///    A replay that finds too few counts every remaining VF of the physnet as used.
pub fn vfs_in_use<P: Borrow<Pod>>(node: &NodeTopology, pods: &[P], gpus: &GpuUsage) -> VfUsage {
    let mut usage = VfUsage::default();
    let known: BTreeSet<&str> = node.vfs().iter().map(|v| v.pci_address.as_str()).collect();
    let mut replay: Vec<(&Pod, String, usize)> = Vec::new();
    for pod in pods.iter().map(Borrow::borrow).filter(|p| holds_devices(p)) {
        let asked = pod_vf_requests(pod).unwrap_or_else(|e| {
            usage.issues.push(format!("pod {}: {e}", PodRef::of(pod)));
            BTreeMap::new()
        });
        let annotation = pod.metadata.annotations.as_ref().and_then(|a| a.get(VF_IDS_ANNOTATION));
        let recorded = match annotation.map(|v| parse_vf_ids(v)) {
            None => VfIds::new(),
            Some(Ok(ids)) => ids,
            Some(Err(e)) => {
                usage.issues.push(format!("pod {}: {e}; its VFs are replayed", PodRef::of(pod)));
                VfIds::new()
            }
        };
        for vf in recorded.values().flatten() {
            if !known.contains(vf.as_str()) {
                usage.issues.push(format!("pod {}: VF {vf} is not one this node publishes; ignored", PodRef::of(pod)));
            } else if !usage.used.insert(vf.clone()) {
                usage.issues.push(format!("VF {vf} is claimed by more than one pod (one is {})", PodRef::of(pod)));
            }
        }
        for (physnet, n) in asked {
            if !recorded.contains_key(&physnet) {
                replay.push((pod, physnet, usize::try_from(n).unwrap_or(usize::MAX)));
            }
        }
    }
    replay.sort_by(|(a, pa, _), (b, pb, _)| {
        let key = |p: &Pod| {
            (
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        key(a).cmp(&key(b)).then_with(|| pa.cmp(pb))
    });
    for (pod, physnet, count) in replay {
        let who = PodRef::of(pod);
        let held: &[usize] = gpus.pods.iter().find(|p| p.pod == who).map(|p| p.gpus.as_slice()).unwrap_or_default();
        let used = &usage.used;
        let candidates = topology_candidates(node, &physnet, |a| !used.contains(a), held);
        let taken = match choose(&candidates, &[], count) {
            Ok(vfs) => vfs,
            Err(e) => {
                usage.issues.push(format!("pod {who}: {physnet}: {e}; counting every VF of it as used"));
                candidates.iter().map(|c| c.pci_address.to_string()).collect()
            }
        };
        usage.used.extend(taken);
    }
    usage
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use weft_topology::{PcieRelation, Vf, parse_node};

    use super::*;
    use crate::usage::{GpuSource, PodGpus};

    /// GPU0 and NIC0 under one switch, GPU1 and NIC1 under another; two fabric VFs on each NIC.
    fn node() -> NodeTopology {
        let text = "\tGPU0\tGPU1\tNIC0\tNIC1\nGPU0\t X \tSYS\tPIX\tSYS\nGPU1\tSYS\t X \tSYS\tPIX\n\
                    NIC0\tPIX\tSYS\t X \tSYS\nNIC1\tSYS\tPIX\tSYS\t X \n";
        let mut node = parse_node(text, "t").unwrap();
        let (a, b) = (node.nics[0].name.clone(), node.nics[1].name.clone());
        let vf = |pci: &str, nic: &str| Vf { pci_address: pci.into(), nic: nic.into(), physnet: Some("fabric".into()) };
        node.set_vfs(vec![
            vf("0000:0c:00.2", &a),
            vf("0000:0c:00.3", &a),
            vf("0000:8c:00.2", &b),
            vf("0000:8c:00.3", &b),
        ])
        .unwrap();
        assert_eq!(node.vf_nearest(2, &[1]), Some(PcieRelation::Pix));
        node
    }

    fn pod(name: &str, created: i64, vfs: u32, annotation: Option<&str>) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"sriov.weft.io/fabric": vfs.to_string()}}}]}
        }))
        .unwrap();
        p.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created).unwrap()));
        if let Some(a) = annotation {
            p.metadata.annotations = Some([(VF_IDS_ANNOTATION.to_string(), a.to_string())].into());
        }
        p
    }

    fn holding(name: &str, gpus: &[usize]) -> GpuUsage {
        GpuUsage {
            pods: vec![PodGpus {
                pod: PodRef { namespace: "ns".into(), name: name.into() },
                gpus: gpus.to_vec(),
                source: GpuSource::Annotation,
            }],
            ..GpuUsage::default()
        }
    }

    #[test]
    fn requests_sum_app_containers_and_name_each_physnet() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"sriov.weft.io/fabric": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"sriov.weft.io/fabric": "1", "sriov.weft.io/storage": "1"}}},
                    {"name": "b", "resources": {"requests": {"sriov.weft.io/fabric": "1"}}},
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
                ]
            }
        }))
        .unwrap();
        let asked = pod_vf_requests(&p).unwrap();
        assert_eq!(asked, BTreeMap::from([("fabric".into(), 3), ("storage".into(), 1)]), "init peak 3 > 1 + 1");
    }

    #[test]
    fn recorded_vfs_are_used_and_unrecorded_pods_replay_near_their_gpus() {
        let n = node();
        let recorded = pod("a", 1, 1, Some(r#"{"fabric":["0000:0c:00.2"]}"#));
        let replayed = pod("b", 2, 1, None);
        let usage = vfs_in_use(&n, &[recorded, replayed], &holding("b", &[1]));
        let used: Vec<&str> = usage.used.iter().map(String::as_str).collect();
        assert_eq!(used, ["0000:0c:00.2", "0000:8c:00.2"], "b holds GPU1, so its VF is under GPU1's switch");
        assert!(usage.issues.is_empty(), "{:?}", usage.issues);
        assert_eq!(usage.free_count(&n, "fabric"), 2);
        assert_eq!(usage.free_count(&n, "storage"), 0);
    }

    #[test]
    fn bad_records_and_overcommit_are_reported_conservatively() {
        let n = node();
        let unknown = pod("a", 1, 1, Some(r#"{"fabric":["0000:99:00.2"]}"#));
        let broken = pod("b", 2, 1, Some("{"));
        let greedy = pod("c", 3, 9, None);
        let usage = vfs_in_use(&n, &[unknown, broken, greedy], &GpuUsage::default());
        assert_eq!(usage.used.len(), 4, "every VF counted as used");
        let all = usage.issues.join("\n");
        assert!(all.contains("0000:99:00.2") && all.contains("not one this node publishes"), "{all}");
        assert!(all.contains("pod ns/b") && all.contains(VF_IDS_ANNOTATION), "{all}");
        assert!(all.contains("pod ns/c") && all.contains("9 VFs asked for"), "{all}");
        assert_eq!(
            parse_vf_ids(r#"{"f":["x","x"]}"#).unwrap_err(),
            format!("{VF_IDS_ANNOTATION}: physnet 'f' lists VF x twice")
        );
        let ids = VfIds::from([("fabric".into(), vec!["0000:0c:00.2".into()])]);
        assert_eq!(parse_vf_ids(&format_vf_ids(&ids)).unwrap(), ids);
    }
}
