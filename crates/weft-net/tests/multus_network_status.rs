//! weft's network-status against Multus' own Go type: what weft writes is decoded by a strict
//! decoder with the field names of network-attachment-definition-client's
//! `pkg/apis/k8s.cni.cncf.io/v1` `NetworkStatus` (46fcc41), and encoded again the way Go's
//! `encoding/json` encodes that struct (fields in declaration order, `omitempty` leaving out empty
//! strings and lists, 0 and false, nil pointers, but never a struct value such as `dns`). A Go
//! round-trip must leave weft's value unchanged, and an entry Multus wrote for an interface keeps
//! Multus' network name (`<namespace>/<name>` of the NetworkAttachmentDefinition, set by Multus'
//! `pkg/types/conf.go`) with weft's device-info added.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use weft_net::vif::{Vif, VifRecord};

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `v1.DNS`: every field `omitempty`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct GoDns {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nameservers: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    domain: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    search: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    options: Vec<String>,
}

/// `v1.PciDevice`.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct GoPciDevice {
    #[serde(rename = "pci-address", skip_serializing_if = "String::is_empty")]
    pci_address: String,
    #[serde(rename = "vhost-net", skip_serializing_if = "String::is_empty")]
    vhostnet: String,
    #[serde(rename = "rdma-device", skip_serializing_if = "String::is_empty")]
    rdma_device: String,
    #[serde(rename = "pf-pci-address", skip_serializing_if = "String::is_empty")]
    pf_pci_address: String,
    #[serde(rename = "representor-device", skip_serializing_if = "String::is_empty")]
    representor_device: String,
}

/// `v1.DeviceInfo` (the vdpa, vhost-user and memif pointers are nil for a VF; a value naming
/// them fails this decoder, which is what the test wants to notice).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct GoDeviceInfo {
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pci: Option<GoPciDevice>,
}

/// `v1.NetworkStatus`, fields in the Go struct's order.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct GoNetworkStatus {
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    interface: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    mac: String,
    #[serde(skip_serializing_if = "is_zero")]
    mtu: i64,
    #[serde(skip_serializing_if = "is_false")]
    default: bool,
    /// A struct value: Go's `omitempty` never leaves it out.
    dns: GoDns,
    #[serde(rename = "device-info", skip_serializing_if = "Option::is_none")]
    device_info: Option<GoDeviceInfo>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gateway: Vec<String>,
}

/// `json.Unmarshal` into `[]v1.NetworkStatus`, then `json.Marshal` of the result (compact; the
/// values here have no `<`, `>` or `&`, which Go would escape).
fn go_round_trip(text: &str) -> String {
    let decoded: Vec<GoNetworkStatus> =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("Multus' decoder refuses {text}: {e}"));
    serde_json::to_string(&decoded).unwrap()
}

fn vif(network: &str) -> Vif {
    Vif {
        physnet: "physnet2".into(),
        pci_address: "0000:3b:02.0".into(),
        pf_pci_address: Some("0000:3b:00.0".into()),
        mac: Some("02:00:00:aa:bb:cc".into()),
        ips: vec!["10.56.0.7/24".into()],
        gateways: vec!["10.56.0.1".into()],
        vlan: Some(100),
        mtu: Some(9000),
        rdma_device: Some("mlx5_3".into()),
        network: Some(network.into()),
    }
}

fn record(vifs: &[(&str, Vif)]) -> VifRecord {
    VifRecord { vifs: vifs.iter().map(|(i, v)| (i.to_string(), v.clone())).collect() }
}

#[test]
fn weft_entries_survive_a_go_round_trip_byte_for_byte() {
    let unset_mtu = Vif { mtu: Some(0), gateways: vec![], rdma_device: None, ..vif("physnet2") };
    let r = record(&[("net1", vif("physnet2")), ("net2", unset_mtu)]);
    let written = serde_json::to_string(&r.network_status()).unwrap();
    assert_eq!(go_round_trip(&written), written);
    let v: Value = serde_json::from_str(&written).unwrap();
    assert!(v[1].get("mtu").is_none(), "an MTU of 0 is left out as Go's omitempty does: {written}");
    assert_eq!(v[0]["dns"], json!({}), "Go writes the dns struct even when empty: {written}");
}

#[test]
fn merged_annotations_survive_a_go_round_trip() {
    let r = record(&[("net1", vif("physnet2"))]);
    // Without Multus: weft's own entry beside the cluster network's.
    let cluster = r#"[{"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"mac":"0a:58:0a:f4:01:05","default":true,"dns":{}}]"#;
    for existing in [None, Some(cluster)] {
        let merged = r.merge_network_status(existing);
        let back: Value = serde_json::from_str(&go_round_trip(&merged)).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(&merged).unwrap(), "{merged}");
    }
}

#[test]
fn multus_entry_keeps_its_attachment_name_and_gains_weft_device_info() {
    // What Multus writes for `k8s.v1.cni.cncf.io/networks: physnet2` in namespace ml, delegating to
    // weft-cni (conf name physnet2): json.MarshalIndent of each v1.NetworkStatus, joined in `[...]`.
    let multus = r#"[{
    "name": "cbr0",
    "interface": "eth0",
    "ips": [
        "10.244.1.5"
    ],
    "mac": "0a:58:0a:f4:01:05",
    "default": true,
    "dns": {}
},{
    "name": "ml/physnet2",
    "interface": "net1",
    "ips": [
        "10.56.0.7"
    ],
    "mac": "02:00:00:aa:bb:cc",
    "mtu": 9000,
    "dns": {}
}]"#;
    let r = record(&[("net1", vif("physnet2"))]);
    let merged = r.merge_network_status(Some(multus));
    let v: Value = serde_json::from_str(&merged).unwrap();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cbr0", "ml/physnet2"], "{merged}");
    let net1 = &v[1];
    assert_eq!(net1["interface"], "net1");
    assert_eq!(net1["device-info"]["type"], "pci");
    assert_eq!(net1["device-info"]["version"], "1.1.0");
    assert_eq!(net1["device-info"]["pci"]["pci-address"], "0000:3b:02.0");
    assert_eq!(net1["device-info"]["pci"]["rdma-device"], "mlx5_3");
    assert_eq!(net1["ips"], json!(["10.56.0.7"]));
    let back: Value = serde_json::from_str(&go_round_trip(&merged)).unwrap();
    assert_eq!(back, v, "{merged}");
    // Merging again changes nothing.
    let again: Value = serde_json::from_str(&r.merge_network_status(Some(&merged))).unwrap();
    assert_eq!(again, v);
}
