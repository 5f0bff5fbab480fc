//! Where a sender's peers are: a [`PeerSource`] answers with the peer addresses of one target
//! and until when they hold. [`StaticPeers`] is a fixed list; [`DnsPeers`] resolves a vertex
//! domain (`<vertex>.<numaNetwork>.<pipeline>.<namespace>.<zone>`, published by weft's DNS
//! registrar as CoreDNS etcd A records) with hickory-resolver.
//!
//! DNS details:
//! - The name is queried fully qualified (with a trailing dot), so the pod's `ndots:5` search
//!   list is never tried first.
//! - hickory's in-process cache keeps each answer for its TTL (10 s from the registrar); the
//!   answer's expiry is the [`PeerSet::valid_until`] the sender re-resolves at.
//! - [`PeerSource::invalidate`] clears the cache; the sender calls it when a connection to a
//!   resolved peer fails, so a pod that went away is dropped before its TTL runs out.
//! - A name with no records (NXDOMAIN or no A/AAAA) is an empty peer set, not an error: the
//!   vertex has no pods now. Other failures (timeouts, refused) are errors; the sender keeps
//!   its current peers and retries.
//! - **SRV first.** The domain is asked for SRV records; each target is a peer on the record's
//!   port. CoreDNS's etcd plugin answers SRV for the vertex domain itself: one target per pod
//!   (`<pod>.<vertex domain>`), the port from the record's `port` (which weft's registrar takes
//!   from the container port named `weft-transport`), the address in the additional section. A
//!   port of 0 (no port in the record) means the configured default. Targets whose address is
//!   not in the additional section are looked up; one that does not resolve is left out. SRV
//!   priority and weight are not used: every target is a peer and the sender's selection
//!   policy spreads the load. A target of `.` (RFC 2782: no service) is no peer.
//! - **A/AAAA otherwise.** When the name has no SRV records, its addresses are the peers, all
//!   on the configured port ([`crate::DEFAULT_PORT`] unless set).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig};
use hickory_resolver::lookup::SrvLookup;
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::{ResolveError as HickoryError, TokioResolver};

/// Environment variable with the vertex domains this vertex sends to, comma-separated (set by
/// weft's Pipeline webhook; the same name as `weft_pipeline::VERTEX_DOMAIN_TARGETS_ENV`).
pub const VERTEX_DOMAIN_TARGETS_ENV: &str = "VERTEX_DOMAIN_TARGETS";
/// Environment variable with the vertex's own domains, comma-separated.
pub const VERTEX_DOMAIN_ENV: &str = "VERTEX_DOMAIN";
/// Environment variable overriding the nameservers the DNS source asks: comma-separated
/// `ip` or `ip:port` (port 53 when left out). Unset: the system's (`/etc/resolv.conf`).
pub const NAMESERVERS_ENV: &str = "WEFT_TRANSPORT_NAMESERVERS";

/// The peers of one target as resolved now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSet {
    /// The peers, sorted, without repeats.
    pub addrs: Vec<SocketAddr>,
    /// When to resolve again; `None`: the set does not change by itself.
    pub valid_until: Option<Instant>,
}

impl PeerSet {
    /// A set from any list of addresses (sorted and deduplicated here).
    pub fn new(mut addrs: Vec<SocketAddr>, valid_until: Option<Instant>) -> Self {
        addrs.sort();
        addrs.dedup();
        Self { addrs, valid_until }
    }
}

/// Resolving failed; the sender keeps its current peers and tries again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("resolving {target}: {why}")]
pub struct ResolveError {
    /// The target (a domain or a description).
    pub target: String,
    /// What went wrong.
    pub why: String,
}

/// A source of peer addresses for one target.
pub trait PeerSource: Send + Sync + 'static {
    /// What is resolved, for logs.
    fn target(&self) -> String;
    /// The peers now.
    fn resolve(&self) -> impl Future<Output = Result<PeerSet, ResolveError>> + Send;
    /// A connection to a resolved peer failed: forget cached answers so the next
    /// [`resolve`](Self::resolve) asks afresh. Nothing by default.
    fn invalidate(&self) {}
}

/// A fixed list of peers (tests, and pipelines without DNS).
#[derive(Clone, Debug)]
pub struct StaticPeers {
    addrs: Vec<SocketAddr>,
}

impl StaticPeers {
    /// These peers, for ever.
    pub fn new(addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self { addrs: addrs.into_iter().collect() }
    }
}

impl PeerSource for StaticPeers {
    fn target(&self) -> String {
        format!("static peers {:?}", self.addrs)
    }

    async fn resolve(&self) -> Result<PeerSet, ResolveError> {
        Ok(PeerSet::new(self.addrs.clone(), None))
    }
}

/// A vertex domain resolved through DNS.
#[derive(Clone)]
pub struct DnsPeers {
    domain: String,
    port: u16,
    resolver: TokioResolver,
}

impl std::fmt::Debug for DnsPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsPeers").field("domain", &self.domain).field("port", &self.port).finish_non_exhaustive()
    }
}

/// Where [`DnsPeers`] sends its queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nameservers {
    /// The system's configuration (`/etc/resolv.conf`): in a pod, the cluster DNS.
    System,
    /// These servers, over UDP (TCP on truncation).
    Addrs(Vec<SocketAddr>),
}

impl Nameservers {
    /// [`NAMESERVERS_ENV`] when set, the system's otherwise.
    pub fn from_env() -> Result<Self, ResolveError> {
        match std::env::var(NAMESERVERS_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                Self::parse(&v).map_err(|why| ResolveError { target: NAMESERVERS_ENV.to_string(), why })
            }
            _ => Ok(Self::System),
        }
    }

    /// Comma-separated `ip` or `ip:port` (port 53 by default).
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut addrs = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let addr = match part.parse::<SocketAddr>() {
                Ok(a) => a,
                Err(_) => match part.parse::<IpAddr>() {
                    Ok(ip) => SocketAddr::new(ip, 53),
                    Err(_) => {
                        return Err(format!("nameserver '{part}' is neither an IP address nor ip:port"));
                    }
                },
            };
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err("no nameserver given".into());
        }
        Ok(Self::Addrs(addrs))
    }
}

impl DnsPeers {
    /// Resolves `domain` (with or without a trailing dot) to peers listening on `port`.
    pub fn new(domain: &str, port: u16, nameservers: &Nameservers) -> Result<Self, ResolveError> {
        let domain = fully_qualified(domain).map_err(|why| ResolveError { target: domain.to_string(), why })?;
        let err = |why: String| ResolveError { target: domain.clone(), why };
        let mut builder = match nameservers {
            Nameservers::System => {
                TokioResolver::builder_tokio().map_err(|e| err(format!("reading the system DNS configuration: {e}")))?
            }
            Nameservers::Addrs(addrs) => {
                let mut group = NameServerConfigGroup::new();
                for addr in addrs {
                    group.merge(NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true));
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], group),
                    TokioConnectionProvider::default(),
                )
            }
        };
        let opts = builder.options_mut();
        // Vertex domains are never in /etc/hosts; the name is absolute, so ndots is moot.
        opts.use_hosts_file = ResolveHosts::Never;
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        Ok(Self { domain, port, resolver: builder.build() })
    }

    /// The name queried, with its trailing dot.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// One source per domain in [`VERTEX_DOMAIN_TARGETS_ENV`], nameservers from
    /// [`NAMESERVERS_ENV`] or the system, every peer on `port`.
    pub fn targets_from_env(port: u16) -> Result<Vec<Self>, ResolveError> {
        let list = std::env::var(VERTEX_DOMAIN_TARGETS_ENV).map_err(|_| ResolveError {
            target: VERTEX_DOMAIN_TARGETS_ENV.to_string(),
            why: "not set; this vertex has no direct edges to send on".into(),
        })?;
        let nameservers = Nameservers::from_env()?;
        parse_domain_list(&list)
            .map_err(|why| ResolveError { target: VERTEX_DOMAIN_TARGETS_ENV.to_string(), why })?
            .iter()
            .map(|d| Self::new(d, port, &nameservers))
            .collect()
    }
}

impl PeerSource for DnsPeers {
    fn target(&self) -> String {
        self.domain.clone()
    }

    async fn resolve(&self) -> Result<PeerSet, ResolveError> {
        let fail = |e: HickoryError| ResolveError { target: self.domain.clone(), why: e.to_string() };
        match self.resolver.srv_lookup(self.domain.as_str()).await {
            Ok(srv) => return self.srv_peers(&srv).await,
            // The name does not exist: no A/AAAA records either.
            Err(e) if e.is_nx_domain() => return Ok(no_peers()),
            // The name exists without SRV records: its addresses are the peers.
            Err(e) if e.is_no_records_found() => {}
            Err(e) => return Err(fail(e)),
        }
        match self.resolver.lookup_ip(self.domain.as_str()).await {
            Ok(lookup) => {
                let addrs = lookup.iter().map(|ip| SocketAddr::new(ip, self.port)).collect();
                Ok(PeerSet::new(addrs, Some(lookup.valid_until())))
            }
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(no_peers()),
            Err(e) => Err(fail(e)),
        }
    }

    fn invalidate(&self) {
        self.resolver.clear_cache();
    }
}

/// No pods now; ask again soon (the negative answer's TTL is not exposed by the resolver).
fn no_peers() -> PeerSet {
    PeerSet::new(Vec::new(), Some(Instant::now() + Duration::from_secs(1)))
}

/// A port from an SRV record: 0 (the record names none) is `default`.
pub fn srv_port(port: u16, default: u16) -> u16 {
    if port == 0 { default } else { port }
}

impl DnsPeers {
    /// The peers of an SRV answer: each target's addresses (from the additional section, else
    /// looked up) on the target's port. The set is valid until the earliest expiry among the
    /// answers used.
    async fn srv_peers(&self, srv: &SrvLookup) -> Result<PeerSet, ResolveError> {
        // Addresses the answer carried, by owner name (hickory keeps the additional records
        // of the last target it followed; the others are looked up below).
        let mut known: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for record in srv.as_lookup().records() {
            let ip = match record.data() {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(a) => IpAddr::V6(a.0),
                _ => continue,
            };
            known.entry(record.name().to_lowercase().to_string()).or_default().push(ip);
        }
        let mut valid_until = srv.as_lookup().valid_until();
        let mut addrs = Vec::new();
        let mut missing = Vec::new();
        for record in srv.iter() {
            if record.target().is_root() {
                continue;
            }
            let target = record.target().to_lowercase().to_string();
            let port = srv_port(record.port(), self.port);
            match known.get(&target) {
                Some(ips) => addrs.extend(ips.iter().map(|ip| SocketAddr::new(*ip, port))),
                None => missing.push((target, port)),
            }
        }
        let lookups = missing.iter().map(|(target, _)| self.resolver.lookup_ip(target.as_str()));
        let mut unresolved = Vec::new();
        for ((target, port), result) in missing.iter().zip(futures::future::join_all(lookups).await) {
            match result {
                Ok(lookup) => {
                    valid_until = valid_until.min(lookup.valid_until());
                    addrs.extend(lookup.iter().map(|ip| SocketAddr::new(ip, *port)));
                }
                Err(e) => unresolved.push(format!("{target}: {e}")),
            }
        }
        if !unresolved.is_empty() {
            tracing::warn!(domain = %self.domain, targets = ?unresolved, "SRV targets without an address are left out");
            if addrs.is_empty() {
                return Err(ResolveError {
                    target: self.domain.clone(),
                    why: format!("no SRV target resolved: {}", unresolved.join("; ")),
                });
            }
        }
        Ok(PeerSet::new(addrs, Some(valid_until)))
    }
}

/// `domain` as an absolute name (one trailing dot), after checking it is a plausible DNS name.
pub fn fully_qualified(domain: &str) -> Result<String, String> {
    let name = domain.trim().trim_end_matches('.');
    if name.is_empty() {
        return Err("empty domain".into());
    }
    if name.len() > 253 {
        return Err(format!("'{name}' is {} characters, over DNS's 253", name.len()));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("'{name}' has a label of {} characters (1 to 63 allowed)", label.len()));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("'{name}': label '{label}' has characters DNS does not allow"));
        }
    }
    Ok(format!("{name}."))
}

/// A comma-separated list of domains (blanks ignored), each checked.
pub fn parse_domain_list(list: &str) -> Result<Vec<String>, String> {
    let domains: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| fully_qualified(d).map(|d| d.trim_end_matches('.').to_string()))
        .collect::<Result<_, _>>()?;
    if domains.is_empty() {
        return Err("no domain in the list".into());
    }
    Ok(domains)
}

/// Addresses in `new` not in `old`, and in `old` not in `new`.
pub fn diff_peers(old: &[SocketAddr], new: &[SocketAddr]) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let added = new.iter().filter(|a| !old.contains(a)).copied().collect();
    let removed = old.iter().filter(|a| !new.contains(a)).copied().collect();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_absolute_once() {
        assert_eq!(
            fully_qualified("inference.video-net.video.default.vertexdomain.local"),
            Ok("inference.video-net.video.default.vertexdomain.local.".into())
        );
        assert_eq!(fully_qualified("a.b."), Ok("a.b.".into()));
        assert!(fully_qualified("").is_err());
        assert!(fully_qualified("a..b").is_err());
        assert!(fully_qualified("a b.c").expect_err("space").contains("label 'a b'"));
        assert!(fully_qualified(&"x".repeat(64)).is_err());
    }

    #[test]
    fn domain_lists_are_split_and_checked() {
        assert_eq!(parse_domain_list(" a.b , c.d.,"), Ok(vec!["a.b".to_string(), "c.d".to_string()]));
        assert!(parse_domain_list(" , ").is_err());
        assert!(parse_domain_list("a.b,bad name").is_err());
    }

    #[test]
    fn nameservers_parse_with_default_port() {
        assert_eq!(
            Nameservers::parse("10.0.0.10, 127.0.0.1:5353"),
            Ok(Nameservers::Addrs(vec![
                "10.0.0.10:53".parse().expect("addr"),
                "127.0.0.1:5353".parse().expect("addr")
            ]))
        );
        assert!(Nameservers::parse("dns.local").expect_err("not ip").contains("dns.local"));
        assert!(Nameservers::parse("").is_err());
    }

    #[test]
    fn peer_sets_are_sorted_and_unique_and_diffed() {
        let a: SocketAddr = "10.0.0.2:7470".parse().expect("a");
        let b: SocketAddr = "10.0.0.1:7470".parse().expect("b");
        let c: SocketAddr = "10.0.0.3:7470".parse().expect("c");
        assert_eq!(PeerSet::new(vec![a, b, a], None).addrs, vec![b, a]);
        assert_eq!(diff_peers(&[a, b], &[b, c]), (vec![c], vec![a]));
    }

    #[tokio::test]
    async fn an_unanswered_lookup_is_an_error_naming_the_domain() {
        // A UDP socket that never answers: the resolver times out.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let mut peers =
            DnsPeers::new("x.vertexdomain.local", 7470, &Nameservers::Addrs(vec![silent.local_addr().expect("addr")]))
                .expect("resolver");
        let opts_timeout = Duration::from_millis(200);
        peers.resolver = {
            let mut b =
                TokioResolver::builder_with_config(peers.resolver.config().clone(), TokioConnectionProvider::default());
            b.options_mut().timeout = opts_timeout;
            b.options_mut().attempts = 1;
            b.build()
        };
        let err = peers.resolve().await.expect_err("timeout");
        assert_eq!(err.target, "x.vertexdomain.local.");
    }
}
