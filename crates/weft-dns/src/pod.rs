//! What one pod should have in DNS, decided from the pod and its claims alone (pure).
//!
//! A pod's records come from its `weft.io/vertex-domains` annotation. Each entry's domain is
//! recomputed from the pod's Numaflow labels and namespace ([`vertex_domain`]); an entry whose
//! domain differs is refused, so a pod cannot claim another vertex's name by writing the
//! annotation. The address is the first of `networkData.ips` (CIDR form, prefix stripped) of the
//! first device of an accepted driver in the entry's ResourceClaim.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use weft_pipeline::domain::{
    PIPELINE_NAME_LABEL, TRANSPORT_PORT_NAME, VERTEX_DOMAINS_ANNOTATION, VERTEX_NAME_LABEL, VertexDomainEntry,
    label_problem, vertex_domain,
};

use crate::record::Prefix;

/// Why an entry (or the whole annotation) gets no record; becomes a Warning Event on the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's note.
    pub message: String,
}

/// A vertex domain the pod may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// The NumaNetwork.
    pub network: String,
    /// The domain, as recomputed (equal to the annotation's).
    pub domain: String,
    /// The record's key.
    pub key: String,
    /// The pod's claim entry (`spec.resourceClaims[].name`) holding the NIC.
    pub claim: String,
}

/// What a pod should have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Ready (PodReady True) and not being deleted: only such pods have records.
    pub ready: bool,
    /// `<prefix>/<zone reversed>/<namespace>/<pipeline>/`: the range holding every record this
    /// registrar can have written for the pod; `None` when the labels cannot form a domain (then
    /// it has none).
    pub dir: Option<String>,
    /// Entries that passed the checks, one per domain.
    pub wanted: Vec<Wanted>,
    /// Entries (or the annotation) refused.
    pub refused: Vec<Refusal>,
    /// The receiver's port: the container port named [`TRANSPORT_PORT_NAME`], written into the
    /// records for SRV answers; `None` when no container names one.
    pub port: Option<u16>,
}

/// The number of the container port named [`TRANSPORT_PORT_NAME`] (containers and init
/// containers, whose port names Kubernetes keeps unique across the pod); an error when it is not
/// a TCP port number.
pub fn transport_port(pod: &Pod) -> Result<Option<u16>, Refusal> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let Some(port) =
        containers.flat_map(|c| c.ports.iter().flatten()).find(|p| p.name.as_deref() == Some(TRANSPORT_PORT_NAME))
    else {
        return Ok(None);
    };
    let bad = |why: String| Refusal { reason: "BadTransportPort", message: why };
    if port.protocol.as_deref().is_some_and(|p| p != "TCP") {
        return Err(bad(format!(
            "container port '{TRANSPORT_PORT_NAME}' is {}, not TCP; records carry no port",
            port.protocol.as_deref().unwrap_or_default()
        )));
    }
    match u16::try_from(port.container_port) {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(bad(format!(
            "container port '{TRANSPORT_PORT_NAME}' is {}, not a port number (1-65535); records carry no port",
            port.container_port
        ))),
    }
}

/// Whether the pod is Ready and not being deleted.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What `pod` should have under `prefix` in `zone`.
pub fn plan(pod: &Pod, prefix: &Prefix, zone: &str) -> Plan {
    let namespace = pod.namespace().unwrap_or_default();
    let labels = pod.labels();
    let pipeline = labels.get(PIPELINE_NAME_LABEL).map(String::as_str);
    let vertex = labels.get(VERTEX_NAME_LABEL).map(String::as_str);
    let dir = pipeline
        .filter(|p| label_problem(p).is_none() && label_problem(&namespace).is_none())
        .map(|p| format!("{}/", prefix.domain_key(&format!("{p}.{namespace}.{zone}"))));
    let mut plan = Plan { ready: is_ready(pod), dir, ..Plan::default() };
    let Some(raw) = pod.annotations().get(VERTEX_DOMAINS_ANNOTATION) else {
        return plan;
    };
    let entries: Vec<VertexDomainEntry> = match serde_json::from_str(raw) {
        Ok(e) => e,
        Err(e) => {
            plan.refused.push(Refusal {
                reason: "InvalidVertexDomains",
                message: format!("annotation {VERTEX_DOMAINS_ANNOTATION} is not a list of vertex domains: {e}"),
            });
            return plan;
        }
    };
    let (Some(pipeline), Some(vertex)) = (pipeline, vertex) else {
        plan.refused.push(Refusal {
            reason: "VertexDomainRefused",
            message: format!(
                "the pod has {VERTEX_DOMAINS_ANNOTATION} but not both labels {PIPELINE_NAME_LABEL} and {VERTEX_NAME_LABEL}"
            ),
        });
        return plan;
    };
    match transport_port(pod) {
        Ok(port) => plan.port = port,
        Err(refusal) => plan.refused.push(refusal),
    }
    for entry in entries {
        match vertex_domain(vertex, &entry.network, pipeline, &namespace, zone) {
            Ok(domain) if domain == entry.domain => {
                if plan.wanted.iter().any(|w| w.domain == domain) {
                    continue;
                }
                plan.wanted.push(Wanted {
                    key: prefix.record_key(&domain, &pod.name_any()),
                    network: entry.network,
                    domain,
                    claim: entry.claim,
                });
            }
            Ok(domain) => plan.refused.push(Refusal {
                reason: "VertexDomainRefused",
                message: format!(
                    "NumaNetwork '{}': the annotation names domain '{}' but the pod's labels and namespace give '{domain}'; no record",
                    entry.network, entry.domain
                ),
            }),
            Err(e) => plan.refused.push(Refusal {
                reason: "VertexDomainRefused",
                message: format!("NumaNetwork '{}': {e}; no record", entry.network),
            }),
        }
    }
    plan
}

/// The ResourceClaim behind one of the pod's claim entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimRef {
    /// The claim's name (in the pod's namespace).
    Named(String),
    /// The entry uses a template and the claim is not in the pod's status yet.
    Pending,
    /// The pod has no such entry in `spec.resourceClaims`.
    Missing,
}

/// The ResourceClaim of the pod's claim entry `entry`: `spec.resourceClaims[].resourceClaimName`,
/// or for a template, `status.resourceClaimStatuses[].resourceClaimName`.
pub fn claim_ref(pod: &Pod, entry: &str) -> ClaimRef {
    let spec = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let Some(claim) = spec.and_then(|cs| cs.iter().find(|c| c.name == entry)) else {
        return ClaimRef::Missing;
    };
    if let Some(name) = &claim.resource_claim_name {
        return ClaimRef::Named(name.clone());
    }
    pod.status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|ss| ss.iter().find(|s| s.name == entry))
        .and_then(|s| s.resource_claim_name.clone())
        .map_or(ClaimRef::Pending, ClaimRef::Named)
}

/// The address a claim gives, if it gives one yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimAddress {
    /// The address.
    Ip(IpAddr),
    /// No device of an accepted driver has `networkData.ips` yet.
    NotYet,
    /// The first address is not an IP in CIDR form (or bare); says which.
    Bad(String),
}

/// The first of `networkData.ips` of the first device of one of `drivers` that has any.
pub fn claim_address(claim: &ResourceClaim, drivers: &[String]) -> ClaimAddress {
    let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    let found = devices.into_iter().flatten().filter(|d| drivers.contains(&d.driver)).find_map(|d| {
        let first = d.network_data.as_ref()?.ips.as_ref()?.first()?;
        Some((d, first))
    });
    let Some((device, cidr)) = found else {
        return ClaimAddress::NotYet;
    };
    let addr = cidr.split_once('/').map_or(cidr.as_str(), |(a, _)| a);
    let prefix_ok = cidr.split_once('/').is_none_or(|(_, len)| len.parse::<u8>().is_ok());
    match addr.parse::<IpAddr>() {
        Ok(ip) if prefix_ok => ClaimAddress::Ip(ip),
        _ => ClaimAddress::Bad(format!(
            "ResourceClaim {}/{}: device '{}' of driver {} has networkData.ips[0] '{cidr}', not an address in CIDR form",
            claim.namespace().unwrap_or_default(),
            claim.name_any(),
            device.device,
            device.driver
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation: serde_json::Value, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "video-inference-0-abcde", "namespace": "default", "uid": "u1",
                "labels": {PIPELINE_NAME_LABEL: "video", VERTEX_NAME_LABEL: "inference"},
                "annotations": {VERTEX_DOMAINS_ANNOTATION: annotation.to_string()},
            },
            "spec": {"containers": [], "resourceClaims": [
                {"name": "net-a-rct", "resourceClaimTemplateName": "net-a-rct"},
                {"name": "fixed", "resourceClaimName": "shared-nic"},
            ]},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "resourceClaimStatuses": [{"name": "net-a-rct", "resourceClaimName": "video-inference-0-abcde-net-a-rct-x1"}],
            },
        }))
        .expect("pod")
    }

    fn prefix() -> Prefix {
        Prefix::new("/skydns").unwrap()
    }

    const ZONE: &str = "vertexdomain.local";

    #[test]
    fn a_matching_entry_is_wanted_under_the_pipeline_directory() {
        let p = pod(
            json!([{"network": "net-a", "domain": "inference.net-a.video.default.vertexdomain.local", "claim": "net-a-rct"}]),
            true,
        );
        let plan = plan(&p, &prefix(), ZONE);
        assert!(plan.ready);
        assert!(plan.refused.is_empty(), "{:?}", plan.refused);
        assert_eq!(plan.dir.as_deref(), Some("/skydns/local/vertexdomain/default/video/"));
        assert_eq!(plan.wanted.len(), 1);
        assert_eq!(
            plan.wanted[0].key,
            "/skydns/local/vertexdomain/default/video/net-a/inference/video-inference-0-abcde"
        );
        assert!(plan.wanted[0].key.starts_with(plan.dir.as_deref().unwrap()));
    }

    #[test]
    fn a_domain_that_the_labels_do_not_give_is_refused() {
        let p = pod(
            json!([
                {"network": "net-a", "domain": "out.net-a.video.default.vertexdomain.local", "claim": "net-a-rct"},
                {"network": "Net_B", "domain": "inference.Net_B.video.default.vertexdomain.local", "claim": "x"},
                {"network": "net-c", "domain": "inference.net-c.video.default.vertexdomain.local", "claim": "fixed"},
            ]),
            true,
        );
        let plan = plan(&p, &prefix(), ZONE);
        assert_eq!(plan.wanted.iter().map(|w| w.network.as_str()).collect::<Vec<_>>(), ["net-c"]);
        assert_eq!(plan.refused.len(), 2);
        assert!(plan.refused[0].message.contains("'out.net-a.video.default.vertexdomain.local'"), "{:?}", plan.refused);
        assert!(plan.refused[0].message.contains("'inference.net-a.video.default.vertexdomain.local'"));
        assert!(plan.refused[1].message.contains("NumaNetwork 'Net_B'"), "{:?}", plan.refused[1]);
        // Another zone is another domain.
        let other = super::plan(&p, &prefix(), "example.org");
        assert!(other.wanted.is_empty() && other.refused.len() == 3);
    }

    #[test]
    fn the_transport_port_comes_from_the_named_container_port() {
        let entries = json!([{"network": "net-a", "domain": "inference.net-a.video.default.vertexdomain.local", "claim": "net-a-rct"}]);
        let mut p = pod(entries.clone(), true);
        assert_eq!(plan(&p, &prefix(), ZONE).port, None, "no named port: records carry none");
        p.spec.as_mut().unwrap().containers = serde_json::from_value(json!([
            {"name": "numa", "ports": [{"name": "metrics", "containerPort": 2469}]},
            {"name": "udf", "ports": [{"name": TRANSPORT_PORT_NAME, "containerPort": 7001, "protocol": "TCP"}]},
        ]))
        .unwrap();
        let got = plan(&p, &prefix(), ZONE);
        assert_eq!((got.port, got.wanted.len()), (Some(7001), 1));
        p.spec.as_mut().unwrap().containers[1].ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        let got = plan(&p, &prefix(), ZONE);
        assert_eq!(got.port, None);
        assert_eq!(got.wanted.len(), 1, "the record is still written, without a port");
        assert_eq!(got.refused.len(), 1);
        assert_eq!(got.refused[0].reason, "BadTransportPort");
        assert!(got.refused[0].message.contains("UDP"), "{:?}", got.refused);
        p.spec.as_mut().unwrap().containers[1].ports.as_mut().unwrap()[0] =
            serde_json::from_value(json!({"name": TRANSPORT_PORT_NAME, "containerPort": 70000})).unwrap();
        let got = plan(&p, &prefix(), ZONE);
        assert!(got.port.is_none() && got.refused[0].message.contains("70000"), "{:?}", got.refused);
    }

    #[test]
    fn bad_annotations_and_missing_labels_are_refusals_not_panics() {
        let mut p = pod(json!([]), true);
        p.metadata.annotations.as_mut().unwrap().insert(VERTEX_DOMAINS_ANNOTATION.into(), "{not json".into());
        let plan1 = plan(&p, &prefix(), ZONE);
        assert_eq!(plan1.refused[0].reason, "InvalidVertexDomains");
        let mut p = pod(json!([{"network": "n", "domain": "d", "claim": "c"}]), true);
        p.metadata.labels.as_mut().unwrap().remove(VERTEX_NAME_LABEL);
        let plan2 = plan(&p, &prefix(), ZONE);
        assert!(plan2.wanted.is_empty());
        assert!(plan2.refused[0].message.contains(VERTEX_NAME_LABEL));
        p.metadata.labels.as_mut().unwrap().insert(PIPELINE_NAME_LABEL.into(), "Bad".into());
        assert_eq!(plan(&p, &prefix(), ZONE).dir, None, "no domain can be formed: no directory");
    }

    #[test]
    fn readiness_needs_ready_true_and_no_deletion() {
        assert!(is_ready(&pod(json!([]), true)));
        assert!(!is_ready(&pod(json!([]), false)));
        let mut p = pod(json!([]), true);
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!is_ready(&p));
        p.status = None;
        assert!(!is_ready(&p));
    }

    #[test]
    fn claims_come_from_the_spec_or_the_status() {
        let mut p = pod(json!([]), true);
        assert_eq!(claim_ref(&p, "net-a-rct"), ClaimRef::Named("video-inference-0-abcde-net-a-rct-x1".into()));
        assert_eq!(claim_ref(&p, "fixed"), ClaimRef::Named("shared-nic".into()));
        assert_eq!(claim_ref(&p, "other"), ClaimRef::Missing);
        p.status.as_mut().unwrap().resource_claim_statuses = None;
        assert_eq!(claim_ref(&p, "net-a-rct"), ClaimRef::Pending);
    }

    fn claim(devices: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c1", "namespace": "default"},
            "spec": {},
            "status": {"devices": devices},
        }))
        .expect("claim")
    }

    fn drivers() -> Vec<String> {
        vec!["nic.weft.io".into(), "dra.net".into()]
    }

    #[test]
    fn the_address_is_the_first_ip_of_an_accepted_driver() {
        let c = claim(json!([
            {"driver": "gpu.nvidia.com", "pool": "p", "device": "gpu0", "networkData": {"ips": ["10.9.9.9/32"]}},
            {"driver": "dra.net", "pool": "p", "device": "vf1"},
            {"driver": "nic.weft.io", "pool": "p", "device": "vf2", "networkData": {"ips": ["192.168.10.7/24", "192.168.10.8/24"]}},
        ]));
        assert_eq!(claim_address(&c, &drivers()), ClaimAddress::Ip("192.168.10.7".parse().unwrap()));
        assert_eq!(claim_address(&c, &["gpu.nvidia.com".into()]), ClaimAddress::Ip("10.9.9.9".parse().unwrap()));
        let v6 =
            claim(json!([{"driver": "dra.net", "pool": "p", "device": "d", "networkData": {"ips": ["fd00::7/64"]}}]));
        assert_eq!(claim_address(&v6, &drivers()), ClaimAddress::Ip("fd00::7".parse().unwrap()));
        let bare =
            claim(json!([{"driver": "dra.net", "pool": "p", "device": "d", "networkData": {"ips": ["10.0.0.1"]}}]));
        assert_eq!(claim_address(&bare, &drivers()), ClaimAddress::Ip("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn no_address_yet_and_bad_addresses_are_told_apart() {
        assert_eq!(claim_address(&claim(json!([])), &drivers()), ClaimAddress::NotYet);
        let empty = claim(json!([{"driver": "dra.net", "pool": "p", "device": "d", "networkData": {"ips": []}}]));
        assert_eq!(claim_address(&empty, &drivers()), ClaimAddress::NotYet);
        for bad in ["10.0.0.300/24", "10.0.0.1/abc", "eth0"] {
            let c = claim(json!([{"driver": "dra.net", "pool": "p", "device": "vf3", "networkData": {"ips": [bad]}}]));
            let ClaimAddress::Bad(why) = claim_address(&c, &drivers()) else { panic!("{bad} accepted") };
            assert!(why.contains("default/c1") && why.contains("vf3") && why.contains(bad), "{why}");
        }
    }
}
