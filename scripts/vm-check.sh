#!/usr/bin/env bash
# The tests this host's kernel cannot run, run for real in Debian's own kernel under qemu: cgroup v2
# (the unified hierarchy with the cpu, cpuset and memory controllers, as a Debian 12 node has it)
# and the RDMA verbs backend on Soft-RoCE (rdma_rxe on a veth pair).
#
#   bash scripts/vm-check.sh        (root, Debian 12; scripts/test-all.sh calls it after the suite)
#
# The tests are the lines of scripts/vm/tests.txt (`<test binary> <test>`). The script builds those
# test binaries as the suite builds them (same features, so after the suite nothing recompiles),
# packs them with their shared libraries, busybox, iproute2's ip and rdma, libibverbs' rxe provider,
# the kernel modules they need (from the linux-image .deb) and scripts/vm/init into an initramfs,
# boots it with qemu-system-x86_64 (KVM when /dev/kvm works, otherwise TCG software emulation;
# 2 CPUs, 2 GiB, serial console) under a hard timeout, and reads the serial log: every test must
# print `ok`, the skip ledger must be empty (in the VM the switch is on and the allow-list is off,
# so a skip fails) and the end marker must carry exit status 0. Anything else, a missing marker or
# the timeout fails this script. What ran is written to <target>/vm-check.txt, which
# scripts/test-all.sh prints at the end of its run.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> vm-check: %s\n' "$*"; }
die() {
  printf 'vm-check: %s\n' "$*" >&2
  exit 1
}

target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
vm="$target/vm"
# The whole VM run (boot, module loads, the tests, power-off). Under TCG on CI's 2 cores it takes
# ~3 minutes; the limit leaves room for a loaded machine and bounds a hang.
vm_timeout="${WEFT_VM_TIMEOUT:-480}"
# One test in the VM (the RDMA conformance suite is the longest: ~2 min under TCG); one that runs
# past it is killed with its kernel stacks printed, and the rest still run.
test_limit="${WEFT_VM_TEST_LIMIT:-240}"
tests_file=scripts/vm/tests.txt
summary="$target/vm-check.txt"
rm -f "$summary"

# Host packages: qemu and busybox for the VM; ip/rdma, libibverbs and its rxe provider to copy in;
# jq to read cargo's JSON. The kernel itself is downloaded, not installed (below).
NEEDED_DEBS=(qemu-system-x86 busybox-static iproute2 libibverbs-dev ibverbs-providers jq)
missing=()
for p in "${NEEDED_DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Debian's current kernel (the package linux-image-amd64 points at), downloaded with apt and
# unpacked under the target directory; only its vmlinuz and the modules the VM loads are kept
# (target/vm/kernel/<package>/), so a second run downloads nothing.
kernel_package() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
kpkg="$(kernel_package)"
[ -n "$kpkg" ] || { apt-get update -qq && kpkg="$(kernel_package)"; }
[ -n "$kpkg" ] || die "apt-cache does not name the kernel package linux-image-amd64 depends on (apt-get update?)"
kdir="$vm/kernel/$kpkg"
# What the VM loads: veth for the pair Soft-RoCE sits on, crc32_generic because rdma_rxe asks the
# crypto API for "crc32" when it registers a device (ENOENT without it; modules.dep cannot say so),
# and rdma_rxe itself.
modules=(veth crc32_generic rdma_rxe)
if [ ! -f "$kdir/ready" ] || [ "$(sed -n 2p "$kdir/ready")" != "${modules[*]}" ]; then
  log "fetching $kpkg"
  rm -rf "$kdir" "$vm/unpack" "$vm/debs"
  mkdir -p "$vm/debs" "$vm/unpack" "$kdir"
  (cd "$vm/debs" && apt-get download -q "$kpkg")
  dpkg-deb -x "$vm"/debs/"$kpkg"_*.deb "$vm/unpack"
  kver="$(basename "$(find "$vm/unpack/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")"
  cp "$vm/unpack/boot/vmlinuz-$kver" "$kdir/vmlinuz"
  busybox depmod -b "$vm/unpack" "$kver"
  # The modules the VM loads and everything they depend on, from the kernel's own modules.dep.
  dep="$vm/unpack/lib/modules/$kver/modules.dep"
  want=("${modules[@]}")
  closure=()
  while [ "${#want[@]}" -gt 0 ]; do
    m="${want[0]}"
    want=("${want[@]:1}")
    line="$(grep -E "(^|/)${m}\.ko:" "$dep" || true)"
    [ -n "$line" ] || die "$kpkg has no module $m"
    path="${line%%:*}"
    case " ${closure[*]:-} " in *" $path "*) continue ;; esac
    closure+=("$path")
    for d in ${line#*:}; do
      d="$(basename "$d" .ko)"
      want+=("$d")
    done
  done
  for path in "${closure[@]}"; do
    mkdir -p "$kdir/modules/$kver/$(dirname "$path")"
    cp "$vm/unpack/lib/modules/$kver/$path" "$kdir/modules/$kver/$path"
  done
  cp "$vm/unpack/lib/modules/$kver/modules.builtin" "$vm/unpack/lib/modules/$kver/modules.order" "$kdir/modules/$kver/"
  printf '%s\n%s\n' "$kver" "${modules[*]}" >"$kdir/ready"
  rm -rf "$vm/unpack" "$vm/debs"
fi
kver="$(sed -n 1p "$kdir/ready")"

# The test binaries, built as scripts/test-all.sh builds the suite (the same feature set, so the
# suite's artifacts are reused), and their paths from cargo's JSON.
[ -s "$tests_file" ] || die "$tests_file lists no tests"
binaries="$(awk 'NF && $1 !~ /^#/ {print $1}' "$tests_file" | sort -u)"
test_args=()
for b in $binaries; do test_args+=(--test "$b"); done
log "building ${binaries//$'\n'/, }"
cargo test --workspace --features "${WEFT_SUITE_FEATURES:-weft/nvml,weft-transport/rdma,weft-transport/gpu}" --locked \
  "${test_args[@]}" --no-run \
  --message-format=json-render-diagnostics >"$vm/build.json"

# The initramfs tree.
root="$vm/root"
rm -rf "$root"
mkdir -p "$root"/{bin,usr/bin,usr/lib,lib64,etc,proc,sys,dev,tmp,root,weft/target/debug/deps}
ln -s usr/lib "$root/lib"
cp "$(command -v busybox)" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp scripts/vm/init "$root/init"
chmod +x "$root/init"
awk 'NF && $1 !~ /^#/' "$tests_file" >"$root/weft/tests.txt"
echo "${modules[*]}" >"$root/weft/modules.txt"
echo "$test_limit" >"$root/weft/test-limit"
mkdir -p "$root/usr/lib/modules"
cp -r "$kdir/modules/$kver" "$root/usr/lib/modules/$kver"
busybox depmod -b "$root" "$kver"

elves=()
for b in $binaries; do
  exe="$(jq -r --arg b "$b" 'select(.reason == "compiler-artifact" and .profile.test and .target.name == $b)
    | .executable // empty' "$vm/build.json" | tail -n1)"
  [ -n "$exe" ] || die "cargo built no test binary named $b (is it a tests/$b.rs target?)"
  # Without cargo's hash: the skip helper names the binary the same either way.
  cp "$exe" "$root/weft/target/debug/deps/$b"
  elves+=("$root/weft/target/debug/deps/$b")
done
for tool in ip rdma; do
  cp "$(command -v "$tool")" "$root/usr/bin/$tool"
  elves+=("$root/usr/bin/$tool")
done
# libibverbs finds its providers through /etc/libibverbs.d and loads them with dlopen.
mkdir -p "$root/etc/libibverbs.d" "$root/usr/lib/x86_64-linux-gnu/libibverbs"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
rxe_provider="$(find /usr/lib/x86_64-linux-gnu/libibverbs -name 'librxe-*.so' | head -n1)"
[ -n "$rxe_provider" ] || die "no rxe provider in /usr/lib/x86_64-linux-gnu/libibverbs (ibverbs-providers)"
cp "$rxe_provider" "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
elves+=("$root/usr/lib/x86_64-linux-gnu/libibverbs/$(basename "$rxe_provider")")
for elf in "${elves[@]}"; do
  for lib in $(ldd "$elf" | awk '/=> \// {print $3} /^\t\/lib64\// {print $1}'); do
    # Under the name the loader asks for (the soname, often a link to a versioned file). Debian
    # merged /usr: /lib is usr/lib in the initramfs too, so one copy serves both names.
    case "$lib" in
      /lib64/*) dest="$root$lib" ;;
      /usr/*) dest="$root$lib" ;;
      *) dest="$root/usr$lib" ;;
    esac
    [ -e "$dest" ] || {
      mkdir -p "$(dirname "$dest")"
      cp -L "$lib" "$dest"
    }
  done
done
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null) >"$vm/initramfs.cpio"
log "initramfs: $(du -h "$vm/initramfs.cpio" | cut -f1), kernel $kver"

# KVM when it works, otherwise TCG (software emulation). /dev/kvm can be there and still unusable
# (a nested hypervisor that refuses a CPU register qemu sets: qemu then aborts as the CPU is reset),
# so a paused qemu that only creates its CPU and quits is the probe.
accel=(-accel tcg -cpu max)
accel_used=TCG
if [ -r /dev/kvm ] && [ -w /dev/kvm ] &&
  (echo quit | timeout 20 qemu-system-x86_64 -accel kvm -cpu host -m 64 -display none -nic none -S -monitor stdio) \
    >/dev/null 2>&1; then
  accel=(-accel kvm -cpu host)
  accel_used=KVM
fi
serial="$vm/serial.log"
log "booting with $accel_used (timeout ${vm_timeout}s; the serial console follows)"
start=$SECONDS
set +e
timeout -k 10 "$vm_timeout" qemu-system-x86_64 "${accel[@]}" -smp 2 -m 2048 -nographic -no-reboot \
  -nic none -kernel "$kdir/vmlinuz" -initrd "$vm/initramfs.cpio" \
  -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4" </dev/null 2>&1 | tee "$serial"
qemu_rc=${PIPESTATUS[0]}
set -e
took=$((SECONDS - start))

# The verdict, from the serial log alone.
tr -d '\r' <"$serial" >"$serial.txt"
problems=()
[ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ] && problems+=("the VM ran past ${vm_timeout}s and was stopped")
end_rc="$(sed -n 's/^WEFT-VM-END rc=\([0-9]*\)$/\1/p' "$serial.txt" | tail -n1)"
if [ -z "$end_rc" ]; then
  problems+=("no end marker (WEFT-VM-END) on the serial console: the VM did not finish its run")
elif [ "$end_rc" != 0 ]; then
  problems+=("the VM's run ended with status $end_rc")
fi
grep -q '^WEFT-VM-SETUP-FAILED' "$serial.txt" && problems+=("$(grep '^WEFT-VM-SETUP-FAILED' "$serial.txt")")
while read -r hung; do
  hung="${hung#WEFT-VM-HUNG }"
  problems+=("${hung%%;*} (killed; its kernel stacks are in the serial log)")
done < <(grep -o 'WEFT-VM-HUNG.*' "$serial.txt" || true)
ledger="$(sed -n '/^WEFT-VM-LEDGER-BEGIN$/,/^WEFT-VM-LEDGER-END$/p' "$serial.txt" | sed '1d;$d')"
[ -z "$ledger" ] || problems+=("tests skipped in the VM: $(printf '%s' "$ledger" | tr '\t\n' ' ;')")
ran=()
while read -r binary test; do
  if grep -qE "^test $test \.\.\. ok$" "$serial.txt"; then
    ran+=("  $binary::$test ok")
  else
    ran+=("  $binary::$test NOT OK")
    problems+=("$binary::$test did not pass in the VM")
  fi
done <"$root/weft/tests.txt"

{
  echo "VM (scripts/vm-check.sh): Debian kernel $kver under qemu ($accel_used), cgroup v2 with cpu/cpuset/memory, Soft-RoCE rxe0 on a veth; ${took}s"
  printf '%s\n' "${ran[@]}"
  if [ "${#problems[@]}" -eq 0 ]; then
    echo "  all ${#ran[@]} passed, none skipped (serial log $serial)"
  else
    printf '  FAILED: %s\n' "${problems[@]}"
    echo "  (serial log $serial)"
  fi
} >"$summary"
log "summary"
cat "$summary"
[ "${#problems[@]}" -eq 0 ]
