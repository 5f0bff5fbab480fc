//! The summary `scripts/test-all.sh` prints at the end of a run: what ran (cargo test's own counts
//! per test binary, read from the run's output in `WEFT_TEST_LOG`) and every skip the suite's tests
//! wrote to the skip ledger (`weft_testkit::require`), each with what it lacked and, for a test in
//! `ALLOWED_SKIPS`, why CI cannot run it. It fails on a skip the allow-list does not explain.
//!
//!   rm -rf target/skip-ledger && cargo test --workspace 2>&1 | tee target/test-all.log; \
//!     WEFT_TEST_LOG=target/test-all.log cargo test -p weft-testkit --test skip_summary -- --ignored --nocapture
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit::skip::{ledger_dir, read_ledger, tally};

/// The environment variable naming the file that holds the run's cargo test output.
const LOG_ENV: &str = "WEFT_TEST_LOG";

#[test]
#[ignore = "needs the ledger and output of a whole run; scripts/test-all.sh runs it at the end"]
fn the_run_skipped_nothing_the_allow_list_does_not_explain() {
    if let Some(path) = std::env::var_os(LOG_ENV).filter(|p| !p.is_empty()) {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{LOG_ENV}={}: {e}", std::path::Path::new(&path).display()));
        let ran = tally(&text);
        println!("What ran (cargo test's counts per test binary, in the order cargo ran them):");
        for r in &ran {
            println!("  {:<64} {:>4} passed {:>3} failed {:>3} ignored", r.binary, r.passed, r.failed, r.ignored);
        }
        let sum = |f: fn(&weft_testkit::skip::Ran) -> u64| ran.iter().map(f).sum::<u64>();
        println!(
            "  total: {} binaries, {} passed (skipped tests among them, below), {} failed, {} ignored",
            ran.len(),
            sum(|r| r.passed),
            sum(|r| r.failed),
            sum(|r| r.ignored)
        );
    }
    let dir = ledger_dir();
    let skips = read_ledger(&dir).unwrap_or_else(|e| panic!("the skip ledger: {e}"));
    let unexplained: Vec<_> = skips.iter().filter(|s| s.allowed.is_none()).collect();
    println!(
        "Skipped: {} ({} allowed, {} unexplained; ledger {})",
        skips.len(),
        skips.len() - unexplained.len(),
        unexplained.len(),
        dir.display()
    );
    for s in &skips {
        match &s.allowed {
            Some(why) => println!("  {}::{}: needs {} (allowed: {why})", s.binary, s.test, s.what),
            None => println!("  {}::{}: needs {} (UNEXPLAINED)", s.binary, s.test, s.what),
        }
    }
    assert!(
        unexplained.is_empty(),
        "{} skipped tests the allow-list does not explain: give the machine what they need, or add them to \
         weft_testkit::skip::ALLOWED_SKIPS with why CI cannot run them",
        unexplained.len()
    );
}
