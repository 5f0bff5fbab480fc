//! The opaque configuration of a NIC claim for weft's NIC DRA driver ([`DRIVER`]).
//!
//! The NumaNetwork controller writes it into the `<name>-rct` ResourceClaimTemplate
//! (`spec.spec.devices.config[].opaque{driver, parameters}`); the driver reads it back from the
//! claim's allocation at NodePrepareResources. Unknown fields are refused, so a typo fails the
//! prepare with a message naming the field instead of being ignored.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// weft's NIC DRA driver name (the ResourceSlice `driver`, the opaque config's `driver`, and the
/// attribute prefix).
pub const DRIVER: &str = "nic.weft.io";
/// `apiVersion` of [`NicConfig`].
pub const API_VERSION: &str = "nic.weft.io/v1alpha1";
/// `kind` of [`NicConfig`].
pub const KIND: &str = "NicConfig";
/// The request name in claims weft generates.
pub const REQUEST_NAME: &str = "nic";

/// The device name weft's NIC driver publishes for the VF at `pci_address` in its ResourceSlices
/// (and the scheduler writes into a claim's allocation): `vf-` and the address in lower case with
/// `:` and `.` as `-` (`0000:3b:02.1` → `vf-0000-3b-02-1`), a DNS label.
pub fn device_name(pci_address: &str) -> String {
    let body: String =
        pci_address.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    format!("vf-{}", body.trim_matches('-'))
}

/// What a pod's NIC on a NumaNetwork gets: an address from the network's range, the VLAN, and
/// optionally a fixed interface name and MTU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NicConfig {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The NumaNetwork's name (addresses are accounted per network).
    pub network: String,
    /// The network's range; the address comes from it (network and IPv4 broadcast addresses
    /// excluded).
    pub ip_range: IpNet,
    /// 802.1Q VLAN ID set on the VF through its PF; absent for an untagged network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The interface name in the pod; absent: the first free `netN` (N ≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// MTU to set; absent: the VF's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl NicConfig {
    /// The configuration for a network with `ip_range` and optional `vlan`.
    pub fn new(network: impl Into<String>, ip_range: IpNet, vlan: Option<u16>) -> NicConfig {
        NicConfig {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            network: network.into(),
            ip_range,
            vlan,
            interface_name: None,
            mtu: None,
        }
    }

    /// Parses the opaque `parameters` and checks `apiVersion`, `kind`, the VLAN range, the
    /// interface name and the MTU, with messages naming the field.
    pub fn parse(parameters: &serde_json::Value) -> Result<NicConfig, String> {
        let c: NicConfig =
            serde_json::from_value(parameters.clone()).map_err(|e| format!("opaque parameters for {DRIVER}: {e}"))?;
        if c.api_version != API_VERSION || c.kind != KIND {
            return Err(format!(
                "opaque parameters for {DRIVER}: apiVersion/kind is {}/{}, expected {API_VERSION}/{KIND}",
                c.api_version, c.kind
            ));
        }
        if let Some(v) = c.vlan
            && !(1..=4094).contains(&v)
        {
            return Err(format!("opaque parameters for {DRIVER}: vlan {v} is outside 1–4094"));
        }
        if let Some(name) = &c.interface_name
            && let Some(problem) = crate::vif::interface_name_problem(name)
        {
            return Err(format!(
                "opaque parameters for {DRIVER}: interfaceName '{name}' is not a Linux interface name: it {problem}"
            ));
        }
        if let Some(mtu) = c.mtu
            && mtu < 68
        {
            return Err(format!("opaque parameters for {DRIVER}: mtu {mtu} is below the IPv4 minimum of 68"));
        }
        Ok(c)
    }
}

/// How many addresses of `range` can be handed out: all of them but the network address, and for
/// IPv4 the broadcast address too; /31 and /32 (IPv4, RFC 3021) and /127 and /128 (IPv6) have no
/// such addresses to spare, so all are usable.
pub fn usable_addresses(range: &IpNet) -> u128 {
    let (bits, prefix, reserved) = match range {
        IpNet::V4(n) => (32u32, u32::from(n.prefix_len()), 2u128),
        IpNet::V6(n) => (128u32, u32::from(n.prefix_len()), 1u128),
    };
    let host_bits = bits - prefix;
    if host_bits <= 1 {
        return 1u128 << host_bits;
    }
    if host_bits == 128 {
        return u128::MAX; // 2^128 - 1: every address but the network address
    }
    (1u128 << host_bits) - reserved
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_with_camel_case_names() {
        let c = NicConfig::new("net-a", "192.168.10.0/24".parse().unwrap(), Some(10));
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": "net-a",
                   "ipRange": "192.168.10.0/24", "vlan": 10})
        );
        assert_eq!(NicConfig::parse(&v).unwrap(), c);
    }

    #[test]
    fn usable_addresses_leave_out_network_and_broadcast() {
        let n = |s: &str| usable_addresses(&s.parse().unwrap());
        assert_eq!(n("192.168.10.0/24"), 254);
        assert_eq!(n("10.0.0.0/30"), 2);
        assert_eq!(n("10.0.0.0/31"), 2);
        assert_eq!(n("10.0.0.1/32"), 1);
        assert_eq!(n("0.0.0.0/0"), (1u128 << 32) - 2);
        assert_eq!(n("fd00::/64"), (1u128 << 64) - 1);
        assert_eq!(n("fd00::/127"), 2);
        assert_eq!(n("::/0"), u128::MAX);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let base = json!({"apiVersion": "nic.weft.io/v1alpha1", "kind": "NicConfig", "network": "n", "ipRange": "10.0.0.0/24"});
        let with = |k: &str, v: serde_json::Value| {
            let mut b = base.clone();
            b[k] = v;
            NicConfig::parse(&b).unwrap_err()
        };
        assert!(with("vlanTag", json!(10)).contains("vlanTag"));
        assert!(with("vlan", json!(4095)).contains("vlan 4095"));
        assert!(with("interfaceName", json!("a/b")).contains("interfaceName"));
        assert!(with("mtu", json!(10)).contains("mtu 10"));
        assert!(with("kind", json!("Other")).contains("expected nic.weft.io/v1alpha1/NicConfig"));
        assert!(with("ipRange", json!("not-a-cidr")).contains("opaque parameters"));
    }
}
