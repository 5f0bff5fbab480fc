//! The RBAC check's own logic: which rules a set of recorded requests exercised, and which no test
//! did.
#![allow(clippy::unwrap_used)]

use weft_testkit::rbac::{Exercised, parse_rules, unexercised};

const ROLE: &str = "
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: weft-agent
rules:
  - apiGroups: [\"\"]
    resources: [\"nodes\"]
    verbs: [\"get\", \"patch\"]
  - apiGroups: [\"resource.k8s.io\"]
    resources: [\"resourceslices\"]
    verbs: [\"create\"]
";

fn used(group: &str, resource: &str, verb: &str) -> Exercised {
    Exercised { file: "base/agent/rbac.yaml".into(), group: group.into(), resource: resource.into(), verb: verb.into() }
}

#[test]
fn a_rule_no_request_used_is_listed_each_verb_on_its_own() {
    let files = vec![("base/agent/rbac.yaml".to_string(), parse_rules(ROLE, "role"))];
    let ledger = [used("", "nodes", "get")];
    assert_eq!(
        unexercised(&files, &ledger, &[]),
        ["base/agent/rbac.yaml: patch core/nodes", "base/agent/rbac.yaml: create resource.k8s.io/resourceslices"]
    );
    let all =
        [used("", "nodes", "get"), used("", "nodes", "patch"), used("resource.k8s.io", "resourceslices", "create")];
    assert!(unexercised(&files, &all, &[]).is_empty());
}

#[test]
fn a_request_granted_by_another_file_does_not_exercise_this_one() {
    let files = vec![("base/agent/rbac.yaml".to_string(), parse_rules(ROLE, "role"))];
    let elsewhere = Exercised {
        file: "components/nic-dra/rbac.yaml".into(),
        ..used("resource.k8s.io", "resourceslices", "create")
    };
    let left = unexercised(&files, &[used("", "nodes", "get"), used("", "nodes", "patch"), elsewhere], &[]);
    assert_eq!(left, ["base/agent/rbac.yaml: create resource.k8s.io/resourceslices"]);
}

#[test]
fn the_allow_list_excuses_only_what_it_names() {
    let files = vec![("base/agent/rbac.yaml".to_string(), parse_rules(ROLE, "role"))];
    let allowed = [("base/agent/rbac.yaml", "", "nodes", "patch", "why")];
    assert_eq!(
        unexercised(&files, &[used("", "nodes", "get")], &allowed),
        ["base/agent/rbac.yaml: create resource.k8s.io/resourceslices"]
    );
}
