//! Every rule of weft's RBAC manifests is exercised by some test: each (group, resource, verb) of
//! each ClusterRole and Role under deploy/base and deploy/components was granted to at least one
//! request a component made in a test (the ledger `weft_testkit::rbac::assert_granted` writes), or
//! is in the commented `ALLOWED_UNEXERCISED`. Run after the whole suite, on its ledger:
//!
//!   rm -rf target/rbac-ledger && cargo test --workspace && \
//!     cargo test -p weft-testkit --test rbac_exercised -- --ignored
//!
//! (`scripts/test-all.sh` does exactly this.)

use std::collections::{BTreeMap, BTreeSet};

use weft_testkit::rbac::{ALLOWED_UNEXERCISED, ledger_dir, rbac_files, read_ledger, rules, unexercised};

#[test]
#[ignore = "needs the ledger the whole suite writes; scripts/test-all.sh runs it after `cargo test --workspace`"]
fn every_rbac_rule_is_exercised_by_some_test() {
    let dir = ledger_dir();
    let ledger = read_ledger(&dir);
    assert!(!ledger.is_empty(), "no RBAC ledger in {}: run the workspace's tests first", dir.display());
    let files: Vec<(String, Vec<_>)> = rbac_files().into_iter().map(|f| (f.clone(), rules(&f))).collect();
    // What each file's rules were exercised by, for the log.
    let mut by_file: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (e, test) in &ledger {
        by_file.entry(&e.file).or_default().insert(format!("{} {}/{} ({test})", e.verb, e.group, e.resource));
    }
    for (file, _) in &files {
        println!("{file}:");
        for line in by_file.get(file.as_str()).into_iter().flatten() {
            println!("  {line}");
        }
    }
    let exercised: Vec<_> = ledger.into_iter().map(|(e, _)| e).collect();
    let left = unexercised(&files, &exercised, ALLOWED_UNEXERCISED);
    assert!(
        left.is_empty(),
        "RBAC rules no test exercised (drop them if no code needs them; else test the path, or add it to \
         ALLOWED_UNEXERCISED with why no test can reach it):\n  {}",
        left.join("\n  ")
    );
}
