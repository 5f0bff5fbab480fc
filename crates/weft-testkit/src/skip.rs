//! The one way a test skips when what it needs is missing (root, a network namespace, etcd,
//! nats-server, dnsmasq, an RDMA device, a GPU, a cgroup hierarchy, ...):
//!
//! ```ignore
//! if !weft_testkit::require(netns::is_root(), "root, to make network namespaces") { return; }
//! let Some(ctx) = weft_testkit::require_ok(GpuContext::probe_open()) else { return };
//! ```
//!
//! A skip is never silent: it prints `skipped <binary>::<test>: needs <what>` to stderr and writes
//! the same to a ledger under the target directory (`<target>/skip-ledger/`, one file per skip),
//! which `scripts/test-all.sh` clears before the suite and summarises after it (the
//! `skip_summary` test). With [`SWITCH`] (`WEFT_TEST_REQUIRE_ALL=1`, set by `scripts/test-all.sh`)
//! a skip is a failure naming what was missing, unless the test is in [`ALLOWED_SKIPS`], the
//! commented list of tests CI's host cannot run (no GPU, no RDMA device, no cgroup v2 there).
//!
//! The test's name is the name of the thread that calls the helper (libtest names each test's
//! thread after the test; a `#[tokio::test]` body runs on it), so call it from the test's own
//! thread, not from a spawned task. In a bench binary (no libtest) the name is the binary's.
//!
//! [`lint`] is the check that no test file skips any other way.
//!
//! Decisions. The allow-list names tests, not needs (a "no GPU" entry would let the next GPU test
//! skip in CI unseen); the `skip_lint` test fails on an entry that names no test, so a rename
//! cannot leave one behind. Only what CI's host cannot have is on it: a GPU, an RDMA device,
//! a cgroup2 mount (the last two run in `scripts/vm-check.sh`'s VM, where [`NO_ALLOW_LIST`] makes
//! their skip a failure; `scripts/gpu-check.sh` does the same for the GPU tests on a machine with
//! one); root, netns, etcd, nats-server,
//! dnsmasq, setpriv, host-local, cgroup v1 and 2 CPUs are all on CI's machine, so their skips fail
//! there. The ledger is one file per skip (no appends racing across test processes), as the RBAC
//! ledger is.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The environment variable that turns every skip outside [`ALLOWED_SKIPS`] into a failure:
/// unset, empty or `0` is off, `1` is on; any other value fails the test that reads it.
pub const SWITCH: &str = "WEFT_TEST_REQUIRE_ALL";

/// Tests that may skip even under [`SWITCH`]: `(binary, test, why CI cannot run it)`. The binary
/// is the test target's name (a `tests/<name>.rs` file), the test its function's name. Each entry
/// is one that CI's machine cannot possibly run; the summary after the suite prints every skip of
/// these with its reason. The `skip_lint` test fails on an entry that names no test.
pub const ALLOWED_SKIPS: &[(&str, &str, &str)] = &[
    // GPU: CI has none. They run in scripts/gpu-check.sh on a machine with a driver and a GPU.
    ("gpu", "staged_path_over_tcp_delivers_the_same_bytes", CUDA_REASON),
    ("gpu", "ipc_between_two_processes_shares_device_memory", CUDA_REASON),
    ("gpu", "ipc_descriptor_from_another_node_is_refused", CUDA_REASON),
    ("nvml", "real_nvml_discovers_the_gpus_and_the_health_watcher_starts", NVML_REASON),
    // RDMA: CI's kernel has no RDMA device (and no rdma_rxe module to make a Soft-RoCE one). They
    // run in scripts/vm-check.sh, on Soft-RoCE in Debian's kernel under qemu.
    ("rdma", "device_backend_passes_the_conformance_suite", RDMA_REASON),
    ("rdma", "device_small_ring_wraps_many_times_under_credits", RDMA_REASON),
    ("rdma", "device_held_payload_is_never_overwritten", RDMA_REASON),
    ("rdma", "device_peer_process_death_fails_the_reader_after_its_frames", RDMA_REASON),
    // cgroup v2: a cgroup v1 host has no cgroup2 mount, or (hybrid) one without controllers. They
    // run in scripts/vm-check.sh, on the unified hierarchy of Debian's kernel under qemu.
    ("cgroup_v1", "v2_paths_on_the_real_unified_mount", CGROUP_V2_REASON),
    ("cgroup_v1", "v2_applies_settings_the_kernel_holds_them_and_rolls_back", CGROUP_V2_REASON),
];

const CUDA_REASON: &str = "needs a CUDA driver and a GPU; CI has no GPU; runs in scripts/gpu-check.sh";
const NVML_REASON: &str = "needs NVML (libnvidia-ml.so.1) and a GPU; CI has no GPU; runs in scripts/gpu-check.sh";
const RDMA_REASON: &str =
    "needs an RDMA device with an active port; CI's host has none; runs in scripts/vm-check.sh (Soft-RoCE under qemu)";
const CGROUP_V2_REASON: &str = "needs a cgroup2 mount with the cpu, cpuset and memory controllers (CI's host is cgroup \
     v1: they are bound to its v1 mounts); runs in scripts/vm-check.sh (cgroup v2 under qemu)";

/// What a skip turns into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The test returns early and passes; the ledger records it as unexplained.
    Skip,
    /// The test returns early and passes; it is in [`ALLOWED_SKIPS`] for this reason.
    Allowed(&'static str),
    /// The test fails ([`SWITCH`] is on and the test is not allowed to skip).
    Fail,
}

/// The switch's value, read: `Ok(true)` on, `Ok(false)` off, `Err` for a value it does not know.
pub fn parse_switch(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{SWITCH}={other:?}: expected 1 (every skip fails) or 0/unset")),
    }
}

/// Whether [`SWITCH`] is on in this process; panics on a value it does not know.
pub fn required_all() -> bool {
    let value = std::env::var(SWITCH).ok();
    parse_switch(value.as_deref()).unwrap_or_else(|e| panic!("{e}"))
}

/// The environment variable that turns the allow-list off: with it on (`1`) and [`SWITCH`] on,
/// every skip fails, an allow-listed one too. Set where a test's need is meant to be met: inside
/// the VM of `scripts/vm-check.sh` (cgroup v2, Soft-RoCE) and by `scripts/gpu-check.sh` (a GPU).
/// Unset, empty or `0` is off; any other value fails the test that reads it.
pub const NO_ALLOW_LIST: &str = "WEFT_TEST_NO_ALLOW_LIST";

/// [`NO_ALLOW_LIST`]'s value, read as [`parse_switch`] reads the switch's.
pub fn parse_no_allow_list(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{NO_ALLOW_LIST}={other:?}: expected 1 (the allow-list is off) or 0/unset")),
    }
}

/// Whether [`NO_ALLOW_LIST`] is on in this process; panics on a value it does not know.
pub fn allow_list_off() -> bool {
    let value = std::env::var(NO_ALLOW_LIST).ok();
    parse_no_allow_list(value.as_deref()).unwrap_or_else(|e| panic!("{e}"))
}

/// The allow-list's reason for `binary::test`, if it has an entry.
pub fn allowed(binary: &str, test: &str) -> Option<&'static str> {
    ALLOWED_SKIPS.iter().find(|(b, t, _)| *b == binary && *t == test).map(|(_, _, why)| *why)
}

/// What a skip of `binary::test` turns into with the switch `on` (and the allow-list in force).
pub fn verdict(on: bool, binary: &str, test: &str) -> Verdict {
    verdict_with(on, true, binary, test)
}

/// What a skip of `binary::test` turns into with the switch `on` and the allow-list in force or
/// not (`allow_list`; [`NO_ALLOW_LIST`] turns it off). Without the switch a skip never fails.
pub fn verdict_with(on: bool, allow_list: bool, binary: &str, test: &str) -> Verdict {
    match allowed(binary, test) {
        Some(_) if on && !allow_list => Verdict::Fail,
        Some(why) => Verdict::Allowed(why),
        None if on => Verdict::Fail,
        None => Verdict::Skip,
    }
}

/// `true` when `met`. Otherwise the calling test skips: the skip is printed and written to the
/// ledger, and `false` comes back (the test returns), or, with [`SWITCH`] on and the test not in
/// [`ALLOWED_SKIPS`], the test fails with `needs <what>`.
#[track_caller]
pub fn require(met: bool, what: impl Display) -> bool {
    if !met {
        skip(&what.to_string());
    }
    met
}

/// The value when `r` is `Ok`; otherwise a skip as [`require`], with the error as what is missing.
#[track_caller]
pub fn require_ok<T, E: Display>(r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            skip(&e.to_string());
            None
        }
    }
}

#[track_caller]
fn skip(what: &str) {
    let (binary, test) = current_test();
    let on = required_all();
    let allow_list = !(on && allow_list_off());
    let verdict = verdict_with(on, allow_list, &binary, &test);
    let entry = Entry { binary: binary.clone(), test: test.clone(), what: what.to_string(), allowed: None };
    let entry = match verdict {
        Verdict::Allowed(why) => Entry { allowed: Some(why.to_string()), ..entry },
        _ => entry,
    };
    let line = entry.to_line();
    record(&line);
    match verdict {
        Verdict::Fail if !allow_list => panic!(
            "{binary}::{test} needs {what}, and {SWITCH}=1 with {NO_ALLOW_LIST}=1 turns every skip into a failure: \
             this machine is meant to have what the test needs{}",
            allowed(&binary, &test).map(|why| format!(" (elsewhere it may skip: {why})")).unwrap_or_default()
        ),
        Verdict::Fail => panic!(
            "{binary}::{test} needs {what}, and {SWITCH}=1 turns a skip into a failure (set it to 0 to let the \
             test skip, or add the test to weft_testkit::skip::ALLOWED_SKIPS with why CI cannot run it)"
        ),
        Verdict::Allowed(why) => eprintln!("skipped {binary}::{test}: needs {what} (allowed: {why})"),
        Verdict::Skip => eprintln!("skipped {binary}::{test}: needs {what}"),
    }
}

/// The running test binary's target name (its file name less cargo's `-<hash>`) and the test's name
/// (the thread's; the binary's own in a bench without libtest).
pub fn current_test() -> (String, String) {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_ref().and_then(|e| e.file_stem()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let binary = target_name(&stem).to_string();
    let test = match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => binary.clone(),
    };
    (binary, test)
}

/// `stem` less a trailing `-<16 hex digits>` (cargo's hash on a test or bench binary).
pub fn target_name(stem: &str) -> &str {
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => name,
        _ => stem,
    }
}

/// One skip, as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The test binary's target name.
    pub binary: String,
    /// The test's name.
    pub test: String,
    /// What it needed and did not find.
    pub what: String,
    /// The allow-list's reason, if the test is on it.
    pub allowed: Option<String>,
}

fn one_line(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

impl Entry {
    /// `binary \t test \t what \t allowed-reason` (empty when not allowed), with a newline.
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\n",
            one_line(&self.binary),
            one_line(&self.test),
            one_line(&self.what),
            one_line(self.allowed.as_deref().unwrap_or(""))
        )
    }

    /// An entry from a ledger line, or why the line is not one.
    pub fn parse(line: &str) -> Result<Entry, String> {
        let fields: Vec<&str> = line.split('\t').collect();
        let [binary, test, what, allowed] = fields[..] else {
            return Err(format!("expected 4 tab-separated fields, found {}: {line:?}", fields.len()));
        };
        Ok(Entry {
            binary: binary.to_string(),
            test: test.to_string(),
            what: what.to_string(),
            allowed: (!allowed.is_empty()).then(|| allowed.to_string()),
        })
    }
}

/// The environment variable that puts the ledger elsewhere (the helper's own tests use it, so
/// their deliberate skips stay out of the suite's ledger).
pub const LEDGER_ENV: &str = "WEFT_TEST_SKIP_LEDGER";

/// `<target>/skip-ledger`: beside the profile directory of the running test binary
/// (`<target>/debug/deps/<test>`), so every crate's tests write to the same place; or
/// [`LEDGER_ENV`] when set.
pub fn ledger_dir() -> PathBuf {
    match std::env::var_os(LEDGER_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => crate::rbac::ledger_dir().with_file_name("skip-ledger"),
    }
}

static SKIPS: AtomicUsize = AtomicUsize::new(0);

/// Writes `line` to the ledger as a file of its own. A ledger that cannot be written is said on
/// stderr (the skip itself is printed either way).
fn record(line: &str) {
    let dir = ledger_dir();
    let n = SKIPS.fetch_add(1, Ordering::Relaxed);
    let file = dir.join(format!("{}-{n}.tsv", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, line)) {
        eprintln!("the skip ledger {} cannot be written: {e}", file.display());
    }
}

/// Every entry of the ledger in `dir` (none when it does not exist), sorted; a line that is not an
/// entry is an error naming its file.
pub fn read_ledger(dir: &Path) -> Result<Vec<Entry>, String> {
    let Ok(files) = std::fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut entries = Vec::new();
    for f in files {
        let path = f.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines().filter(|l| !l.is_empty()) {
            entries.push(Entry::parse(line).map_err(|e| format!("{}: {e}", path.display()))?);
        }
    }
    entries.sort_by(|a, b| (&a.binary, &a.test, &a.what).cmp(&(&b.binary, &b.test, &b.what)));
    Ok(entries)
}

/// What one test binary ran, from cargo test's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ran {
    /// The binary: `tests/foo.rs`, `unittests src/lib.rs`, `Doc-tests weft_x` as cargo names it,
    /// with the crate it belongs to when cargo says (`weft-x: tests/foo.rs`).
    pub binary: String,
    /// Tests passed (a skipped test passes: the skip ledger says which).
    pub passed: u64,
    /// Tests failed.
    pub failed: u64,
    /// Tests ignored.
    pub ignored: u64,
    /// Tests filtered out.
    pub filtered: u64,
}

fn count(summary: &str, word: &str) -> u64 {
    summary
        .split(';')
        .find_map(|part| part.trim().strip_suffix(word).and_then(|n| n.trim().rsplit(' ').next()?.parse().ok()))
        .unwrap_or(0)
}

/// Each binary cargo test ran, from its output (`Running <target> (<path>)` or `Doc-tests <crate>`,
/// then `test result: ...`), in order. A result without a header before it is named `?`.
pub fn tally(log: &str) -> Vec<Ran> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Running ") {
            // `Running tests/foo.rs (target/debug/deps/foo-<hash>)`: the crate is the path's
            // directory only for unit tests, so name the target and the binary file.
            let (target, exe) = match rest.rsplit_once(" (") {
                Some((t, e)) => (t, e.trim_end_matches(')')),
                None => (rest, ""),
            };
            let stem = Path::new(exe).file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            current =
                Some(if stem.is_empty() { target.to_string() } else { format!("{target} ({})", target_name(&stem)) });
        } else if let Some(rest) = line.strip_prefix("Doc-tests ") {
            current = Some(format!("doc-tests {rest}"));
        } else if let Some(rest) = line.strip_prefix("test result: ") {
            let summary = rest.split_once(". ").map_or(rest, |(_, s)| s);
            out.push(Ran {
                binary: current.take().unwrap_or_else(|| "?".to_string()),
                passed: count(summary, "passed"),
                failed: count(summary, "failed"),
                ignored: count(summary, "ignored"),
                filtered: count(summary, "filtered out"),
            });
        }
    }
    out
}

/// The end-of-run report: what ran per binary (when `ran` is given) and every skip in `skips`,
/// each allowed one with its reason and the others marked `UNEXPLAINED`.
pub fn report(ran: Option<&[Ran]>, skips: &[Entry], ledger: &Path) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if let Some(ran) = ran {
        out.push_str("What ran (cargo test's counts per test binary, in the order cargo ran them):\n");
        for r in ran {
            let _ = writeln!(
                out,
                "  {:<56} {:>4} passed {:>3} failed {:>3} ignored",
                r.binary, r.passed, r.failed, r.ignored
            );
        }
        let sum = |f: fn(&Ran) -> u64| ran.iter().map(f).sum::<u64>();
        let _ = writeln!(
            out,
            "  total: {} binaries, {} passed (the skipped tests below among them), {} failed, {} ignored",
            ran.len(),
            sum(|r| r.passed),
            sum(|r| r.failed),
            sum(|r| r.ignored)
        );
    }
    let unexplained = skips.iter().filter(|s| s.allowed.is_none()).count();
    let _ = writeln!(
        out,
        "Skipped: {} ({} allowed, {unexplained} unexplained; ledger {})",
        skips.len(),
        skips.len() - unexplained,
        ledger.display()
    );
    for s in skips {
        match &s.allowed {
            Some(why) => {
                let _ = writeln!(out, "  {}::{}: needs {} (allowed: {why})", s.binary, s.test, s.what);
            }
            None => {
                let _ = writeln!(out, "  {}::{}: needs {} (UNEXPLAINED)", s.binary, s.test, s.what);
            }
        }
    }
    out
}

/// Where a source file sits, for [`lint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Under a crate's `tests/`, `benches/` or `examples/`: all of it is test code.
    Test,
    /// Under a crate's `src/`: only what follows its first `#[cfg(test)]` is test code.
    Library,
}

/// What in `text` (a Rust file of kind `kind`) skips other than through this module's helper:
/// reading the `CI` environment variable (anywhere), and, in test code, printing a line that says
/// a test skipped, or defining a skip helper (a function named `skip`, `skip_*`, `*_skip` such as
/// `gpu_or_skip`, or `prerequisite`, or a closure bound to `skip`). Test code in `src/` is what
/// follows the first `#[cfg(test)]` line before a `mod`. Each finding names its line.
pub fn lint(text: &str, kind: SourceKind) -> Vec<String> {
    let mut found = Vec::new();
    let test_from = match kind {
        SourceKind::Test => 0,
        SourceKind::Library => {
            // The first `#[cfg(test)]` on a line of its own with a `mod` on the next line.
            let mut at = 0;
            let mut from = text.len();
            let mut lines = text.split_inclusive('\n').peekable();
            while let Some(line) = lines.next() {
                let next_is_mod = lines.peek().is_some_and(|l| l.contains("mod "));
                if line.trim() == "#[cfg(test)]" && next_is_mod {
                    from = at;
                    break;
                }
                at += line.len();
            }
            from
        }
    };
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    for pattern in ["var(\"CI\")", "var_os(\"CI\")"] {
        for (at, _) in text.match_indices(pattern) {
            found.push(format!("line {}: reads the CI environment variable (use weft_testkit::require)", line_of(at)));
        }
    }
    let test_code = &text[test_from..];
    for mac in ["println!(", "print!("] {
        for (at, _) in test_code.match_indices(mac) {
            // The macro's arguments, up to the end of the statement.
            let args = &test_code[at..];
            let args = &args[..args.find(");").map_or(args.len(), |e| e + 2)];
            if args.to_ascii_lowercase().contains("skip") {
                found.push(format!(
                    "line {}: prints that a test skipped (use weft_testkit::require)",
                    line_of(test_from + at)
                ));
            }
        }
    }
    for (at, _) in test_code.match_indices("fn ") {
        let name: String = test_code[at + 3..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let word_before_ok = at == 0 || !test_code.as_bytes()[at - 1].is_ascii_alphanumeric();
        if word_before_ok && is_skip_helper_name(&name) {
            found.push(format!(
                "line {}: defines its own skip helper `{name}` (use weft_testkit::require)",
                line_of(test_from + at)
            ));
        }
    }
    for pattern in ["let skip = |", "let skip = move |"] {
        for (at, _) in test_code.match_indices(pattern) {
            found.push(format!(
                "line {}: defines its own skip helper `skip` (use weft_testkit::require)",
                line_of(test_from + at)
            ));
        }
    }
    found.sort_by_key(|f| f.split(':').next().and_then(|l| l.trim_start_matches("line ").parse::<usize>().ok()));
    found
}

fn is_skip_helper_name(name: &str) -> bool {
    name == "skip" || name == "prerequisite" || name.starts_with("skip_") || name.ends_with("_skip")
}
