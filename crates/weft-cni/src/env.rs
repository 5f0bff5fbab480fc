//! The CNI environment (SPEC.md §2 "Parameters"), validated per command as the spec's table says:
//!
//! | command | required |
//! |---|---|
//! | ADD, CHECK | `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME` |
//! | DEL | `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_IFNAME` |
//! | GC | `CNI_COMMAND`, `CNI_PATH` |
//! | STATUS, VERSION | `CNI_COMMAND` |
//!
//! An empty variable counts as missing (as the reference library reads them). Container IDs and
//! interface names are checked as the reference library checks them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::{CniError, code};

/// The CNI variables a delegated plugin gets (the spec: "the same environment").
pub const CNI_VARS: [&str; 6] = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"];

/// The operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// ADD
    Add,
    /// DEL
    Del,
    /// CHECK
    Check,
    /// STATUS
    Status,
    /// VERSION
    Version,
    /// GC
    Gc,
}

impl Command {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
            Command::Gc => "GC",
        }
    }

    fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            _ => return None,
        })
    }
}

/// `CNI_ARGS` (`K=V;K2=V2`): the keys weft-cni reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`
    pub pod_uid: Option<String>,
    /// `MAC`: the MAC to give the VF (a runtime override; `runtimeConfig.mac` wins).
    pub mac: Option<String>,
}

/// Keys the kubelet's runtimes pass that weft-cni knows and does not use.
const KNOWN_UNUSED: [&str; 2] = ["K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_NETNS"];

impl CniArgs {
    /// Read `CNI_ARGS`. An unknown key is an error unless `IgnoreUnknown` is `1` or `true` (the
    /// reference library's rule); a pair without `=` is an error.
    pub fn parse(text: &str) -> Result<CniArgs, CniError> {
        let mut pairs = Vec::new();
        for part in text.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| CniError::env("CNI_ARGS", format!("'{part}' is not a KEY=VALUE pair")))?;
            pairs.push((k, v));
        }
        let ignore_unknown =
            pairs.iter().any(|(k, v)| *k == "IgnoreUnknown" && (v.eq_ignore_ascii_case("true") || *v == "1"));
        let mut args = CniArgs::default();
        for (k, v) in pairs {
            let v = Some(v.to_string()).filter(|v| !v.is_empty());
            match k {
                "K8S_POD_NAMESPACE" => args.pod_namespace = v,
                "K8S_POD_NAME" => args.pod_name = v,
                "K8S_POD_UID" => args.pod_uid = v,
                "MAC" => args.mac = v,
                "IgnoreUnknown" => {}
                k if KNOWN_UNUSED.contains(&k) || ignore_unknown => {}
                k => {
                    return Err(CniError::env(
                        "CNI_ARGS",
                        format!(
                            "unknown key '{k}' (known: K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID, MAC; set IgnoreUnknown=1 to pass others)"
                        ),
                    ));
                }
            }
        }
        Ok(args)
    }
}

/// The validated environment of one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`, read.
    pub args: CniArgs,
    /// `CNI_PATH`, split on `:`.
    pub path: Vec<PathBuf>,
    /// The CNI variables as given (for delegated plugins).
    pub raw: BTreeMap<String, String>,
}

/// Whether `s` is a valid container ID or network name (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
pub fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

pub use weft_net::vif::interface_name_problem;

impl CniEnv {
    /// Read and validate the environment through `get` (`std::env::var` in the binary). Missing
    /// required variables are named together, in one code-4 error.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        let raw: BTreeMap<String, String> =
            CNI_VARS.iter().filter_map(|k| var(k).map(|v| (k.to_string(), v))).collect();
        let Some(command_text) = var("CNI_COMMAND") else {
            return Err(CniError::env("CNI_COMMAND", "required env variables [CNI_COMMAND] missing"));
        };
        let command = Command::parse(&command_text).ok_or_else(|| {
            CniError::env(
                "CNI_COMMAND",
                format!("unknown CNI_COMMAND '{command_text}' (ADD, DEL, CHECK, STATUS, VERSION or GC)"),
            )
        })?;
        let required: &[&str] = match command {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
            Command::Gc => &["CNI_PATH"],
            Command::Status | Command::Version => &[],
        };
        let missing: Vec<&str> = required.iter().copied().filter(|k| var(k).is_none()).collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("required env variables [{}] missing", missing.join(",")),
            ));
        }
        let container_id = var("CNI_CONTAINERID");
        if required.contains(&"CNI_CONTAINERID")
            && let Some(id) = &container_id
            && !valid_name(id)
        {
            return Err(CniError::env("CNI_CONTAINERID", "invalid characters in containerID").with_details(id.clone()));
        }
        let ifname = var("CNI_IFNAME");
        if required.contains(&"CNI_IFNAME")
            && let Some(name) = &ifname
            && let Some(problem) = interface_name_problem(name)
        {
            return Err(CniError::env("CNI_IFNAME", format!("interface name '{name}' {problem}")));
        }
        let args = match command {
            Command::Add | Command::Del | Command::Check => CniArgs::parse(&var("CNI_ARGS").unwrap_or_default())?,
            _ => CniArgs::default(),
        };
        let path = var("CNI_PATH")
            .map(|p| p.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
            .unwrap_or_default();
        Ok(CniEnv { command, container_id, netns: var("CNI_NETNS").map(PathBuf::from), ifname, args, path, raw })
    }

    /// `CNI_CONTAINERID` (present for ADD, DEL and CHECK after validation).
    pub fn container_id(&self) -> &str {
        self.container_id.as_deref().unwrap_or_default()
    }

    /// `CNI_IFNAME` (present for ADD, DEL and CHECK after validation).
    pub fn ifname(&self) -> &str {
        self.ifname.as_deref().unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CniEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn missing_variables_are_named_per_command() {
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "net1")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert_eq!(e.msg, "required env variables [CNI_CONTAINERID,CNI_NETNS] missing");
        // DEL does not need the netns, GC needs the path, STATUS nothing.
        assert!(env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "net1")]).is_ok());
        let e = env(&[("CNI_COMMAND", "GC")]).unwrap_err();
        assert!(e.msg.contains("CNI_PATH"), "{e}");
        assert!(env(&[("CNI_COMMAND", "STATUS")]).is_ok());
        let e = env(&[]).unwrap_err();
        assert!(e.msg.contains("CNI_COMMAND"), "{e}");
        let e = env(&[("CNI_COMMAND", "FROB")]).unwrap_err();
        assert_eq!((e.code, e.msg.starts_with("CNI_COMMAND")), (4, true));
    }

    #[test]
    fn container_id_and_ifname_are_checked() {
        let base = [("CNI_COMMAND", "ADD"), ("CNI_NETNS", "/run/netns/x")];
        let e = env(&[base[0], base[1], ("CNI_CONTAINERID", "-bad"), ("CNI_IFNAME", "net1")]).unwrap_err();
        assert!(e.msg.starts_with("CNI_CONTAINERID"), "{e}");
        let e = env(&[base[0], base[1], ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "a-very-long-ifname")]).unwrap_err();
        assert!(e.msg.contains("longer than 15"), "{e}");
        let e = env(&[base[0], base[1], ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "a:b")]).unwrap_err();
        assert!(e.msg.starts_with("CNI_IFNAME"), "{e}");
        let ok = env(&[base[0], base[1], ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "net1"), ("CNI_PATH", "/a::/b")])
            .unwrap();
        assert_eq!(ok.path, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(ok.raw.len(), 5);
    }

    #[test]
    fn cni_args_read_known_keys_and_refuse_unknown_ones_unless_told() {
        let a = CniArgs::parse("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u;MAC=02:00:00:00:00:01").unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("ns"));
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:01"));
        let e = CniArgs::parse("FOO=1").unwrap_err();
        assert!(e.msg.contains("unknown key 'FOO'"), "{e}");
        assert!(CniArgs::parse("IgnoreUnknown=1;FOO=1;K8S_POD_NAME=p").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=true;FOO=1").is_ok());
        assert!(CniArgs::parse("K8S_POD_INFRA_CONTAINER_ID=abc").is_ok());
        let e = CniArgs::parse("NOEQUALS").unwrap_err();
        assert!(e.msg.contains("not a KEY=VALUE"), "{e}");
    }
}
