#!/usr/bin/env bash
# Runs the C tests of the infinirt C ABI (capi/) under valgrind: any invalid access or definite
# leak fails. Builds libinfinirt (debug), compiles the C programs, runs each under memcheck.
#
#   ci/capi-valgrind.sh
#
# Skips (exit 0, with a message) when valgrind or a C compiler is missing.
# UNIRT_VALGRIND_BACKENDS picks the vendors probed (default: cpu). The wgpu software drivers
# (lavapipe / llvmpipe JIT code) and libcuda are not ours to check, and are far too slow
# under valgrind; set UNIRT_VALGRIND_BACKENDS=cpu,wgpu to include them anyway.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cc="${CC:-cc}"
if ! command -v valgrind >/dev/null 2>&1; then
  echo "capi-valgrind: SKIPPED: valgrind not installed (apt-get install valgrind)"
  exit 0
fi
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "capi-valgrind: SKIPPED: no C compiler ($cc)"
  exit 0
fi

target="${CARGO_TARGET_DIR:-$root/target}"
# The same build command as ci/test.sh's: `cargo build -p unirt-capi` alone resolves the
# dependencies' features differently from the whole workspace and so rebuilt wgpu and unirt
# (2.5 minutes on 2 cores) right after ci/test.sh had built them; this one is a no-op there.
cargo build --workspace --all-targets
lib="$target/debug"
if [ ! -f "$lib/libinfinirt.so" ]; then
  echo "capi-valgrind: $lib/libinfinirt.so was not built" >&2
  exit 1
fi

out="$target/capi-valgrind"
mkdir -p "$out"
programs=(capi/tests/c/abi_test.c capi/tests/c/infinirt_test.c capi/tests/c/exit_paths.c
  capi/tests/c/lifetime_test.c capi/tests/c/fork_test.c capi/tests/c/sizes_test.c
  examples/c/capture_replay.c capi/tests/c/fuzz_test.c)
for src in "${programs[@]}"; do
  exe="$out/$(basename "$src" .c)"
  "$cc" -std=c11 -O1 -g -Wall -Wextra -Werror -I capi/include -I capi/tests/c "$src" -o "$exe" \
    -L "$lib" -linfinirt -Wl,-rpath,"$lib" -lpthread -ldl
done

# The C ABI fuzzer runs single-threaded for a bounded time under memcheck, keeping at most
# 32 MiB of big buffers live per seed (memcheck shadows what a seed touches) and trying huge
# sizes only from 1 TiB (refused before any mapping: memcheck takes seconds per GiB mapped).
export UNIRT_CAPI_FUZZ_SECONDS="${UNIRT_VALGRIND_FUZZ_SECONDS:-15}" UNIRT_CAPI_FUZZ_THREADS=1
export UNIRT_CAPI_FUZZ_BIG_MIB=32 UNIRT_CAPI_FUZZ_HUGE_LOG2=40

export UNIRT_BACKENDS="${UNIRT_VALGRIND_BACKENDS:-cpu}"
status=0
for src in "${programs[@]}"; do
  exe="$out/$(basename "$src" .c)"
  echo "capi-valgrind: $exe (UNIRT_BACKENDS=$UNIRT_BACKENDS)"
  # Definite leaks and invalid accesses fail; the process-wide device table and the stream
  # worker threads live until exit by design ("still reachable" / "possibly lost").
  leaks=(--leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite)
  # A forked child has none of its parent's threads, so what only their stacks referenced
  # reads as "definitely lost" there: fork_test is checked for invalid accesses (parent and
  # child) and its leaks are left to the programs above.
  if [ "$(basename "$exe")" = fork_test ]; then
    leaks=(--leak-check=no)
  fi
  if ! valgrind --quiet --error-exitcode=1 "${leaks[@]}" --track-origins=yes \
      --suppressions=ci/valgrind.supp "$exe"; then
    echo "capi-valgrind: FAILED: $exe" >&2
    status=1
  fi
done
if [ "$status" = 0 ]; then
  echo "capi-valgrind: all ${#programs[@]} programs clean"
fi
exit "$status"
