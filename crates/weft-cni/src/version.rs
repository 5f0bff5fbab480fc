//! CNI spec versions weft-cni speaks, and the VERSION answer.

use serde_json::{Value, json};

use crate::error::{CniError, code};

/// A CNI spec version weft-cni supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.3.0
    V0_3_0,
    /// 0.3.1
    V0_3_1,
    /// 0.4.0 (adds CHECK)
    V0_4_0,
    /// 1.0.0 (drops `ips[].version`)
    V1_0_0,
    /// 1.1.0 (adds STATUS, GC, interface `mtu`/`socketPath`/`pciID`, route attributes)
    V1_1_0,
}

/// The versions, oldest first, as VERSION lists them.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

impl Version {
    /// The newest version.
    pub const LATEST: Version = Version::V1_1_0;

    /// The version named by `text`, if weft-cni supports it.
    pub fn parse(text: &str) -> Option<Version> {
        Some(match text {
            "0.3.0" => Version::V0_3_0,
            "0.3.1" => Version::V0_3_1,
            "0.4.0" => Version::V0_4_0,
            "1.0.0" => Version::V1_0_0,
            "1.1.0" => Version::V1_1_0,
            _ => return None,
        })
    }

    /// The version named by a configuration's `cniVersion` (missing means 0.1.0, as the reference
    /// library reads it), or the spec's "incompatible version" error.
    pub fn of_config(text: Option<&str>) -> Result<Version, CniError> {
        let text = text.unwrap_or("0.1.0");
        Version::parse(text).ok_or_else(|| {
            CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                .with_details(format!("config is \"{text}\", plugin supports {SUPPORTED:?}"))
        })
    }

    /// Its text.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The VERSION answer: `cniVersion` is the one given on stdin (the spec: "the value of
/// `cniVersion` specified on input"), the newest when none is given.
pub fn version_answer(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| Version::LATEST.to_string());
    json!({ "cniVersion": asked, "supportedVersions": SUPPORTED })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_order_and_reject_the_unsupported() {
        assert!(Version::parse("0.4.0") < Version::parse("1.0.0"));
        assert_eq!(Version::of_config(Some("1.1.0")), Ok(Version::V1_1_0));
        let e = Version::of_config(None).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.details.contains("\"0.1.0\""), "{e:?}");
        assert!(Version::of_config(Some("0.2.0")).is_err());
    }

    #[test]
    fn version_answer_echoes_the_asked_version() {
        let v = version_answer(br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["supportedVersions"], json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]));
        assert_eq!(version_answer(b"")["cniVersion"], "1.1.0");
    }
}
