#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ (cargo fuzz, libFuzzer) and runs each in turn, one process
# each, for a set time or a set number of executions. Prints per target: executions, executions
# per second, seconds, corpus size and the result. Exits non-zero when a target crashes (the
# input that did it stays in fuzz/artifacts/<target>/) or the fuzzer cannot be built.
#
#   scripts/fuzz.sh [SECONDS | --runs N] [TARGET...]   default: 10 seconds per target, all targets
#   scripts/fuzz.sh --merge [TARGET...]                add what the runs found to fuzz/corpus/
#
# Needs the nightly toolchain (`rustup toolchain install nightly`: sanitizer coverage flags) and
# cargo-fuzz (`cargo install cargo-fuzz`); without either it fails and says so. The seeds in
# fuzz/corpus/<target>/ are read, never written: what a run finds goes to fuzz/corpus-work/
# (not in git). Builds go to fuzz/target (or $FUZZ_TARGET_DIR). FUZZING.md has the targets and
# the recorded runs.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'fuzz.sh: %s\n' "$*" >&2; exit 2; }

mode=time
amount=10
if [ "${1:-}" = "--runs" ]; then
  mode=runs
  amount="${2:?--runs needs a number}"
  shift 2
elif [ "${1:-}" = "--merge" ]; then
  mode=merge
  shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  amount="$1"
  shift
fi
[[ "$amount" =~ ^[0-9]+$ ]] || die "'$amount' is not a number"

# The fuzzer needs nightly (-Zsanitizer=fuzzer flags) and cargo-fuzz: fail, never skip, without them.
cargo +nightly --version >/dev/null 2>&1 ||
  die "the nightly toolchain is missing (rustup toolchain install nightly); the fuzz targets need it"
cargo +nightly fuzz --version >/dev/null 2>&1 ||
  die "cargo-fuzz is missing (cargo install cargo-fuzz --locked); the fuzz targets need it"

all_targets=$(cd fuzz && cargo +nightly fuzz list)
if [ "$#" -gt 0 ]; then targets="$*"; else targets="$all_targets"; fi
for t in $targets; do
  grep -qx "$t" <<<"$all_targets" || die "no fuzz target '$t' (targets: $(echo $all_targets))"
done

export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/fuzz/target}"
# Release code with debug assertions (overflow checks and debug_assert! count as crashes).
# FUZZ_NO_BUILD=1 runs the binaries already built (while a rebuild would compete for the CPU).
if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  (cd fuzz && cargo +nightly fuzz build -O --debug-assertions) || die "the fuzz targets do not build"
fi
bin_dir="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

mkdir -p fuzz/logs
if [ "$mode" = merge ]; then
  for t in $targets; do
    [ -d "fuzz/corpus-work/$t" ] || continue
    "$bin_dir/$t" -merge=1 "fuzz/corpus/$t" "fuzz/corpus-work/$t" >"fuzz/logs/$t.merge.log" 2>&1
    echo "$t: $(find "fuzz/corpus/$t" -type f | wc -l) files in fuzz/corpus/$t"
  done
  exit 0
fi

failed=()
printf '%-24s %14s %10s %8s %8s  %s\n' target executions exec/s seconds corpus result
for t in $targets; do
  work="fuzz/corpus-work/$t"
  mkdir -p "$work" "fuzz/artifacts/$t"
  args=(-print_final_stats=1 -timeout=20 -rss_limit_mb=2048 "-artifact_prefix=fuzz/artifacts/$t/")
  [ -f "fuzz/dicts/$t.dict" ] && args+=("-dict=fuzz/dicts/$t.dict")
  if [ "$mode" = runs ]; then args+=("-runs=$amount"); else args+=("-max_total_time=$amount"); fi
  log="fuzz/logs/$t.log"
  start=$(date +%s)
  rc=0
  "$bin_dir/$t" "${args[@]}" "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corpus=$(( $(find "$work" -type f | wc -l) + $(find "fuzz/corpus/$t" -type f | wc -l) ))
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    result="CRASH (exit $rc): $(ls -t "fuzz/artifacts/$t" | head -1 | sed "s|^|fuzz/artifacts/$t/|"), log $log"
    failed+=("$t")
  fi
  printf '%-24s %14s %10s %8s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$secs" "$corpus" "$result"
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} target(s) crashed: ${failed[*]}" >&2
  for t in "${failed[@]}"; do grep -m3 -E 'panicked|ERROR: libFuzzer|SUMMARY' "fuzz/logs/$t.log" >&2 || true; done
  exit 1
fi
