//! ADD, DEL, CHECK, GC and STATUS.
//!
//! ADD, per VF, in sriov-cni's order (reference §3), each step undone if a later one fails:
//!
//! 1. the VF's lock (`<cacheDir>/pci/<pci>.lock`, bounded wait → code 11), taken for every VF of
//!    the attachment in PCI-address order before any work;
//! 2. its allocation record: refused while the recorded netns exists, removed when it is gone;
//! 3. its original state: host name, MAC, MTU, up; and, when ADD will change them, the PF-side
//!    VLAN/QoS/protocol and administrative MAC;
//! 4. VLAN and MAC through the PF ([`PfControl`]);
//! 5. into the pod: down, renamed to a temporary name in the host, moved, renamed to its name in
//!    the pod (so neither namespace ever sees a clash), MAC, MTU, up;
//! 6. IPAM ADD (IPAM DEL when anything after it fails, or when it fails itself), addresses and
//!    routes in the pod;
//! 7. the cache file and the allocation record.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use weft_net::config::resource_name;
use weft_net::vif::Vif;

pub use crate::attach::temp_name;
use crate::attach::{Host, MoveProgress, PodLink, TakenBack};
use crate::conf::NetConf;
use crate::env::CniEnv;
use crate::error::{CniError, code};
use crate::ipam::{IpamCtx, Target};
use crate::net::{LinkError, Links, Netns};
use crate::pf::{PfControl, PfError};
use crate::podres;
use crate::result::{CniResult, Interface, IpConfig, parse_cidr};
use crate::state::{ATTACHMENT_FORMAT, Applied, AttachedVf, Attachment, OriginalState, PodRef, StateDir};

fn link_err(e: LinkError) -> CniError {
    CniError::new(code::LINK, e.to_string())
}

fn pf_err(e: PfError) -> CniError {
    CniError::new(code::PF_CONTROL, e.to_string())
}

/// Several errors as one: the first one's code, every message.
fn combine(mut errors: Vec<CniError>) -> Result<(), CniError> {
    if errors.is_empty() {
        return Ok(());
    }
    let first = errors.remove(0);
    if errors.is_empty() {
        return Err(first);
    }
    let rest: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let details =
        if first.details.is_empty() { rest.join("; ") } else { format!("{}; {}", first.details, rest.join("; ")) };
    Err(CniError { details, ..first })
}

/// How far one VF's ADD got (what undo must reverse).
#[derive(Debug, Default)]
struct Progress {
    pf_vlan: bool,
    pf_mac: bool,
    link: MoveProgress,
    ipam: bool,
}

/// One VF to attach.
struct Job<'a> {
    pci: &'a str,
    ifname: &'a str,
    vf_index: u32,
    pf_pci: String,
    pf_netdev: Option<String>,
    rdma: Option<String>,
    host_index: u32,
    original: OriginalState,
}

/// One invocation's plugin: configuration, environment, the PF seam, the host's netlink.
pub struct Plugin<'a, P: PfControl> {
    env: &'a CniEnv,
    conf: &'a NetConf,
    stdin: &'a [u8],
    pf: &'a P,
    host: Host,
    state: StateDir,
}

impl<'a, P: PfControl> Plugin<'a, P> {
    /// Set up for one invocation. Must be called within a tokio runtime (netlink).
    pub fn new(env: &'a CniEnv, conf: &'a NetConf, stdin: &'a [u8], pf: &'a P) -> Result<Plugin<'a, P>, CniError> {
        let host = Host::new()?;
        Ok(Plugin { env, conf, stdin, pf, host, state: StateDir::new(&conf.cache_dir) })
    }

    fn ipam(&self) -> IpamCtx<'_> {
        IpamCtx { conf: self.conf, env: self.env, stdin: self.stdin }
    }

    fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.conf.lock_timeout_ms)
    }

    /// ADD: the result, `prevResult` with this attachment's interfaces, addresses and routes added.
    pub async fn add(&self) -> Result<CniResult, CniError> {
        let (cid, ifname) = (self.env.container_id(), self.env.ifname());
        let netns_path = self.env.netns.clone().ok_or_else(|| CniError::env("CNI_NETNS", "missing"))?;
        let netns = Netns::open(&netns_path).map_err(|e| CniError::env("CNI_NETNS", e))?;
        if netns.same_as(self.host.netns()) {
            return Err(CniError::env(
                "CNI_NETNS",
                format!("{} is the plugin's own network namespace", netns_path.display()),
            ));
        }
        if self.state.load(cid, ifname)?.is_some() {
            return Err(CniError::new(
                code::VF_IN_USE,
                format!(
                    "attachment ({cid}, {ifname}) is already set up ({}); DEL it first",
                    self.state.attachment_path(cid, ifname).display()
                ),
            ));
        }
        let pod = netns.links().map_err(link_err)?;
        let mut result = self.conf.prev_result.clone().unwrap_or_default();
        let targets = self.targets(&netns, &pod).await?;
        if targets.is_empty() {
            return Ok(result);
        }
        if targets.len() > 1 && self.conf.mac.is_some() {
            return Err(CniError::config(
                "mac",
                format!("one MAC cannot go to the {} VFs this pod holds", targets.len()),
            ));
        }
        let mut locks = Vec::new();
        let mut order: Vec<&str> = targets.iter().map(|(p, _)| p.as_str()).collect();
        order.sort_unstable();
        for pci in order {
            locks.push(self.state.lock_pci(pci, self.lock_timeout())?);
        }
        let mut attached: Vec<(AttachedVf, Option<CniResult>)> = Vec::new();
        for (pci, name) in &targets {
            match self.attach(&netns, &pod, pci, name).await {
                Ok(done) => attached.push(done),
                Err(e) => {
                    self.undo_attached(&netns, &pod, attached.iter().map(|(v, _)| v)).await;
                    return Err(e);
                }
            }
        }
        let attachment = Attachment {
            format: ATTACHMENT_FORMAT.to_string(),
            container_id: cid.to_string(),
            ifname: ifname.to_string(),
            netns: netns_path.display().to_string(),
            network: self.conf.name.clone(),
            pod: PodRef {
                namespace: self.env.args.pod_namespace.clone(),
                name: self.env.args.pod_name.clone(),
                uid: self.env.args.pod_uid.clone(),
            },
            vfs: attached.iter().map(|(v, _)| v.clone()).collect(),
        };
        let saved = attachment
            .vfs
            .iter()
            .try_for_each(|v| self.state.write_pci_record(&v.pci_address, &netns_path))
            .and_then(|()| self.state.save(&attachment));
        if let Err(e) = saved {
            for v in &attachment.vfs {
                let _ = self.state.remove_pci_record(&v.pci_address);
            }
            let _ = self.state.remove(cid, ifname);
            self.undo_attached(&netns, &pod, attachment.vfs.iter()).await;
            return Err(e);
        }
        drop(locks);
        for (vf, ipam) in attached {
            let index = result.interfaces.len();
            result.interfaces.push(Interface {
                name: vf.ifname.clone(),
                mac: vf.vif.mac.clone(),
                mtu: vf.vif.mtu,
                sandbox: Some(netns_path.display().to_string()),
                socket_path: None,
                pci_id: Some(vf.pci_address.clone()),
            });
            if let Some(r) = ipam {
                result.ips.extend(r.ips.into_iter().map(|ip| IpConfig { interface: Some(index), ..ip }));
                result.routes.extend(r.routes);
                if result.dns.is_empty() {
                    result.dns = r.dns;
                }
            }
        }
        if let Some(dns) = &self.conf.dns {
            result.dns = dns.clone();
        }
        result.cni_version = self.conf.version.to_string();
        Ok(result)
    }

    /// The VFs of this ADD and their names in the pod: the `deviceID` as `CNI_IFNAME`, or (chained
    /// mode) the pod's devices of `sriov.weft.io/<physnet>` not attached to it yet, named from
    /// `interfaceNames` or `net1`, `net2`, … skipping names the pod already uses.
    async fn targets(&self, netns: &Netns, pod: &Links) -> Result<Vec<(String, String)>, CniError> {
        if let Some(pci) = &self.conf.device_id {
            return Ok(vec![(pci.clone(), self.env.ifname().to_string())]);
        }
        let physnet = self.conf.physnet.as_deref().ok_or_else(|| {
            CniError::config(
                "deviceID",
                "missing: give deviceID (Multus injects it) or physnet (chained mode asks the kubelet for the pod's sriov.weft.io/<physnet> VFs)",
            )
        })?;
        let (Some(namespace), Some(name)) = (&self.env.args.pod_namespace, &self.env.args.pod_name) else {
            return Err(CniError::env(
                "CNI_ARGS",
                "chained mode (no deviceID) needs K8S_POD_NAMESPACE and K8S_POD_NAME",
            ));
        };
        let resource = resource_name(physnet);
        let devices = podres::pod_devices(&self.conf.pod_resources_socket, namespace, name, &resource).await?;
        let mut used: HashSet<String> = pod.names().await.map_err(link_err)?.into_iter().collect();
        let mut out = Vec::new();
        for pci in devices {
            if let Some(held) = self.state.pci_record(&pci)?
                && Netns::open(&held).is_ok_and(|h| h.same_as(netns))
            {
                continue;
            }
            let ifname = match self.conf.interface_names.get(&pci) {
                Some(n) => n.clone(),
                None => {
                    let mut i = 1;
                    while used.contains(&format!("net{i}")) {
                        i += 1;
                    }
                    format!("net{i}")
                }
            };
            used.insert(ifname.clone());
            out.push((pci, ifname));
        }
        Ok(out)
    }

    /// ADD of one VF; everything it did is undone when it fails.
    async fn attach(
        &self,
        netns: &Netns,
        pod: &Links,
        pci: &str,
        ifname: &str,
    ) -> Result<(AttachedVf, Option<CniResult>), CniError> {
        let located = self.host.locate(&self.conf.sysfs_root, pci)?;
        if let Some(held) = self.state.pci_record(pci)? {
            if Netns::alive(&held) {
                return Err(CniError::new(
                    code::VF_IN_USE,
                    format!("VF {pci} is allocated to the network namespace {}, which still exists", held.display()),
                ));
            }
            self.state.remove_pci_record(pci)?;
        }
        let link = self.host.host_link(pci, &located).await?;
        if pod.get(ifname).await.map_err(link_err)?.is_some() {
            return Err(CniError::new(
                code::LINK,
                format!("interface {ifname} already exists in {}", netns.path().display()),
            ));
        }
        let vf = located.vf;
        let mut job = Job {
            pci,
            ifname,
            vf_index: vf.index,
            pf_pci: vf.pf_pci_address.clone(),
            pf_netdev: located.pf_netdev,
            rdma: vf.function.rdma_device.clone(),
            host_index: link.index,
            original: OriginalState { host_ifname: link.name, mac: link.mac, mtu: link.mtu, up: link.up, pf: None },
        };
        let mut progress = Progress::default();
        match self.attach_steps(netns, pod, &mut job, &mut progress).await {
            Ok(done) => Ok(done),
            Err(e) => {
                self.undo(netns, pod, &job, &progress).await;
                Err(e)
            }
        }
    }

    async fn attach_steps(
        &self,
        netns: &Netns,
        pod: &Links,
        job: &mut Job<'_>,
        progress: &mut Progress,
    ) -> Result<(AttachedVf, Option<CniResult>), CniError> {
        let conf = self.conf;
        let mut applied = Applied::default();
        if conf.touches_pf() {
            let pf_name = job.pf_netdev.clone().ok_or_else(|| {
                CniError::new(
                    code::VF_UNUSABLE,
                    format!(
                        "PF {} of VF {} has no netdev in the host: VLAN and MAC are set through it",
                        job.pf_pci, job.pci
                    ),
                )
            })?;
            job.original.pf = Some(self.pf.vf_state(self.host.links(), &pf_name, job.vf_index).await.map_err(pf_err)?);
            if let Some(v) = conf.vlan {
                progress.pf_vlan = true;
                self.pf
                    .set_vlan(self.host.links(), &pf_name, job.vf_index, v.vlan, v.qos, v.proto)
                    .await
                    .map_err(pf_err)?;
                applied.vlan = Some(v);
            }
            if let Some(mac) = &conf.mac {
                progress.pf_mac = true;
                self.pf.set_mac(self.host.links(), &pf_name, job.vf_index, mac).await.map_err(pf_err)?;
                applied.mac = Some(mac.clone());
            }
        }
        let want = PodLink { ifname: job.ifname, mac: conf.mac.as_ref(), mtu: conf.mtu };
        let index =
            self.host.move_into(netns, pod, job.pci, job.host_index, &job.original, &want, &mut progress.link).await?;
        applied.mtu = conf.mtu;

        progress.ipam = true;
        let netns_text = netns.path().display().to_string();
        let target = Target { container_id: self.env.container_id(), netns: Some(&netns_text), ifname: job.ifname };
        let ipam = self.ipam().add(target)?;
        let mut ips = Vec::new();
        let mut gateways = Vec::new();
        if let Some(r) = &ipam {
            let apply = |e: LinkError| CniError::new(code::IPAM_APPLY, e.to_string());
            for ip in &r.ips {
                let net = parse_cidr(&ip.address).ok_or_else(|| {
                    CniError::new(code::IPAM_APPLY, format!("IPAM address '{}' is not a CIDR", ip.address))
                })?;
                pod.add_address(index, job.ifname, net).await.map_err(apply)?;
                ips.push(ip.address.clone());
                if let Some(g) = &ip.gateway {
                    gateways.push(g.clone());
                }
            }
            let gw: Vec<IpAddr> = gateways.iter().filter_map(|g| g.parse().ok()).collect();
            for route in &r.routes {
                pod.add_route(index, job.ifname, route, &gw).await.map_err(apply)?;
            }
        }
        let now = pod.get(job.ifname).await.map_err(link_err)?.ok_or_else(|| {
            CniError::new(code::LINK, format!("{} vanished from {}", job.ifname, netns.path().display()))
        })?;
        let vif = Vif {
            physnet: conf.physnet.clone().unwrap_or_else(|| conf.name.clone()),
            pci_address: job.pci.to_string(),
            pf_pci_address: Some(job.pf_pci.clone()),
            mac: now.mac.as_ref().map(ToString::to_string),
            ips,
            gateways,
            vlan: applied.vlan.map(|v| v.vlan).filter(|v| *v != 0),
            mtu: Some(now.mtu),
            rdma_device: job.rdma.clone(),
            network: Some(conf.name.clone()),
        };
        let vf = AttachedVf {
            pci_address: job.pci.to_string(),
            vf_index: job.vf_index,
            pf_netdev: job.pf_netdev.clone(),
            ifname: job.ifname.to_string(),
            original: job.original.clone(),
            applied,
            vif,
        };
        Ok((vf, ipam))
    }

    /// Undo a failed VF's ADD, in reverse; failures are reported on stderr (the first error is
    /// what the caller gets).
    async fn undo(&self, netns: &Netns, pod: &Links, job: &Job<'_>, progress: &Progress) {
        let netns_text = netns.path().display().to_string();
        if progress.ipam {
            let target = Target { container_id: self.env.container_id(), netns: Some(&netns_text), ifname: job.ifname };
            if let Err(e) = self.ipam().del(target) {
                eprintln!("weft-cni: undoing ADD of VF {}: IPAM DEL: {e}", job.pci);
            }
        }
        let restored =
            self.host.undo_move(netns, pod, job.pci, job.host_index, job.ifname, &job.original, &progress.link).await;
        if let Err(e) = restored {
            eprintln!("weft-cni: undoing ADD of VF {}: returning it to the host: {e}", job.pci);
        }
        let applied = Applied {
            vlan: progress.pf_vlan.then_some(self.conf.vlan).flatten(),
            mac: progress.pf_mac.then(|| self.conf.mac.clone()).flatten(),
            mtu: None,
        };
        if let Err(e) = self.restore_pf(job.pci, job.vf_index, job.pf_netdev.as_deref(), &job.original, &applied).await
        {
            eprintln!("weft-cni: undoing ADD of VF {}: {e}", job.pci);
        }
    }

    /// Undo VFs whose ADD had completed (a later VF of the same attachment failed).
    async fn undo_attached(&self, netns: &Netns, pod: &Links, vfs: impl DoubleEndedIterator<Item = &AttachedVf>) {
        let netns_text = netns.path().display().to_string();
        for vf in vfs.rev() {
            let target = Target { container_id: self.env.container_id(), netns: Some(&netns_text), ifname: &vf.ifname };
            if let Err(e) = self.ipam().del(target) {
                eprintln!("weft-cni: undoing ADD of VF {}: IPAM DEL: {e}", vf.pci_address);
            }
            if let Err(e) = self.release_vf(pod, netns, vf).await {
                eprintln!("weft-cni: undoing ADD of VF {}: {e}", vf.pci_address);
            }
        }
    }

    /// The PF-side settings ADD `applied` back to `original`.
    async fn restore_pf(
        &self,
        pci: &str,
        vf_index: u32,
        pf_netdev: Option<&str>,
        original: &OriginalState,
        applied: &Applied,
    ) -> Result<(), CniError> {
        if applied.vlan.is_none() && applied.mac.is_none() {
            return Ok(());
        }
        let (Some(pf), Some(before)) = (pf_netdev, &original.pf) else {
            return Err(CniError::new(
                code::PF_CONTROL,
                format!("VF {pci}: no PF netdev or original PF-side state to restore"),
            ));
        };
        let mut errors = Vec::new();
        if applied.mac.is_some()
            && let Some(mac) = &before.admin_mac
            && let Err(e) = self.pf.set_mac(self.host.links(), pf, vf_index, mac).await
        {
            errors.push(pf_err(e));
        }
        if applied.vlan.is_some()
            && let Err(e) =
                self.pf.set_vlan(self.host.links(), pf, vf_index, before.vlan, before.qos, before.proto).await
        {
            errors.push(pf_err(e));
        }
        combine(errors)
    }

    /// One attached VF back to the host (its PF-side settings restored), from `pod`.
    async fn release_vf(&self, pod: &Links, netns: &Netns, vf: &AttachedVf) -> Result<(), CniError> {
        let mut errors = Vec::new();
        match self.host.take_back(pod, &vf.pci_address, &vf.ifname, &vf.original).await {
            Ok(TakenBack::Returned | TakenBack::AlreadyHome) => {}
            Ok(TakenBack::Missing) => eprintln!(
                "weft-cni: VF {}: {} is not in {} and {} is not in the host",
                vf.pci_address,
                vf.ifname,
                netns.path().display(),
                vf.original.host_ifname
            ),
            Err(e) => errors.push(e),
        }
        if let Err(e) =
            self.restore_pf(&vf.pci_address, vf.vf_index, vf.pf_netdev.as_deref(), &vf.original, &vf.applied).await
        {
            errors.push(e);
        }
        combine(errors)
    }

    /// After the pod's namespace is gone, the kernel has put a physical VF back in the host under
    /// its pod name (or `dev<N>`); give it its original name and MTU again, as far as sysfs shows it.
    async fn rename_back(&self, vf: &AttachedVf) {
        if let Err(e) = self.host.rename_back(&self.conf.sysfs_root, &vf.pci_address, &vf.original).await {
            eprintln!("weft-cni: VF {}: {e}", vf.pci_address);
        }
    }

    /// DEL of one attachment, also what GC does to a stale one: IPAM DEL per VF, each VF back to
    /// the host, PF-side settings restored, records and cache removed. State stays when anything
    /// failed, so a repeated DEL can finish the work.
    async fn release(&self, att: &Attachment, netns: Option<&Path>) -> Result<(), CniError> {
        let mut order: Vec<&str> = att.vfs.iter().map(|v| v.pci_address.as_str()).collect();
        order.sort_unstable();
        let mut locks = Vec::new();
        for pci in order {
            locks.push(self.state.lock_pci(pci, self.lock_timeout())?);
        }
        let netns_path: PathBuf = netns.map_or_else(|| PathBuf::from(&att.netns), Path::to_path_buf);
        let mut errors = Vec::new();
        for vf in att.vfs.iter().rev() {
            let target = Target { container_id: &att.container_id, netns: Some(&att.netns), ifname: &vf.ifname };
            if let Err(e) = self.ipam().del(target) {
                errors.push(e);
            }
        }
        match Netns::open(&netns_path) {
            Ok(ns) => {
                let pod = ns.links().map_err(link_err)?;
                for vf in att.vfs.iter().rev() {
                    if let Err(e) = self.release_vf(&pod, &ns, vf).await {
                        errors.push(e);
                    }
                }
            }
            Err(_) => {
                for vf in att.vfs.iter().rev() {
                    if let Err(e) = self
                        .restore_pf(&vf.pci_address, vf.vf_index, vf.pf_netdev.as_deref(), &vf.original, &vf.applied)
                        .await
                    {
                        errors.push(e);
                    }
                    self.rename_back(vf).await;
                }
            }
        }
        if !errors.is_empty() {
            return combine(errors);
        }
        for vf in &att.vfs {
            if self.state.pci_record(&vf.pci_address)?.is_some_and(|p| p == Path::new(&att.netns)) {
                self.state.remove_pci_record(&vf.pci_address)?;
            }
        }
        self.state.remove(&att.container_id, &att.ifname)?;
        drop(locks);
        Ok(())
    }

    /// DEL: idempotent. Without a cached attachment there is nothing of weft-cni's to undo; with a
    /// `deviceID` the IPAM plugin is still asked to release (the spec: DEL goes to delegates).
    pub async fn del(&self) -> Result<(), CniError> {
        let (cid, ifname) = (self.env.container_id(), self.env.ifname());
        match self.state.load(cid, ifname)? {
            Some(att) => self.release(&att, self.env.netns.as_deref()).await,
            None if self.conf.device_id.is_some() => {
                let netns = self.env.netns.as_ref().map(|p| p.display().to_string());
                self.ipam().del(Target { container_id: cid, netns: netns.as_deref(), ifname })
            }
            None => Ok(()),
        }
    }

    /// CHECK: every VF of the attachment is in the pod under its name, with the MAC (as
    /// `prevResult` lists it, else as ADD set it), MTU and addresses ADD gave it; then IPAM CHECK.
    pub async fn check(&self) -> Result<(), CniError> {
        let (cid, ifname) = (self.env.container_id(), self.env.ifname());
        let prev = self
            .conf
            .prev_result
            .as_ref()
            .ok_or_else(|| CniError::config("prevResult", "CHECK needs the ADD result as prevResult"))?;
        let Some(att) = self.state.load(cid, ifname)? else {
            if self.conf.device_id.is_none() && prev.interfaces.iter().all(|i| i.pci_id.is_none()) {
                // Chained mode that attached nothing.
                return Ok(());
            }
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("no attachment ({cid}, {ifname}) in {}: was ADD run?", self.state.root().display()),
            ));
        };
        let failed = |m: String| CniError::new(code::CHECK_FAILED, m);
        let netns_path = self.env.netns.clone().ok_or_else(|| CniError::env("CNI_NETNS", "missing"))?;
        let netns = Netns::open(&netns_path).map_err(|e| failed(e.to_string()))?;
        let pod = netns.links().map_err(link_err)?;
        let sandbox = netns_path.display().to_string();
        for vf in &att.vfs {
            let name = &vf.ifname;
            let listed =
                prev.interfaces.iter().find(|i| i.name == *name && i.sandbox.as_deref().is_none_or(|s| s == sandbox));
            let Some(listed) = listed else {
                return Err(failed(format!("prevResult does not list interface {name} in {sandbox}")));
            };
            let link = pod
                .get(name)
                .await
                .map_err(link_err)?
                .ok_or_else(|| failed(format!("{name} (VF {}) is not in {sandbox}", vf.pci_address)))?;
            let have_mac = link.mac.as_ref().map(ToString::to_string).unwrap_or_default();
            if let Some(want) = listed.mac.as_ref().or(vf.vif.mac.as_ref())
                && !want.eq_ignore_ascii_case(&have_mac)
            {
                return Err(failed(format!("{name}: MAC is {have_mac}, expected {want}")));
            }
            if let Some(want) = vf.vif.mtu
                && link.mtu != want
            {
                return Err(failed(format!("{name}: MTU is {}, expected {want}", link.mtu)));
            }
            let present = pod.addresses(link.index).await.map_err(link_err)?;
            let mut expected = Vec::new();
            for ip in &vf.vif.ips {
                let net: IpNet =
                    parse_cidr(ip).ok_or_else(|| failed(format!("{name}: cached address '{ip}' is not a CIDR")))?;
                if !present.contains(&net) {
                    return Err(failed(format!("{name}: address {ip} is missing")));
                }
                expected.push(net.addr());
            }
            let target = Target { container_id: cid, netns: Some(&sandbox), ifname: name };
            self.ipam().check(target, &expected)?;
        }
        Ok(())
    }

    /// GC: every cached attachment of this network that is not in `cni.dev/valid-attachments` is
    /// released as DEL would; then IPAM GC. Errors are collected, not stopped at.
    pub async fn gc(&self) -> Result<(), CniError> {
        let valid: HashSet<(&str, &str)> =
            self.conf.valid_attachments.iter().map(|a| (a.container_id.as_str(), a.ifname.as_str())).collect();
        let (attachments, unreadable) = self.state.list();
        for path in unreadable {
            eprintln!("weft-cni: GC: skipping unreadable {path}");
        }
        let mut errors = Vec::new();
        for att in attachments.iter().filter(|a| a.network == self.conf.name) {
            if valid.contains(&(att.container_id.as_str(), att.ifname.as_str())) {
                continue;
            }
            if let Err(e) = self.release(att, None).await {
                errors.push(e);
            }
        }
        let containers: HashSet<String> = self.conf.valid_attachments.iter().map(|a| a.container_id.clone()).collect();
        if let Err(e) = self.ipam().gc(&containers) {
            errors.push(e);
        }
        combine(errors)
    }
}

/// STATUS: ready when the state directory is writable and IPAM can serve (the delegate's own
/// STATUS, or a free address in weft's range); else code 50.
pub fn status(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let dir = &conf.cache_dir;
    let probe = dir.join(format!(".status.{}", std::process::id()));
    let writable = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&probe, b""))
        .and_then(|()| std::fs::remove_file(&probe));
    if let Err(e) = writable {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            format!("state directory {} is not writable: {e}", dir.display()),
        ));
    }
    let ipam = IpamCtx { conf, env, stdin };
    ipam.status()
        .map_err(|e| if e.code == code::NOT_AVAILABLE { e } else { CniError::new(code::NOT_AVAILABLE, e.to_string()) })
}
