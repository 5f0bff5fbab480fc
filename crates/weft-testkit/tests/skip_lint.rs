//! No test in the workspace skips except through `weft_testkit::require`: nothing reads the `CI`
//! environment variable, and no test code (a crate's `tests/`, `benches/`, `examples/`, or what
//! follows `#[cfg(test)]` in its `src/`) prints that it skipped or defines a skip helper of its
//! own. Also: the lint catches each kind of offender, and every allow-list entry names a test.
//!
//! The `src/` of the test-only crates is test code. This file holds the planted offenders as
//! fixtures and `weft_testkit::skip` is the helper itself, so the workspace scan leaves both out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use weft_testkit::skip::{ALLOWED_SKIPS, SourceKind, lint};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries {
        let path = e.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Crates that are test code through and through (their `src/` too).
const TEST_ONLY: &[&str] = &["weft-testkit", "weft-nri-harness", "weft-kubelet-harness", "weft-fakeapi"];

#[test]
fn no_test_in_the_workspace_skips_outside_the_helper() {
    let root = workspace();
    let this = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/skip_lint.rs").canonicalize().unwrap();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/skip.rs").canonicalize().unwrap();
    let mut scanned = 0;
    let mut offences = Vec::new();
    let crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(crates.len() > 20, "{} crates under {}", crates.len(), root.display());
    for krate in crates {
        for (dir, kind) in [
            ("tests", SourceKind::Test),
            ("benches", SourceKind::Test),
            ("examples", SourceKind::Test),
            ("src", if TEST_ONLY.iter().any(|c| krate.ends_with(c)) { SourceKind::Test } else { SourceKind::Library }),
        ] {
            let mut files = Vec::new();
            rust_files(&krate.join(dir), &mut files);
            for file in files.into_iter().filter(|f| *f != this && *f != helper) {
                let text = std::fs::read_to_string(&file).unwrap();
                scanned += 1;
                for found in lint(&text, kind) {
                    offences.push(format!("{}: {found}", file.strip_prefix(&root).unwrap().display()));
                }
            }
        }
    }
    assert!(scanned > 200, "scanned only {scanned} files");
    assert!(
        offences.is_empty(),
        "tests that skip outside weft_testkit::require (one helper, one switch, one ledger):\n  {}",
        offences.join("\n  ")
    );
}

#[test]
fn the_lint_catches_each_planted_offender() {
    let ci = r#"
fn etcd() -> bool {
    if std::env::var("CI").is_ok() { panic!() }
    std::env::var_os("CI").is_some()
}"#;
    let found = lint(ci, SourceKind::Test);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("line 3: reads the CI environment variable"), "{found:?}");
    assert!(found[1].starts_with("line 4:"), "{found:?}");
    // Reading CI is an offence in library code too, before any #[cfg(test)].
    assert_eq!(lint(ci, SourceKind::Library).len(), 2);

    let printed = r#"
#[test]
fn t() {
    if !have("ip") {
        eprintln!(
            "SKIPPED {test}: needs ip"
        );
        return;
    }
    println!("skipping: no etcd");
}"#;
    let found = lint(printed, SourceKind::Test);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("line 5: prints that a test skipped"), "{found:?}");
    assert!(found[1].starts_with("line 10: prints that a test skipped"), "{found:?}");

    let helpers = r#"
fn gpu_or_skip(test: &str) -> Option<u32> { None }
fn skip_unless_root() -> bool { true }
pub fn prerequisite(met: bool, why: &str) -> bool { met }
fn v1_node() -> Option<u32> {
    let mut skip = [0u8; 16]; // not a helper
    let skip = |why: String| None;
    skip(String::new())
}"#;
    let found = lint(helpers, SourceKind::Test);
    assert_eq!(found.len(), 4, "{found:?}");
    for (f, (line, name)) in
        found.iter().zip([(2, "gpu_or_skip"), (3, "skip_unless_root"), (4, "prerequisite"), (7, "skip")])
    {
        assert!(f.starts_with(&format!("line {line}: defines its own skip helper `{name}`")), "{found:?}");
    }
}

#[test]
fn the_lint_leaves_alone_what_is_not_a_test_skipping() {
    // A shipped binary's message before #[cfg(test)], tests named after the code's own skipping,
    // and the helper's calls.
    let library = r#"
fn gc(path: &str) {
    eprintln!("weft-cni: GC: skipping unreadable {path}");
}
#[cfg(test)]
mod tests {
    #[test]
    fn malformed_files_are_skipped_with_a_note() {}
    #[test]
    fn skipped_task_pods_do_not_count() {}
    #[test]
    fn the_cache_skips_link_queries() {
        if !weft_testkit::require(true, "root") { return; }
        println!("{}", 1);
    }
}"#;
    assert_eq!(lint(library, SourceKind::Library), Vec::<String>::new());
    // The same print in test code is an offence.
    assert_eq!(lint(library, SourceKind::Test).len(), 1);
}

#[test]
fn every_allowed_skip_names_a_test_that_exists() {
    let root = workspace();
    for (binary, test, _) in ALLOWED_SKIPS {
        let files: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
            .unwrap()
            .map(|e| e.unwrap().path().join("tests").join(format!("{binary}.rs")))
            .filter(|p| p.exists())
            .collect();
        let defined = files.iter().any(|f| std::fs::read_to_string(f).unwrap().contains(&format!("fn {test}(")));
        assert!(defined, "ALLOWED_SKIPS names {binary}::{test}, but no crates/*/tests/{binary}.rs defines it");
    }
}
