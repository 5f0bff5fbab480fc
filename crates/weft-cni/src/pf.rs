//! A VF's settings held by its PF: VLAN (id, QoS, protocol) and the administrative MAC. They are
//! read and written over netlink on the PF (`RTM_GETLINK` with `RTEXT_FILTER_VF` and
//! `IFLA_VFINFO_LIST`; `RTM_SETLINK` with `IFLA_VF_VLAN`, `IFLA_VF_VLAN_LIST` for 802.1ad, and
//! `IFLA_VF_MAC`), as `ip link set <pf> vf <n> vlan <id> qos <q> proto <p>` does.
//!
//! [`PfControl`] is the seam: [`NetlinkPfControl`] talks to the kernel, [`FakePfControl`] records
//! the calls for tests (no machine here has SR-IOV).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};

use rtnetlink::packet_route::link::{
    LinkAttribute, LinkMessage, LinkVfInfo, VfInfo, VfInfoMac, VfInfoVlan, VfVlan, VfVlanInfo, VlanProtocol,
};
use serde::{Deserialize, Serialize};

use crate::net::Links;

/// A hardware address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub Vec<u8>);

impl Mac {
    /// Read `02:00:00:aa:bb:cc` (6 octets; 20 for InfiniBand), `:` or `-` separated.
    pub fn parse(text: &str) -> Option<Mac> {
        let bytes: Option<Vec<u8>> =
            text.split([':', '-']).map(|p| (p.len() == 2).then(|| u8::from_str_radix(p, 16).ok()).flatten()).collect();
        bytes.filter(|b| b.len() == 6 || b.len() == 20).map(Mac)
    }

    /// Whether every octet is zero (a PF reports an unset administrative MAC so).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|b| format!("{b:02x}")).collect();
        f.write_str(&parts.join(":"))
    }
}

impl Serialize for Mac {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mac, D::Error> {
        let text = String::deserialize(d)?;
        Mac::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("'{text}' is not a MAC address")))
    }
}

/// The VLAN tag protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum VlanProto {
    /// 802.1Q (the default).
    #[default]
    #[serde(rename = "802.1q")]
    Dot1Q,
    /// 802.1ad (QinQ).
    #[serde(rename = "802.1ad")]
    Dot1Ad,
}

/// A VF's settings as its PF reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PfVfState {
    /// VLAN id (0: untagged).
    pub vlan: u16,
    /// QoS.
    pub qos: u8,
    /// Tag protocol.
    pub proto: VlanProto,
    /// The administrative MAC (all zeros when none was set; `None` when the PF did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_mac: Option<Mac>,
}

/// A failed PF call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PfError {
    /// The PF netdev is not in the host namespace.
    #[error("PF {pf} is not a link in the host network namespace")]
    NoPf {
        /// PF netdev.
        pf: String,
    },
    /// The PF reports no VFs over netlink (not an SR-IOV PF, or SR-IOV disabled).
    #[error(
        "PF {pf} reports no VFs over netlink (IFLA_VFINFO_LIST is empty): it is not an SR-IOV PF or its VFs are disabled"
    )]
    NoVfs {
        /// PF netdev.
        pf: String,
    },
    /// The PF does not list this VF.
    #[error("PF {pf} reports no VF {vf}")]
    NoSuchVf {
        /// PF netdev.
        pf: String,
        /// VF index.
        vf: u32,
    },
    /// The kernel refused a call.
    #[error("{op}: {message}")]
    Call {
        /// What was being done.
        op: String,
        /// Why.
        message: String,
    },
}

/// Reads and sets a VF's PF-side settings. The futures are `Send`, so a controller can be held
/// behind a trait object and called from a multi-threaded server's handlers.
pub trait PfControl: Send + Sync {
    /// VF `vf`'s settings on PF `pf`.
    fn vf_state(&self, host: &Links, pf: &str, vf: u32) -> impl Future<Output = Result<PfVfState, PfError>> + Send;
    /// Set VF `vf`'s VLAN on PF `pf` (vlan 0 with qos 0: untagged).
    fn set_vlan(
        &self,
        host: &Links,
        pf: &str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> impl Future<Output = Result<(), PfError>> + Send;
    /// Set VF `vf`'s administrative MAC on PF `pf`.
    fn set_mac(&self, host: &Links, pf: &str, vf: u32, mac: &Mac) -> impl Future<Output = Result<(), PfError>> + Send;
}

/// The kernel, over netlink on the PF.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetlinkPfControl;

fn call_error(op: String, e: crate::net::LinkError) -> PfError {
    PfError::Call { op, message: e.message }
}

impl NetlinkPfControl {
    async fn pf_index(host: &Links, pf: &str) -> Result<u32, PfError> {
        match host.get(pf).await {
            Ok(Some(l)) => Ok(l.index),
            Ok(None) => Err(PfError::NoPf { pf: pf.to_string() }),
            Err(e) => Err(call_error(format!("looking up PF {pf}"), e)),
        }
    }

    async fn set_vf(host: &Links, pf: &str, op: String, info: Vec<VfInfo>) -> Result<(), PfError> {
        let index = Self::pf_index(host, pf).await?;
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::VfInfoList(vec![LinkVfInfo(info)]));
        host.set_message(op.clone(), m).await.map_err(|e| call_error(op, e))
    }
}

impl PfControl for NetlinkPfControl {
    async fn vf_state(&self, host: &Links, pf: &str, vf: u32) -> Result<PfVfState, PfError> {
        let message = host
            .get_message(pf, true)
            .await
            .map_err(|e| call_error(format!("reading PF {pf}'s VFs"), e))?
            .ok_or_else(|| PfError::NoPf { pf: pf.to_string() })?;
        let list: Vec<&LinkVfInfo> = message
            .attributes
            .iter()
            .filter_map(|a| match a {
                LinkAttribute::VfInfoList(l) => Some(l.iter()),
                _ => None,
            })
            .flatten()
            .collect();
        if list.is_empty() {
            return Err(PfError::NoVfs { pf: pf.to_string() });
        }
        for LinkVfInfo(infos) in list {
            let id = infos.iter().find_map(|i| match i {
                VfInfo::Mac(m) => Some(m.vf_id),
                VfInfo::Vlan(v) => Some(v.vf_id),
                _ => None,
            });
            if id != Some(vf) {
                continue;
            }
            let mut state = PfVfState::default();
            for i in infos {
                match i {
                    VfInfo::Mac(m) => {
                        state.admin_mac = Some(Mac(m.mac[..6].to_vec()));
                    }
                    VfInfo::Vlan(v) => {
                        state.vlan = u16::try_from(v.vlan_id).unwrap_or(0);
                        state.qos = u8::try_from(v.qos).unwrap_or(0);
                    }
                    VfInfo::VlanList(l) => {
                        if let Some(VfVlan::Info(first)) = l.first() {
                            state.proto = match first.protocol {
                                VlanProtocol::Ieee8021Ad => VlanProto::Dot1Ad,
                                _ => VlanProto::Dot1Q,
                            };
                        }
                    }
                    _ => {}
                }
            }
            return Ok(state);
        }
        Err(PfError::NoSuchVf { pf: pf.to_string(), vf })
    }

    async fn set_vlan(
        &self,
        host: &Links,
        pf: &str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> Result<(), PfError> {
        let op = format!("setting VF {vf} of PF {pf} to vlan {vlan} qos {qos} proto {}", proto_name(proto));
        let info = match proto {
            VlanProto::Dot1Q => VfInfo::Vlan(VfInfoVlan::new(vf, u32::from(vlan), u32::from(qos))),
            VlanProto::Dot1Ad => VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
                vf,
                u32::from(vlan),
                u32::from(qos),
                VlanProtocol::Ieee8021Ad,
            ))]),
        };
        Self::set_vf(host, pf, op, vec![info]).await
    }

    async fn set_mac(&self, host: &Links, pf: &str, vf: u32, mac: &Mac) -> Result<(), PfError> {
        let op = format!("setting VF {vf} of PF {pf} to MAC {mac}");
        Self::set_vf(host, pf, op, vec![VfInfo::Mac(VfInfoMac::new(vf, &mac.0))]).await
    }
}

/// `802.1Q` / `802.1ad`, as `ip link` writes them.
pub fn proto_name(p: VlanProto) -> &'static str {
    match p {
        VlanProto::Dot1Q => "802.1Q",
        VlanProto::Dot1Ad => "802.1ad",
    }
}

/// A call the fake saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PfCall {
    /// `vf_state`.
    State {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
    },
    /// `set_vlan`.
    SetVlan {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// VLAN id.
        vlan: u16,
        /// QoS.
        qos: u8,
        /// Protocol.
        proto: VlanProto,
    },
    /// `set_mac`.
    SetMac {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// MAC.
        mac: Mac,
    },
}

/// Test support: a PF that keeps VF settings in memory, records every call, and can be told to
/// refuse VLAN or MAC settings.
#[derive(Debug, Default)]
pub struct FakePfControl {
    state: Mutex<BTreeMap<(String, u32), PfVfState>>,
    calls: Mutex<Vec<PfCall>>,
    /// When set, `set_vlan` fails with this message.
    pub fail_vlan: Option<String>,
    /// When set, `set_mac` fails with this message.
    pub fail_mac: Option<String>,
}

impl FakePfControl {
    /// A PF with no VF settings yet (every VF untagged, no administrative MAC).
    pub fn new() -> FakePfControl {
        FakePfControl::default()
    }

    /// VF `vf` of `pf` starts with `state`.
    pub fn with_state(self, pf: &str, vf: u32, state: PfVfState) -> FakePfControl {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).insert((pf.to_string(), vf), state);
        self
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<PfCall> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// VF `vf`'s settings now.
    pub fn current(&self, pf: &str, vf: u32) -> PfVfState {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(pf.to_string(), vf))
            .cloned()
            .unwrap_or_default()
    }

    fn record(&self, call: PfCall) {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(call);
    }
}

impl PfControl for FakePfControl {
    async fn vf_state(&self, _host: &Links, pf: &str, vf: u32) -> Result<PfVfState, PfError> {
        self.record(PfCall::State { pf: pf.to_string(), vf });
        Ok(self.current(pf, vf))
    }

    async fn set_vlan(
        &self,
        _host: &Links,
        pf: &str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> Result<(), PfError> {
        self.record(PfCall::SetVlan { pf: pf.to_string(), vf, vlan, qos, proto });
        if let Some(m) = &self.fail_vlan {
            return Err(PfError::Call { op: format!("setting VF {vf} of PF {pf} to vlan {vlan}"), message: m.clone() });
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let e = s.entry((pf.to_string(), vf)).or_default();
        (e.vlan, e.qos, e.proto) = (vlan, qos, proto);
        Ok(())
    }

    async fn set_mac(&self, _host: &Links, pf: &str, vf: u32, mac: &Mac) -> Result<(), PfError> {
        self.record(PfCall::SetMac { pf: pf.to_string(), vf, mac: mac.clone() });
        if let Some(m) = &self.fail_mac {
            return Err(PfError::Call { op: format!("setting VF {vf} of PF {pf} to MAC {mac}"), message: m.clone() });
        }
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.entry((pf.to_string(), vf)).or_default().admin_mac = Some(mac.clone());
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_print_and_refuse_garbage() {
        let m = Mac::parse("02:00:00:AA:bb:cc").unwrap();
        assert_eq!(m.to_string(), "02:00:00:aa:bb:cc");
        assert_eq!(Mac::parse("02-00-00-aa-bb-cc"), Some(m));
        for bad in ["", "02:00:00:aa:bb", "02:00:00:aa:bb:cc:dd", "zz:00:00:aa:bb:cc", "2:0:0:a:b:c"] {
            assert!(Mac::parse(bad).is_none(), "{bad}");
        }
        assert!(Mac(vec![0; 6]).is_zero());
        let json = serde_json::to_string(&PfVfState {
            vlan: 5,
            qos: 1,
            proto: VlanProto::Dot1Ad,
            admin_mac: Mac::parse("02:00:00:00:00:09"),
        })
        .unwrap();
        assert_eq!(json, r#"{"vlan":5,"qos":1,"proto":"802.1ad","adminMac":"02:00:00:00:00:09"}"#);
    }
}
