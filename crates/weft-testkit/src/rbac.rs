//! Checks that every request a component made (as the fake API server recorded it) is granted by
//! that component's RBAC manifest under `deploy/`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft_fakeapi::RecordedRequest;

/// One RBAC rule: API groups, resources (with subresources as `nodes/status`), verbs.
#[derive(Debug)]
pub struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// `Some(ns)` for a Role's rules (granted only in that namespace).
    namespace: Option<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The rules of every ClusterRole and Role in `file` (relative to `deploy/`). A Role without a
/// namespace gets `weft-system`, the namespace kustomize puts it in.
pub fn rules(file: &str) -> Vec<Rule> {
    let path = deploy_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for doc in docs {
        let namespace = match doc["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => Some(doc["metadata"]["namespace"].as_str().unwrap_or("weft-system").to_string()),
            _ => continue,
        };
        for r in doc["rules"].as_array().into_iter().flatten() {
            out.push(Rule {
                groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                verbs: strings(&r["verbs"]),
                namespace: namespace.clone(),
            });
        }
    }
    assert!(!out.is_empty(), "{file} holds no ClusterRole or Role rules");
    out
}

fn any(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// Whether `rules` grant request `r`.
pub fn granted(rules: &[Rule], r: &RecordedRequest) -> bool {
    rules.iter().any(|rule| {
        any(&rule.groups, &r.group)
            && any(&rule.resources, &r.rbac_resource())
            && any(&rule.verbs, r.verb.as_str())
            && rule.namespace.as_ref().is_none_or(|ns| r.namespace.as_ref() == Some(ns))
    })
}

/// Panic naming each request in `requests` that the rules in `files` do not grant.
pub fn assert_granted(requests: &[RecordedRequest], files: &[&str]) {
    assert!(!requests.is_empty(), "no requests recorded; the check would prove nothing");
    let rules: Vec<Rule> = files.iter().flat_map(|f| rules(f)).collect();
    let missing: Vec<String> = requests
        .iter()
        .filter(|r| !granted(&rules, r))
        .map(|r| format!("{} {}/{} in {:?}", r.verb, r.group, r.rbac_resource(), r.namespace))
        .collect();
    assert!(missing.is_empty(), "requests not granted by {files:?}:\n  {}", missing.join("\n  "));
}
