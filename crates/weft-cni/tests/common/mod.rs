//! Test support: real network namespaces and veth pairs (a veth's host end stands in for a VF's
//! netdev; this machine has no SR-IOV), a fake sysfs tree naming them as VFs, and the weft-cni
//! executable run as a runtime runs it. Every namespace and link a test makes is removed by a guard
//! when the test ends, pass or fail. Names are unique per process and test.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use weft_topology::discover::FakeSriovTree;

/// The weft-cni executable.
pub const BIN: &str = env!("CARGO_BIN_EXE_weft-cni");
/// Where Debian's containernetworking-plugins put the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
static BUS: AtomicU32 = AtomicU32::new(0);

// Each test binary uses a different part of the shared netns support.
#[allow(unused_imports)]
pub use weft_testkit::netns::{NetnsGuard, VethGuard, can_netns, have, ip, ip_ok, unique};

/// [`can_netns`] and Debian's host-local IPAM plugin; a skip through `weft_testkit::require` when not.
pub fn can_host_local() -> bool {
    can_netns()
        && weft_testkit::require(
            Path::new(CNI_BIN_DIR).join("host-local").exists(),
            format!("{CNI_BIN_DIR}/host-local (apt-get install containernetworking-plugins)"),
        )
}

/// A link as `ip -j link` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkView {
    /// Name.
    pub name: String,
    /// MAC.
    pub mac: String,
    /// MTU.
    pub mtu: u64,
    /// Administratively up.
    pub up: bool,
}

/// The link `name` in the host (`netns` None) or in namespace `netns`, if it exists.
pub fn link(name: &str, netns: Option<&str>) -> Option<LinkView> {
    let mut args = vec!["-j"];
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["link", "show", "dev", name]);
    let out = ip(&args);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let l = v.get(0)?;
    Some(LinkView {
        name: l["ifname"].as_str()?.to_string(),
        mac: l["address"].as_str().unwrap_or_default().to_string(),
        mtu: l["mtu"].as_u64().unwrap_or_default(),
        up: l["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP")),
    })
}

/// The addresses (`a.b.c.d/n`) of `name` in `netns`.
pub fn addresses(name: &str, netns: &str) -> Vec<String> {
    let out = ip(&["-j", "-n", netns, "addr", "show", "dev", name]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v.get(0)
        .and_then(|l| l["addr_info"].as_array())
        .map(|a| a.iter().map(|i| format!("{}/{}", i["local"].as_str().unwrap_or_default(), i["prefixlen"])).collect())
        .unwrap_or_default()
}

/// Every link name in `netns`.
pub fn link_names(netns: &str) -> Vec<String> {
    let out = ip(&["-j", "-n", netns, "link", "show"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| a.iter().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Run weft-cni (or `binary`) with `env` and `stdin`: (stdout as JSON or Null, exit status success).
pub fn exec_bin(binary: &str, env: &[(&str, String)], stdin: &Value) -> (Value, bool, String) {
    let mut cmd = Command::new(binary);
    for k in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning the plugin");
    {
        use std::io::Write;
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin.to_string().as_bytes()).expect("writing stdin");
    }
    let out = child.wait_with_output().expect("waiting for the plugin");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (value, out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// Run weft-cni.
pub fn exec(env: &[(&str, String)], stdin: &Value) -> (Value, bool, String) {
    exec_bin(BIN, env, stdin)
}

/// The CNI environment of a call.
pub fn cni_env(command: &str, container: &str, netns: Option<&str>, ifname: &str) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", container.to_string()),
        ("CNI_IFNAME", ifname.to_string()),
        ("CNI_PATH", CNI_BIN_DIR.to_string()),
    ];
    if let Some(ns) = netns {
        env.push(("CNI_NETNS", ns.to_string()));
    }
    env
}

/// A node for one test: a temporary directory with a fake sysfs, a cache and a host-local store,
/// VFs that are real veth host ends, and namespaces for pods.
pub struct Node {
    /// The temporary directory.
    pub dir: tempfile::TempDir,
    /// The fake sysfs.
    pub tree: FakeSriovTree,
    /// The VFs: (PCI address, veth).
    pub vfs: Vec<(String, VethGuard)>,
    /// The PF's netdev name in the fake sysfs.
    pub pf_netdev: String,
}

impl Node {
    /// A node with `n` VFs on one PF whose netdev is `pf_netdev` (a real link or not, as the test
    /// needs).
    ///
    /// Every node gets PCI addresses of its own (domain from the process id, bus from a counter):
    /// weft-cni names a moving VF after its PCI address, which is unique on a real node, and the
    /// tests' nodes share the one host network namespace.
    pub fn new(n: u32, pf_netdev: &str) -> Node {
        assert!(n <= 6, "one PF's functions 2-7 hold at most 6 VFs");
        let dir = tempfile::tempdir().expect("temp dir");
        let tree = FakeSriovTree::new(&dir.path().join("sysfs"));
        let domain = std::process::id() % 0xffff;
        let bus = BUS.fetch_add(1, Ordering::Relaxed) % 0x100;
        let pf_pci = format!("{domain:04x}:{bus:02x}:00.0");
        tree.pf(&pf_pci, &[&format!("{domain:04x}:00:02.0")], pf_netdev, 0);
        let mut vfs = Vec::new();
        for i in 0..n {
            let veth = VethGuard::new("wcv");
            let pci = format!("{domain:04x}:{bus:02x}:00.{}", i + 2);
            tree.vf(&pf_pci, i, &pci, Some(&veth.name));
            vfs.push((pci, veth));
        }
        Node { dir, tree, vfs, pf_netdev: pf_netdev.to_string() }
    }

    /// The cache directory.
    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// The host-local data directory.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }

    /// Addresses host-local holds for network `name`.
    pub fn held_ips(&self, network: &str) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.ipam_dir().join(network)) else { return Vec::new() };
        let mut v: Vec<String> = rd
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        v.sort();
        v
    }

    /// A configuration for VF `i` with host-local over `subnet`; `extra` keys are merged in.
    pub fn conf(&self, version: &str, network: &str, vf: Option<usize>, subnet: &str, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": version,
            "name": network,
            "type": "weft-cni",
            "sysfsRoot": self.dir.path().join("sysfs"),
            "cacheDir": self.cache(),
            "ipam": {"type": "host-local", "dataDir": self.ipam_dir(), "ranges": [[{"subnet": subnet}]]},
        });
        if let Some(i) = vf {
            c["deviceID"] = json!(self.vfs[i].0);
        }
        if let (Value::Object(m), Value::Object(e)) = (&mut c, extra) {
            m.extend(e);
        }
        c
    }

    /// The cached attachment files.
    pub fn cached(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.cache()) else { return Vec::new() };
        let mut v: Vec<String> = rd
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".json"))
            .collect();
        v.sort();
        v
    }

    /// The allocation record of VF `i`, if any.
    pub fn record(&self, i: usize) -> Option<String> {
        std::fs::read_to_string(self.cache().join("pci").join(&self.vfs[i].0)).ok()
    }
}

/// `prevResult`-style map from `ip -j` for assertions.
pub fn as_map(v: &Value) -> BTreeMap<String, Value> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
}
