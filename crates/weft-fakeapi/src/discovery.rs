//! Minimal discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceSpec};

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "emulationMajor": "1",
        "emulationMinor": "34",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "33",
        "gitVersion": "v1.34.0-weft-fakeapi",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn groups_of(reg: &Registry) -> BTreeMap<&str, Vec<&str>> {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in reg.all().filter(|s| !s.group.is_empty()) {
        let versions = groups.entry(s.group.as_str()).or_default();
        if !versions.contains(&s.version.as_str()) {
            versions.push(s.version.as_str());
        }
    }
    groups
}

fn group_doc(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> =
        versions.iter().map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v })).collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({ "kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": vs, "preferredVersion": preferred })
}

/// `/apis`.
pub(crate) fn groups(reg: &Registry) -> Value {
    let groups: Vec<Value> = groups_of(reg)
        .iter()
        .map(|(name, versions)| {
            let mut g = group_doc(name, versions);
            if let Some(map) = g.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            g
        })
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `/apis/{group}`.
pub(crate) fn group(reg: &Registry, name: &str) -> Option<Value> {
    groups_of(reg).get(name).map(|versions| group_doc(name, versions))
}

/// `/api/v1` or `/apis/{group}/{version}`.
pub(crate) fn resources(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let specs: Vec<&ResourceSpec> = reg.all().filter(|s| s.group == group && s.version == version).collect();
    if specs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for s in specs {
        resources.push(json!({
            "name": s.plural, "singularName": s.kind.to_lowercase(), "namespaced": s.namespaced,
            "kind": s.kind, "verbs": VERBS,
        }));
        if s.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", s.plural), "singularName": "", "namespaced": s.namespaced,
                "kind": s.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(
        json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources }),
    )
}
