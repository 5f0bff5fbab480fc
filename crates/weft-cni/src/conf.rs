//! The network configuration weft-cni reads from stdin (its NetConf), validated field by field so
//! every error names the field. Unknown top-level keys are allowed (the spec: plugins may define
//! fields; runtimes pass unknown ones through).
//!
//! ```json
//! {
//!   "cniVersion": "1.1.0", "name": "physnet2-net", "type": "weft-cni",
//!   "physnet": "physnet2",
//!   "deviceID": "0000:3b:00.2",
//!   "vlan": 100, "vlanQoS": 0, "vlanProto": "802.1q",
//!   "mac": "02:00:00:aa:bb:cc", "mtu": 9000,
//!   "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.56.0.0/24" }]] },
//!   "physnetConfig": "/etc/weft/physnets.yaml",
//!   "sysfsRoot": "/", "cacheDir": "/var/lib/cni/weft",
//!   "podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock",
//!   "interfaceNames": { "0000:3b:00.2": "fast0" },
//!   "lockTimeoutMs": 10000
//! }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use weft_net::config::{Physnet, PhysnetConfig};
use weft_topology::discover::normalize_pci_bus_id;

use crate::env::{Command, interface_name_problem, valid_name};
use crate::error::{CniError, code};
use crate::pf::{Mac, VlanProto};
use crate::result::{CniResult, Dns};
use crate::version::Version;

/// Where weft-cni keeps its state unless `cacheDir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni/weft";
/// How long an ADD or DEL waits for a VF's lock unless `lockTimeoutMs` says otherwise.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 10_000;
/// The IPAM type that makes weft-cni hand out addresses from the physnet's range itself.
pub const WEFT_IPAM: &str = "weft";

/// How addresses are found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ipam {
    /// No IPAM: the VF gets no address.
    None,
    /// A delegated IPAM plugin: the executable `ipam.type` in `CNI_PATH`.
    Delegated(String),
    /// weft's own: the physnet's subnet from the physnet configuration file.
    Weft,
}

/// VLAN settings applied to the VF through its PF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VlanSetting {
    /// VLAN id, 0 (untagged) to 4094.
    pub vlan: u16,
    /// 802.1p priority, 0–7.
    pub qos: u8,
    /// Tag protocol.
    pub proto: VlanProto,
}

/// One `cni.dev/valid-attachments` entry (GC).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValidAttachment {
    /// `CNI_CONTAINERID` of the attachment.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME` of the attachment.
    pub ifname: String,
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct NetConf {
    /// `cniVersion`.
    pub version: Version,
    /// `name`.
    pub name: String,
    /// `type`.
    pub plugin_type: String,
    /// `physnet`.
    pub physnet: Option<String>,
    /// The physnet's entry in the physnet configuration, when one was named.
    pub physnet_entry: Option<Physnet>,
    /// The VF: `runtimeConfig.deviceID`, else `deviceID`, as a full PCI address.
    pub device_id: Option<String>,
    /// VLAN to set through the PF: `vlan`/`vlanQoS`/`vlanProto`, else the physnet's VLAN.
    pub vlan: Option<VlanSetting>,
    /// MAC: `runtimeConfig.mac`, else `MAC` in CNI_ARGS, else `mac`.
    pub mac: Option<Mac>,
    /// MTU: `mtu`, else the physnet's.
    pub mtu: Option<u32>,
    /// IPAM.
    pub ipam: Ipam,
    /// `sysfsRoot`.
    pub sysfs_root: PathBuf,
    /// `cacheDir`.
    pub cache_dir: PathBuf,
    /// `podResourcesSocket`.
    pub pod_resources_socket: PathBuf,
    /// `interfaceNames`: VF PCI address → interface name in chained mode.
    pub interface_names: BTreeMap<String, String>,
    /// `lockTimeoutMs`.
    pub lock_timeout_ms: u64,
    /// `prevResult`.
    pub prev_result: Option<CniResult>,
    /// `dns`: when set, it replaces the IPAM answer's DNS in the result.
    pub dns: Option<Dns>,
    /// `cni.dev/valid-attachments` (GC).
    pub valid_attachments: Vec<ValidAttachment>,
}

/// The `cniVersion` text of a configuration, when it has one (for error results).
pub fn peek_version(stdin: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(stdin).ok()?.get("cniVersion")?.as_str().map(str::to_string)
}

fn field<T: DeserializeOwned>(obj: &Map<String, Value>, key: &str) -> Result<Option<T>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| CniError::config(key, e)),
    }
}

fn nested<T: DeserializeOwned>(obj: &Map<String, Value>, outer: &str, key: &str) -> Result<Option<T>, CniError> {
    match obj.get(outer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(inner)) => match inner.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                serde_json::from_value(v.clone()).map(Some).map_err(|e| CniError::config(&format!("{outer}.{key}"), e))
            }
        },
        Some(_) => Err(CniError::config(outer, "must be an object")),
    }
}

fn pci(field_name: &str, text: &str) -> Result<String, CniError> {
    normalize_pci_bus_id(text)
        .ok_or_else(|| CniError::config(field_name, format!("'{text}' is not a PCI address (like 0000:3b:00.2)")))
}

impl NetConf {
    /// Read the configuration of a `command` invocation; `args_mac` is `MAC` from CNI_ARGS.
    pub fn parse(stdin: &[u8], command: Command, args_mac: Option<&str>) -> Result<NetConf, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(code::DECODE, format!("error decoding network configuration from stdin: {e}"))
        })?;
        let Value::Object(obj) = value else {
            return Err(CniError::new(code::DECODE, "the network configuration on stdin is not a JSON object"));
        };
        let name: String = field(&obj, "name")?.ok_or_else(|| CniError::config("name", "missing network name"))?;
        if !valid_name(&name) {
            return Err(CniError::config(
                "name",
                format!("'{name}' has invalid characters (use [a-zA-Z0-9][a-zA-Z0-9_.-]*)"),
            ));
        }
        let version_text: Option<String> = field(&obj, "cniVersion")?;
        let version = Version::of_config(version_text.as_deref())?;
        let least = match command {
            Command::Check => Some(Version::V0_4_0),
            Command::Gc | Command::Status => Some(Version::V1_1_0),
            _ => None,
        };
        if let Some(least) = least
            && version < least
        {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("config version {version} does not allow {} (needs {least} or later)", command.as_str()),
            ));
        }
        let plugin_type: String = field(&obj, "type")?.ok_or_else(|| CniError::config("type", "missing"))?;
        if plugin_type.is_empty() || plugin_type.contains('/') {
            return Err(CniError::config("type", format!("'{plugin_type}' is not a plugin executable name")));
        }

        let physnet: Option<String> = field(&obj, "physnet")?;
        if let Some(p) = &physnet
            && (p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(CniError::config("physnet", format!("'{p}' is not a physnet name")));
        }
        let physnet_config: Option<PathBuf> = field(&obj, "physnetConfig")?;
        let physnet_entry = match (&physnet_config, &physnet) {
            (Some(path), Some(p)) => {
                let cfg = PhysnetConfig::from_file(path).map_err(|e| CniError::config("physnetConfig", e))?;
                let entry = cfg.physnet(p).cloned().ok_or_else(|| {
                    CniError::config("physnet", format!("'{p}' is not in the physnet configuration {}", path.display()))
                })?;
                Some(entry)
            }
            (Some(_), None) => return Err(CniError::config("physnetConfig", "needs physnet to name an entry")),
            (None, _) => None,
        };

        let device_id = match nested::<String>(&obj, "runtimeConfig", "deviceID")? {
            Some(d) => Some(pci("runtimeConfig.deviceID", &d)?),
            None => field::<String>(&obj, "deviceID")?.map(|d| pci("deviceID", &d)).transpose()?,
        };

        let vlan = Self::vlan(&obj, physnet_entry.as_ref())?;

        let mac_text = match nested::<String>(&obj, "runtimeConfig", "mac")? {
            Some(m) => Some(("runtimeConfig.mac", m)),
            None => match args_mac {
                Some(m) => Some(("CNI_ARGS MAC", m.to_string())),
                None => field::<String>(&obj, "mac")?.map(|m| ("mac", m)),
            },
        };
        let mac = mac_text
            .map(|(f, m)| Mac::parse(&m).ok_or_else(|| CniError::config(f, format!("'{m}' is not a MAC address"))))
            .transpose()?;

        let mtu = match field::<u32>(&obj, "mtu")? {
            Some(m) if !(68..=65_535).contains(&m) => {
                return Err(CniError::config("mtu", format!("{m} is not an MTU (68-65535)")));
            }
            Some(m) => Some(m),
            None => physnet_entry.as_ref().and_then(|p| p.mtu),
        };

        let ipam = match obj.get("ipam") {
            None | Some(Value::Null) => Ipam::None,
            Some(Value::Object(i)) => match i.get("type") {
                None | Some(Value::Null) => Ipam::None,
                Some(Value::String(t)) if t.is_empty() => Ipam::None,
                Some(Value::String(t)) if t == WEFT_IPAM => Ipam::Weft,
                Some(Value::String(t)) if !t.contains('/') => Ipam::Delegated(t.clone()),
                Some(t) => return Err(CniError::config("ipam.type", format!("{t} is not a plugin executable name"))),
            },
            Some(_) => return Err(CniError::config("ipam", "must be an object")),
        };
        if ipam == Ipam::Weft && physnet_entry.as_ref().and_then(|p| p.subnet.as_ref()).is_none() {
            return Err(CniError::config(
                "ipam",
                "type 'weft' hands out the physnet's subnet: set physnet and physnetConfig, and give that physnet a subnet",
            ));
        }

        let interface_names = match field::<BTreeMap<String, String>>(&obj, "interfaceNames")? {
            None => BTreeMap::new(),
            Some(m) => {
                let mut out = BTreeMap::new();
                for (k, v) in m {
                    let at = format!("interfaceNames.{k}");
                    if let Some(problem) = interface_name_problem(&v) {
                        return Err(CniError::config(&at, format!("interface name '{v}' {problem}")));
                    }
                    out.insert(pci(&at, &k)?, v);
                }
                out
            }
        };

        let lock_timeout_ms = match field::<u64>(&obj, "lockTimeoutMs")? {
            Some(0) => return Err(CniError::config("lockTimeoutMs", "must be at least 1")),
            Some(ms) => ms,
            None => DEFAULT_LOCK_TIMEOUT_MS,
        };

        let prev_result = match obj.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => Some(CniResult::from_value(v, "prevResult")?),
        };
        let dns: Option<Dns> = field::<Dns>(&obj, "dns")?.filter(|d| !d.is_empty());
        let valid_attachments: Vec<ValidAttachment> = field(&obj, "cni.dev/valid-attachments")?.unwrap_or_default();

        Ok(NetConf {
            version,
            name,
            plugin_type,
            physnet,
            physnet_entry,
            device_id,
            vlan,
            mac,
            mtu,
            ipam,
            sysfs_root: field(&obj, "sysfsRoot")?.unwrap_or_else(|| PathBuf::from("/")),
            cache_dir: field(&obj, "cacheDir")?.unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE_DIR)),
            pod_resources_socket: field(&obj, "podResourcesSocket")?
                .unwrap_or_else(|| PathBuf::from(weft_deviceplugin::podresources::DEFAULT_SOCKET)),
            interface_names,
            lock_timeout_ms,
            prev_result,
            dns,
            valid_attachments,
        })
    }

    /// `vlan`, `vlanQoS`, `vlanProto` as sriov-cni checks them; without `vlan`, the physnet's VLAN.
    fn vlan(obj: &Map<String, Value>, physnet: Option<&Physnet>) -> Result<Option<VlanSetting>, CniError> {
        let vlan: Option<i64> = field(obj, "vlan")?;
        let qos: Option<i64> = field(obj, "vlanQoS")?;
        let proto: Option<String> = field(obj, "vlanProto")?;
        let Some(vlan) = vlan else {
            if qos.is_some() {
                return Err(CniError::config("vlanQoS", "needs vlan to be set"));
            }
            if proto.is_some() {
                return Err(CniError::config("vlanProto", "needs vlan to be set"));
            }
            return Ok(physnet.and_then(|p| p.vlan).map(|v| VlanSetting { vlan: v, qos: 0, proto: VlanProto::Dot1Q }));
        };
        let vlan = u16::try_from(vlan)
            .ok()
            .filter(|v| *v <= 4094)
            .ok_or_else(|| CniError::config("vlan", format!("{vlan} is not a VLAN id (0-4094, 0 = untagged)")))?;
        let qos = match qos {
            None => 0,
            Some(q) => u8::try_from(q)
                .ok()
                .filter(|q| *q <= 7)
                .ok_or_else(|| CniError::config("vlanQoS", format!("{q} is not a priority (0-7)")))?,
        };
        if qos != 0 && vlan == 0 {
            return Err(CniError::config("vlanQoS", "a non-zero QoS needs a non-zero vlan"));
        }
        let proto = match proto.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("802.1q") => VlanProto::Dot1Q,
            Some("802.1ad") => VlanProto::Dot1Ad,
            Some(_) => {
                return Err(CniError::config(
                    "vlanProto",
                    format!("'{}' is not 802.1q or 802.1ad", proto.unwrap_or_default()),
                ));
            }
        };
        if proto == VlanProto::Dot1Ad && vlan == 0 {
            return Err(CniError::config("vlanProto", "802.1ad needs a non-zero vlan"));
        }
        Ok(Some(VlanSetting { vlan, qos, proto }))
    }

    /// Whether ADD changes anything on the PF side (VLAN or the administrative MAC).
    pub fn touches_pf(&self) -> bool {
        self.vlan.is_some() || self.mac.is_some()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NetConf, CniError> {
        NetConf::parse(text.as_bytes(), Command::Add, None)
    }

    const BASE: &str = r#""cniVersion":"1.1.0","name":"n1","type":"weft-cni""#;

    #[test]
    fn a_minimal_config_gets_the_defaults_and_unknown_keys_pass() {
        let c = parse(&format!("{{{BASE},\"deviceID\":\"3b:00.2\",\"somethingElse\":[1]}}")).unwrap();
        assert_eq!(c.device_id.as_deref(), Some("0000:3b:00.2"));
        assert_eq!(c.cache_dir, PathBuf::from(DEFAULT_CACHE_DIR));
        assert_eq!(c.sysfs_root, PathBuf::from("/"));
        assert_eq!(c.ipam, Ipam::None);
        assert_eq!(c.vlan, None);
        assert!(!c.touches_pf());
    }

    #[test]
    fn bad_values_name_their_field_with_code_7() {
        for (extra, field) in [
            (r#""vlan":5000"#, "vlan"),
            (r#""vlan":"x""#, "vlan"),
            (r#""vlanQoS":3"#, "vlanQoS"),
            (r#""vlan":0,"vlanQoS":3"#, "vlanQoS"),
            (r#""vlan":10,"vlanQoS":8"#, "vlanQoS"),
            (r#""vlan":0,"vlanProto":"802.1ad""#, "vlanProto"),
            (r#""vlan":10,"vlanProto":"qinq""#, "vlanProto"),
            (r#""vlanProto":"802.1q""#, "vlanProto"),
            (r#""mac":"zz""#, "mac"),
            (r#""mtu":20"#, "mtu"),
            (r#""deviceID":"eth0""#, "deviceID"),
            (r#""runtimeConfig":{"deviceID":"x"}"#, "runtimeConfig.deviceID"),
            (r#""ipam":{"type":"../x"}"#, "ipam.type"),
            (r#""ipam":{"type":"weft"}"#, "ipam"),
            (r#""interfaceNames":{"0000:3b:00.2":"bad name"}"#, "interfaceNames.0000:3b:00.2"),
            (r#""lockTimeoutMs":0"#, "lockTimeoutMs"),
            (r#""physnetConfig":"/nonexistent.yaml","physnet":"p""#, "physnetConfig"),
        ] {
            let e = parse(&format!("{{{BASE},{extra}}}")).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{extra}: {e}");
            assert!(e.msg.contains(&format!(": {field}: ")), "{extra}: {e}");
        }
        let e = parse(r#"{"cniVersion":"1.1.0","type":"weft-cni"}"#).unwrap_err();
        assert!(e.msg.contains("name"), "{e}");
        let e = parse("not json").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        let e = parse(r#"{"cniVersion":"9.9.9","name":"n","type":"t"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn vlan_mac_and_version_rules() {
        let c = parse(&format!("{{{BASE},\"vlan\":100,\"vlanQoS\":3,\"vlanProto\":\"802.1AD\"}}")).unwrap();
        assert_eq!(c.vlan, Some(VlanSetting { vlan: 100, qos: 3, proto: VlanProto::Dot1Ad }));
        // runtimeConfig.mac wins over CNI_ARGS MAC, which wins over mac.
        let text =
            format!("{{{BASE},\"mac\":\"02:00:00:00:00:01\",\"runtimeConfig\":{{\"mac\":\"02:00:00:00:00:03\"}}}}");
        let c = NetConf::parse(text.as_bytes(), Command::Add, Some("02:00:00:00:00:02")).unwrap();
        assert_eq!(c.mac.unwrap().to_string(), "02:00:00:00:00:03");
        let c = NetConf::parse(
            format!("{{{BASE},\"mac\":\"02:00:00:00:00:01\"}}").as_bytes(),
            Command::Add,
            Some("02:00:00:00:00:02"),
        )
        .unwrap();
        assert_eq!(c.mac.unwrap().to_string(), "02:00:00:00:00:02");
        let old = r#"{"cniVersion":"0.3.1","name":"n","type":"t"}"#;
        let e = NetConf::parse(old.as_bytes(), Command::Check, None).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        let e = NetConf::parse(old.replace("0.3.1", "1.0.0").as_bytes(), Command::Gc, None).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn the_physnet_supplies_vlan_mtu_and_the_weft_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("physnets.yaml");
        std::fs::write(&path, "physnets:\n  - name: physnet2\n    devices: [wcpf0]\n    subnet: 10.56.0.0/24\n    vlan: 100\n    mtu: 9000\n").unwrap();
        let text = format!(
            "{{{BASE},\"physnet\":\"physnet2\",\"physnetConfig\":{},\"ipam\":{{\"type\":\"weft\"}}}}",
            serde_json::to_string(&path).unwrap()
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.ipam, Ipam::Weft);
        assert_eq!(c.vlan.map(|v| v.vlan), Some(100));
        assert_eq!(c.mtu, Some(9000));
        let e = parse(&text.replace("\"physnet2\"", "\"physnet9\"")).unwrap_err();
        assert!(e.msg.contains(": physnet: 'physnet9' is not in"), "{e}");
    }
}
