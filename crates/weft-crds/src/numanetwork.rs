//! `NumaNetwork` (`numaflow.numaproj.io/v1alpha1`): a second-NIC network that Numaflow pipeline
//! edges can run over.
//!
//! A cluster administrator creates one per physical network (a DRA DeviceClass of NICs, an IP range,
//! optionally a VLAN); pipelines name it in `edges[].numaNetwork.name`. The controller (not built
//! yet) turns it into a ResourceClaimTemplate named [`resource_claim_template_name`]
//! (`<name>-rct`) whose claims give each vertex pod a NIC of that class with an address from the
//! range. Reference: `docs/numanetwork.md`.
//!
//! Decisions (details in the docs):
//! - **Kind `NumaNetwork`**, plural `numanetworks`, short names `nnet` and `nn`. The seed writes
//!   `kind: numaNetwork`; Kubernetes kinds are UpperCamelCase, and upstream's prototype
//!   (numaproj-contrib/gpu-direct-comm) uses `NumaNetwork` with short name `nn`.
//! - **Field names spelled correctly**: `refDeviceClass`, `refResourceClaimDranet` (the seed also
//!   writes `refDeviceCalss` and `refResouceClaimDranet`).
//! - **Cluster-scoped**: one network is shared by pipelines in any namespace, and its IP range and
//!   VLAN are cluster-wide facts that only one object may claim.
//! - **Immutable** `ipRange`, `vlanTag` and `refDeviceClass.name`: pods hold addresses, VLAN
//!   membership and NICs allocated from the values they were created with. `ethernetSpeed` is
//!   informational and may change.
//! - `vlanTag` and `ethernetSpeed` are optional: no tag means an untagged network, and the speed is
//!   a note for people (dranet cannot read it from the cabling).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{FieldError, FieldErrors};

/// The `ipRange` type, shared with the IPAM objects (crate `weft-ipam`).
pub use weft_ipam::{Cidr, CidrError};

/// API group (kept from the seed).
pub const GROUP: &str = "numaflow.numaproj.io";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// Kind.
pub const KIND: &str = "NumaNetwork";
/// The CRD's name, `<plural>.<group>`.
pub const CRD_NAME: &str = "numanetworks.numaflow.numaproj.io";
/// The status condition that says the network is usable (its ResourceClaimTemplates exist).
pub const READY_CONDITION: &str = "Ready";
/// Suffix of the ResourceClaimTemplate made for a NumaNetwork (from the seed).
pub const RCT_SUFFIX: &str = "-rct";
/// Longest `metadata.name`: `<name>-rct` must still be a valid object name (≤ 253 characters).
pub const MAX_NAME_LEN: usize = MAX_DNS_SUBDOMAIN_LEN - RCT_SUFFIX.len();
/// Longest DNS subdomain (RFC 1123), the limit on object names such as a DeviceClass's.
pub const MAX_DNS_SUBDOMAIN_LEN: usize = 253;
/// Longest `ipRange` string. The longest valid CIDR is 49 characters
/// (`0000:0000:0000:0000:0000:0000:255.255.255.255/128`); the bound also keeps the CEL cost low.
pub const MAX_IP_RANGE_LEN: usize = 64;
/// Lowest `vlanTag` (0 means "untagged" in 802.1Q; leave the field out for that).
pub const VLAN_MIN: i32 = 1;
/// Highest `vlanTag` (4095 is reserved by 802.1Q).
pub const VLAN_MAX: i32 = 4094;

/// Schema `pattern` for `refDeviceClass.name`: an RFC 1123 DNS subdomain, as Kubernetes checks
/// object names.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Schema `pattern` for `ipRange`, for validators that do not run CEL (kubeconform, editors): an
/// exact IPv4 CIDR (octets 0–255 without leading zeros, prefix 0–32) or
/// the rough shape of an IPv6 one (hex digits, colons and dots with at least one colon, prefix
/// 0–128). The CEL rules [`IP_RANGE_IS_CIDR_RULE`] and [`IP_RANGE_MASKED_RULE`] are exact. Every
/// string that [`Cidr::parse`] accepts matches it.
pub const CIDR_PATTERN: &str = r"^(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8]))$";

/// CEL: `ipRange` is a CIDR (Kubernetes ≥ 1.31 for CRD rules).
pub const IP_RANGE_IS_CIDR_RULE: &str = "isCIDR(self)";
/// CEL: `ipRange` names a network, not a host in it (host bits zero).
pub const IP_RANGE_MASKED_RULE: &str = "!isCIDR(self) || cidr(self) == cidr(self).masked()";
/// CEL transition rule making a field immutable.
pub const IMMUTABLE_RULE: &str = "self == oldSelf";
/// CEL transition rule on `refResourceClaimDranet`: `vlanTag` cannot be added or removed.
pub const VLAN_PRESENCE_RULE: &str = "has(self.vlanTag) == has(oldSelf.vlanTag)";
/// CEL rule on the object: the name leaves room for the `-rct` suffix.
pub const NAME_LENGTH_RULE: &str = "self.metadata.name.size() <= 249";

const IP_RANGE_EXAMPLE: &str = "e.g. 192.168.10.0/24 or fd00:10::/64";

/// A network for pipeline edges: which NICs (a DRA DeviceClass) and which addresses (an IP range,
/// optionally a VLAN) the pods on the edge get.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "numaflow.numaproj.io",
    version = "v1alpha1",
    kind = "NumaNetwork",
    plural = "numanetworks",
    singular = "numanetwork",
    shortname = "nnet",
    shortname = "nn",
    category = "weft",
    status = "NumaNetworkStatus",
    derive = "PartialEq",
    label("app.kubernetes.io/part-of", "weft"),
    doc = "NumaNetwork is a second-NIC network that Numaflow pipeline edges run over: a DRA \
           DeviceClass of NICs, an IP range and optionally a VLAN. Cluster-scoped; weft creates a \
           ResourceClaimTemplate named <name>-rct in each namespace whose pipelines use it.",
    validation = Rule::new(NAME_LENGTH_RULE)
        .message("metadata.name must be at most 249 characters, so that the ResourceClaimTemplate name <name>-rct fits in 253"),
    printcolumn(
        name = "DeviceClass",
        type_ = "string",
        json_path = ".spec.refDeviceClass.name",
        description = "DRA DeviceClass of the NICs"
    ),
    printcolumn(name = "IPRange", type_ = "string", json_path = ".spec.refResourceClaimDranet.ipRange"),
    printcolumn(
        name = "VLAN",
        type_ = "integer",
        json_path = ".spec.refResourceClaimDranet.vlanTag",
        description = "802.1Q VLAN ID; empty when untagged"
    ),
    printcolumn(
        name = "Speed",
        type_ = "integer",
        json_path = ".spec.refResourceClaimDranet.ethernetSpeed",
        description = "Ethernet speed of the path in Gb/s, as recorded by the author"
    ),
    printcolumn(
        name = "Addresses",
        type_ = "string",
        json_path = ".status.addresses.usage",
        description = "Addresses allocated / addresses in ipRange"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Status of the Ready condition"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NumaNetworkSpec {
    /// The DRA DeviceClass whose devices are the NICs pods on this network get.
    pub ref_device_class: DeviceClassReference,
    /// Addressing of the second NICs: IP range, optional VLAN, and the path's speed.
    pub ref_resource_claim_dranet: DranetClaimParameters,
}

/// A reference to a cluster-scoped DRA DeviceClass (`resource.k8s.io`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassReference {
    /// Name of the DeviceClass, e.g. `vf.nvidia.dra.net`. A DNS subdomain (lower-case letters,
    /// digits, '-' and '.'; at most 253 characters). Immutable.
    #[schemars(length(min = 1, max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message(
        "refDeviceClass.name is immutable: pods hold NICs of the old class; create a new NumaNetwork instead"
    ))]
    pub name: String,
}

/// What the second NIC's claim asks of the network. These are the seed's dranet parameters; weft
/// does not pass them to dranet verbatim (dranet rejects unknown keys) but uses them to configure
/// addressing and VLAN for the claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(VLAN_PRESENCE_RULE).message(
    "vlanTag cannot be added or removed after creation: pods are attached to the network as it was created"
))]
pub struct DranetClaimParameters {
    /// The IP network second NICs get addresses from, in CIDR notation with the host bits zero,
    /// e.g. `192.168.10.0/24` or `fd00:10::/64`. Immutable.
    #[schemars(length(max = 64), pattern(CIDR_PATTERN))]
    #[x_kube(
        validation = Rule::new(IP_RANGE_IS_CIDR_RULE)
            .message("ipRange must be a CIDR (address/prefix), e.g. 192.168.10.0/24 or fd00:10::/64"),
        validation = Rule::new(IP_RANGE_MASKED_RULE)
            .message("ipRange must be a network address with the host bits zero, e.g. 192.168.10.0/24 rather than 192.168.10.5/24"),
        validation = Rule::new(IMMUTABLE_RULE)
            .message("ipRange is immutable: pods hold addresses from the old range; create a new NumaNetwork instead")
    )]
    pub ip_range: String,
    /// The Ethernet link speed of the physical path in Gb/s (at least 1). Informational: software
    /// cannot measure the cabling, so this records what the author knows. Optional; may change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32", range(min = 1))]
    pub ethernet_speed: Option<i32>,
    /// The 802.1Q VLAN ID (1–4094) the network's traffic is tagged with. Leave it out for an
    /// untagged network. Immutable, and cannot be added or removed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32", range(min = 1, max = 4094))]
    #[x_kube(validation = Rule::new(IMMUTABLE_RULE).message(
        "vlanTag is immutable: pods are attached to the old VLAN; create a new NumaNetwork instead"
    ))]
    pub vlan_tag: Option<i32>,
}

/// What the controller last did with a NumaNetwork.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaNetworkStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Name of the ResourceClaimTemplate pods on this network reference (`<name>-rct`); it exists in
    /// every namespace with a pipeline that uses the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claim_template: Option<String>,
    /// Namespaces where the ResourceClaimTemplate exists (those with a pipeline that uses the
    /// network), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// How much of `ipRange` is handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<AddressUsage>,
    /// Standard conditions; `Ready` is True when the ResourceClaimTemplates are in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Addresses of a NumaNetwork's range held by pods' NICs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressUsage {
    /// Addresses allocated (one `NetworkAddress` object each).
    pub allocated: i64,
    /// Addresses the range can hand out (network and IPv4 broadcast addresses excluded);
    /// saturates at 9223372036854775807 for very large IPv6 ranges.
    pub size: i64,
    /// `allocated/size`, exact, for the printer column (e.g. `3/254`).
    pub usage: String,
}

/// Name of the ResourceClaimTemplate made for the NumaNetwork `network_name`: `<name>-rct`.
pub fn resource_claim_template_name(network_name: &str) -> String {
    format!("{network_name}{RCT_SUFFIX}")
}

impl NumaNetwork {
    /// Checks everything the CRD's schema and CEL creation rules check: the spec
    /// ([`NumaNetworkSpec::validate`]) and the length of `metadata.name` (an object without a name
    /// yet, e.g. one with `generateName`, is not checked for it).
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = Vec::new();
        if let Some(name) = self.metadata.name.as_deref() {
            check_name(name, &mut errors);
        }
        self.spec.collect_errors(&mut errors);
        FieldErrors(errors).into_result()
    }

    /// [`validate`](Self::validate) plus the CRD's transition rules against the stored object.
    pub fn validate_update(&self, old: &NumaNetwork) -> Result<(), FieldErrors> {
        let mut errors = self.validate().err().map(|e| e.0).unwrap_or_default();
        self.spec.collect_update_errors(&old.spec, &mut errors);
        FieldErrors(errors).into_result()
    }

    /// Name of this network's ResourceClaimTemplate, once the object has a name.
    pub fn resource_claim_template_name(&self) -> Option<String> {
        self.metadata.name.as_deref().map(resource_claim_template_name)
    }

    /// The `Ready` condition, if the controller has set one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == READY_CONDITION)
    }
}

impl NumaNetworkSpec {
    /// Checks exactly what the CRD's schema and CEL creation rules check on the spec, returning
    /// every failure with its field path (`spec.refResourceClaimDranet.vlanTag: 4095 is outside
    /// 1–4094`). The controller and the admission webhook use it so they reject what the API
    /// server would.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut errors = Vec::new();
        self.collect_errors(&mut errors);
        FieldErrors(errors).into_result()
    }

    /// The CRD's transition rules: `ipRange`, `vlanTag` (including its presence) and
    /// `refDeviceClass.name` cannot change. Does not re-check `self` (see [`validate`](Self::validate)).
    pub fn validate_update(&self, old: &NumaNetworkSpec) -> Result<(), FieldErrors> {
        let mut errors = Vec::new();
        self.collect_update_errors(old, &mut errors);
        FieldErrors(errors).into_result()
    }

    fn collect_errors(&self, errors: &mut Vec<FieldError>) {
        check_device_class_name(&self.ref_device_class.name, errors);
        let dranet = &self.ref_resource_claim_dranet;
        check_ip_range(&dranet.ip_range, errors);
        if let Some(speed) = dranet.ethernet_speed
            && speed < 1
        {
            errors.push(FieldError::new(
                "spec.refResourceClaimDranet.ethernetSpeed",
                format!("{speed} is not a link speed: it must be at least 1 (Gb/s); leave it out if unknown"),
            ));
        }
        if let Some(vlan) = dranet.vlan_tag
            && !(VLAN_MIN..=VLAN_MAX).contains(&vlan)
        {
            errors.push(FieldError::new(
                "spec.refResourceClaimDranet.vlanTag",
                format!("{vlan} is outside {VLAN_MIN}–{VLAN_MAX}; leave it out for an untagged network"),
            ));
        }
    }

    fn collect_update_errors(&self, old: &NumaNetworkSpec, errors: &mut Vec<FieldError>) {
        let new_class = &self.ref_device_class.name;
        let old_class = &old.ref_device_class.name;
        if new_class != old_class {
            errors.push(FieldError::new(
                "spec.refDeviceClass.name",
                format!(
                    "is immutable (was '{old_class}', now '{new_class}'): pods hold NICs of the old class; \
                     create a new NumaNetwork instead"
                ),
            ));
        }
        let (new, old) = (&self.ref_resource_claim_dranet, &old.ref_resource_claim_dranet);
        if new.ip_range != old.ip_range {
            errors.push(FieldError::new(
                "spec.refResourceClaimDranet.ipRange",
                format!(
                    "is immutable (was '{}', now '{}'): pods hold addresses from the old range; \
                     create a new NumaNetwork instead",
                    old.ip_range, new.ip_range
                ),
            ));
        }
        let vlan = |v: Option<i32>| v.map_or_else(|| "untagged".to_string(), |v| v.to_string());
        if new.vlan_tag != old.vlan_tag {
            let what = if new.vlan_tag.is_some() == old.vlan_tag.is_some() {
                "is immutable"
            } else {
                "cannot be added or removed after creation"
            };
            errors.push(FieldError::new(
                "spec.refResourceClaimDranet.vlanTag",
                format!(
                    "{what} (was {}, now {}): pods are attached to the network as it was created; \
                     create a new NumaNetwork instead",
                    vlan(old.vlan_tag),
                    vlan(new.vlan_tag)
                ),
            ));
        }
    }
}

fn check_name(name: &str, errors: &mut Vec<FieldError>) {
    let len = name.chars().count();
    if len > MAX_NAME_LEN {
        errors.push(FieldError::new(
            "metadata.name",
            format!(
                "is {len} characters; at most {MAX_NAME_LEN}, so that the ResourceClaimTemplate name \
                 <name>{RCT_SUFFIX} fits in {MAX_DNS_SUBDOMAIN_LEN}"
            ),
        ));
    }
}

fn check_device_class_name(name: &str, errors: &mut Vec<FieldError>) {
    const PATH: &str = "spec.refDeviceClass.name";
    let len = name.chars().count();
    if name.is_empty() {
        errors.push(FieldError::new(PATH, "must not be empty: name a DRA DeviceClass, e.g. vf.nvidia.dra.net"));
    } else if len > MAX_DNS_SUBDOMAIN_LEN {
        errors.push(FieldError::new(PATH, format!("is {len} characters; at most {MAX_DNS_SUBDOMAIN_LEN}")));
    } else if !is_dns_subdomain(name) {
        errors.push(FieldError::new(
            PATH,
            format!(
                "'{name}' is not a DNS subdomain: use lower-case letters, digits, '-' and '.', each \
                 dot-separated part starting and ending with a letter or digit, e.g. vf.nvidia.dra.net"
            ),
        ));
    }
}

/// Whether `s` matches [`DNS_SUBDOMAIN_PATTERN`] (length is checked separately).
fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        match (bytes.first(), bytes.last()) {
            (Some(first), Some(last)) => alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-'),
            _ => false,
        }
    })
}

fn check_ip_range(range: &str, errors: &mut Vec<FieldError>) {
    const PATH: &str = "spec.refResourceClaimDranet.ipRange";
    let len = range.chars().count();
    if len > MAX_IP_RANGE_LEN {
        errors.push(FieldError::new(PATH, format!("is {len} characters; a CIDR is at most {MAX_IP_RANGE_LEN}")));
        return;
    }
    match Cidr::parse(range) {
        Err(e) => errors.push(FieldError::new(PATH, format!("'{range}' is not a CIDR: {e}; {IP_RANGE_EXAMPLE}"))),
        Ok(cidr) if !cidr.is_masked() => {
            errors.push(FieldError::new(PATH, format!("'{range}' has host bits set; the network is {}", cidr.masked())))
        }
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests;
