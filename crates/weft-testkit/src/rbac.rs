//! Checks that every request a component made (as the fake API server recorded it) is granted by
//! that component's RBAC manifests under `deploy/`, and that every rule of those manifests is
//! exercised by some test.
//!
//! Each [`assert_granted`] call writes what it saw to a ledger under the target directory
//! (`<target>/rbac-ledger/`, one file per call): for each recorded request, each rule of the files
//! named that grants it, as `file, group, resource, verb` and the test's name. The ledger is the
//! union over every test process of the suite, so a rule is "exercised" when any test, in any
//! crate, recorded a request it grants. [`unexercised`] lists the `(group, resource, verb)` of each
//! rule that no ledger entry covers, less [`ALLOWED_UNEXERCISED`]; the test
//! `weft-testkit/tests/rbac_exercised.rs` fails on them, run by `scripts/test-all.sh` after the
//! workspace's tests (which clears the ledger first).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use weft_fakeapi::{RecordedRequest, Verb};

/// One RBAC rule: API groups, resources (with subresources as `nodes/status`), verbs.
#[derive(Debug, Clone)]
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
    parse_rules(&text, file)
}

/// The rules of every ClusterRole and Role in the YAML documents `text` (`file` names it in
/// panics).
pub fn parse_rules(text: &str, file: &str) -> Vec<Rule> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{file}: {e}"));
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

/// Whether `rule` grants request `r`.
fn rule_grants(rule: &Rule, r: &RecordedRequest) -> bool {
    granted(std::slice::from_ref(rule), r)
}

/// What the API server authorizes for request `r`: the request itself, and for a PATCH that
/// created its object (201: a server-side apply of an object that did not exist) also `create`, as
/// upstream's patch handler (k8s.io/apiserver `endpoints/handlers/patch.go`) authorizes an apply
/// that creates with the verb `create` besides the request's `patch`.
fn authorized(r: &RecordedRequest) -> Vec<RecordedRequest> {
    let mut out = vec![r.clone()];
    if r.verb == Verb::Patch && r.code == 201 {
        out.push(RecordedRequest { verb: Verb::Create, ..r.clone() });
    }
    out
}

/// Panic naming each request in `requests` that the rules in `files` do not grant. Records in the
/// ledger which rules of `files` the requests exercised.
pub fn assert_granted(requests: &[RecordedRequest], files: &[&str]) {
    assert!(!requests.is_empty(), "no requests recorded; the check would prove nothing");
    let requests: Vec<RecordedRequest> = requests.iter().flat_map(authorized).collect();
    let requests = &requests[..];
    let per_file: Vec<(&str, Vec<Rule>)> = files.iter().map(|f| (*f, rules(f))).collect();
    let all: Vec<Rule> = per_file.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
    let missing: Vec<String> = requests
        .iter()
        .filter(|r| !granted(&all, r))
        .map(|r| format!("{} {}/{} in {:?}", r.verb, r.group, r.rbac_resource(), r.namespace))
        .collect();
    let mut used = Vec::new();
    for r in requests {
        for (file, rules) in &per_file {
            if rules.iter().any(|rule| rule_grants(rule, r)) {
                used.push(Exercised {
                    file: file.to_string(),
                    group: r.group.clone(),
                    resource: r.rbac_resource(),
                    verb: r.verb.as_str().to_string(),
                });
            }
        }
    }
    record(&used);
    assert!(missing.is_empty(), "requests not granted by {files:?}:\n  {}", missing.join("\n  "));
}

/// One rule exercised: a request of this group, resource and verb, granted by `file`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Exercised {
    /// The RBAC file, relative to `deploy/`.
    pub file: String,
    /// API group, `""` for core.
    pub group: String,
    /// Resource, with a subresource as `pods/status`.
    pub resource: String,
    /// The verb.
    pub verb: String,
}

/// Rules no test can exercise, with why: `(file, group, resource, verb)`. Keep it small; each entry
/// names the code path that needs the permission and why the suite cannot reach it.
pub const ALLOWED_UNEXERCISED: &[(&str, &str, &str, &str, &str)] = &[
    // The resource manager's GET https://<node>:10250/pods: the kubelet authorizes it itself (a
    // SubjectAccessReview for nodes/pods), so it never is a request to the API server that the fake
    // records, and weft-kubelet-harness does not authorize.
    ("base/agent/rbac.yaml", "", "nodes/pods", "get", "the kubelet authorizes it, not the API server"),
    // `blockOwnerDeletion` on owner references: the OwnerReferencesPermissionEnforcement admission
    // plugin checks `update` of the owner's finalizers when an owned object is written. An
    // authorization check inside the API server's admission, not a request; the fake API server
    // runs no admission plugins.
    (
        "base/controller/rbac.yaml",
        "numaflow.numaproj.io",
        "numanetworks/finalizers",
        "update",
        "checked by an admission plugin, not requested",
    ),
    (
        "components/webhook/controller-rbac.yaml",
        "batch.volcano.sh",
        "jobs/finalizers",
        "update",
        "checked by an admission plugin, not requested",
    ),
    // weft_kube::controller re-reads (GET) an object whose reconcile failed with a 404, to tell a
    // deleted object from an error. The same generic code is exercised for ConfigMaps by weft-crds'
    // `object_deleted_mid_reconcile_is_not_an_error`; the job controller's tests cannot make a
    // Volcano Job's reconcile fail with a 404 without deleting it between the watch event and the
    // reconcile, a race no test can order.
    (
        "components/webhook/controller-rbac.yaml",
        "batch.volcano.sh",
        "jobs",
        "get",
        "the controller skeleton's 404 re-read, a race",
    ),
    // weft_ipam::network_address: a GET after a create answered AlreadyExists for an address the
    // allocator's watch cache had not shown taken: another writer got there between the cache and
    // the create, a race no test can order (the cache is read first).
    ("base/controller/rbac.yaml", "weft.io", "networkaddresses", "get", "the allocator's race with its cache"),
    ("components/nic-dra/rbac.yaml", "weft.io", "networkaddresses", "get", "the allocator's race with its cache"),
    // kube-runtime watchers with a field selector (the NIC DRA driver's ResourceSlices of its node,
    // the webhook's Pipeline CRD by name) WATCH after their first LIST; against the fake API server
    // the suite records only their LISTs (the watcher relists). A gap of the test peer, not of the
    // code: kept here until weft-fakeapi serves these watches as the API server does.
    ("components/nic-dra/rbac.yaml", "resource.k8s.io", "resourceslices", "watch", "fake API server gap"),
    (
        "components/webhook/rbac.yaml",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "watch",
        "fake API server gap",
    ),
];

/// `<target>/rbac-ledger`: beside the profile directory of the running test binary
/// (`<target>/debug/deps/<test>`), so every crate's tests write to the same place.
pub fn ledger_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let target = exe.ancestors().nth(3).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("target"));
    target.join("rbac-ledger")
}

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Append `used` to the ledger, as one file of tab-separated lines (`file group resource verb test`).
/// A ledger that cannot be written only loses coverage (the whole-suite check then fails on it).
fn record(used: &[Exercised]) {
    let dir = ledger_dir();
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let exe = std::env::current_exe().ok();
    let binary = exe.as_ref().and_then(|e| e.file_stem()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let mut text = String::new();
    for e in used {
        text.push_str(&format!("{}\t{}\t{}\t{}\t{binary}::{test}\n", e.file, e.group, e.resource, e.verb));
    }
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let _ = std::fs::write(dir.join(format!("{binary}-{}-{n}.tsv", std::process::id())), text);
}

/// The ledger: every entry every [`assert_granted`] call wrote, with the tests that wrote it.
pub fn read_ledger(dir: &Path) -> Vec<(Exercised, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if let [file, group, resource, verb, test] = f[..] {
                let e =
                    Exercised { file: file.into(), group: group.into(), resource: resource.into(), verb: verb.into() };
                out.push((e, test.to_string()));
            }
        }
    }
    out
}

/// Every file under `deploy/base` and `deploy/components` that holds a ClusterRole or Role,
/// relative to `deploy/`.
pub fn rbac_files() -> Vec<String> {
    let mut out = Vec::new();
    for top in ["base", "components"] {
        let mut stack = vec![deploy_dir().join(top)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "yaml") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    if text.lines().any(|l| l == "kind: ClusterRole" || l == "kind: Role") {
                        let rel = path.strip_prefix(deploy_dir()).unwrap_or(&path);
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// Each `(group, resource, verb)` of each rule in `files` (file, rules) that no entry of `ledger`
/// exercised and `allowed` does not excuse, as `file: verb group/resource`.
pub fn unexercised(
    files: &[(String, Vec<Rule>)],
    ledger: &[Exercised],
    allowed: &[(&str, &str, &str, &str, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    for (file, rules) in files {
        for rule in rules {
            for group in &rule.groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        let hit = ledger.iter().any(|e| {
                            &e.file == file && &e.group == group && &e.resource == resource && &e.verb == verb
                        });
                        let excused =
                            allowed.iter().any(|(f, g, r, v, _)| f == file && g == group && r == resource && v == verb);
                        if !hit && !excused {
                            let g = if group.is_empty() { "core" } else { group.as_str() };
                            out.push(format!("{file}: {verb} {g}/{resource}"));
                        }
                    }
                }
            }
        }
    }
    out
}
