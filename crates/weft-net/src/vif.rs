//! The multi-VIF record the seed asks for: a map from the interface name in the pod to the VIF it
//! is (physnet, PCI address, MAC, IPs, VLAN), kept on the pod as `weft.io/vifs`, and the same facts
//! in Multus' `k8s.v1.cni.cncf.io/network-status` shape, which existing tools and weft's resource
//! manager (NIC-aligned CPUs) read.
//!
//! Seed 002 wanted a dict keyed by interface name rather than a list "for finer control over
//! interface naming"; Kuryr stored it as `openstack.org/kuryr-vif`. weft keeps the dict (a JSON
//! object ordered by name) and writes network-status beside it, with the field names and
//! omissions of network-attachment-definition-client's Go types (`NetworkStatus`, `DeviceInfo`,
//! `PciDevice`, device-info version `1.1.0`), checked against that source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The pod annotation holding the [`VifRecord`].
pub const VIFS_ANNOTATION: &str = "weft.io/vifs";
/// Multus' status annotation.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The device-info spec version Multus and sriov-network-device-plugin write.
pub const DEVICE_INFO_VERSION: &str = "1.1.0";

/// One secondary interface of a pod: an SR-IOV VF on a physnet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Vif {
    /// The physnet the VF belongs to.
    pub physnet: String,
    /// The VF's PCI address.
    pub pci_address: String,
    /// Its PF's PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf_pci_address: Option<String>,
    /// The MAC in the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Addresses in CIDR form (`10.56.0.7/24`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Gateways of those addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// The VLAN the PF tags the VF's traffic with (none: untagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// MTU in the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The VF's RDMA device, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// The CNI network's name (weft-cni's configuration `name`): the name of weft's own
    /// network-status entry. An entry Multus wrote for the interface keeps Multus' name
    /// (`<namespace>/<name>` of the NetworkAttachmentDefinition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// A pod's VIFs by interface name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VifRecord {
    /// Interface name in the pod → VIF.
    pub vifs: BTreeMap<String, Vif>,
}

/// One entry of Multus' network-status list: network-attachment-definition-client's Go
/// `NetworkStatus`, fields in its declaration order (Go's `encoding/json` writes them in that
/// order) with its omissions: `omitempty` leaves out an empty string or list, an `mtu` of 0 and a
/// `default` of false, but never the `dns` struct, which Go writes as `{}` when empty. So Multus'
/// decoder reads weft's entry and writes it back unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// The network's name: `<namespace>/<name>` of the NetworkAttachmentDefinition when Multus
    /// made the attachment, else the CNI network's name.
    pub name: String,
    /// Interface name in the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Plain IPs, without prefix length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU; 0 (unknown) is left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: u32,
    /// Whether this is the cluster's default network (never for a VF). Left out when false, as
    /// the upstream Go type's `omitempty` does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// DNS settings of the attachment (always written, as Go writes a struct value).
    #[serde(default)]
    pub dns: Dns,
    /// The device behind the interface.
    #[serde(rename = "device-info", default, skip_serializing_if = "Option::is_none")]
    pub device_info: Option<DeviceInfo>,
    /// Gateways.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// network-status `dns` (the Go `DNS` type, every field `omitempty`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// network-status `device-info` (the device-info spec).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `pci` for a VF.
    #[serde(rename = "type")]
    pub kind: String,
    /// [`DEVICE_INFO_VERSION`].
    pub version: String,
    /// PCI facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciDeviceInfo>,
}

/// device-info `pci`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDeviceInfo {
    /// The VF's PCI address (left out when empty, as Go's `omitempty` does).
    #[serde(rename = "pci-address", default, skip_serializing_if = "String::is_empty")]
    pub pci_address: String,
    /// Its RDMA device.
    #[serde(rename = "rdma-device", default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Its PF's PCI address.
    #[serde(rename = "pf-pci-address", default, skip_serializing_if = "Option::is_none")]
    pub pf_pci_address: Option<String>,
}

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VifError {
    /// The annotation is not a record.
    #[error("annotation {annotation}: {message}")]
    Invalid {
        /// Which annotation.
        annotation: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl VifRecord {
    /// Read the `weft.io/vifs` annotation's value.
    pub fn parse(text: &str) -> Result<VifRecord, VifError> {
        serde_json::from_str(text)
            .map_err(|e| VifError::Invalid { annotation: VIFS_ANNOTATION, message: e.to_string() })
    }

    /// The annotation's value (keys in name order, so equal records are equal strings).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// The record as network-status entries, in interface-name order.
    pub fn network_status(&self) -> Vec<NetworkStatus> {
        self.vifs
            .iter()
            .map(|(ifname, v)| NetworkStatus {
                name: v.network.clone().unwrap_or_else(|| v.physnet.clone()),
                interface: Some(ifname.clone()),
                ips: v.ips.iter().map(|ip| ip.split('/').next().unwrap_or(ip).to_string()).collect(),
                mac: v.mac.clone(),
                mtu: v.mtu.unwrap_or(0),
                default: false,
                dns: Dns::default(),
                device_info: Some(v.device_info()),
                gateway: v.gateways.clone(),
            })
            .collect()
    }

    /// `network_status` merged into an existing network-status value. An entry already there for
    /// one of this record's interfaces is kept where it is, with its name, and gets the VIF's
    /// `device-info`: Multus writes the entry of each attachment it made, named after the
    /// NetworkAttachmentDefinition (`<namespace>/<name>`, not the CNI network's name), and its
    /// decoder and other tools find the attachment by that name. Only an entry weft wrote itself
    /// (named after the VIF's network) is replaced whole. Interfaces without an entry get weft's,
    /// after the others; every other entry (the cluster network, other plugins') is kept. An
    /// unreadable existing value is replaced.
    pub fn merge_network_status(&self, existing: Option<&str>) -> String {
        let mut entries: Vec<serde_json::Value> =
            existing.and_then(|t| serde_json::from_str(t).ok()).unwrap_or_default();
        let mut own: BTreeMap<String, NetworkStatus> =
            self.network_status().into_iter().filter_map(|s| Some((s.interface.clone()?, s))).collect();
        for entry in &mut entries {
            let Some(ifname) = entry.get("interface").and_then(serde_json::Value::as_str) else { continue };
            let Some(mine) = own.remove(ifname) else { continue };
            let same_name = entry.get("name").and_then(serde_json::Value::as_str) == Some(mine.name.as_str());
            match (same_name, entry.as_object_mut()) {
                (false, Some(fields)) => {
                    let info = serde_json::to_value(&mine.device_info).unwrap_or_default();
                    fields.insert("device-info".to_string(), info);
                }
                _ => *entry = serde_json::to_value(mine).unwrap_or_default(),
            }
        }
        entries.extend(own.into_values().filter_map(|s| serde_json::to_value(s).ok()));
        serde_json::to_string(&entries).unwrap_or_else(|_| "[]".to_string())
    }
}

impl Vif {
    /// The VIF as network-status `device-info` (type `pci`, version [`DEVICE_INFO_VERSION`]).
    pub fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            kind: "pci".to_string(),
            version: DEVICE_INFO_VERSION.to_string(),
            pci: Some(PciDeviceInfo {
                pci_address: self.pci_address.clone(),
                rdma_device: self.rdma_device.clone(),
                pf_pci_address: self.pf_pci_address.clone(),
            }),
        }
    }
}

/// Why `name` cannot be an interface name, if it cannot (≤ 15 bytes, not `.`/`..`, no `/`, `:` or
/// whitespace).
pub fn interface_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 characters")
    } else if name == "." || name == ".." {
        Some("is . or ..")
    } else if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        Some("contains /, : or whitespace")
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;

    fn vif() -> Vif {
        Vif {
            physnet: "physnet2".into(),
            pci_address: "0000:3b:00.3".into(),
            pf_pci_address: Some("0000:3b:00.0".into()),
            mac: Some("02:00:00:aa:bb:cc".into()),
            ips: vec!["10.56.0.7/24".into()],
            gateways: vec!["10.56.0.1".into()],
            vlan: Some(100),
            mtu: Some(9000),
            rdma_device: Some("mlx5_3".into()),
            network: Some("default/physnet2".into()),
        }
    }

    #[test]
    fn record_is_a_dict_by_interface_name_and_round_trips() {
        let mut r = VifRecord::default();
        r.vifs.insert("net2".into(), Vif { pci_address: "0000:3b:00.4".into(), ..vif() });
        r.vifs.insert("net1".into(), vif());
        let text = r.to_annotation();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["net1"]["pciAddress"], "0000:3b:00.3");
        assert_eq!(v["net1"]["vlan"], 100);
        assert!(text.find("net1").unwrap() < text.find("net2").unwrap());
        assert_eq!(VifRecord::parse(&text).unwrap(), r);
        let err = VifRecord::parse("[1]").unwrap_err().to_string();
        assert!(err.starts_with("annotation weft.io/vifs:"), "{err}");
    }

    #[test]
    fn network_status_has_multus_field_names_and_plain_ips() {
        let mut r = VifRecord::default();
        r.vifs.insert("net1".into(), vif());
        let v = serde_json::to_value(r.network_status()).unwrap();
        let e = &v[0];
        assert_eq!(e["name"], "default/physnet2");
        assert_eq!(e["interface"], "net1");
        assert_eq!(e["ips"], serde_json::json!(["10.56.0.7"]));
        // network-attachment-definition-client's NetworkStatus: `json:"default,omitempty"`.
        assert!(e.get("default").is_none(), "{e}");
        assert_eq!(e["device-info"]["type"], "pci");
        assert_eq!(e["device-info"]["version"], "1.1.0");
        assert_eq!(e["device-info"]["pci"]["pci-address"], "0000:3b:00.3");
        assert_eq!(e["device-info"]["pci"]["rdma-device"], "mlx5_3");
        assert_eq!(e["device-info"]["pci"]["pf-pci-address"], "0000:3b:00.0");
    }

    #[test]
    fn merge_keeps_other_entries_and_replaces_the_entries_weft_wrote() {
        let mut r = VifRecord::default();
        r.vifs.insert("net1".into(), vif());
        // weft's own entry of an earlier pass (same network name), now stale.
        let existing = r#"[{"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"default":true},
                           {"name":"default/physnet2","interface":"net1","ips":["192.0.2.1"]}]"#;
        let merged: serde_json::Value = serde_json::from_str(&r.merge_network_status(Some(existing))).unwrap();
        let names: Vec<&str> = merged.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["cbr0", "default/physnet2"]);
        assert_eq!(merged[1]["ips"], serde_json::json!(["10.56.0.7"]));
        assert_eq!(merged[1]["mtu"], 9000);
        let fresh: serde_json::Value = serde_json::from_str(&r.merge_network_status(Some("not json"))).unwrap();
        assert_eq!(fresh.as_array().unwrap().len(), 1);
    }
}
