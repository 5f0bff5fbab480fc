#!/usr/bin/env bash
# Every GPU-side test, for a machine with an NVIDIA GPU and its driver (not run by CI: CI has no GPU).
#
#   bash scripts/gpu-check.sh
#
# Runs, with the skip switch on and the allow-list off (WEFT_TEST_REQUIRE_ALL=1,
# WEFT_TEST_NO_ALLOW_LIST=1), so a test that finds no GPU FAILS instead of skipping:
#   - weft-transport's `gpu` feature: tests/gpu.rs (CUDA IPC between processes, the pinned-host
#     staged path over TCP, descriptors) and the payload codec's unit tests;
#   - the `nvml` feature against the real library: weft-topology's real-NVML discovery test and
#     weft-gpu-plugin's tests/nvml.rs (discovery of the real GPUs and the health watcher on them).
# These include every GPU test in weft_testkit::skip::ALLOWED_SKIPS. It prints what this machine
# shows (nvidia-smi, device nodes, libraries), what ran per test binary and every test that lacked
# something, and exits non-zero when any test failed or no GPU is visible.
set -uo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> gpu-check: %s\n' "$*"; }

target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
run_log="$target/gpu-check.log"
export WEFT_TEST_SKIP_LEDGER="$target/gpu-check-ledger"
export WEFT_TEST_REQUIRE_ALL=1 WEFT_TEST_NO_ALLOW_LIST=1
rm -rf "$WEFT_TEST_SKIP_LEDGER"
mkdir -p "$target"
: >"$run_log"

log "what this machine shows"
visible=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 | tee -a "$run_log" | grep -q '^GPU '; then
  visible=1
else
  echo "nvidia-smi lists no GPU ($(command -v nvidia-smi || echo 'nvidia-smi is not installed'))"
fi
ls /dev/nvidia* 2>/dev/null || echo "no /dev/nvidia* device nodes"
for lib in libnvidia-ml.so.1 libcuda.so.1; do
  ldconfig -p 2>/dev/null | grep -q "$lib" && echo "$lib: found by the loader" || echo "$lib: not found by the loader"
done

# Each step: a name and its cargo test arguments. Every step runs, whatever the one before did.
steps=(
  "weft-transport gpu (tests/gpu.rs)|-p weft-transport --features gpu --test gpu"
  "weft-transport gpu (unit tests of the payload codec)|-p weft-transport --features gpu --lib gpu::"
  "weft-topology nvml (tests/discover.rs, real NVML)|-p weft-topology --features nvml --test discover real_nvml"
  "weft-gpu-plugin nvml (tests/nvml.rs)|-p weft-gpu-plugin --features nvml --test nvml"
)
failed=()
for step in "${steps[@]}"; do
  name="${step%%|*}"
  read -r -a args <<<"${step#*|}"
  log "$name"
  # A filter after `--test X` goes to the test binary; split cargo's args from it.
  cargo_args=()
  filter=()
  for ((i = 0; i < ${#args[@]}; i++)); do
    a="${args[$i]}"
    if [ "$a" = --test ] || [ "$a" = -p ] || [ "$a" = --features ]; then
      cargo_args+=("$a" "${args[$((i + 1))]}")
      i=$((i + 1))
    elif [ "$a" = --lib ]; then
      cargo_args+=("$a")
    else
      filter+=("$a")
    fi
  done
  if ! cargo test --locked "${cargo_args[@]}" -- "${filter[@]}" 2>&1 | tee -a "$run_log"; then
    failed+=("$name")
  fi
done

log "what ran and what lacked something (${run_log}, ${WEFT_TEST_SKIP_LEDGER})"
# The suite's own report (weft_testkit::skip::report): cargo's counts per binary and the ledger. With
# the allow-list off each ledger entry is a test that failed above for what it lacked (so the
# report's own verdict adds nothing: it is printed, not counted).
WEFT_TEST_LOG="$run_log" WEFT_TEST_REQUIRE_ALL=0 WEFT_TEST_NO_ALLOW_LIST=0 RUST_BACKTRACE=0 \
  cargo test --locked -q -p weft-testkit --test skip_summary -- --ignored --nocapture 2>/dev/null |
  grep -v -E '^(running 1 test|test result|failures:|$)|the_run_skipped' || true
echo "Each test:"
grep -E '^test .* \.\.\. (ok|FAILED)$' "$run_log" | sed 's/^/  /' || true

if [ "$visible" = 0 ]; then
  echo "gpu-check: FAILED: no GPU is visible on this machine (nvidia-smi lists none)"
fi
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpu-check: FAILED: %s\n' "${failed[@]}"
fi
if [ "$visible" = 0 ] || [ "${#failed[@]}" -gt 0 ]; then
  exit 1
fi
echo "gpu-check: every GPU-side test ran and passed"
