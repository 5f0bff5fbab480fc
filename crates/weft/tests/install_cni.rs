//! `weft install-cni` as the SR-IOV component's init container runs it: the real binary copying a
//! plugin into a CNI bin dir (temporary directories here). `weft-cni` itself is another package's
//! binary, so any file stands in for it. Also: the physnets file the component ships parses with
//! the parser the agent uses.

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output};

fn install(from: &Path, to: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .arg("install-cni")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .args(extra)
        .output()
        .expect("weft binary runs")
}

fn text(out: &Output) -> String {
    format!("stdout: {}\nstderr: {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A source file with `bytes` (large enough to take several read chunks) and an empty bin dir.
fn setup(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let image = tmp.path().join("image");
    let bin = tmp.path().join("opt-cni-bin");
    fs::create_dir(&image).expect("mkdir");
    fs::create_dir(&bin).expect("mkdir");
    let from = image.join("weft-cni");
    fs::write(&from, bytes).expect("write plugin");
    (tmp, from, bin)
}

fn plugin_bytes(seed: u8) -> Vec<u8> {
    (0..200_000u32).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Files in `dir` other than `keep` (a temporary file left behind would show here).
fn others(dir: &Path, keep: &str) -> Vec<String> {
    fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != keep)
        .collect()
}

#[test]
fn a_fresh_install_copies_the_bytes_executable_and_leaves_no_temporary_file() {
    let bytes = plugin_bytes(1);
    let (_tmp, from, bin) = setup(&bytes);
    // The image's file need not be executable; the installed one must be.
    fs::set_permissions(&from, fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = install(&from, &bin, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let target = bin.join("weft-cni");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("installed {} as {}", from.display(), target.display())),
        "{}",
        text(&out)
    );
    assert_eq!(fs::read(&target).expect("installed"), bytes);
    assert_eq!(fs::metadata(&target).expect("meta").permissions().mode() & 0o777, 0o755);
    assert!(others(&bin, "weft-cni").is_empty(), "{:?}", others(&bin, "weft-cni"));
}

#[test]
fn an_identical_target_is_not_rewritten() {
    let bytes = plugin_bytes(2);
    let (_tmp, from, bin) = setup(&bytes);
    let first = install(&from, &bin, &[]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let target = bin.join("weft-cni");
    let before = fs::metadata(&target).expect("meta");

    let again = install(&from, &bin, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("already identical"), "{}", text(&again));
    let after = fs::metadata(&target).expect("meta");
    // Same file, untouched: a rewrite would have renamed a new inode into place.
    assert_eq!((after.ino(), after.mtime(), after.mtime_nsec()), (before.ino(), before.mtime(), before.mtime_nsec()));
    assert!(others(&bin, "weft-cni").is_empty());
}

#[test]
fn a_changed_target_is_replaced_by_rename_under_the_chosen_name() {
    let (_tmp, from, bin) = setup(&plugin_bytes(3));
    let target = bin.join("sriov-weft");
    // An older plugin of the same length (compared by content, not size) and one of another length.
    for old in [plugin_bytes(4), b"#!/bin/sh\nexit 1\n".to_vec()] {
        fs::write(&target, &old).expect("old plugin");
        let before = fs::metadata(&target).expect("meta").ino();
        let out = install(&from, &bin, &["--name", "sriov-weft"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("replaced {}", target.display())),
            "{}",
            text(&out)
        );
        assert_eq!(fs::read(&target).expect("installed"), plugin_bytes(3));
        assert_ne!(fs::metadata(&target).expect("meta").ino(), before, "the new file is renamed over the old one");
        assert_eq!(fs::metadata(&target).expect("meta").permissions().mode() & 0o777, 0o755);
        assert!(others(&bin, "sriov-weft").is_empty(), "{:?}", others(&bin, "sriov-weft"));
    }
    assert!(!bin.join("weft-cni").exists());
}

#[test]
fn a_symlink_at_the_name_is_replaced_not_written_through() {
    let (tmp, from, bin) = setup(&plugin_bytes(5));
    // A link at the target's name is replaced, never written through.
    let elsewhere = tmp.path().join("elsewhere");
    fs::write(&elsewhere, b"keep me").expect("write");
    std::os::unix::fs::symlink(&elsewhere, bin.join("weft-cni")).expect("symlink");
    let out = install(&from, &bin, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!fs::symlink_metadata(bin.join("weft-cni")).expect("meta").file_type().is_symlink());
    assert_eq!(fs::read(&elsewhere).expect("read"), b"keep me");
    assert_eq!(fs::read(bin.join("weft-cni")).expect("read"), plugin_bytes(5));
}

#[test]
fn a_missing_source_is_an_error_naming_it_and_installs_nothing() {
    let (_tmp, from, bin) = setup(b"x");
    let missing = from.with_file_name("not-there");
    let out = install(&missing, &bin, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("the plugin binary {} does not exist", missing.display())), "{}", text(&out));
    assert!(others(&bin, "").is_empty());
}

#[test]
fn a_missing_or_unwritable_directory_is_an_error_naming_it() {
    let (tmp, from, bin) = setup(b"plugin");
    let missing = tmp.path().join("no-such-dir");
    let out = install(&from, &missing, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("the CNI binary directory {} does not exist", missing.display())),
        "{}",
        text(&out)
    );

    let out = install(&from, &from, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("the CNI binary directory {} is not a directory", from.display())),
        "{}",
        text(&out)
    );

    fs::set_permissions(&bin, fs::Permissions::from_mode(0o555)).expect("chmod");
    let probe = bin.join("probe");
    let out = if fs::write(&probe, b"").is_err() {
        install(&from, &bin, &[])
    } else {
        // Root (CAP_DAC_OVERRIDE) writes a read-only directory anyway: run the command as nobody.
        let _ = fs::remove_file(&probe);
        let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists());
        let setpriv =
            setpriv.ok_or("setpriv (util-linux), to check the read-only directory case: root writes a 0555 directory");
        let Some(setpriv) = weft_testkit::require_ok(setpriv) else { return };
        for d in [tmp.path(), from.parent().expect("image dir")] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        fs::set_permissions(&from, fs::Permissions::from_mode(0o644)).expect("chmod");
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_weft"), "install-cni"])
            .arg("--from")
            .arg(&from)
            .arg("--to")
            .arg(&bin)
            .output()
            .expect("setpriv runs weft")
    };
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod back");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("cannot write to the CNI binary directory {}", bin.display())),
        "{}",
        text(&out)
    );
    assert!(others(&bin, "").is_empty());
}

/// The physnets file of `deploy/components/sriov` (the ConfigMap weft-physnets) is read by the
/// agent's parser (`--physnet-config`), and names the physnet the example NetworkAttachmentDefinition uses.
#[test]
fn the_sriov_components_physnets_example_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let cm: serde_json::Value = serde_saphyr::from_str(
        &fs::read_to_string(root.join("components/sriov/physnets.yaml")).expect("components/sriov/physnets.yaml"),
    )
    .expect("ConfigMap YAML");
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "weft-physnets");
    let text = cm["data"]["physnets.yaml"].as_str().expect("data.physnets.yaml");
    let cfg = weft_net::config::PhysnetConfig::from_text(text, "physnets.yaml").expect("physnets.yaml is valid");
    let p = cfg.physnet("physnet2").expect("physnet2");
    assert_eq!(p.vlan, Some(100));
    assert_eq!(p.subnet.as_ref().map(|s| s.cidr.to_string()).as_deref(), Some("10.56.0.0/24"));
    assert!(cfg.physnet("physnet3").is_some(), "the seed's second physnet");
}
