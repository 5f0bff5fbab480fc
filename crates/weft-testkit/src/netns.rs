//! Real network namespaces and veth pairs for tests that move links (weft-cni, the NIC DRA
//! driver's attach hooks): a veth's host end stands in for a VF's netdev, since no machine here
//! has SR-IOV. Every namespace and link is removed by a guard when the test ends, pass or fail.
//! Names are unique per process and call.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call: `<prefix><pid><n>`, at most 15 characters.
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!("{prefix}{}{n}", std::process::id() % 100_000);
    assert!(name.len() <= 15, "{name} is too long for an interface name");
    name
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Whether `cmd -V` runs.
pub fn have(cmd: &str) -> bool {
    Command::new(cmd).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Whether the test can make namespaces and links (root, `ip`); a skip through
/// [`crate::require`] when not.
pub fn can_netns() -> bool {
    crate::require(is_root(), "root, to create network namespaces and veth pairs")
        && crate::require(have("ip"), "iproute2's ip")
}

/// Run iproute2's `ip` with `args`.
pub fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("running ip")
}

/// Run `ip` and insist it succeeds.
pub fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A network namespace, deleted on drop.
pub struct NetnsGuard {
    /// Its name.
    pub name: String,
}

impl NetnsGuard {
    /// A new namespace.
    #[allow(clippy::new_without_default)]
    pub fn new() -> NetnsGuard {
        let name = unique("wtn");
        ip_ok(&["netns", "add", &name]);
        NetnsGuard { name }
    }

    /// Its path.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Delete it now (the drop is then a no-op).
    pub fn delete(&self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A veth pair in the host, removed on drop wherever its ends are (a namespace's removal takes
/// the ends inside it).
pub struct VethGuard {
    /// The end that plays the VF.
    pub name: String,
    /// The other end.
    pub peer: String,
}

impl VethGuard {
    /// A new pair, `name` up.
    pub fn new(prefix: &str) -> VethGuard {
        let name = unique(prefix);
        let peer = format!("{name}p");
        ip_ok(&["link", "add", &name, "type", "veth", "peer", "name", &peer]);
        ip_ok(&["link", "set", &name, "up"]);
        VethGuard { name, peer }
    }
}

impl Drop for VethGuard {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.peer]);
        let _ = ip(&["link", "del", &self.name]);
    }
}
