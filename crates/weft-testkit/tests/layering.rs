//! The Kubernetes crates' layering (ARCHITECTURE.md): component crates and the node side build on
//! the shared runtime (`weft-kube`) and records (`weft-record`), never on one another, and no shipped
//! crate depends on test support.

use std::path::PathBuf;

/// Component crates: none may depend on another.
const COMPONENTS: [&str; 7] = [
    "weft-extender",
    "weft-admission",
    "weft-crds",
    "weft-gpu-plugin",
    "weft-sriov-plugin",
    "weft-dns",
    "weft-nic-dra",
];
/// Shared layers: may not depend on any component.
const SHARED: [&str; 5] = ["weft-kube", "weft-record", "weft-deviceplugin", "weft-ipam", "weft-checkpoint"];
const TEST_ONLY: [&str; 4] = ["weft-testkit", "weft-fakeapi", "weft-nri-harness", "weft-kubelet-harness"];

/// The names in a crate's `[dependencies]` table (not dev- or build-dependencies).
fn dependencies(krate: &str) -> Vec<String> {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", krate, "Cargo.toml"].iter().collect();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut in_deps = false;
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            names.push(name.to_string());
        }
    }
    names
}

#[test]
fn components_build_on_the_runtime_and_records_never_on_each_other() {
    for krate in COMPONENTS {
        let deps = dependencies(krate);
        // Directly, or through a shared layer that does (the device plugins' framework).
        let on_runtime = |d: &String| d == "weft-kube" || (SHARED.contains(&d.as_str()) && builds_on_kube(d));
        assert!(deps.iter().any(on_runtime), "{krate} should build on weft-kube: {deps:?}");
        for other in COMPONENTS.iter().chain(&TEST_ONLY) {
            assert!(!deps.iter().any(|d| d == other), "{krate} depends on {other}");
        }
    }
    for krate in SHARED {
        let deps = dependencies(krate);
        for other in COMPONENTS.iter().chain(&TEST_ONLY) {
            assert!(!deps.iter().any(|d| d == other), "{krate} depends on {other}");
        }
    }
}

fn builds_on_kube(krate: &str) -> bool {
    dependencies(krate).iter().any(|d| d == "weft-kube")
}

#[test]
fn the_dependency_reader_sees_real_dependencies() {
    // Guards the test above against reading nothing.
    let deps = dependencies("weft-extender");
    assert!(deps.contains(&"weft-record".to_string()) && deps.contains(&"kube".to_string()), "{deps:?}");
    assert!(!deps.contains(&"weft-testkit".to_string()), "dev-dependencies are not dependencies: {deps:?}");
}
