//! The one skip helper: a skip is printed and written to the ledger, the switch turns it into a
//! failure naming what was missing, the allow-list lets CI-impossible tests skip anyway, and the
//! summary reads the ledger and cargo's output. The helper's behaviour in a test process is
//! checked by running this binary again on an ignored child test, with the ledger in a temporary
//! directory (so these deliberate skips never reach the suite's ledger).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use weft_testkit::skip::{
    ALLOWED_SKIPS, Entry, LEDGER_ENV, NO_ALLOW_LIST, Ran, SWITCH, Verdict, parse_no_allow_list, parse_switch,
    read_ledger, tally, target_name, verdict, verdict_with,
};
use weft_testkit::{require, require_ok};

/// Runs the ignored child test `name` of this binary with the switch set to `switch` (unset on
/// `None`), the allow-list in force, and the ledger in `ledger`.
fn child(name: &str, switch: Option<&str>, ledger: &Path) -> Output {
    child_with(name, switch, None, ledger)
}

/// [`child`] with [`NO_ALLOW_LIST`] set to `no_allow_list` (unset on `None`).
fn child_with(name: &str, switch: Option<&str>, no_allow_list: Option<&str>, ledger: &Path) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"]).env(LEDGER_ENV, ledger);
    for (var, value) in [(SWITCH, switch), (NO_ALLOW_LIST, no_allow_list)] {
        match value {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "a child process of the tests below"]
fn child_lacks_a_thing() {
    assert!(!require(false, "a thing this test lacks"), "require(false, ..) returns false");
}

#[test]
#[ignore = "a child process of the tests below"]
fn child_has_everything() {
    assert!(require(true, "nothing"));
    assert_eq!(require_ok::<u32, String>(Ok(7)), Some(7));
}

#[test]
#[ignore = "a child process of the tests below"]
fn child_cannot_start_its_server() {
    let started: Result<u32, String> = Err("exampled is not installed".into());
    assert_eq!(require_ok(started), None);
}

#[test]
fn a_skip_says_so_on_stderr_writes_the_ledger_and_the_test_passes() {
    for switch in [None, Some(""), Some("0")] {
        let ledger = tempfile::tempdir().unwrap();
        let out = child("child_lacks_a_thing", switch, ledger.path());
        assert!(out.status.success(), "switch {switch:?}: {}{}", stdout(&out), stderr(&out));
        assert!(
            stderr(&out).contains("skipped skip::child_lacks_a_thing: needs a thing this test lacks"),
            "{}",
            stderr(&out)
        );
        let entries = read_ledger(ledger.path()).unwrap();
        let want = Entry {
            binary: "skip".into(),
            test: "child_lacks_a_thing".into(),
            what: "a thing this test lacks".into(),
            allowed: None,
        };
        assert_eq!(entries, [want]);
    }
}

#[test]
fn with_the_switch_a_skip_fails_naming_what_was_missing_and_is_still_in_the_ledger() {
    let ledger = tempfile::tempdir().unwrap();
    let out = child("child_lacks_a_thing", Some("1"), ledger.path());
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("skip::child_lacks_a_thing needs a thing this test lacks"), "{err}");
    assert!(err.contains("WEFT_TEST_REQUIRE_ALL=1"), "{err}");
    let entries = read_ledger(ledger.path()).unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].allowed, None);
}

#[test]
fn require_ok_skips_with_the_error_as_what_is_missing() {
    let ledger = tempfile::tempdir().unwrap();
    let out = child("child_cannot_start_its_server", None, ledger.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let entries = read_ledger(ledger.path()).unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        (entries[0].test.as_str(), entries[0].what.as_str()),
        ("child_cannot_start_its_server", "exampled is not installed")
    );

    let out = child("child_cannot_start_its_server", Some("1"), ledger.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("needs exampled is not installed"), "{}", stderr(&out));
}

#[test]
fn a_met_requirement_records_nothing_even_with_the_switch() {
    let ledger = tempfile::tempdir().unwrap();
    let out = child("child_has_everything", Some("1"), ledger.path());
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(std::fs::read_dir(ledger.path()).unwrap().next().is_none(), "the ledger directory stays empty");
}

#[test]
fn a_switch_value_it_does_not_know_fails_naming_the_variable() {
    assert_eq!(parse_switch(None), Ok(false));
    assert_eq!(parse_switch(Some("")), Ok(false));
    assert_eq!(parse_switch(Some("0")), Ok(false));
    assert_eq!(parse_switch(Some("1")), Ok(true));
    let err = parse_switch(Some("yes")).unwrap_err();
    assert!(err.contains("WEFT_TEST_REQUIRE_ALL=\"yes\""), "{err}");

    let ledger = tempfile::tempdir().unwrap();
    let out = child("child_lacks_a_thing", Some("yes"), ledger.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("WEFT_TEST_REQUIRE_ALL=\"yes\""), "{}", stderr(&out));
}

#[test]
fn only_the_allow_list_skips_under_the_switch() {
    let (binary, test, why) = ALLOWED_SKIPS[0];
    assert_eq!(verdict(true, binary, test), Verdict::Allowed(why));
    assert_eq!(verdict(false, binary, test), Verdict::Allowed(why));
    assert_eq!(verdict(true, binary, "some_other_test"), Verdict::Fail);
    assert_eq!(verdict(true, "some_other_binary", test), Verdict::Fail);
    assert_eq!(verdict(false, "some_other_binary", test), Verdict::Skip);
}

#[test]
fn without_the_allow_list_an_allowed_test_fails_under_the_switch_only() {
    let (binary, test, why) = ALLOWED_SKIPS[0];
    assert_eq!(verdict_with(true, false, binary, test), Verdict::Fail);
    assert_eq!(verdict_with(false, false, binary, test), Verdict::Allowed(why));
    assert_eq!(verdict_with(true, true, binary, test), Verdict::Allowed(why));
    assert_eq!(verdict_with(true, false, binary, "some_other_test"), Verdict::Fail);
    assert_eq!(verdict_with(false, false, binary, "some_other_test"), Verdict::Skip);
}

#[test]
fn the_allow_list_switch_fails_the_skip_naming_itself_and_an_unknown_value_is_an_error() {
    assert_eq!(parse_no_allow_list(None), Ok(false));
    assert_eq!(parse_no_allow_list(Some("0")), Ok(false));
    assert_eq!(parse_no_allow_list(Some("1")), Ok(true));
    assert!(parse_no_allow_list(Some("on")).unwrap_err().contains("WEFT_TEST_NO_ALLOW_LIST=\"on\""));

    let ledger = tempfile::tempdir().unwrap();
    let out = child_with("child_lacks_a_thing", Some("1"), Some("1"), ledger.path());
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("skip::child_lacks_a_thing needs a thing this test lacks"), "{err}");
    assert!(err.contains("WEFT_TEST_NO_ALLOW_LIST=1"), "{err}");
    assert_eq!(read_ledger(ledger.path()).unwrap().len(), 1, "the failed skip is in the ledger too");

    // Without the switch it changes nothing: the test skips and passes.
    let ledger = tempfile::tempdir().unwrap();
    let out = child_with("child_lacks_a_thing", None, Some("1"), ledger.path());
    assert!(out.status.success(), "{}", stderr(&out));

    let ledger = tempfile::tempdir().unwrap();
    let out = child_with("child_lacks_a_thing", Some("1"), Some("on"), ledger.path());
    assert!(!out.status.success());
    assert!(stderr(&out).contains("WEFT_TEST_NO_ALLOW_LIST=\"on\""), "{}", stderr(&out));
}

/// The test binaries whose allowed skips need a GPU (scripts/gpu-check.sh runs them).
const GPU_BINARIES: [&str; 2] = ["gpu", "nvml"];

#[test]
fn every_allow_entry_gives_a_reason_and_gpu_rdma_and_cgroup_v2_are_the_only_ones_each_naming_its_script() {
    for (binary, test, why) in ALLOWED_SKIPS {
        assert!(!why.trim().is_empty(), "{binary}::{test} has no reason");
        assert!(["gpu", "nvml", "rdma", "cgroup_v1"].contains(binary), "{binary}::{test}: {why}");
    }
    let (gpu, rdma_and_v2): (Vec<_>, Vec<_>) = ALLOWED_SKIPS.iter().partition(|(b, _, _)| GPU_BINARIES.contains(b));
    assert!(gpu.iter().all(|(_, _, why)| why.contains("scripts/gpu-check.sh")), "{gpu:?}");
    assert!(rdma_and_v2.iter().all(|(_, _, why)| why.contains("scripts/vm-check.sh")), "{rdma_and_v2:?}");
}

/// The RDMA and cgroup v2 entries are what the VM runs (scripts/vm/tests.txt), and the VM runs
/// nothing else: a test added to one list and not the other fails here.
#[test]
fn the_vm_runs_exactly_the_allowed_rdma_and_cgroup_v2_tests() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vm/tests.txt");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut in_vm: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (b, t) =
                l.split_once(' ').unwrap_or_else(|| panic!("{}: {l:?} is not `<binary> <test>`", file.display()));
            (b.to_string(), t.trim().to_string())
        })
        .collect();
    in_vm.sort();
    let mut allowed: Vec<(String, String)> = ALLOWED_SKIPS
        .iter()
        .filter(|(b, _, _)| !GPU_BINARIES.contains(b))
        .map(|(b, t, _)| (b.to_string(), t.to_string()))
        .collect();
    allowed.sort();
    assert_eq!(in_vm, allowed, "{} and ALLOWED_SKIPS' RDMA and cgroup v2 entries", file.display());
}

#[test]
fn a_ledger_line_round_trips_and_a_bad_one_is_an_error_naming_its_file() {
    let e = Entry {
        binary: "cni".into(),
        test: "add\tdel".into(),
        what: "root\nand ip".into(),
        allowed: Some("a reason".into()),
    };
    let line = e.to_line();
    assert_eq!(line.matches('\t').count(), 3, "{line:?}");
    let back = Entry::parse(line.trim_end_matches('\n')).unwrap();
    assert_eq!(back, Entry { test: "add del".into(), what: "root and ip".into(), ..e });

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("1-0.tsv"), "just one field\n").unwrap();
    let err = read_ledger(dir.path()).unwrap_err();
    assert!(err.contains("1-0.tsv") && err.contains("expected 4 tab-separated fields"), "{err}");
    assert_eq!(read_ledger(&dir.path().join("absent")).unwrap(), []);
}

#[test]
fn a_binary_name_loses_cargos_hash_only() {
    assert_eq!(target_name("cgroup_v1-0123456789abcdef"), "cgroup_v1");
    assert_eq!(target_name("weft_cni-9f0e1d2c3b4a5968"), "weft_cni");
    assert_eq!(target_name("two-words"), "two-words");
    assert_eq!(target_name("plain"), "plain");
}

#[test]
fn the_tally_names_each_binary_cargo_ran_and_its_counts() {
    let log = "\
   Compiling weft-x v0.1.0
    Finished `test` profile [unoptimized + debuginfo] target(s) in 1.00s
     Running unittests src/lib.rs (target/debug/deps/weft_x-0123456789abcdef)

running 3 tests
test a ... ok
test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished in 0.01s

     Running tests/cni.rs (target/debug/deps/cni-fedcba9876543210)
skipped cni::add: needs root
test result: FAILED. 9 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.50s

   Doc-tests weft_x
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
";
    let ran = tally(log);
    let want = [
        Ran { binary: "unittests src/lib.rs (weft_x)".into(), passed: 3, failed: 0, ignored: 1, filtered: 2 },
        Ran { binary: "tests/cni.rs (cni)".into(), passed: 9, failed: 1, ignored: 0, filtered: 0 },
        Ran { binary: "doc-tests weft_x".into(), passed: 0, failed: 0, ignored: 0, filtered: 0 },
    ];
    assert_eq!(ran, want);
}

#[test]
fn the_report_lists_what_ran_and_marks_each_skip_allowed_or_unexplained() {
    let ran = [
        Ran { binary: "tests/gpu.rs (gpu)".into(), passed: 5, failed: 0, ignored: 0, filtered: 0 },
        Ran { binary: "tests/cni.rs (cni)".into(), passed: 11, failed: 1, ignored: 2, filtered: 0 },
    ];
    let (binary, test, why) = ALLOWED_SKIPS[0];
    let skips = [
        Entry { binary: binary.into(), test: test.into(), what: "a GPU".into(), allowed: Some(why.into()) },
        Entry { binary: "cni".into(), test: "add".into(), what: "root".into(), allowed: None },
    ];
    let text = weft_testkit::skip::report(Some(&ran), &skips, Path::new("/t/skip-ledger"));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].starts_with("  tests/gpu.rs (gpu)") && lines[1].ends_with("5 passed   0 failed   0 ignored"),
        "{text}"
    );
    assert!(lines[2].ends_with("11 passed   1 failed   2 ignored"), "{text}");
    assert_eq!(lines[3], "  total: 2 binaries, 16 passed (the skipped tests below among them), 1 failed, 2 ignored");
    assert_eq!(lines[4], "Skipped: 2 (1 allowed, 1 unexplained; ledger /t/skip-ledger)");
    assert_eq!(lines[5], format!("  {binary}::{test}: needs a GPU (allowed: {why})"));
    assert_eq!(lines[6], "  cni::add: needs root (UNEXPLAINED)");
    assert_eq!(lines.len(), 7, "{text}");

    let none = weft_testkit::skip::report(None, &[], Path::new("/t/skip-ledger"));
    assert_eq!(none, "Skipped: 0 (0 allowed, 0 unexplained; ledger /t/skip-ledger)\n");
}

/// scripts/gpu-check.sh runs every test binary that holds an allowed GPU skip (it runs them with
/// the allow-list off, so a GPU test it left out would skip unseen everywhere).
#[test]
fn the_gpu_check_runs_every_binary_holding_an_allowed_gpu_test() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu-check.sh");
    let script = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    for (binary, test, _) in ALLOWED_SKIPS.iter().filter(|(b, _, _)| GPU_BINARIES.contains(b)) {
        let runs = [" ", "\"", "\n"].iter().any(|end| script.contains(&format!("--test {binary}{end}")));
        assert!(runs, "{} does not run {binary}::{test}", file.display());
    }
}
