//! Test support shared by the etcd tests and the benchmark: a real etcd on loopback, and a DNS
//! lookup that reads etcd the way CoreDNS's etcd plugin does.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use weft_dns::{EtcdStore, RecordStore, Stored};

/// Where Debian's `etcd-server` puts etcd.
pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// How long a test waits for anything before it fails as hung (not a timing assertion).
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Awaits `f`, failing with `what` if it hangs past [`HANG_GUARD`].
pub async fn guard<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Polls `check` (an etcd read) until it returns true, under the hang guard. etcd has no change
/// notification this test could use without a Watch client, so this polls; the assertion is the
/// state reached, never the time it took.
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    guard(what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// A single-member etcd on 127.0.0.1 with its own data directory and ephemeral ports, killed
/// (and its directory removed) on drop.
pub struct Etcd {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port").local_addr().expect("local addr").port()
}

impl Etcd {
    /// Starts etcd, or returns `None` when `/usr/bin/etcd` is missing (a skip through
    /// `weft_testkit::require`, a failure under `WEFT_TEST_REQUIRE_ALL=1`).
    pub async fn start() -> Option<Etcd> {
        if !weft_testkit::require(
            Path::new(ETCD_BIN).exists(),
            format!("{ETCD_BIN} (Debian package etcd-server; scripts/test-all.sh installs it)"),
        ) {
            return None;
        }
        // A port picked here may be taken before etcd binds it; then etcd exits and we try again.
        let mut last = String::new();
        for _ in 0..5 {
            match Etcd::try_start().await {
                Ok(e) => return Some(e),
                Err(why) => last = why,
            }
        }
        panic!("etcd did not start: {last}");
    }

    async fn try_start() -> Result<Etcd, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).map_err(|e| format!("log file: {e}"))?;
        let child = Command::new(ETCD_BIN)
            .args(["--name", "weft-test"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("weft-test={peer_url}")])
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("log file: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning {ETCD_BIN}: {e}"))?;
        let mut etcd = Etcd { child, dir, endpoint };
        let store = etcd.store();
        let ready = async {
            loop {
                if let Some(status) = etcd.child.try_wait().map_err(|e| e.to_string())? {
                    return Err(format!("etcd exited ({status}): {}", etcd.log()));
                }
                if store.get("/weft-test/ping").await.is_ok() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        match tokio::time::timeout(HANG_GUARD, ready).await {
            Ok(Ok(())) => Ok(etcd),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("etcd did not answer within {HANG_GUARD:?}: {}", etcd.log())),
        }
    }

    /// A client of this etcd.
    pub fn store(&self) -> EtcdStore {
        EtcdStore::connect(std::slice::from_ref(&self.endpoint), Duration::from_secs(5)).expect("endpoint")
    }

    /// The data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// etcd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CoreDNS's `msg.Service` (plugin/etcd/msg/service.go) as Go's `encoding/json` fills it: the
/// fields it declares, everything else ignored.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Service {
    pub host: String,
    pub port: i64,
    pub priority: i64,
    pub weight: i64,
    pub text: String,
    pub mail: bool,
    pub ttl: u32,
    pub targetstrip: i64,
    pub group: String,
}

/// One address CoreDNS would answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub key: String,
    pub ip: IpAddr,
    /// The JSON `ttl` (CoreDNS answers the smaller of it and the lease's clamped TTL).
    pub ttl: u32,
    pub lease: i64,
    /// The JSON `port` (0 when absent), which CoreDNS puts in SRV answers.
    pub port: i64,
}

/// The labels of `name` reversed under `path`, as CoreDNS's `msg.Path` joins them (Go's
/// `path.Join("/" + path + "/", labels...)`: empty and repeated separators cleaned away).
fn coredns_path(path: &str, labels: &[&str]) -> String {
    let parts: Vec<&str> = path.split('/').chain(labels.iter().copied()).filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// The A/AAAA answers CoreDNS's etcd plugin gives for `name` under `path` (e.g. `/skydns`), read as
/// `Etcd.Records` does (coredns 4b26cce, `plugin/etcd/etcd.go`, `msg/path.go`):
/// - the key is `path` + the name's labels reversed (`msg.PathWithWildcard`), cut before the first
///   label `*` or `any`, which are wildcards;
/// - a prefix Get on `key/`; only if that finds nothing, an exact Get on `key`;
/// - with a wildcard, only records whose key matches every other label of the whole name's path
///   (`loopNodes`: a key shorter than the name is skipped; a wildcard matches any segment);
/// - each value decoded as `msg.Service`; a `host` that parses as an IP is an A (IPv4) or AAAA
///   (IPv6) record. A value that does not decode fails the whole lookup, as in CoreDNS.
pub async fn coredns_lookup(store: &EtcdStore, path: &str, name: &str) -> Result<Vec<Answer>, String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_lowercase();
    let labels: Vec<&str> = name.split('.').rev().collect();
    let wildcard = labels.iter().position(|l| *l == "*" || *l == "any");
    let key = coredns_path(path, &labels[..wildcard.unwrap_or(labels.len())]);
    let mut kvs: Vec<Stored> = store.get_prefix(&format!("{key}/")).await.map_err(|e| e.to_string())?;
    if kvs.is_empty() {
        kvs = store.get(&key).await.map_err(|e| e.to_string())?.into_iter().collect();
    }
    if wildcard.is_some() {
        let whole = coredns_path(path, &labels);
        let name_parts: Vec<&str> = whole.split('/').collect();
        kvs.retain(|kv| {
            let key_parts: Vec<&str> = kv.key.split('/').collect();
            name_parts
                .iter()
                .enumerate()
                .all(|(i, n)| i < key_parts.len() && (*n == "*" || *n == "any" || key_parts[i] == *n))
        });
    }
    let mut out = Vec::new();
    for kv in kvs {
        let s: Service = serde_json::from_slice(&kv.value).map_err(|e| format!("{}: {e}", kv.key))?;
        if let Ok(ip) = s.host.parse::<IpAddr>() {
            out.push(Answer { key: kv.key, ip, ttl: s.ttl, lease: kv.lease, port: s.port });
        }
    }
    Ok(out)
}

/// CoreDNS's `msg.Domain`: a record's key turned back into a name. It drops exactly one leading
/// path segment (written for `/skydns`), so under a path of more segments the rest become labels.
pub fn coredns_domain(key: &str) -> String {
    let mut l: Vec<&str> = key.split('/').collect();
    if l.last() == Some(&"") {
        l.pop();
    }
    l[1..].reverse();
    format!("{}.", l[1..l.len() - 1].join("."))
}

/// The SRV answers CoreDNS's etcd plugin gives for `name` under `path` as (target, port), with
/// the address its additional section carries for each target, read as `plugin.SRV` does for
/// services whose `host` is an IP: the target is [`coredns_domain`] of the record's key, the port
/// is the JSON `port`, and a port of -1 is skipped.
pub async fn coredns_srv(store: &EtcdStore, path: &str, name: &str) -> Result<Vec<(String, i64, IpAddr)>, String> {
    let mut out = Vec::new();
    for a in coredns_lookup(store, path, name).await? {
        if a.port == -1 {
            continue;
        }
        out.push((coredns_domain(&a.key), a.port, a.ip));
    }
    Ok(out)
}
