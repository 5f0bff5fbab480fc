//! Physnets in the seed's terms, validated.
//!
//! Seed 002 configured two mappings: `physical_device_mappings = "physnet2:enp1s0f0,…"` (which PF
//! serves a physnet, neutron-sriov-nic-agent style) and `default_physnet_subnets =
//! "physnet2:<subnet>,…"` (where a physnet's ports get addresses). weft keeps both, in two forms:
//!
//! - the seed's strings, for flags: [`PhysnetConfig::from_seed`] reads
//!   `physnet:device[,physnet:device…]`, `physnet:cidr[,…]` and `physnet:vlan[,…]`;
//! - a file (YAML or JSON), [`PhysnetConfig::from_file`]:
//!
//! ```yaml
//! physnets:
//!   - name: physnet2
//!     devices: ["ens1f0#0-3", "0000:3b:00.1"]   # PF netdev or PCI address, optional VF ranges
//!     subnet: 10.56.0.0/24
//!     rangeStart: 10.56.0.10                    # optional, default subnet + 1
//!     rangeEnd: 10.56.0.200                     # optional, default broadcast - 1
//!     gateway: 10.56.0.1                        # optional, never handed out
//!     vlan: 100                                 # optional, 1-4094; set on the VF through its PF
//!     mtu: 9000                                 # optional
//! ```
//!
//! A device entry is a PF and, after `#`, the VF indexes it gives the physnet (`0,2-7,9`, as
//! sriov-network-device-plugin's `pfNames`); without `#` every VF of the PF. Seed neutron subnets
//! were UUIDs; weft has no Neutron, so a physnet's subnet is a CIDR. Every error names the entry.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use weft_topology::discover::{PhysicalFunction, SriovInventory, VirtualFunction, normalize_pci_bus_id};

/// The extended resource prefix of a physnet's VFs: `sriov.weft.io/<physnet>`.
pub const RESOURCE_PREFIX: &str = "sriov.weft.io/";

/// The extended resource of a physnet.
pub fn resource_name(physnet: &str) -> String {
    format!("{RESOURCE_PREFIX}{physnet}")
}

/// The physnet of an extended resource name, when it is one of weft's.
pub fn physnet_of_resource(resource: &str) -> Option<&str> {
    resource.strip_prefix(RESOURCE_PREFIX).filter(|p| !p.is_empty())
}

/// A configuration error, naming the entry.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a configuration (syntax, or a field of the wrong type).
    #[error("{at}: {message}")]
    Syntax {
        /// File, or the flag.
        at: String,
        /// What the parser said.
        message: String,
    },
    /// An entry is not valid.
    #[error("{at}: {message}")]
    Invalid {
        /// The entry (`physnets[1] (physnet3).devices[0] 'ens1f1#3-1'`).
        at: String,
        /// What is wrong and what is expected.
        message: String,
    },
}

fn invalid(at: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { at: at.into(), message: message.into() }
}

/// Which VFs of a PF a physnet takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VfIndexes {
    /// All of them.
    All,
    /// These indexes, ascending, no repeats.
    Only(Vec<u32>),
}

impl VfIndexes {
    /// Whether VF `index` is one of them.
    pub fn contains(&self, index: u32) -> bool {
        match self {
            VfIndexes::All => true,
            VfIndexes::Only(v) => v.binary_search(&index).is_ok(),
        }
    }
}

/// One `physical_device_mappings` device: a PF and some of its VFs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMapping {
    /// The PF: netdev name or PCI address.
    pub pf: String,
    /// Its VFs on the physnet.
    pub vfs: VfIndexes,
}

/// Most VF indexes one range may name (PCIe SR-IOV allows 65,535 VFs; real NICs have ≤ 1,024).
const MAX_VF_INDEX: u32 = 65_535;

impl DeviceMapping {
    /// Read `pf[#0,2-7,9]`.
    pub fn parse(text: &str) -> Result<DeviceMapping, String> {
        let (pf, ranges) = match text.split_once('#') {
            Some((pf, r)) => (pf.trim(), Some(r)),
            None => (text.trim(), None),
        };
        if pf.is_empty() {
            return Err("no PF before '#' (expected a netdev name or PCI address)".into());
        }
        if pf.len() > 15 && normalize_pci_bus_id(pf).is_none() {
            return Err(format!("'{pf}' is neither a netdev name (at most 15 characters) nor a PCI address"));
        }
        if pf.chars().any(|c| c.is_whitespace() || c == '/' || c == ':' && !pf.contains('.')) {
            return Err(format!("'{pf}' is neither a netdev name nor a PCI address"));
        }
        let Some(ranges) = ranges else { return Ok(DeviceMapping { pf: pf.to_string(), vfs: VfIndexes::All }) };
        let mut idx = Vec::new();
        for part in ranges.split(',') {
            let part = part.trim();
            let num = |s: &str| -> Result<u32, String> {
                s.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= MAX_VF_INDEX)
                    .ok_or_else(|| format!("VF index '{s}' is not a number in 0..={MAX_VF_INDEX}"))
            };
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            if lo > hi {
                return Err(format!("VF range {part} runs backwards"));
            }
            idx.extend(lo..=hi);
        }
        idx.sort_unstable();
        if let Some(w) = idx.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("VF {} is named twice", w[0]));
        }
        Ok(DeviceMapping { pf: pf.to_string(), vfs: VfIndexes::Only(idx) })
    }
}

/// Where a physnet's ports get addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    /// The subnet.
    pub cidr: IpNet,
    /// First address handed out (default: the subnet's first host).
    pub range_start: IpAddr,
    /// Last address handed out (default: the last host; for IPv4 the address before broadcast).
    pub range_end: IpAddr,
    /// The gateway, never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// One physnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Physnet {
    /// Its name (also the resource `sriov.weft.io/<name>`).
    pub name: String,
    /// The PFs (and VFs) that serve it.
    pub devices: Vec<DeviceMapping>,
    /// Addresses, when weft hands them out.
    pub subnet: Option<Subnet>,
    /// VLAN the PF tags the VFs' traffic with.
    pub vlan: Option<u16>,
    /// MTU in the pod.
    pub mtu: Option<u32>,
}

/// Every physnet, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhysnetConfig {
    /// By name.
    pub physnets: BTreeMap<String, Physnet>,
}

/// The file form, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileForm {
    physnets: Vec<FilePhysnet>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FilePhysnet {
    name: String,
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    vlan: Option<u32>,
    #[serde(default)]
    mtu: Option<u32>,
}

/// Whether `name` can be a physnet: the name part of the extended resource `sriov.weft.io/<name>`
/// (a qualified name's name part: 1–63 letters, digits, `-`, `_`, `.`, starting and ending with a
/// letter or digit).
pub fn valid_physnet_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn parse_ip(at: &str, field: &str, text: &str) -> Result<IpAddr, ConfigError> {
    text.trim().parse().map_err(|_| invalid(format!("{at}.{field}"), format!("'{text}' is not an IP address")))
}

/// The subnet of `cidr` with optional start, end and gateway, checked as host-local checks its
/// ranges (reference §5): the range inside the subnet and in order, the gateway inside it, IPv4
/// /31 and /32 too small.
fn build_subnet(
    at: &str,
    cidr: &str,
    start: Option<&str>,
    end: Option<&str>,
    gateway: Option<&str>,
) -> Result<Subnet, ConfigError> {
    let net: IpNet = cidr
        .trim()
        .parse()
        .map_err(|_| invalid(format!("{at}.subnet"), format!("'{cidr}' is not a CIDR (like 10.56.0.0/24)")))?;
    let net = net.trunc();
    let (first, last) = match net {
        IpNet::V4(n) => {
            if n.prefix_len() > 30 {
                return Err(invalid(format!("{at}.subnet"), format!("{n} is too small (at most /30 for IPv4)")));
            }
            (
                IpAddr::V4(u32::from(n.network()).wrapping_add(1).into()),
                IpAddr::V4(u32::from(n.broadcast()).wrapping_sub(1).into()),
            )
        }
        IpNet::V6(n) => {
            if n.prefix_len() > 126 {
                return Err(invalid(format!("{at}.subnet"), format!("{n} is too small (at most /126 for IPv6)")));
            }
            (IpAddr::V6(u128::from(n.network()).wrapping_add(1).into()), IpAddr::V6(n.broadcast()))
        }
    };
    let range_start = start.map(|s| parse_ip(at, "rangeStart", s)).transpose()?.unwrap_or(first);
    let range_end = end.map(|s| parse_ip(at, "rangeEnd", s)).transpose()?.unwrap_or(last);
    let gateway = gateway.map(|s| parse_ip(at, "gateway", s)).transpose()?;
    for (field, ip) in [("rangeStart", Some(range_start)), ("rangeEnd", Some(range_end)), ("gateway", gateway)] {
        if let Some(ip) = ip
            && !net.contains(&ip)
        {
            return Err(invalid(format!("{at}.{field}"), format!("{ip} is outside the subnet {net}")));
        }
    }
    if range_start > range_end {
        return Err(invalid(
            format!("{at}.rangeStart"),
            format!("{range_start} comes after rangeEnd {range_end}: the range is empty"),
        ));
    }
    Ok(Subnet { cidr: net, range_start, range_end, gateway })
}

fn check_vlan(at: &str, vlan: u32) -> Result<Option<u16>, ConfigError> {
    match vlan {
        0 => Ok(None),
        1..=4094 => Ok(Some(vlan as u16)),
        _ => Err(invalid(format!("{at}.vlan"), format!("{vlan} is not a VLAN id (1-4094; 0 means none)"))),
    }
}

fn check_mtu(at: &str, mtu: u32) -> Result<u32, ConfigError> {
    if (68..=65_535).contains(&mtu) {
        Ok(mtu)
    } else {
        Err(invalid(format!("{at}.mtu"), format!("{mtu} is not an MTU (68-65535)")))
    }
}

impl PhysnetConfig {
    /// Read a YAML or JSON file.
    pub fn from_file(path: &Path) -> Result<PhysnetConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        PhysnetConfig::from_text(&text, &path.display().to_string())
    }

    /// Read YAML or JSON text; `origin` names it in errors.
    pub fn from_text(text: &str, origin: &str) -> Result<PhysnetConfig, ConfigError> {
        let form: FileForm = serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::Syntax { at: origin.to_string(), message: e.to_string() })?;
        let mut cfg = PhysnetConfig::default();
        for (i, p) in form.physnets.into_iter().enumerate() {
            let at = format!("{origin}: physnets[{i}] ({})", p.name);
            let mut devices = Vec::new();
            for (j, d) in p.devices.iter().enumerate() {
                devices.push(DeviceMapping::parse(d).map_err(|m| invalid(format!("{at}.devices[{j}] '{d}'"), m))?);
            }
            let subnet = match &p.subnet {
                Some(c) => {
                    Some(build_subnet(&at, c, p.range_start.as_deref(), p.range_end.as_deref(), p.gateway.as_deref())?)
                }
                None if p.range_start.is_some() || p.range_end.is_some() || p.gateway.is_some() => {
                    return Err(invalid(&at, "rangeStart, rangeEnd and gateway need a subnet"));
                }
                None => None,
            };
            let vlan = p.vlan.map(|v| check_vlan(&at, v)).transpose()?.flatten();
            let mtu = p.mtu.map(|m| check_mtu(&at, m)).transpose()?;
            cfg.add(&at, Physnet { name: p.name, devices, subnet, vlan, mtu })?;
        }
        cfg.check_overlaps(origin)?;
        Ok(cfg)
    }

    /// Build from the seed's option strings: `physical_device_mappings`
    /// (`physnet2:ens1f0#0-3,physnet3:ens1f1`), `default_physnet_subnets` (`physnet2:10.56.0.0/24`)
    /// and weft's `physnet_vlans` (`physnet2:100`). Empty strings are allowed for the last two.
    pub fn from_seed(device_mappings: &str, subnets: &str, vlans: &str) -> Result<PhysnetConfig, ConfigError> {
        let pairs = |flag: &'static str, text: &str| -> Result<Vec<(String, String)>, ConfigError> {
            // A device's VF list holds commas too (`ens1f0#0,2`): an item without ':' continues the
            // one before it.
            let mut out: Vec<(String, String)> = Vec::new();
            for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match item.split_once(':').filter(|(name, _)| valid_physnet_name(name.trim())) {
                    Some((name, value))
                        if !(flag == "physical_device_mappings"
                            && name.len() == 4
                            && value.contains('.')
                            && name.chars().all(|c| c.is_ascii_hexdigit())) =>
                    {
                        out.push((name.trim().to_string(), value.trim().to_string()))
                    }
                    _ => match out.last_mut() {
                        Some(last) if flag == "physical_device_mappings" && last.1.contains('#') => {
                            last.1.push(',');
                            last.1.push_str(item);
                        }
                        _ => {
                            return Err(ConfigError::Syntax {
                                at: format!("{flag} '{item}'"),
                                message: "expected <physnet>:<value>".into(),
                            });
                        }
                    },
                }
            }
            Ok(out)
        };
        let mut by_name: BTreeMap<String, Physnet> = BTreeMap::new();
        for (name, dev) in pairs("physical_device_mappings", device_mappings)? {
            let at = format!("physical_device_mappings '{name}:{dev}'");
            let d = DeviceMapping::parse(&dev).map_err(|m| invalid(&at, m))?;
            by_name
                .entry(name.clone())
                .or_insert_with(|| Physnet { name, devices: Vec::new(), subnet: None, vlan: None, mtu: None })
                .devices
                .push(d);
        }
        for (name, cidr) in pairs("default_physnet_subnets", subnets)? {
            let at = format!("default_physnet_subnets '{name}:{cidr}'");
            let p =
                by_name.get_mut(&name).ok_or_else(|| invalid(&at, format!("physnet {name} has no device mapping")))?;
            if p.subnet.is_some() {
                return Err(invalid(&at, format!("physnet {name} has a subnet already")));
            }
            p.subnet = Some(build_subnet(&at, &cidr, None, None, None)?);
        }
        for (name, vlan) in pairs("physnet_vlans", vlans)? {
            let at = format!("physnet_vlans '{name}:{vlan}'");
            let p =
                by_name.get_mut(&name).ok_or_else(|| invalid(&at, format!("physnet {name} has no device mapping")))?;
            let v: u32 = vlan.parse().map_err(|_| invalid(&at, format!("'{vlan}' is not a VLAN id")))?;
            p.vlan = check_vlan(&at, v)?;
        }
        let mut cfg = PhysnetConfig::default();
        for (name, p) in by_name {
            cfg.add(&format!("physnet {name}"), p)?;
        }
        cfg.check_overlaps("physical_device_mappings")?;
        Ok(cfg)
    }

    fn add(&mut self, at: &str, p: Physnet) -> Result<(), ConfigError> {
        if !valid_physnet_name(&p.name) {
            return Err(invalid(
                at,
                format!(
                    "'{}' cannot name the resource sriov.weft.io/<physnet>: use letters, digits, '-', '_' and '.', \
                     starting and ending with a letter or digit, at most 63 characters",
                    p.name
                ),
            ));
        }
        if p.devices.is_empty() {
            return Err(invalid(at, "no devices: name the PFs that serve this physnet"));
        }
        if self.physnets.contains_key(&p.name) {
            return Err(invalid(at, format!("physnet {} is defined twice", p.name)));
        }
        self.physnets.insert(p.name.clone(), p);
        Ok(())
    }

    /// Two physnets may share a PF only on disjoint VF indexes.
    fn check_overlaps(&self, origin: &str) -> Result<(), ConfigError> {
        let all: Vec<(&str, &DeviceMapping)> =
            self.physnets.values().flat_map(|p| p.devices.iter().map(move |d| (p.name.as_str(), d))).collect();
        for (i, (a, da)) in all.iter().enumerate() {
            for (b, db) in &all[i + 1..] {
                if da.pf != db.pf {
                    continue;
                }
                let shared = match (&da.vfs, &db.vfs) {
                    (VfIndexes::All, _) | (_, VfIndexes::All) => true,
                    (VfIndexes::Only(x), VfIndexes::Only(y)) => x.iter().any(|v| y.binary_search(v).is_ok()),
                };
                if shared {
                    return Err(invalid(
                        origin,
                        format!("physnets {a} and {b} both take VFs of {} (give each its own VF indexes)", da.pf),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A physnet by name.
    pub fn physnet(&self, name: &str) -> Option<&Physnet> {
        self.physnets.get(name)
    }

    /// The node's VFs on each physnet, from its SR-IOV inventory, in PF then VF-index order. A
    /// mapping whose PF the node lacks, or a named VF index the PF has not enabled, is a note, not
    /// an error: nodes differ, and one configuration serves them all.
    pub fn assign<'a>(
        &self,
        inventory: &'a SriovInventory,
        notes: &mut Vec<String>,
    ) -> BTreeMap<String, Vec<(&'a PhysicalFunction, &'a VirtualFunction)>> {
        let mut out: BTreeMap<String, Vec<(&PhysicalFunction, &VirtualFunction)>> = BTreeMap::new();
        for p in self.physnets.values() {
            let list = out.entry(p.name.clone()).or_default();
            for d in &p.devices {
                let Some(pf) = inventory.pf(&d.pf) else {
                    notes.push(format!("physnet {}: no SR-IOV PF {} with VFs enabled on this node", p.name, d.pf));
                    continue;
                };
                list.extend(pf.vfs.iter().filter(|vf| d.vfs.contains(vf.index)).map(|vf| (pf, vf)));
                if let VfIndexes::Only(idx) = &d.vfs {
                    let missing: Vec<u32> =
                        idx.iter().copied().filter(|i| !pf.vfs.iter().any(|vf| vf.index == *i)).collect();
                    if !missing.is_empty() {
                        notes.push(format!("physnet {}: PF {} has no VFs {missing:?} enabled", p.name, d.pf));
                    }
                }
            }
        }
        out
    }

    /// The node's VFs as its published topology lists them ([`weft_topology::Vf`]): each VF of a
    /// physnet, under the NIC of `node` that is its PF (matched by PCI address, netdev or RDMA
    /// device). A PF that is not among the node's NICs is a note and its VFs are left out: a VF
    /// whose relation to the GPUs is unknown cannot be placed near them.
    pub fn topology_vfs(
        &self,
        node: &weft_topology::NodeTopology,
        inventory: &SriovInventory,
        notes: &mut Vec<String>,
    ) -> Vec<weft_topology::Vf> {
        let mut out = Vec::new();
        let mut unplaced = std::collections::BTreeSet::new();
        for (physnet, vfs) in self.assign(inventory, notes) {
            for (pf, vf) in vfs {
                let f = &pf.function;
                let nic = node.nics.iter().find(|n| {
                    n.pci_bus_id.as_deref().and_then(normalize_pci_bus_id).as_deref() == Some(pf.pci_address.as_str())
                        || (n.netdev.is_some() && n.netdev == f.netdev)
                        || (n.rdma_device.is_some() && n.rdma_device == f.rdma_device)
                });
                match nic {
                    Some(nic) => out.push(weft_topology::Vf {
                        pci_address: vf.pci_address.clone(),
                        nic: nic.name.clone(),
                        physnet: Some(physnet.clone()),
                    }),
                    None => {
                        if unplaced.insert(pf.pci_address.clone()) {
                            notes.push(format!(
                                "physnet {physnet}: PF {} is not among the node's NICs; its VFs are not published",
                                pf.pci_address
                            ));
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests assert by unwrapping
mod tests {
    use super::*;
    use weft_topology::discover::FakeSriovTree;

    #[test]
    fn device_mappings_read_vf_ranges_as_sriov_dp_does() {
        let d = DeviceMapping::parse("ens1f0#0,2-4,9").unwrap();
        assert_eq!(d.pf, "ens1f0");
        assert_eq!(d.vfs, VfIndexes::Only(vec![0, 2, 3, 4, 9]));
        assert_eq!(DeviceMapping::parse("0000:3b:00.0").unwrap().vfs, VfIndexes::All);
        for (bad, want) in [
            ("ens1f0#3-1", "runs backwards"),
            ("ens1f0#1,1", "VF 1 is named twice"),
            ("ens1f0#x", "'x' is not a number"),
            ("#1", "no PF"),
            ("a-very-long-interface-name", "neither a netdev name"),
        ] {
            let e = DeviceMapping::parse(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn seed_strings_build_the_same_physnets_as_the_file() {
        let seed = PhysnetConfig::from_seed(
            "physnet2:ens1f0#0-3,physnet2:0000:5e:00.0,physnet3:ens1f1#0,2",
            "physnet2:10.56.0.0/24",
            "physnet2:100",
        )
        .unwrap();
        let file = PhysnetConfig::from_text(
            "physnets:\n  - name: physnet2\n    devices: ['ens1f0#0-3', '0000:5e:00.0']\n    subnet: 10.56.0.0/24\n    vlan: 100\n  - name: physnet3\n    devices: ['ens1f1#0,2']\n",
            "physnets.yaml",
        )
        .unwrap();
        assert_eq!(seed, file);
        let p2 = seed.physnet("physnet2").unwrap();
        assert_eq!(p2.devices.len(), 2);
        assert_eq!(p2.vlan, Some(100));
        let s = p2.subnet.as_ref().unwrap();
        assert_eq!((s.range_start.to_string(), s.range_end.to_string()), ("10.56.0.1".into(), "10.56.0.254".into()));
        assert_eq!(seed.physnet("physnet3").unwrap().devices[0].vfs, VfIndexes::Only(vec![0, 2]));
        assert_eq!(resource_name("physnet2"), "sriov.weft.io/physnet2");
        assert_eq!(physnet_of_resource("sriov.weft.io/physnet2"), Some("physnet2"));
        assert_eq!(physnet_of_resource("nvidia.com/gpu"), None);
    }

    #[test]
    fn errors_name_the_entry_and_what_to_do() {
        let cases = [
            (
                "physnets:\n  - name: p1\n    devices: [ens1#2-1]\n",
                "physnets[0] (p1).devices[0] 'ens1#2-1'",
                "runs backwards",
            ),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n    subnet: 10.0.0.0/31\n",
                "physnets[0] (p1).subnet",
                "too small",
            ),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n    subnet: 10.0.0.0/24\n    rangeStart: 10.0.1.5\n",
                "physnets[0] (p1).rangeStart",
                "outside the subnet",
            ),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n    subnet: 10.0.0.0/24\n    rangeStart: 10.0.0.9\n    rangeEnd: 10.0.0.8\n",
                "physnets[0] (p1).rangeStart",
                "the range is empty",
            ),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n    vlan: 4095\n",
                "physnets[0] (p1).vlan",
                "not a VLAN id",
            ),
            ("physnets:\n  - name: p1\n    devices: [ens1]\n    mtu: 10\n", "physnets[0] (p1).mtu", "not an MTU"),
            ("physnets:\n  - name: p1\n    devices: []\n", "physnets[0] (p1)", "no devices"),
            ("physnets:\n  - name: -p\n    devices: [ens1]\n", "physnets[0] (-p)", "cannot name the resource"),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n  - name: p1\n    devices: [ens2]\n",
                "physnets[1] (p1)",
                "defined twice",
            ),
            (
                "physnets:\n  - name: p1\n    devices: ['ens1#0-3']\n  - name: p2\n    devices: ['ens1#3']\n",
                "f.yaml",
                "both take VFs of ens1",
            ),
            (
                "physnets:\n  - name: p1\n    devices: [ens1]\n    gateway: 10.0.0.1\n",
                "physnets[0] (p1)",
                "need a subnet",
            ),
            ("physnets:\n  - name: p1\n    devices: [ens1]\n    vlans: 3\n", "f.yaml", "vlans"),
        ];
        for (text, at, msg) in cases {
            let e = PhysnetConfig::from_text(text, "f.yaml").unwrap_err().to_string();
            assert!(e.contains(at) && e.contains(msg), "{text}\n=> {e}");
        }
        let e = PhysnetConfig::from_seed("physnet2:ens1", "physnet9:10.0.0.0/24", "").unwrap_err().to_string();
        assert!(e.contains("default_physnet_subnets 'physnet9:10.0.0.0/24'") && e.contains("no device mapping"), "{e}");
        let e = PhysnetConfig::from_seed("ens1", "", "").unwrap_err().to_string();
        assert!(e.contains("physical_device_mappings 'ens1'") && e.contains("<physnet>:<value>"), "{e}");
    }

    #[test]
    fn assign_maps_the_nodes_vfs_and_notes_what_the_node_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:3b:00.0", &["0000:00:02.0"], "ens1f0", 0);
        for i in 0..4 {
            tree.vf("0000:3b:00.0", i, &format!("0000:3b:00.{}", i + 2), None);
        }
        let mut notes = Vec::new();
        let inv = weft_topology::discover::read_sriov(&tree.root(), &mut notes);
        let cfg = PhysnetConfig::from_seed("physnet2:ens1f0#0-1,physnet3:ens1f0#2-5,physnet4:ens9", "", "").unwrap();
        let got = cfg.assign(&inv, &mut notes);
        let pcis = |p: &str| got[p].iter().map(|(_, vf)| vf.pci_address.as_str()).collect::<Vec<_>>();
        assert_eq!(pcis("physnet2"), ["0000:3b:00.2", "0000:3b:00.3"]);
        assert_eq!(pcis("physnet3"), ["0000:3b:00.4", "0000:3b:00.5"]);
        assert!(pcis("physnet4").is_empty());
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("PF ens1f0 has no VFs [4, 5] enabled"), "{notes:?}");
        assert!(notes[1].contains("no SR-IOV PF ens9"), "{notes:?}");
    }

    #[test]
    fn published_vfs_sit_under_the_nic_that_is_their_pf() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSriovTree::new(dir.path());
        tree.pf("0000:3b:00.0", &["0000:00:02.0"], "ens1f0", 0);
        tree.pf("0000:5e:00.0", &["0000:00:03.0"], "ens2f0", 0);
        for i in 0..2 {
            tree.vf("0000:3b:00.0", i, &format!("0000:3b:00.{}", i + 2), None);
            tree.vf("0000:5e:00.0", i, &format!("0000:5e:00.{}", i + 2), None);
        }
        let mut notes = Vec::new();
        let inv = weft_topology::discover::read_sriov(&tree.root(), &mut notes);
        let text = "\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n";
        let mut node = weft_topology::parse_node(text, "t").unwrap();
        node.nics[0].pci_bus_id = Some("0000:3B:00.0".into());
        let cfg = PhysnetConfig::from_seed("fabric:ens1f0#1,fabric:ens2f0", "", "").unwrap();
        let vfs = cfg.topology_vfs(&node, &inv, &mut notes);
        assert_eq!(vfs.len(), 1, "{vfs:?}");
        assert_eq!((vfs[0].pci_address.as_str(), vfs[0].nic.as_str()), ("0000:3b:00.3", node.nics[0].name.as_str()));
        assert_eq!(vfs[0].physnet.as_deref(), Some("fabric"));
        assert_eq!(notes, ["physnet fabric: PF 0000:5e:00.0 is not among the node's NICs; its VFs are not published"]);
        node.set_vfs(vfs).unwrap();
    }
}
