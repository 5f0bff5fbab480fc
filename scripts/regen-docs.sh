#!/usr/bin/env bash
# Rewrite every block of generated command output in README.md, BENCHMARKS.md and docs/*.md
# (`<!-- generated: weft ... -->` ... `<!-- end generated -->`) with what the code prints now.
# Run it after a change that moves the documented numbers (placement policy, report format), then
# review and commit the diff. crates/weft/tests/docs_numbers.rs checks the same blocks in CI.
#
#   bash scripts/regen-docs.sh            # release build of weft (the matrix blocks run 5,000-node cells)
#   WEFT_DOCS_BIN=target/debug/weft bash scripts/regen-docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${WEFT_DOCS_BIN:-}" ]; then
  cargo build --release -p weft --locked
  WEFT_DOCS_BIN="$PWD/${CARGO_TARGET_DIR:-target}/release/weft"
fi
WEFT_REGEN_DOCS=1 WEFT_DOCS_BIN="$WEFT_DOCS_BIN" \
  cargo test -p weft --locked --test docs_numbers documented_command_output_is_what_the_code_prints -- --nocapture
