//! Moving a VF's netdev into a pod's network namespace and back: the link steps weft-cni's ADD,
//! DEL and GC take, shared with weft's NIC DRA driver (`weft_nic_dra::attach`, its NRI
//! RunPodSandbox and StopPodSandbox hooks), so there is one copy of them.
//!
//! Into the pod ([`Host::move_into`]): down, renamed in the host to a temporary name
//! ([`temp_name`]), moved, renamed to its pod name (so neither namespace ever sees a clash), MAC,
//! MTU, up. Back ([`Host::return_to_host`]): down, renamed to the temporary name in the pod,
//! moved, then in the host its original name, MTU, MAC and up state ([`Host::host_restore`]). A
//! move that failed half-way is undone from its [`MoveProgress`] ([`Host::undo_move`]). When the
//! pod's namespace is already gone, the kernel has returned a physical VF to the host under
//! another name; [`Host::rename_back`] finds it in sysfs and restores it.
//!
//! [`Host::attach`] and [`Host::detach`] are the whole round trip for a caller that has no PF
//! settings and no IPAM of its own to interleave (the DRA driver: the VLAN is already set and the
//! address already allocated): into the pod with its addresses, and back.
//!
//! Every error is a [`CniError`] (code 103 for link calls, 100 for a VF that cannot be used) whose
//! message names the link, the namespace and the operation.

use std::path::Path;

use ipnet::IpNet;
use weft_topology::discover::{SysfsRoot, VirtualFunction, read_vf};

use crate::error::{CniError, code};
use crate::net::{Link, LinkError, Links, Netns};
use crate::pf::Mac;
use crate::state::OriginalState;

fn link_err(e: LinkError) -> CniError {
    CniError::new(code::LINK, e.to_string())
}

/// The temporary name a VF carries while it moves between namespaces: `wcni` and 8 hex digits
/// of a hash of its PCI address (unique per VF, 12 characters).
pub fn temp_name(pci: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in pci.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("wcni{h:08x}")
}

/// What a VF is set to in the pod.
#[derive(Clone, Copy, Debug)]
pub struct PodLink<'a> {
    /// Its interface name there.
    pub ifname: &'a str,
    /// Its MAC; `None`: untouched.
    pub mac: Option<&'a Mac>,
    /// Its MTU; `None`: untouched.
    pub mtu: Option<u32>,
}

/// How far [`Host::move_into`] got (what [`Host::undo_move`] must reverse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveProgress {
    /// It was set down in the host.
    pub down: bool,
    /// It was renamed to its temporary name in the host.
    pub renamed: bool,
    /// It was moved into the pod.
    pub moved: bool,
    /// It was given its pod name.
    pub named: bool,
}

/// A VF's netdev in the host: its sysfs facts and its link.
#[derive(Clone, Debug)]
pub struct HostVf {
    /// The VF as sysfs shows it.
    pub vf: VirtualFunction,
    /// Its PF's netdev, when the PF has one.
    pub pf_netdev: Option<String>,
}

/// Where [`Host::take_back`] found a VF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakenBack {
    /// It was in the pod and is back in the host.
    Returned,
    /// It was not in the pod, and its original name is a link in the host.
    AlreadyHome,
    /// It is neither in the pod under its pod name nor in the host under its original name.
    Missing,
}

/// The host side of the moves: a netlink connection and the namespace the caller runs in. Must
/// be made within a tokio runtime (netlink).
#[derive(Debug)]
pub struct Host {
    links: Links,
    netns: Netns,
}

impl Host {
    /// The calling thread's namespace (the host, for weft-cni and the agent).
    pub fn new() -> Result<Host, CniError> {
        let links = Links::here().map_err(link_err)?;
        let netns = Netns::current().map_err(|e| CniError::new(code::IO, e.to_string()))?;
        Ok(Host { links, netns })
    }

    /// The host's netlink calls.
    pub fn links(&self) -> &Links {
        &self.links
    }

    /// The host's namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// VF `pci` in sysfs under `sysfs_root`: its index, PF and host netdev (code 100 when it is
    /// not an SR-IOV VF there).
    pub fn locate(&self, sysfs_root: &Path, pci: &str) -> Result<HostVf, CniError> {
        let root = SysfsRoot::new(sysfs_root);
        let (vf, pf_netdev) =
            read_vf(&root, pci).map_err(|e| CniError::new(code::VF_UNUSABLE, format!("VF {pci}: {e}")))?;
        Ok(HostVf { vf, pf_netdev })
    }

    /// The host link of VF `pci` as [`Host::locate`] found it (code 100 when it has no netdev, or
    /// its netdev is not a link here).
    pub async fn host_link(&self, pci: &str, vf: &HostVf) -> Result<Link, CniError> {
        let host_name = vf.vf.function.netdev.clone().ok_or_else(|| {
            CniError::new(
                code::VF_UNUSABLE,
                format!("VF {pci} has no netdev in the host network namespace (bound to a userspace driver such as vfio-pci, or held in another namespace)"),
            )
        })?;
        self.links.get(&host_name).await.map_err(link_err)?.ok_or_else(|| {
            CniError::new(
                code::VF_UNUSABLE,
                format!("VF {pci}'s netdev {host_name} (from sysfs) is not a link in the host network namespace"),
            )
        })
    }

    /// Move VF `pci` (link `host_index`, state `original`) into `netns` (whose netlink calls are
    /// `pod`) as `want`, and bring it up; its index there. `progress` says how far it got when it
    /// fails: give it to [`Host::undo_move`].
    #[allow(clippy::too_many_arguments)]
    pub async fn move_into(
        &self,
        netns: &Netns,
        pod: &Links,
        pci: &str,
        host_index: u32,
        original: &OriginalState,
        want: &PodLink<'_>,
        progress: &mut MoveProgress,
    ) -> Result<u32, CniError> {
        let tmp = temp_name(pci);
        let host_name = &original.host_ifname;
        progress.down = true;
        self.links.set_up(host_index, host_name, false).await.map_err(link_err)?;
        self.links.rename(host_index, host_name, &tmp).await.map_err(link_err)?;
        progress.renamed = true;
        self.links.move_to(host_index, &tmp, netns).await.map_err(link_err)?;
        progress.moved = true;
        let arrived = pod.get(&tmp).await.map_err(link_err)?.ok_or_else(|| {
            CniError::new(code::LINK, format!("VF netdev {tmp} did not arrive in {}", netns.path().display()))
        })?;
        let index = arrived.index;
        pod.rename(index, &tmp, want.ifname).await.map_err(link_err)?;
        progress.named = true;
        if let Some(mac) = want.mac {
            pod.set_mac(index, want.ifname, mac).await.map_err(link_err)?;
        }
        if let Some(mtu) = want.mtu {
            pod.set_mtu(index, want.ifname, mtu).await.map_err(link_err)?;
        }
        pod.set_up(index, want.ifname, true).await.map_err(link_err)?;
        Ok(index)
    }

    /// Undo a [`Host::move_into`] of VF `pci` that got as far as `progress`: the VF back in the
    /// host as it was.
    #[allow(clippy::too_many_arguments)]
    pub async fn undo_move(
        &self,
        netns: &Netns,
        pod: &Links,
        pci: &str,
        host_index: u32,
        ifname: &str,
        original: &OriginalState,
        progress: &MoveProgress,
    ) -> Result<(), CniError> {
        let tmp = temp_name(pci);
        if progress.moved {
            let current = if progress.named { ifname } else { tmp.as_str() };
            match pod.get(current).await {
                Ok(Some(l)) => self.return_to_host(pod, l.index, current, pci, original).await,
                Ok(None) => Err(CniError::new(code::LINK, format!("{current} is not in {}", netns.path().display()))),
                Err(e) => Err(link_err(e)),
            }
        } else if progress.renamed {
            self.host_restore(host_index, &tmp, original).await
        } else if progress.down && original.up {
            self.links.set_up(host_index, &original.host_ifname, true).await.map_err(link_err)
        } else {
            Ok(())
        }
    }

    /// The VF `current` (index `index` in the pod, whose netlink calls are `pod`) back to the
    /// host under its original name, MAC, MTU and up state.
    pub async fn return_to_host(
        &self,
        pod: &Links,
        index: u32,
        current: &str,
        pci: &str,
        original: &OriginalState,
    ) -> Result<(), CniError> {
        let tmp = temp_name(pci);
        pod.set_up(index, current, false).await.map_err(link_err)?;
        if current != tmp {
            pod.rename(index, current, &tmp).await.map_err(link_err)?;
        }
        pod.move_to(index, &tmp, &self.netns).await.map_err(link_err)?;
        let back = self.links.get(&tmp).await.map_err(link_err)?.ok_or_else(|| {
            CniError::new(code::LINK, format!("VF {pci} ({tmp}) did not arrive in the host network namespace"))
        })?;
        self.host_restore(back.index, &tmp, original).await
    }

    /// In the host: link `index`, named `current`, gets its original name, MTU, MAC and up state.
    pub async fn host_restore(&self, index: u32, current: &str, original: &OriginalState) -> Result<(), CniError> {
        let name = &original.host_ifname;
        if current != name {
            self.links.set_up(index, current, false).await.map_err(link_err)?;
            self.links.rename(index, current, name).await.map_err(link_err)?;
        }
        if let Some(now) = self.links.get(name).await.map_err(link_err)? {
            if now.mtu != original.mtu {
                self.links.set_mtu(index, name, original.mtu).await.map_err(link_err)?;
            }
            if let Some(mac) = &original.mac
                && now.mac.as_ref() != Some(mac)
            {
                self.links.set_mac(index, name, mac).await.map_err(link_err)?;
            }
        }
        if original.up {
            self.links.set_up(index, name, true).await.map_err(link_err)?;
        }
        Ok(())
    }

    /// VF `pci`, named `ifname` in the pod (netlink calls `pod`), back to the host as
    /// `original`; or where it is when it is not in the pod.
    pub async fn take_back(
        &self,
        pod: &Links,
        pci: &str,
        ifname: &str,
        original: &OriginalState,
    ) -> Result<TakenBack, CniError> {
        match pod.get(ifname).await {
            Ok(Some(l)) => self.return_to_host(pod, l.index, ifname, pci, original).await.map(|()| TakenBack::Returned),
            Ok(None) => match self.links.get(&original.host_ifname).await {
                Ok(Some(_)) => Ok(TakenBack::AlreadyHome),
                _ => Ok(TakenBack::Missing),
            },
            Err(e) => Err(link_err(e)),
        }
    }

    /// After the pod's namespace is gone, the kernel has put a physical VF back in the host under
    /// its pod name (or `dev<N>`): give it its original name, MTU, MAC and up state again, as far
    /// as sysfs under `sysfs_root` shows it. Nothing to do (`Ok`) when sysfs shows no netdev or
    /// the netdev is not a link here.
    pub async fn rename_back(&self, sysfs_root: &Path, pci: &str, original: &OriginalState) -> Result<(), CniError> {
        let root = SysfsRoot::new(sysfs_root);
        let Ok((now, _)) = read_vf(&root, pci) else { return Ok(()) };
        let Some(name) = now.function.netdev else { return Ok(()) };
        if let Ok(Some(l)) = self.links.get(&name).await
            && let Err(e) = self.host_restore(l.index, &name, original).await
        {
            return Err(CniError::new(e.code, format!("renaming {name} back to {}: {e}", original.host_ifname)));
        }
        Ok(())
    }

    /// The whole move of VF `pci` (link `host_index`, state `original`) into `netns` as `want`,
    /// up, with `addresses`; its link as the pod sees it. Everything is undone when a step fails
    /// (the error is the step's; an undo that fails too is added to its details).
    #[allow(clippy::too_many_arguments)]
    pub async fn attach(
        &self,
        netns: &Netns,
        pod: &Links,
        pci: &str,
        host_index: u32,
        original: &OriginalState,
        want: &PodLink<'_>,
        addresses: &[IpNet],
    ) -> Result<Link, CniError> {
        let mut progress = MoveProgress::default();
        let done = async {
            let index = self.move_into(netns, pod, pci, host_index, original, want, &mut progress).await?;
            for a in addresses {
                pod.add_address(index, want.ifname, *a).await.map_err(link_err)?;
            }
            pod.get(want.ifname).await.map_err(link_err)?.ok_or_else(|| {
                CniError::new(code::LINK, format!("{} vanished from {}", want.ifname, netns.path().display()))
            })
        }
        .await;
        match done {
            Ok(link) => Ok(link),
            Err(e) => match self.undo_move(netns, pod, pci, host_index, want.ifname, original, &progress).await {
                Ok(()) => Err(e),
                Err(u) => {
                    let details = format!("returning VF {pci} to the host failed too: {u}");
                    let details = if e.details.is_empty() { details } else { format!("{}; {details}", e.details) };
                    Err(CniError { details, ..e })
                }
            },
        }
    }

    /// The reverse of [`Host::attach`]: VF `pci`, named `ifname` in the namespace at `netns_path`,
    /// back to the host as `original`. When the namespace is gone, the VF is found through sysfs
    /// under `sysfs_root` and renamed back ([`Host::rename_back`]). Idempotent: a VF already home
    /// is left alone.
    pub async fn detach(
        &self,
        netns_path: &Path,
        sysfs_root: &Path,
        pci: &str,
        ifname: &str,
        original: &OriginalState,
    ) -> Result<TakenBack, CniError> {
        match Netns::open(netns_path) {
            Ok(ns) => {
                if ns.same_as(&self.netns) {
                    return Err(CniError::new(
                        code::INVALID_ENV,
                        format!("{} is the host's own network namespace", netns_path.display()),
                    ));
                }
                let pod = ns.links().map_err(link_err)?;
                match self.take_back(&pod, pci, ifname, original).await? {
                    TakenBack::Missing => {
                        // Not in the pod under its name: maybe still under the temporary name
                        // (a move cut short), in the pod or in the host.
                        let tmp = temp_name(pci);
                        if let Some(l) = pod.get(&tmp).await.map_err(link_err)? {
                            self.return_to_host(&pod, l.index, &tmp, pci, original).await?;
                            return Ok(TakenBack::Returned);
                        }
                        if let Some(l) = self.links.get(&tmp).await.map_err(link_err)? {
                            self.host_restore(l.index, &tmp, original).await?;
                            return Ok(TakenBack::Returned);
                        }
                        Ok(TakenBack::Missing)
                    }
                    other => Ok(other),
                }
            }
            Err(_) => {
                self.rename_back(sysfs_root, pci, original).await?;
                match self.links.get(&original.host_ifname).await {
                    Ok(Some(_)) => Ok(TakenBack::AlreadyHome),
                    _ => Ok(TakenBack::Missing),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_fit_and_differ_per_vf() {
        let a = temp_name("0000:3b:00.2");
        let b = temp_name("0000:3b:00.3");
        assert_ne!(a, b);
        assert!(a.len() <= 15 && a.starts_with("wcni"), "{a}");
        assert_eq!(a, temp_name("0000:3b:00.2"));
    }
}
