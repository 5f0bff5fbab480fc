#!/usr/bin/env bash
# The whole test suite, as CI runs it (`.ci/run` calls exactly this).
# Installs and starts what the tests need, then runs format, lint and every test.
# Run as root on a fresh Debian machine with a Rust toolchain: `bash scripts/test-all.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# System packages the tests need. The GPU topology engine needs none; later subsystems add theirs here
# (etcd-server, nats-server, dnsmasq-base, libibverbs-dev to link the RDMA feature,
# containernetworking-plugins, iproute2; chromium for the browser test of weft simulate --report).
NEEDED_DEBS=(containernetworking-plugins iproute2 etcd-server nats-server dnsmasq-base libibverbs-dev chromium)
if [ "${#NEEDED_DEBS[@]}" -gt 0 ]; then
  missing=()
  for p in "${NEEDED_DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
fi

# A cold CI run gains nothing from incremental compilation, and its caches take ~1.6 GB of a disk
# that can be small; set CARGO_INCREMENTAL=1 to keep them locally.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

log "disk"
df -h . || true

log "toolchain"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo --version

log "cargo fmt --check"
cargo fmt --all --check

log "cargo clippy (workspace, all targets, NVML, RDMA and GPU features on)"
cargo clippy --workspace --all-targets --features weft/nvml,weft-transport/rdma,weft-transport/gpu --locked -- -D warnings

log "deploy manifests (hadolint, yamllint, kustomize and Helm renders, Kubernetes 1.34 schema validation, chart = kustomize)"
bash scripts/lint-deploy.sh

log "cargo test (workspace)"
# Every RBAC check (weft_testkit::rbac::assert_granted) writes the rules its requests used to this
# ledger; the check after the suite fails on rules that no test exercised.
rm -rf "${CARGO_TARGET_DIR:-target}/rbac-ledger"
# Every skip (weft_testkit::require) writes the test and what it lacked to the skip ledger. The switch
# turns a skip into a failure unless weft_testkit::skip::ALLOWED_SKIPS explains why CI cannot run the
# test (no GPU, no RDMA device, no cgroup v2 here). On exit, pass or fail, the run prints what ran (per
# test binary, from the output kept in test-all.log) and every skip (the skip_summary test).
export WEFT_TEST_REQUIRE_ALL=1
rm -rf "${CARGO_TARGET_DIR:-target}/skip-ledger"
# Absolute: cargo runs the summary test from its package's directory.
test_log="$(realpath -m "${CARGO_TARGET_DIR:-target}")/test-all.log"
# What the VM step ran (scripts/vm-check.sh writes it); printed with the summary.
vm_summary="$(realpath -m "${CARGO_TARGET_DIR:-target}")/vm-check.txt"
rm -f "$vm_summary"
# The suite is built as the image ships weft: with the `nvml` feature (Dockerfile), so the NVML
# tests run (here without the driver's library: the library-absent path, for real) at no extra
# build. Every later cargo call of this script that builds tests uses the same features (the
# workspace with --test/--bench picks the target), so none rebuilds a crate the suite built.
export WEFT_SUITE_FEATURES=weft/nvml,weft-transport/rdma,weft-transport/gpu
skip_summary() {
  log "what ran and what skipped (${test_log}, ${CARGO_TARGET_DIR:-target}/skip-ledger)"
  local status=0
  WEFT_TEST_LOG="$test_log" cargo test --workspace --features "$WEFT_SUITE_FEATURES" --test skip_summary --locked -q \
    -- --ignored --nocapture || status=$?
  if [ -f "$vm_summary" ]; then cat "$vm_summary"; else echo "VM (scripts/vm-check.sh): not run"; fi
  return "$status"
}
trap 'rc=$?; skip_summary || rc=1; exit $rc' EXIT
cargo test --workspace --features "$WEFT_SUITE_FEATURES" --locked --no-fail-fast 2>&1 | tee "$test_log"

log "cgroup v2 and Soft-RoCE: the allow-listed tests this host cannot run, in Debian's kernel under qemu"
# Boots Debian's kernel (TCG when the host has no usable KVM) with the tests' binaries in an
# initramfs; there none may skip. ~3 min warm, ~5 cold; bounded by its own timeout.
bash scripts/vm-check.sh

log "weft simulate --matrix, the small cells (weft against the baselines; a loss on a cell marked gate: true fails)"
# The debug weft binary the suite just built for its CLI tests. Which cells gate is set in the
# matrix file (crates/weft-sim/scenarios/matrix.yaml), not here.
"${CARGO_TARGET_DIR:-target}/debug/weft" simulate --matrix crates/weft-sim/scenarios/matrix.yaml --small-only

log "RBAC: every rule of deploy/'s roles exercised by some test (the ledger the suite just wrote)"
cargo test --workspace --features "$WEFT_SUITE_FEATURES" --test rbac_exercised --locked -- --ignored --nocapture

log "weft-transport's side-by-side bench, quick smoke run (real nats-server; every path checked for loss and duplicates)"
cargo test --workspace --features "$WEFT_SUITE_FEATURES" --bench transport --locked

# The fuzz targets (fuzz/, scripts/fuzz.sh) are not run here: their instrumented nightly build
# shares nothing with this one and costs ~26 min of two cores cold, which would take a cold run of
# this script past its 40-minute budget (FUZZING.md, "In CI"). Run `bash scripts/fuzz.sh` for them.
