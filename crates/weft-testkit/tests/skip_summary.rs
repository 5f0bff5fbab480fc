//! The report `scripts/test-all.sh` prints at the end of a run (`weft_testkit::skip::report`):
//! what ran (cargo test's own counts per test binary, read from the run's output in
//! `WEFT_TEST_LOG`) and every entry the suite's tests wrote to the skip ledger
//! (`weft_testkit::require`), each with what it lacked and, for a test in `ALLOWED_SKIPS`, why CI
//! cannot run it. It fails on an entry the allow-list does not explain.
//!
//!   rm -rf target/skip-ledger && cargo test --workspace 2>&1 | tee target/test-all.log; \
//!     WEFT_TEST_LOG=target/test-all.log cargo test -p weft-testkit --test skip_summary -- --ignored --nocapture
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit::skip::{ledger_dir, read_ledger, report, tally};

/// The environment variable naming the file that holds the run's cargo test output.
const LOG_ENV: &str = "WEFT_TEST_LOG";

#[test]
#[ignore = "needs the ledger and output of a whole run; scripts/test-all.sh runs it at the end"]
fn the_run_skipped_nothing_the_allow_list_does_not_explain() {
    let ran = std::env::var_os(LOG_ENV).filter(|p| !p.is_empty()).map(|path| {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{LOG_ENV}={}: {e}", std::path::Path::new(&path).display()));
        tally(&text)
    });
    let dir = ledger_dir();
    let entries = read_ledger(&dir).unwrap_or_else(|e| panic!("the skip ledger: {e}"));
    print!("{}", report(ran.as_deref(), &entries, &dir));
    let unexplained = entries.iter().filter(|s| s.allowed.is_none()).count();
    assert!(
        unexplained == 0,
        "{unexplained} tests skipped that the allow-list does not explain: give the machine what they need, \
         or add them to weft_testkit::skip::ALLOWED_SKIPS with why CI cannot run them"
    );
}
