//! Vertex domains: the DNS names under which a vertex's pods are reachable on a NumaNetwork.
//!
//! A domain is `<vertex>.<numaNetwork>.<pipeline>.<namespace>.<zone>` (the upstream proposal's
//! latest form, PR #3129), zone [`DEFAULT_ZONE`] unless configured. Every part left of the zone
//! is one DNS label: at most 63 characters of lower-case letters, digits and '-', starting and
//! ending with a letter or digit (RFC 1123), and not `any`, which CoreDNS's etcd plugin reads as
//! a wildcard ([`wildcard_problem`]). The whole name is at most 253 characters. A
//! NumaNetwork's name may be a DNS subdomain (with dots); such a network cannot be one label of a
//! domain, and [`vertex_domain`] says so instead of producing a name with extra levels.

use serde::{Deserialize, Serialize};

/// The zone vertex domains live under unless configured otherwise.
pub const DEFAULT_ZONE: &str = "vertexdomain.local";
/// Pod annotation listing the pod's vertex domains as JSON ([`VertexDomainEntry`] array). The
/// Pipeline webhook puts it on the vertex template (so Numaflow copies it to every pod); the DNS
/// registrar reads it.
pub const VERTEX_DOMAINS_ANNOTATION: &str = "weft.io/vertex-domains";
/// Environment variable with the vertex's own domain(s), comma-separated.
pub const VERTEX_DOMAIN_ENV: &str = "VERTEX_DOMAIN";
/// Environment variable with the domains of the vertices this vertex sends to over `direct`
/// edges, comma-separated.
pub const VERTEX_DOMAIN_TARGETS_ENV: &str = "VERTEX_DOMAIN_TARGETS";
/// The container port name a vertex pod gives weft-transport's receiver. When a container
/// declares a port of this name, the DNS registrar writes its number into the pod's records,
/// and CoreDNS serves it in SRV answers; without it receivers use weft-transport's default port.
pub const TRANSPORT_PORT_NAME: &str = "weft-transport";
/// Numaflow's pod label naming the pipeline.
pub const PIPELINE_NAME_LABEL: &str = "numaflow.numaproj.io/pipeline-name";
/// Numaflow's pod label naming the vertex.
pub const VERTEX_NAME_LABEL: &str = "numaflow.numaproj.io/vertex-name";

/// Longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest DNS name, without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;

/// One vertex domain of a pod: the network, the domain, and the name of the pod's
/// `spec.resourceClaims[]` entry whose NIC carries the address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VertexDomainEntry {
    /// The NumaNetwork's name.
    pub network: String,
    /// The fully qualified domain (no trailing dot).
    pub domain: String,
    /// The pod-level claim entry (`spec.resourceClaims[].name`) of the network's NIC.
    pub claim: String,
}

/// A vertex domain cannot be formed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    /// A part is not a DNS label.
    #[error("{part} '{value}' cannot be a DNS label of the vertex domain: {why}")]
    Label {
        /// Which part: "vertex", "NumaNetwork", "pipeline" or "namespace".
        part: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// The zone is not a DNS name.
    #[error("vertex domain zone '{zone}' is not a DNS name: {why}")]
    Zone {
        /// The zone.
        zone: String,
        /// What is wrong.
        why: String,
    },
    /// The whole name is too long.
    #[error(
        "vertex domain '{domain}' is {len} characters, over the DNS limit of 253; shorten the vertex, NumaNetwork, pipeline or namespace name"
    )]
    TooLong {
        /// The name formed.
        domain: String,
        /// Its length.
        len: usize,
    },
}

/// Why `value` is not an RFC 1123 DNS label, or `None` when it is one.
pub fn label_problem(value: &str) -> Option<String> {
    let b = value.as_bytes();
    if b.is_empty() {
        return Some("it is empty".into());
    }
    if b.len() > MAX_LABEL_LEN {
        return Some(format!("it is {} characters, over the DNS label limit of {MAX_LABEL_LEN}", b.len()));
    }
    if let Some(c) = value.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        let what = if c == '.' { "'.' (it would add a level to the domain)".to_string() } else { format!("{c:?}") };
        return Some(format!("it contains {what}; only lower-case letters, digits and '-' are allowed"));
    }
    if b[0] == b'-' || b[b.len() - 1] == b'-' {
        return Some("it starts or ends with '-'".into());
    }
    None
}

/// The labels CoreDNS's etcd plugin reads as wildcards (`msg.PathWithWildcard`): a query name with
/// one of them is looked up one level above it and answered with every record whose key matches
/// the other labels, so the label matches any value there.
pub const WILDCARD_LABELS: [&str; 2] = ["any", "*"];

/// Why `value` cannot be a label of a name CoreDNS serves from etcd (a wildcard label), or `None`.
pub fn wildcard_problem(value: &str) -> Option<String> {
    WILDCARD_LABELS.contains(&value).then(|| {
        format!(
            "CoreDNS's etcd plugin reads the label '{value}' as a wildcard, so the name would also answer \
             the pods of every other value in that place (another namespace's, say); use another name"
        )
    })
}

/// Why `value` cannot be one label of a vertex domain: not an RFC 1123 label
/// ([`label_problem`]), or a label CoreDNS reads as a wildcard ([`wildcard_problem`]).
pub fn domain_label_problem(value: &str) -> Option<String> {
    label_problem(value).or_else(|| wildcard_problem(value))
}

/// Checks that `zone` is a DNS name of labels (no trailing dot).
pub fn check_zone(zone: &str) -> Result<(), DomainError> {
    let err = |why: String| DomainError::Zone { zone: zone.to_string(), why };
    if zone.is_empty() {
        return Err(err("it is empty".into()));
    }
    if zone.len() > MAX_NAME_LEN {
        return Err(err(format!("it is {} characters, over 253", zone.len())));
    }
    for label in zone.split('.') {
        if let Some(why) = domain_label_problem(label) {
            return Err(err(format!("label '{label}': {why}")));
        }
    }
    Ok(())
}

/// The domain `<vertex>.<network>.<pipeline>.<namespace>.<zone>`, or what is wrong with it.
pub fn vertex_domain(
    vertex: &str,
    network: &str,
    pipeline: &str,
    namespace: &str,
    zone: &str,
) -> Result<String, DomainError> {
    for (part, value) in
        [("vertex", vertex), ("NumaNetwork", network), ("pipeline", pipeline), ("namespace", namespace)]
    {
        if let Some(why) = domain_label_problem(value) {
            return Err(DomainError::Label { part, value: value.to_string(), why });
        }
    }
    check_zone(zone)?;
    let domain = format!("{vertex}.{network}.{pipeline}.{namespace}.{zone}");
    if domain.len() > MAX_NAME_LEN {
        let len = domain.len();
        return Err(DomainError::TooLong { domain, len });
    }
    Ok(domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_pipeline_gets_hierarchical_domains() {
        assert_eq!(
            vertex_domain("inference", "pipeline1-multi-network", "video", "default", DEFAULT_ZONE).unwrap(),
            "inference.pipeline1-multi-network.video.default.vertexdomain.local"
        );
    }

    #[test]
    fn each_bad_part_is_named() {
        let e = vertex_domain("Inference", "n", "p", "ns", DEFAULT_ZONE).unwrap_err();
        assert!(matches!(e, DomainError::Label { part: "vertex", .. }), "{e}");
        let e = vertex_domain("v", "net.a", "p", "ns", DEFAULT_ZONE).unwrap_err();
        assert!(e.to_string().contains("NumaNetwork 'net.a'"), "{e}");
        assert!(e.to_string().contains("add a level"), "{e}");
        let e = vertex_domain("v", "n", &"p".repeat(64), "ns", DEFAULT_ZONE).unwrap_err();
        assert!(e.to_string().contains("64 characters"), "{e}");
        let e = vertex_domain("v", "n", "p", "-ns", DEFAULT_ZONE).unwrap_err();
        assert!(matches!(e, DomainError::Label { part: "namespace", .. }), "{e}");
        let e = vertex_domain("v", "n", "p", "ns", "vertexdomain..local").unwrap_err();
        assert!(matches!(e, DomainError::Zone { .. }), "{e}");
    }

    #[test]
    fn labels_coredns_reads_as_wildcards_are_refused() {
        // CoreDNS's etcd plugin (msg.PathWithWildcard) reads a label `any` or `*` as a wildcard:
        // the domain of namespace `any` would answer every namespace's vertex of that name.
        for (part, args) in [
            ("namespace", ["inference", "net-a", "video", "any"]),
            ("pipeline", ["inference", "net-a", "any", "default"]),
            ("NumaNetwork", ["inference", "any", "video", "default"]),
            ("vertex", ["any", "net-a", "video", "default"]),
            ("vertex", ["*", "net-a", "video", "default"]),
        ] {
            let [v, n, p, ns] = args;
            let e = vertex_domain(v, n, p, ns, DEFAULT_ZONE).unwrap_err();
            assert!(matches!(&e, DomainError::Label { part: got, .. } if *got == part), "{args:?}: {e}");
            if args.contains(&"any") {
                assert!(e.to_string().contains("wildcard"), "{e}");
            }
        }
        for zone in ["any.local", "vertexdomain.any", "*.local"] {
            assert!(matches!(check_zone(zone), Err(DomainError::Zone { .. })), "{zone}");
        }
        // A label that merely contains the word is a plain label.
        assert!(vertex_domain("any-1", "net-a", "company", "default", DEFAULT_ZONE).is_ok());
    }

    #[test]
    fn the_whole_name_is_limited_to_253() {
        let l = "a".repeat(63);
        // 4 × 63 + 4 dots + "x" = 257 > 253, though every label is fine.
        let e = vertex_domain(&l, &l, &l, &l, "x").unwrap_err();
        assert!(matches!(e, DomainError::TooLong { len: 257, .. }), "{e}");
        let ok = vertex_domain(&l, &l, &l, &"a".repeat(59), "x").unwrap();
        assert_eq!(ok.len(), 253);
    }

    #[test]
    fn entries_round_trip_in_camel_case() {
        let e = VertexDomainEntry {
            network: "n".into(),
            domain: "v.n.p.ns.vertexdomain.local".into(),
            claim: "n-rct".into(),
        };
        let v = serde_json::to_value(vec![e.clone()]).unwrap();
        assert_eq!(v, serde_json::json!([{"network": "n", "domain": "v.n.p.ns.vertexdomain.local", "claim": "n-rct"}]));
        let back: Vec<VertexDomainEntry> = serde_json::from_value(v).unwrap();
        assert_eq!(back, vec![e]);
    }
}
