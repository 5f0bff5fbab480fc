//! The ADD result (SPEC.md §5 "ADD Success"), read from any supported version and written in the
//! shape of the version asked for:
//!
//! | version | `interfaces[]` | `ips[]` | `routes[]` |
//! |---|---|---|---|
//! | 0.3.0, 0.3.1, 0.4.0 | name, mac, sandbox | version, address, gateway, interface | dst, gw |
//! | 1.0.0 | name, mac, sandbox | address, gateway, interface | dst, gw |
//! | 1.1.0 | + mtu, socketPath, pciID | address, gateway, interface | + mtu, advmss, priority, table, scope |
//!
//! `dns` is always written (an empty object when there is none), as the reference library does;
//! empty lists are left out.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{CniError, code};
use crate::version::Version;

/// One interface of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name.
    pub name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The network namespace path, for interfaces in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// A socket (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
    /// The PCI device (1.1.0).
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// One address of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR form (`10.56.0.7/24`).
    pub address: String,
    /// The subnet's gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces` (absent in IPAM answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// One route of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination, CIDR.
    pub dst: String,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
    /// Path MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Priority, lower first (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope: 0 global, 253 link, 254 host (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// DNS settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty() && self.domain.is_none() && self.search.is_empty() && self.options.is_empty()
    }
}

/// A result (or an IPAM plugin's abbreviated one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    /// The version it was written in.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// Interfaces.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// DNS.
    #[serde(default)]
    pub dns: Dns,
}

fn decode(what: &str, e: impl std::fmt::Display) -> CniError {
    CniError::new(code::DECODE, format!("{what}: {e}"))
}

/// An address of a result, read (`10.56.0.7/24`).
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>().ok()
}

impl CniResult {
    /// Read a result (`prevResult`, an IPAM answer) of any supported version. Addresses, gateways
    /// and routes must parse, and interface indexes must point into `interfaces`; `what` names
    /// the source in errors.
    pub fn from_value(value: &Value, what: &str) -> Result<CniResult, CniError> {
        let r: CniResult = serde_json::from_value(value.clone()).map_err(|e| decode(what, e))?;
        for (i, ip) in r.ips.iter().enumerate() {
            if parse_cidr(&ip.address).is_none() {
                return Err(decode(what, format!("ips[{i}].address '{}' is not a CIDR address", ip.address)));
            }
            if let Some(gw) = &ip.gateway
                && gw.parse::<IpAddr>().is_err()
            {
                return Err(decode(what, format!("ips[{i}].gateway '{gw}' is not an IP address")));
            }
            if let Some(n) = ip.interface
                && n >= r.interfaces.len()
                && !r.interfaces.is_empty()
            {
                return Err(decode(what, format!("ips[{i}].interface {n} is not an index into interfaces")));
            }
        }
        for (i, route) in r.routes.iter().enumerate() {
            if parse_cidr(&route.dst).is_none() {
                return Err(decode(what, format!("routes[{i}].dst '{}' is not a CIDR", route.dst)));
            }
            if let Some(gw) = &route.gw
                && gw.parse::<IpAddr>().is_err()
            {
                return Err(decode(what, format!("routes[{i}].gw '{gw}' is not an IP address")));
            }
        }
        Ok(r)
    }

    /// The result in the shape of `version` (see the module docs).
    pub fn to_json(&self, version: Version) -> Value {
        let v11 = version >= Version::V1_1_0;
        let mut out = Map::new();
        out.insert("cniVersion".into(), Value::from(version.as_str()));
        if !self.interfaces.is_empty() {
            let list = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut m = Map::new();
                    m.insert("name".into(), Value::from(i.name.clone()));
                    put(&mut m, "mac", i.mac.clone());
                    if v11 {
                        put(&mut m, "mtu", i.mtu);
                    }
                    put(&mut m, "sandbox", i.sandbox.clone());
                    if v11 {
                        put(&mut m, "socketPath", i.socket_path.clone());
                        put(&mut m, "pciID", i.pci_id.clone());
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(list));
        }
        if !self.ips.is_empty() {
            let list = self
                .ips
                .iter()
                .map(|ip| {
                    let mut m = Map::new();
                    if version < Version::V1_0_0 {
                        let family = match parse_cidr(&ip.address) {
                            Some(IpNet::V6(_)) => "6",
                            _ => "4",
                        };
                        m.insert("version".into(), Value::from(family));
                    }
                    m.insert("address".into(), Value::from(ip.address.clone()));
                    put(&mut m, "gateway", ip.gateway.clone());
                    put(&mut m, "interface", ip.interface);
                    Value::Object(m)
                })
                .collect();
            out.insert("ips".into(), Value::Array(list));
        }
        if !self.routes.is_empty() {
            let list = self
                .routes
                .iter()
                .map(|r| {
                    let mut m = Map::new();
                    m.insert("dst".into(), Value::from(r.dst.clone()));
                    put(&mut m, "gw", r.gw.clone());
                    if v11 {
                        put(&mut m, "mtu", r.mtu);
                        put(&mut m, "advmss", r.advmss);
                        put(&mut m, "priority", r.priority);
                        put(&mut m, "table", r.table);
                        put(&mut m, "scope", r.scope);
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("routes".into(), Value::Array(list));
        }
        out.insert("dns".into(), serde_json::to_value(&self.dns).unwrap_or_else(|_| Value::Object(Map::new())));
        Value::Object(out)
    }
}

fn put<T: Into<Value>>(m: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        m.insert(key.into(), v.into());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sample() -> CniResult {
        CniResult {
            cni_version: "1.1.0".into(),
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                mtu: Some(9000),
                sandbox: Some("/run/netns/x".into()),
                socket_path: None,
                pci_id: Some("0000:3b:00.2".into()),
            }],
            ips: vec![
                IpConfig { address: "10.1.0.5/16".into(), gateway: Some("10.1.0.1".into()), interface: Some(0) },
                IpConfig { address: "fd00::5/64".into(), gateway: None, interface: Some(0) },
            ],
            routes: vec![Route {
                dst: "10.2.0.0/16".into(),
                gw: Some("10.1.0.1".into()),
                priority: Some(10),
                ..Route::default()
            }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn each_version_gets_its_own_shape() {
        let r = sample();
        let v11 = r.to_json(Version::V1_1_0);
        assert_eq!(v11["interfaces"][0]["mtu"], 9000);
        assert_eq!(v11["interfaces"][0]["pciID"], "0000:3b:00.2");
        assert_eq!(v11["routes"][0]["priority"], 10);
        assert!(v11["ips"][0].get("version").is_none());
        assert_eq!(v11["dns"], json!({}));
        let v10 = r.to_json(Version::V1_0_0);
        assert!(v10["interfaces"][0].get("mtu").is_none());
        assert!(v10["interfaces"][0].get("pciID").is_none());
        assert!(v10["routes"][0].get("priority").is_none());
        assert_eq!(v10["cniVersion"], "1.0.0");
        let v04 = r.to_json(Version::V0_4_0);
        assert_eq!(v04["ips"][0]["version"], "4");
        assert_eq!(v04["ips"][1]["version"], "6");
        assert_eq!(v04["ips"][0]["interface"], 0);
    }

    #[test]
    fn results_of_every_version_read_back_and_bad_ones_are_named() {
        let r = sample();
        for v in [Version::V0_3_0, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0] {
            let back = CniResult::from_value(&r.to_json(v), "prevResult").unwrap();
            assert_eq!(back.ips.len(), 2);
            assert_eq!(back.interfaces[0].name, "net1");
        }
        let e = CniResult::from_value(&json!({"ips":[{"address":"10.0.0.1"}]}), "IPAM result").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("ips[0].address"), "{e}");
        let e = CniResult::from_value(&json!({"interfaces":"x"}), "prevResult").unwrap_err();
        assert!(e.msg.starts_with("prevResult"), "{e}");
    }
}
