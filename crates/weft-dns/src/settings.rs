//! What the registrar is told: where etcd is, how records look, which pods and drivers count.

use std::time::Duration;

use crate::record::Prefix;

/// The accepted NIC drivers by default: weft's NIC DRA driver and dranet.
pub const DEFAULT_DRIVERS: [&str; 2] = ["nic.weft.io", "dra.net"];
/// The registrar's owner marker by default: one registrar per cluster, behind leader election.
pub const DEFAULT_REGISTRAR_ID: &str = "weft-controller";
/// The pods watched by default: Numaflow's vertex pods (both labels present).
pub const DEFAULT_POD_SELECTOR: &str = "numaflow.numaproj.io/pipeline-name,numaflow.numaproj.io/vertex-name";

/// The registrar's settings. [`DnsSettings::default`] is the documented default of each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsSettings {
    /// etcd client URLs, `http://host:port` (plain HTTP/2; TLS is not supported).
    pub endpoints: Vec<String>,
    /// The etcd path the records live under; CoreDNS's `path` (default `/skydns`).
    pub prefix: String,
    /// The `ttl` of each record, seconds (default 10). CoreDNS answers with the smaller of this
    /// and the lease's remaining TTL (clamped to its `min-lease-ttl`, 30 s by default).
    pub ttl: u32,
    /// The TTL of the registrar's etcd lease, whole seconds (default 30): how long the records of
    /// a registrar that died stay. Kept alive every third of it.
    pub lease_ttl: Duration,
    /// The zone vertex domains are under (default `vertexdomain.local`); domains in the pods'
    /// annotation are checked against it.
    pub zone: String,
    /// DRA drivers whose devices' `networkData` carries the vertex address.
    pub drivers: Vec<String>,
    /// This registrar's owner marker in every record it writes; keep it stable across restarts so
    /// that a restarted registrar collects its stale records.
    pub registrar_id: String,
    /// Each etcd request's deadline (default 5 s).
    pub request_timeout: Duration,
    /// How soon a pod whose claim has no address yet is looked at again (default 2 s).
    pub claim_requeue: Duration,
    /// Label selector of the pods watched (default: Numaflow's pipeline and vertex labels present).
    pub pod_selector: String,
    /// Revoke the lease when the registrar stops in order, removing its records at once (default
    /// false: they stay until the lease runs out, so a successor can take them over without a gap).
    pub revoke_on_shutdown: bool,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: crate::record::DEFAULT_PREFIX.into(),
            ttl: crate::record::DEFAULT_TTL,
            lease_ttl: Duration::from_secs(30),
            zone: weft_pipeline::domain::DEFAULT_ZONE.into(),
            drivers: DEFAULT_DRIVERS.iter().map(|d| d.to_string()).collect(),
            registrar_id: DEFAULT_REGISTRAR_ID.into(),
            request_timeout: Duration::from_secs(5),
            claim_requeue: Duration::from_secs(2),
            pod_selector: DEFAULT_POD_SELECTOR.into(),
            revoke_on_shutdown: false,
        }
    }
}

/// A setting that cannot work; names the setting and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DNS registrar setting {setting} = '{value}': {why}")]
pub struct SettingsError {
    /// Which setting (`endpoints`, `prefix`, ...).
    pub setting: &'static str,
    /// Its value as given.
    pub value: String,
    /// What is wrong.
    pub why: String,
}

fn err(setting: &'static str, value: impl ToString, why: impl ToString) -> SettingsError {
    SettingsError { setting, value: value.to_string(), why: why.to_string() }
}

impl DnsSettings {
    /// Checks every setting; the first problem found is the error.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.endpoints.is_empty() {
            return Err(err("endpoints", "", "at least one etcd endpoint is needed"));
        }
        for e in &self.endpoints {
            crate::etcd::check_endpoint(e)?;
        }
        Prefix::new(&self.prefix)?;
        if self.ttl == 0 {
            return Err(err("ttl", self.ttl, "must be at least 1 second (0 would make CoreDNS answer with 300 s)"));
        }
        let lease = self.lease_ttl;
        if lease.as_secs() == 0 || lease.subsec_nanos() != 0 || lease.as_secs() > i64::MAX as u64 {
            return Err(err("lease_ttl", format!("{lease:?}"), "must be a whole number of seconds, at least 1"));
        }
        weft_pipeline::domain::check_zone(&self.zone).map_err(|e| err("zone", &self.zone, e))?;
        if self.drivers.is_empty() || self.drivers.iter().any(|d| d.trim().is_empty()) {
            return Err(err("drivers", self.drivers.join(","), "name at least one driver, none empty"));
        }
        let id = &self.registrar_id;
        if id.is_empty() || id.len() > 253 || id.chars().any(|c| c.is_control()) {
            return Err(err("registrar_id", id, "must be 1 to 253 characters without control characters"));
        }
        if self.request_timeout.is_zero() {
            return Err(err("request_timeout", format!("{:?}", self.request_timeout), "must be above zero"));
        }
        if self.claim_requeue.is_zero() {
            return Err(err("claim_requeue", format!("{:?}", self.claim_requeue), "must be above zero"));
        }
        if self.pod_selector.trim().is_empty() {
            return Err(err(
                "pod_selector",
                &self.pod_selector,
                "an empty selector would put the finalizer on every pod",
            ));
        }
        Ok(())
    }

    /// The lease TTL in seconds (validated settings only).
    pub(crate) fn lease_secs(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_secs()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        DnsSettings::default().validate().expect("defaults");
    }

    #[test]
    fn each_bad_setting_is_named() {
        let bad = |f: fn(&mut DnsSettings)| {
            let mut s = DnsSettings::default();
            f(&mut s);
            s.validate().expect_err("invalid").setting
        };
        assert_eq!(bad(|s| s.endpoints.clear()), "endpoints");
        assert_eq!(bad(|s| s.endpoints = vec!["https://etcd:2379".into()]), "endpoints");
        assert_eq!(bad(|s| s.endpoints = vec!["etcd:2379".into()]), "endpoints");
        assert_eq!(bad(|s| s.prefix = "skydns".into()), "prefix");
        assert_eq!(bad(|s| s.ttl = 0), "ttl");
        assert_eq!(bad(|s| s.lease_ttl = Duration::from_millis(1500)), "lease_ttl");
        assert_eq!(bad(|s| s.lease_ttl = Duration::ZERO), "lease_ttl");
        assert_eq!(bad(|s| s.zone = "Vertex.local".into()), "zone");
        assert_eq!(bad(|s| s.drivers = vec![" ".into()]), "drivers");
        assert_eq!(bad(|s| s.registrar_id = String::new()), "registrar_id");
        assert_eq!(bad(|s| s.request_timeout = Duration::ZERO), "request_timeout");
        assert_eq!(bad(|s| s.pod_selector = String::new()), "pod_selector");
        let e = {
            let s = DnsSettings { ttl: 0, ..DnsSettings::default() };
            s.validate().unwrap_err().to_string()
        };
        assert!(e.contains("ttl = '0'"), "{e}");
    }
}
