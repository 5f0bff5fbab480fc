//! IPAM for one VF: the delegated plugin, or weft's own range store.
//!
//! Each VF's IPAM calls carry the VF's interface name in the pod as `CNI_IFNAME` (with a
//! `deviceID` that is `CNI_IFNAME` itself; in chained mode `net1`, `net2`, …), so a plugin like
//! host-local, which keys reservations by container and interface, gives each VF its own address.
//!
//! Delegates that predate CNI 1.1.0 (Debian's host-local is 1.1.1 of the plugins, speaking up to
//! 1.0.0) answer a 1.1.0 configuration with code 1. For ADD, DEL and CHECK weft-cni then asks
//! again at 1.0.0, whose IPAM result has the same shape. STATUS and GC came with 1.1.0: before
//! either, weft-cni asks the delegate's VERSION, and a delegate that does not list 1.1.0 has no
//! such command and is skipped (noted on stderr).

use std::collections::HashSet;
use std::net::IpAddr;

use serde_json::Value;

use crate::conf::{Ipam, NetConf};
use crate::delegate::{self, CallEnv};
use crate::env::CniEnv;
use crate::error::{CniError, code};
use crate::result::{CniResult, IpConfig};
use crate::store::RangeStore;
use crate::version::Version;

/// IPAM for one invocation.
pub struct IpamCtx<'a> {
    /// The configuration.
    pub conf: &'a NetConf,
    /// The environment.
    pub env: &'a CniEnv,
    /// The configuration as received (what delegates get).
    pub stdin: &'a [u8],
}

/// The attachment a call is about.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_NETNS`.
    pub netns: Option<&'a str>,
    /// The VF's interface name.
    pub ifname: &'a str,
}

impl IpamCtx<'_> {
    fn delegated(&self, plugin: &str, command: &str, target: Option<Target<'_>>) -> Result<Vec<u8>, CniError> {
        let binary = delegate::find(plugin, self.env)?;
        let call = CallEnv {
            command,
            container_id: target.map(|t| t.container_id),
            netns: target.and_then(|t| t.netns),
            ifname: target.map(|t| t.ifname),
        };
        if matches!(command, "STATUS" | "GC") {
            let versions = delegate::supported_versions(&binary, plugin, self.env)?;
            if !versions.iter().any(|v| v == Version::V1_1_0.as_str()) {
                eprintln!(
                    "weft-cni: IPAM plugin {plugin} speaks CNI {} and so has no {command} (it came with 1.1.0): skipped",
                    versions.join(", ")
                );
                return Ok(Vec::new());
            }
        }
        let first = delegate::run(&binary, plugin, self.env, &call, self.stdin);
        match first {
            Err(e) if e.code == code::INCOMPATIBLE_VERSION && self.conf.version == Version::V1_1_0 => {
                let older = delegate::with_version(self.stdin, Version::V1_0_0.as_str())
                    .ok_or_else(|| CniError::new(code::DECODE, "the network configuration is not a JSON object"))?;
                delegate::run(&binary, plugin, self.env, &call, &older)
            }
            other => other,
        }
    }

    fn store(&self) -> Result<(RangeStore, &weft_net::config::Subnet), CniError> {
        let physnet = self.conf.physnet_entry.as_ref();
        let subnet = physnet
            .and_then(|p| p.subnet.as_ref())
            .ok_or_else(|| CniError::config("ipam", "weft IPAM needs a physnet with a subnet"))?;
        let name = physnet.map(|p| p.name.as_str()).unwrap_or_default();
        Ok((RangeStore::new(&self.conf.cache_dir, name), subnet))
    }

    /// ADD: the addresses, routes and DNS for `target`; `None` without IPAM.
    pub fn add(&self, target: Target<'_>) -> Result<Option<CniResult>, CniError> {
        match &self.conf.ipam {
            Ipam::None => Ok(None),
            Ipam::Delegated(plugin) => {
                let out = self.delegated(plugin, "ADD", Some(target))?;
                let value: Value = serde_json::from_slice(&out).map_err(|e| {
                    CniError::new(
                        code::DECODE,
                        format!("IPAM plugin {plugin} answered ADD with something that is not JSON: {e}"),
                    )
                })?;
                CniResult::from_value(&value, &format!("IPAM plugin {plugin}'s ADD result")).map(Some)
            }
            Ipam::Weft => {
                let (store, subnet) = self.store()?;
                let ip = store.allocate(subnet, target.container_id, target.ifname)?;
                Ok(Some(CniResult {
                    cni_version: self.conf.version.to_string(),
                    ips: vec![IpConfig {
                        address: format!("{ip}/{}", subnet.cidr.prefix_len()),
                        gateway: subnet.gateway.map(|g| g.to_string()),
                        interface: None,
                    }],
                    ..CniResult::default()
                }))
            }
        }
    }

    /// DEL: release what `target` holds.
    pub fn del(&self, target: Target<'_>) -> Result<(), CniError> {
        match &self.conf.ipam {
            Ipam::None => Ok(()),
            Ipam::Delegated(plugin) => self.delegated(plugin, "DEL", Some(target)).map(drop),
            Ipam::Weft => {
                let (store, _) = self.store()?;
                store.release(target.container_id, target.ifname).map(drop)
            }
        }
    }

    /// CHECK: the IPAM side of `target` is as ADD left it; `expected` are the addresses ADD gave.
    pub fn check(&self, target: Target<'_>, expected: &[IpAddr]) -> Result<(), CniError> {
        match &self.conf.ipam {
            Ipam::None => Ok(()),
            Ipam::Delegated(plugin) => self.delegated(plugin, "CHECK", Some(target)).map(drop),
            Ipam::Weft => {
                let (store, _) = self.store()?;
                let held = store.held_by(target.container_id, target.ifname)?;
                for ip in expected {
                    if !held.contains(ip) {
                        return Err(CniError::new(
                            code::CHECK_FAILED,
                            format!(
                                "{}: address {ip} is no longer reserved for {} in {}",
                                target.ifname,
                                target.container_id,
                                store.dir().display()
                            ),
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// GC: release what no valid attachment holds (`valid` are the valid container IDs).
    pub fn gc(&self, valid: &HashSet<String>) -> Result<(), CniError> {
        match &self.conf.ipam {
            Ipam::None => Ok(()),
            Ipam::Delegated(plugin) => self.delegated(plugin, "GC", None).map(drop),
            Ipam::Weft => {
                let (store, _) = self.store()?;
                store.gc(valid).map(drop)
            }
        }
    }

    /// STATUS: whether IPAM can serve an ADD.
    pub fn status(&self) -> Result<(), CniError> {
        match &self.conf.ipam {
            Ipam::None => Ok(()),
            Ipam::Delegated(plugin) => match self.delegated(plugin, "STATUS", None) {
                Ok(_) => Ok(()),
                Err(e) => {
                    Err(CniError::new(code::NOT_AVAILABLE, format!("IPAM plugin {plugin} is not available: {e}")))
                }
            },
            Ipam::Weft => {
                let (store, subnet) = self.store()?;
                match store.free(subnet)? {
                    0 => Err(CniError::new(
                        code::NOT_AVAILABLE,
                        format!(
                            "no free address left in {}-{} ({})",
                            subnet.range_start,
                            subnet.range_end,
                            store.dir().display()
                        ),
                    )),
                    _ => Ok(()),
                }
            }
        }
    }
}
