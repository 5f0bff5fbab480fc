//! Test support for the attach hooks (the tests and the bench): real network namespaces and veth
//! pairs (a veth's host end stands in for a VF's netdev; no machine here has SR-IOV), a fake sysfs
//! naming the veths as VFs, prepared NICs, and rtnetlink looks into a namespace. Every namespace
//! and link is removed by a guard, pass or fail. Names are unique per process and call.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::IpNet;
use weft_cni::net::{Link, Netns};
use weft_nic_dra::prepared::{ClaimRef, PodNics, PreparedNic};
use weft_nri::api;
use weft_topology::discover::FakeSriovTree;

static BUS: AtomicU32 = AtomicU32::new(0);

// Each test binary uses a different part of the shared netns support.
#[allow(unused_imports)]
pub use weft_testkit::netns::{NetnsGuard, VethGuard, can_netns, ip, ip_ok, unique};

/// A node: a temporary directory with a fake sysfs in which `n` veth host ends are VFs of one PF.
pub struct Node {
    /// The temporary directory.
    pub dir: tempfile::TempDir,
    /// The VFs: (PCI address, veth).
    pub vfs: Vec<(String, VethGuard)>,
}

impl Node {
    /// `n` VFs (at most 6). PCI addresses are unique per process and node: the VF's temporary
    /// name while it moves comes from its PCI address, and the tests share the host namespace.
    pub fn new(n: u32) -> Node {
        assert!(n <= 6);
        let dir = tempfile::tempdir().expect("temp dir");
        let tree = FakeSriovTree::new(&dir.path().join("sysfs"));
        let domain = std::process::id() % 0xffff;
        let bus = BUS.fetch_add(1, Ordering::Relaxed) % 0x100;
        let pf_pci = format!("{domain:04x}:{bus:02x}:00.0");
        tree.pf(&pf_pci, &[&format!("{domain:04x}:00:02.0")], "wdpf0", 0);
        let mut vfs = Vec::new();
        for i in 0..n {
            let veth = VethGuard::new("wdv");
            let pci = format!("{domain:04x}:{bus:02x}:00.{}", i + 2);
            tree.vf(&pf_pci, i, &pci, Some(&veth.name));
            vfs.push((pci, veth));
        }
        Node { dir, vfs }
    }

    /// The fake sysfs root.
    pub fn sysfs(&self) -> PathBuf {
        self.dir.path().join("sysfs")
    }

    /// The hooks' record directory.
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

/// What the DRA side prepared, by pod UID.
#[derive(Default)]
pub struct Prepared(pub Mutex<HashMap<String, Vec<PreparedNic>>>);

impl Prepared {
    /// Pod `uid` holds `nics`.
    pub fn set(&self, uid: &str, nics: Vec<PreparedNic>) {
        self.0.lock().unwrap().insert(uid.to_string(), nics);
    }
}

impl PodNics for Prepared {
    fn nics_for_pod(&self, pod_uid: &str) -> Vec<PreparedNic> {
        self.0.lock().unwrap().get(pod_uid).cloned().unwrap_or_default()
    }
}

/// A NIC prepared for pod `uid` from `claim`: VF `pci` (index `index`), `address`.
pub fn nic(
    claim: &ClaimRef,
    uid: &str,
    (pci, index): (&str, u32),
    address: &str,
    interface_name: Option<&str>,
    mtu: Option<u32>,
) -> PreparedNic {
    PreparedNic {
        claim: claim.clone(),
        request: "nic".into(),
        pool: "node-a".into(),
        device: format!("vf-{index}"),
        pod_uids: vec![uid.to_string()],
        vf_pci: pci.to_string(),
        pf: "wdpf0".into(),
        vf_index: index,
        network: "fabric".into(),
        address: address.parse::<IpNet>().unwrap(),
        vlan: Some(100),
        interface_name: interface_name.map(str::to_string),
        mtu,
        aligned: None,
    }
}

/// A sandbox of pod `uid` (`ml/<name>`) in the namespace at `netns` (`None`: hostNetwork).
pub fn sandbox(uid: &str, name: &str, netns: Option<&str>) -> api::PodSandbox {
    let mut p = api::PodSandbox::new();
    p.id = format!("sb-{uid}");
    p.uid = uid.to_string();
    p.name = name.to_string();
    p.namespace = "ml".to_string();
    let mut linux = api::LinuxPodSandbox::new();
    let mut ipc = api::LinuxNamespace::new();
    ipc.type_ = "ipc".into();
    linux.namespaces.push(ipc);
    if let Some(path) = netns {
        let mut n = api::LinuxNamespace::new();
        n.type_ = "network".into();
        n.path = path.to_string();
        linux.namespaces.push(n);
    }
    p.linux = Some(linux).into();
    p
}

/// Link `name` in the namespace at `netns` (the host's with `None`), over rtnetlink. Must run
/// within a tokio runtime.
pub async fn link_in(netns: Option<&str>, name: &str) -> Option<Link> {
    let ns = match netns {
        Some(p) => Netns::open(Path::new(p)).unwrap(),
        None => Netns::current().unwrap(),
    };
    ns.links().unwrap().get(name).await.unwrap()
}

/// The addresses of link `name` in the namespace at `netns`.
pub async fn addresses_in(netns: &str, name: &str) -> Vec<IpNet> {
    let links = Netns::open(Path::new(netns)).unwrap().links().unwrap();
    let l = links.get(name).await.unwrap().expect("the link exists");
    links.addresses(l.index).await.unwrap()
}

/// Every link name in the namespace at `netns`.
pub async fn names_in(netns: &str) -> Vec<String> {
    Netns::open(Path::new(netns)).unwrap().links().unwrap().names().await.unwrap()
}
