//! A DNS record change moves traffic to the new peer set without loss, against a real DNS
//! server: dnsmasq on loopback, answering the vertex domain from a hosts file with a 1 s TTL.
//! The record first points at receiver A (127.0.0.2), then at receiver B (127.0.0.3, same port:
//! DNS A records carry no port); dnsmasq re-reads the file on SIGHUP.
//!
//! A second test serves SRV records (one target per receiver, each its own port), as CoreDNS's
//! etcd plugin does for records that carry a port.
//!
//! Needs `dnsmasq` (Debian: `apt-get install -y dnsmasq-base`). Without it the test skips
//! through `weft_testkit::require` (a failure under `WEFT_TEST_REQUIRE_ALL=1`).

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{Recorder, guard, msg, wait_until};
use weft_transport::resolve::{DnsPeers, Nameservers};
use weft_transport::{Backoff, PeerSource, Receiver, ReceiverConfig, Sender, SenderConfig, TcpBackend};

const DOMAIN: &str = "inference.video-net.video.default.vertexdomain.local";

fn dnsmasq_binary() -> Option<PathBuf> {
    ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"].iter().map(PathBuf::from).find(|p| p.exists())
}

/// dnsmasq as a child process, killed when dropped.
struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
}

impl Dnsmasq {
    /// Starts dnsmasq on a free loopback port with `extra` options and waits until it answers
    /// for `DOMAIN`.
    async fn start(bin: &Path, hosts: &Path, extra: &[String]) -> Self {
        for _ in 0..5 {
            // A free port: bind one, release it, hand it to dnsmasq (another try if it was
            // taken meanwhile and dnsmasq exits).
            let port = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("free port").port();
            let child = Command::new(bin)
                .args([
                    "--keep-in-foreground",
                    "--conf-file=/dev/null",
                    "--listen-address=127.0.0.1",
                    "--bind-interfaces",
                    "--no-resolv",
                    "--no-hosts",
                    "--local-ttl=1",
                    // Authoritative for the zone: unknown names are NXDOMAIN, not REFUSED.
                    "--local=/vertexdomain.local/",
                    "--log-facility=-",
                    "--pid-file",
                ])
                .arg(format!("--port={port}"))
                .arg(format!("--addn-hosts={}", hosts.display()))
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start dnsmasq");
            let mut dns = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) };
            let probe = DnsPeers::new(DOMAIN, 1, &Nameservers::Addrs(vec![dns.addr])).expect("resolver");
            let give_up = tokio::time::Instant::now() + support::DEADLINE;
            loop {
                if let Some(status) = dns.child.try_wait().expect("dnsmasq status") {
                    let mut err = String::new();
                    if let Some(mut e) = dns.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    eprintln!("dnsmasq on port {port} exited ({status}): {err}");
                    break;
                }
                if matches!(probe.resolve().await, Ok(set) if !set.addrs.is_empty()) {
                    return dns;
                }
                assert!(tokio::time::Instant::now() < give_up, "dnsmasq on port {port} never answered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("dnsmasq did not start on any of 5 ports");
    }

    fn reload(&self) {
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().expect("kill -HUP");
        assert!(status.success(), "SIGHUP to dnsmasq");
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_hosts(path: &Path, ip: &str) {
    // Written whole, then renamed over, so dnsmasq never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{ip} {DOMAIN}\n")).expect("write hosts");
    std::fs::rename(&tmp, path).expect("rename hosts");
}

/// Receivers A on 127.0.0.2 and B on 127.0.0.3 with one port.
async fn receivers(a: &Recorder, b: &Recorder) -> (Receiver, Receiver) {
    for _ in 0..20 {
        let ra = Receiver::bind(
            &TcpBackend::default(),
            "127.0.0.2:0".parse().expect("addr"),
            ReceiverConfig::default(),
            a.handler(),
        )
        .await
        .expect("bind A");
        let port = ra.local_addr().port();
        match Receiver::bind(
            &TcpBackend::default(),
            SocketAddr::from(([127, 0, 0, 3], port)),
            ReceiverConfig::default(),
            b.handler(),
        )
        .await
        {
            Ok(rb) => return (ra, rb),
            Err(e) => eprintln!("port {port} taken on 127.0.0.3 ({e}); trying another"),
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

/// dnsmasq's path, or `None` when it is not installed (a skip through `weft_testkit::require`).
fn dnsmasq() -> Option<PathBuf> {
    weft_testkit::require_ok(dnsmasq_binary().ok_or("dnsmasq (apt-get install -y dnsmasq-base)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_give_each_receiver_its_own_port() {
    let Some(bin) = dnsmasq() else { return };
    let rec_a = Recorder::default();
    let rec_b = Recorder::default();
    let a = Receiver::bind(
        &TcpBackend::default(),
        "127.0.0.2:0".parse().expect("addr"),
        ReceiverConfig::default(),
        rec_a.handler(),
    )
    .await
    .expect("bind A");
    let b = Receiver::bind(
        &TcpBackend::default(),
        "127.0.0.3:0".parse().expect("addr"),
        ReceiverConfig::default(),
        rec_b.handler(),
    )
    .await
    .expect("bind B");
    let (pa, pb) = (a.local_addr().port(), b.local_addr().port());
    let zero = "zero.video-net.video.default.vertexdomain.local";
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let hosts = dir.path().join("empty.hosts");
    std::fs::write(&hosts, "").expect("write hosts");
    // As CoreDNS answers for records with a port: one target per pod under the vertex domain,
    // each with its own port and address.
    let dns = Dnsmasq::start(
        &bin,
        &hosts,
        &[
            format!("--srv-host={DOMAIN},pod-a.{DOMAIN},{pa}"),
            format!("--srv-host={DOMAIN},pod-b.{DOMAIN},{pb}"),
            format!("--host-record=pod-a.{DOMAIN},127.0.0.2"),
            format!("--host-record=pod-b.{DOMAIN},127.0.0.3"),
            // A record without a port: CoreDNS answers port 0.
            format!("--srv-host={zero},pod-a.{DOMAIN},0"),
        ],
    )
    .await;
    let nameservers = Nameservers::Addrs(vec![dns.addr]);

    // The default port (1) is not used where the SRV record names one.
    let peers = DnsPeers::new(DOMAIN, 1, &nameservers).expect("resolver");
    let set = guard("SRV answer", peers.resolve()).await.expect("resolve");
    let mut want = vec![a.local_addr(), b.local_addr()];
    want.sort();
    assert_eq!(set.addrs, want, "each target at its own port");
    assert!(set.valid_until.is_some_and(|t| t <= std::time::Instant::now() + Duration::from_secs(1)), "1 s TTL");
    let fallback = DnsPeers::new(zero, pa, &nameservers).expect("resolver");
    let set = guard("SRV answer with port 0", fallback.resolve()).await.expect("resolve");
    assert_eq!(set.addrs, vec![a.local_addr()], "port 0 is the configured default");

    let sender = Sender::new(TcpBackend::default(), peers, SenderConfig::default());
    // Both links up first, or the first one up takes everything queued meanwhile.
    guard("a link to each target", sender.wait_for_links(2)).await;
    let mut handles = Vec::new();
    for i in 0..40 {
        handles.push(sender.send(msg(format!("m{i}"), 64)).await.expect("send"));
    }
    for h in handles {
        guard("ack", h.acked()).await.expect("acked");
    }
    assert_eq!(rec_a.distinct() + rec_b.distinct(), 40);
    assert!(rec_a.calls() > 0 && rec_b.calls() > 0, "both receivers, each on its port, took messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_record_change_moves_traffic_to_the_new_peers_without_loss() {
    let Some(bin) = dnsmasq() else { return };
    let rec_a = Recorder::default();
    let rec_b = Recorder::default();
    let (a, b) = receivers(&rec_a, &rec_b).await;
    let port = a.local_addr().port();

    let dir = tempfile::tempdir().expect("tempdir");
    // dnsmasq re-reads the file after dropping privileges (user nobody): let it read.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let hosts = dir.path().join("vertexdomain.hosts");
    write_hosts(&hosts, "127.0.0.2");
    let dns = Dnsmasq::start(&bin, &hosts, &[]).await;
    let nameservers = Nameservers::Addrs(vec![dns.addr]);

    let probe = DnsPeers::new(DOMAIN, port, &nameservers).expect("resolver");
    assert_eq!(probe.domain(), format!("{DOMAIN}."), "queried fully qualified");
    let first = guard("dnsmasq answers", probe.resolve()).await.expect("resolve");
    assert_eq!(first.addrs, vec![a.local_addr()]);
    let ttl_left =
        first.valid_until.expect("a DNS answer expires").saturating_duration_since(std::time::Instant::now());
    assert!(ttl_left <= Duration::from_secs(1), "the 1 s TTL is honoured: {ttl_left:?}");

    // A vertex with no pods: no records, an empty peer set rather than an error.
    let missing =
        DnsPeers::new("nothing.video-net.video.default.vertexdomain.local", port, &nameservers).expect("resolver");
    let none = guard("NXDOMAIN", missing.resolve()).await.expect("an empty set, not an error");
    assert!(none.addrs.is_empty() && none.valid_until.is_some(), "{none:?}");

    let sender = Sender::new(
        TcpBackend::default(),
        DnsPeers::new(DOMAIN, port, &nameservers).expect("resolver"),
        SenderConfig {
            min_resolve_interval: Duration::from_millis(100),
            backoff: Backoff { initial: Duration::from_millis(10), max: Duration::from_millis(200), jitter: 0.5 },
            ..SenderConfig::default()
        },
    );
    let mut sent = 0usize;
    let mut send_batch = async |n: usize| {
        let mut handles = Vec::new();
        for _ in 0..n {
            handles.push(sender.send(msg(format!("m{sent}"), 512)).await.expect("send"));
            sent += 1;
        }
        for h in handles {
            guard("ack", h.acked()).await.expect("acked");
        }
    };
    send_batch(50).await;
    assert_eq!(rec_a.calls(), 50);
    assert_eq!(rec_b.calls(), 0);

    // The record moves to B. Keep sending until the sender has re-resolved (at the TTL).
    write_hosts(&hosts, "127.0.0.3");
    dns.reload();
    let give_up = tokio::time::Instant::now() + support::DEADLINE;
    while sender.stats().peers != vec![b.local_addr()] {
        assert!(tokio::time::Instant::now() < give_up, "the sender never saw the new record");
        send_batch(5).await;
    }
    let a_before = rec_a.calls();
    send_batch(50).await;
    assert_eq!(rec_a.calls(), a_before, "nothing goes to the removed peer");
    wait_until("the link to A closed", || sender.stats().links.iter().all(|l| l.peer != a.local_addr())).await;

    // Nothing lost, nothing twice.
    let mut all = rec_a.counts();
    for (id, n) in rec_b.counts() {
        *all.entry(id).or_default() += n;
    }
    assert_eq!(all.len(), sent, "every message delivered");
    assert!(all.values().all(|n| *n == 1), "no message delivered twice");
    assert!(rec_b.calls() >= 50);
    let stats = sender.stats();
    assert_eq!(stats.acked as usize, sent);
    assert!(stats.resolutions >= 2, "{stats:?}");
}
