//! CNI errors: the spec's `{cniVersion, code, msg, details}` result, with the spec's well-known codes
//! and weft-cni's own (100 and up).

use serde_json::{Map, Value};

/// Error codes. 1–99 are the spec's (SPEC.md, "Error"); 100 and up are weft-cni's.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration (the message names key and value).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables (the message names them).
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure (stdin, state files).
    pub const IO: u32 = 5;
    /// Failed to decode content (stdin is not JSON, a result is not a result).
    pub const DECODE: u32 = 6;
    /// Invalid network configuration (the message names the field).
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later (a VF's lock is held past the wait, the kubelet's PodResources is away).
    pub const TRY_AGAIN: u32 = 11;
    /// STATUS: the plugin cannot service ADD.
    pub const NOT_AVAILABLE: u32 = 50;

    /// The VF cannot be used: not an SR-IOV VF in sysfs, no netdev in the host namespace (bound
    /// to a userspace driver, or still held elsewhere), no PF netdev where one is needed.
    pub const VF_UNUSABLE: u32 = 100;
    /// The VF is allocated to another pod whose network namespace still exists.
    pub const VF_IN_USE: u32 = 101;
    /// Setting or reading the VF through its PF failed (VLAN, MAC over netlink on the PF).
    pub const PF_CONTROL: u32 = 102;
    /// A link operation failed (rename, move between namespaces, MTU, MAC, up/down), or the
    /// interface name is taken in the pod.
    pub const LINK: u32 = 103;
    /// The IPAM answer could not be applied (an address or route the kernel refused, or an
    /// answer that is not a result).
    pub const IPAM_APPLY: u32 = 104;
    /// The kubelet's PodResources answer could not be used (chained mode).
    pub const POD_RESOURCES: u32 = 105;
    /// CHECK found the attachment differs from what ADD set up.
    pub const CHECK_FAILED: u32 = 106;
    /// weft IPAM: no free address left in the physnet's range.
    pub const RANGE_EXHAUSTED: u32 = 107;
    /// The delegated IPAM plugin could not be found or run, or answered something unreadable.
    pub const DELEGATE: u32 = 108;
}

/// A CNI error result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    /// The code (see [`code`]).
    pub code: u32,
    /// A short message.
    pub msg: String,
    /// A longer description.
    pub details: String,
}

impl CniError {
    /// An error with a message and no details.
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError { code, msg: msg.into(), details: String::new() }
    }

    /// The same error with `details`.
    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// An invalid-configuration error naming `field`.
    pub fn config(field: &str, message: impl std::fmt::Display) -> CniError {
        CniError::new(code::INVALID_CONFIG, format!("invalid network configuration: {field}: {message}"))
    }

    /// An invalid-environment error naming `variable`.
    pub fn env(variable: &str, message: impl std::fmt::Display) -> CniError {
        CniError::new(code::INVALID_ENV, format!("{variable}: {message}"))
    }

    /// An I/O error on `what`.
    pub fn io(what: impl std::fmt::Display, e: &std::io::Error) -> CniError {
        CniError::new(code::IO, format!("{what}: {e}"))
    }

    /// The error result for `cni_version`: `{cniVersion, code, msg, details}` (details left out when
    /// empty, as the reference library does).
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut m = Map::new();
        m.insert("cniVersion".into(), Value::from(cni_version));
        m.insert("code".into(), Value::from(self.code));
        m.insert("msg".into(), Value::from(self.msg.clone()));
        if !self.details.is_empty() {
            m.insert("details".into(), Value::from(self.details.clone()));
        }
        Value::Object(m)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_keys_and_leaves_empty_details_out() {
        let e = CniError::new(code::INVALID_CONFIG, "bad").with_details("vlan 5000");
        let v = e.to_json("1.1.0");
        assert_eq!(v, serde_json::json!({"cniVersion":"1.1.0","code":7,"msg":"bad","details":"vlan 5000"}));
        let v = CniError::new(code::IO, "x").to_json("0.4.0");
        assert!(v.get("details").is_none());
        assert_eq!(e.to_string(), "bad: vlan 5000");
    }
}
