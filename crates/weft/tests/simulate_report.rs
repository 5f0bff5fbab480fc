//! `weft simulate --report` on the command line: a report that cannot be written is an error naming
//! the flag and the path before any run (the browser test, `report_browser.rs`, checks the page).

use std::process::Command;

#[test]
fn an_unwritable_report_path_fails_before_the_run_naming_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("no-such-dir").join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        // The records on stdout show whether the run took place.
        .args(["simulate", "--pods", "200", "--pods-out", "-", "--report"])
        .arg(&path)
        .output()
        .expect("weft runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--report") && err.contains(&path.display().to_string()), "{err}");
    let records = String::from_utf8_lossy(&out.stdout);
    assert!(records.is_empty(), "the run took place first: {} bytes of records", records.len());
}
