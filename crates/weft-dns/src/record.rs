//! Records as CoreDNS's etcd plugin reads them (coredns `plugin/etcd`, `msg.Service`).
//!
//! - **Key**: `<prefix>/<domain labels reversed, joined by '/'>/<pod name>`, e.g.
//!   `/skydns/local/vertexdomain/default/video/net-a/inference/video-inference-0-x7k2p`. CoreDNS
//!   answers a query for the domain with a prefix Get on `<prefix>/…/inference/`, so every pod of
//!   the vertex is one A (or AAAA) record of the name.
//! - **Value**: the SkyDNS service JSON CoreDNS decodes (`host`, `ttl`, and `port` when the pod
//!   names its transport port, which CoreDNS serves in SRV answers), plus `weft`, the owner
//!   marker. Go's `encoding/json` skips fields the struct does not declare, so CoreDNS never sees
//!   it; `msg.Service` declares `host`, `port`, `priority`, `weight`, `text`, `mail`, `ttl`,
//!   `targetstrip`, `group`, none of them `weft`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::settings::SettingsError;

/// CoreDNS's default path.
pub const DEFAULT_PREFIX: &str = "/skydns";
/// The records' `ttl` by default, seconds.
pub const DEFAULT_TTL: u32 = 10;

/// A checked etcd path prefix: `/` and one segment, not `.` or `..` (CoreDNS joins its `path` with
/// Go's `path.Join`, which would clean those away, and turns a key back into an SRV target with
/// `msg.Domain`, which drops exactly one leading segment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix(String);

impl Prefix {
    /// Checks `prefix`.
    pub fn new(prefix: &str) -> Result<Prefix, SettingsError> {
        let bad = |why: &str| SettingsError { setting: "prefix", value: prefix.to_string(), why: why.to_string() };
        let Some(rest) = prefix.strip_prefix('/') else {
            return Err(bad("must start with '/', e.g. /skydns"));
        };
        if rest.is_empty() {
            return Err(bad("must name at least one path segment, e.g. /skydns"));
        }
        if rest.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
            return Err(bad("segments must not be empty, '.' or '..' (and no trailing '/')"));
        }
        if rest.contains('/') {
            return Err(bad(
                "must be one segment, e.g. /skydns: CoreDNS makes an SRV answer's target from the record's key with \
                 msg.Domain, which drops only the first segment, so the others would become labels of the target \
                 (docs/dns.md, \"Names CoreDNS cannot serve\")",
            ));
        }
        if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("must not contain spaces or control characters"));
        }
        Ok(Prefix(prefix.to_string()))
    }

    /// The prefix, e.g. `/skydns`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The range that holds every record under this prefix: `<prefix>/`.
    pub fn dir(&self) -> String {
        format!("{}/", self.0)
    }

    /// The key CoreDNS looks a name up under: `<prefix>/<labels reversed>` (no trailing `/`). A
    /// trailing dot on `domain` is ignored, as in a DNS query.
    pub fn domain_key(&self, domain: &str) -> String {
        let domain = domain.strip_suffix('.').unwrap_or(domain);
        let mut key = self.0.clone();
        for label in domain.split('.').rev() {
            key.push('/');
            key.push_str(label);
        }
        key
    }

    /// The key of `pod`'s record of `domain`.
    pub fn record_key(&self, domain: &str, pod: &str) -> String {
        format!("{}/{pod}", self.domain_key(domain))
    }
}

/// Who wrote a record: the registrar and the pod. CoreDNS ignores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// The registrar's id ([`crate::DnsSettings::registrar_id`]).
    pub owner: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
}

/// One record's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The address: CoreDNS answers A for an IPv4 host, AAAA for IPv6.
    pub host: String,
    /// Seconds.
    pub ttl: u32,
    /// The receiver's port, for SRV answers (CoreDNS: `port`); absent when the pod names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The owner marker.
    pub weft: Owner,
}

impl Record {
    /// The record of `ip`.
    pub fn new(ip: IpAddr, ttl: u32, owner: Owner) -> Record {
        Record { host: ip.to_string(), ttl, port: None, weft: owner }
    }

    /// The record with the receiver's `port` (SRV), or none.
    pub fn with_port(mut self, port: Option<u16>) -> Record {
        self.port = port;
        self
    }

    /// The JSON stored in etcd.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The owner marker of a stored value, or `None` when the value is not a record with one (another
/// writer's record, or not JSON at all).
pub fn owner_of(value: &[u8]) -> Option<Owner> {
    #[derive(Deserialize)]
    struct Marked {
        weft: Option<Owner>,
    }
    serde_json::from_slice::<Marked>(value).ok().and_then(|m| m.weft)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner { owner: "r1".into(), namespace: "default".into(), pod: "p-0".into(), pod_uid: "u1".into() }
    }

    #[test]
    fn keys_reverse_the_domain_under_the_prefix() {
        let p = Prefix::new("/skydns").unwrap();
        assert_eq!(
            p.record_key("inference.net-a.video.default.vertexdomain.local", "video-inference-0-abcde"),
            "/skydns/local/vertexdomain/default/video/net-a/inference/video-inference-0-abcde"
        );
        assert_eq!(p.domain_key("a.b."), "/skydns/b/a");
        assert_eq!(p.dir(), "/skydns/");
    }

    #[test]
    fn a_prefix_of_more_than_one_segment_is_refused() {
        // CoreDNS's msg.Domain drops one path segment when it makes an SRV target from a key.
        let e = Prefix::new("/dns/sky").unwrap_err();
        assert_eq!(e.setting, "prefix");
        assert!(e.why.contains("one segment"), "{e}");
        assert!(Prefix::new("/weft").is_ok());
    }

    #[test]
    fn bad_prefixes_are_refused() {
        for bad in ["", "/", "skydns", "/skydns/", "//skydns", "/a/../b", "/a b"] {
            assert!(Prefix::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_value_is_coredns_json_with_the_marker_beside_it() {
        let r = Record::new("10.1.2.3".parse().unwrap(), 10, owner());
        let v: serde_json::Value = serde_json::from_slice(&r.to_bytes()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"host": "10.1.2.3", "ttl": 10,
                "weft": {"owner": "r1", "namespace": "default", "pod": "p-0", "podUID": "u1"}})
        );
        assert_eq!(owner_of(&r.to_bytes()), Some(owner()));
        let v: serde_json::Value = serde_json::from_slice(&r.with_port(Some(7000)).to_bytes()).unwrap();
        assert_eq!(v["port"], 7000, "CoreDNS's SRV port field");
    }

    #[test]
    fn values_without_a_marker_have_no_owner() {
        assert_eq!(owner_of(br#"{"host":"10.0.0.1"}"#), None);
        assert_eq!(owner_of(b"not json"), None);
        assert_eq!(owner_of(br#"{"weft": {"owner": 3}}"#), None);
        assert_eq!(owner_of(br#"["a"]"#), None);
    }
}
