//! Running a delegated (IPAM) plugin, as SPEC.md §4 says: the executable `ipam.type` found in
//! `CNI_PATH`, run with the same environment (the CNI variables overridden where the call differs)
//! and the whole network configuration on stdin; its stderr goes to weft-cni's stderr; a failure
//! comes back as its own error code and message.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use serde_json::Value;

use crate::env::CniEnv;
use crate::error::{CniError, code};

/// The CNI variables of one delegated call.
#[derive(Clone, Debug, Default)]
pub struct CallEnv<'a> {
    /// `CNI_COMMAND`.
    pub command: &'a str,
    /// `CNI_CONTAINERID` (unset when `None`).
    pub container_id: Option<&'a str>,
    /// `CNI_NETNS` (unset when `None`).
    pub netns: Option<&'a str>,
    /// `CNI_IFNAME` (unset when `None`).
    pub ifname: Option<&'a str>,
}

/// The executable `plugin` in `CNI_PATH`.
pub fn find(plugin: &str, env: &CniEnv) -> Result<PathBuf, CniError> {
    if env.path.is_empty() {
        return Err(CniError::env("CNI_PATH", format!("needed to find the IPAM plugin '{plugin}', but it is not set")));
    }
    env.path.iter().map(|d| d.join(plugin)).find(|p| is_executable(p)).ok_or_else(|| {
        let dirs: Vec<String> = env.path.iter().map(|p| p.display().to_string()).collect();
        CniError::new(code::DELEGATE, format!("IPAM plugin '{plugin}' not found in CNI_PATH ({})", dirs.join(":")))
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The versions `binary` (the plugin `plugin`) lists in its VERSION answer.
pub fn supported_versions(binary: &Path, plugin: &str, env: &CniEnv) -> Result<Vec<String>, CniError> {
    let call = CallEnv { command: "VERSION", ..CallEnv::default() };
    let out = run(binary, plugin, env, &call, br#"{"cniVersion":"1.1.0"}"#)?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| {
        CniError::new(code::DELEGATE, format!("IPAM plugin {plugin}'s VERSION answer is not JSON: {e}"))
    })?;
    Ok(v.get("supportedVersions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default())
}

/// `stdin` with its `cniVersion` replaced by `version`.
pub fn with_version(stdin: &[u8], version: &str) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(stdin).ok()?;
    v.as_object_mut()?.insert("cniVersion".into(), Value::from(version));
    serde_json::to_vec(&v).ok()
}

/// Run `binary` (the plugin `plugin`) for `call` with `stdin`, the environment being the process's
/// own with every CNI variable taken from `env` and then from `call`. Returns its stdout on success,
/// its error (code, msg and details as it gave them) on failure.
pub fn run(binary: &Path, plugin: &str, env: &CniEnv, call: &CallEnv<'_>, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let mut cmd = Process::new(binary);
    for k in crate::env::CNI_VARS {
        match env.raw.get(k) {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.env("CNI_COMMAND", call.command);
    for (k, v) in [("CNI_CONTAINERID", call.container_id), ("CNI_NETNS", call.netns), ("CNI_IFNAME", call.ifname)] {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let what = format!("IPAM plugin {plugin} ({})", call.command);
    let mut child = cmd
        .spawn()
        .map_err(|e| CniError::new(code::DELEGATE, format!("{what}: cannot run {}: {e}", binary.display())))?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin that exits without reading closes the pipe; its exit status tells what happened.
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().map_err(|e| CniError::new(code::DELEGATE, format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(v) if v.get("code").and_then(Value::as_u64).is_some() => {
            let c = v.get("code").and_then(Value::as_u64).and_then(|c| u32::try_from(c).ok()).unwrap_or(code::DELEGATE);
            let msg = v.get("msg").and_then(Value::as_str).unwrap_or_default().to_string();
            let details = v.get("details").and_then(Value::as_str).unwrap_or_default();
            let details = if details.is_empty() { what } else { format!("{what}: {details}") };
            Err(CniError { code: c, msg, details })
        }
        _ => Err(CniError::new(code::DELEGATE, format!("{what} failed ({})", out.status))
            .with_details(String::from_utf8_lossy(&out.stdout).trim().to_string())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_replaced_and_everything_else_kept() {
        let out = with_version(br#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"x"}}"#, "1.0.0").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["ipam"]["type"], "x");
    }

    #[test]
    fn a_missing_plugin_or_path_is_named() {
        let env = CniEnv::from_lookup(|k| (k == "CNI_COMMAND").then(|| "STATUS".to_string())).unwrap();
        let e = find("host-local", &env).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.starts_with("CNI_PATH"), "{e}");
        let env = CniEnv::from_lookup(|k| match k {
            "CNI_COMMAND" => Some("STATUS".into()),
            "CNI_PATH" => Some("/nonexistent-a:/nonexistent-b".into()),
            _ => None,
        })
        .unwrap();
        let e = find("host-local", &env).unwrap_err();
        assert_eq!(e.code, code::DELEGATE);
        assert!(e.msg.contains("/nonexistent-a:/nonexistent-b"), "{e}");
    }
}
