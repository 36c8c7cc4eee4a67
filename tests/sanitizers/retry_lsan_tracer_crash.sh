#!/usr/bin/env bash
# The test launcher of ASan builds (tests/CMakeLists.txt sets it as each test binary's CROSSCOMPILING_EMULATOR).
#
# LeakSanitizer's exit-time check stops every thread with a tracer; when a thread that is not RLX's (lavapipe's
# driver threads, torn down by Mesa's own atexit handler) is halfway through exiting, the tracer itself can take
# a SIGSEGV, and the process fails with "Tracer caught signal 11 ... LeakSanitizer has encountered a fatal
# error" after every test in it passed (google/sanitizers#1353; seen once in CI on a Vulkan random-graph shard).
# That is a crash of the checker, not a finding, so a run that fails with exactly that signature, and with no
# ASan, UBSan or leak report, runs once more; any other failure, and a second tracer crash, fail as they are.
# stdout and stderr stay apart: gtest_discover_tests parses the test list from stdout alone.
set -uo pipefail
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

tracer_crash_only() {
  grep -q 'Tracer caught signal' "$out" "$err" && grep -q 'LeakSanitizer has encountered a fatal error' "$out" "$err" &&
    ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|\[  FAILED  \]' "$out" "$err"
}

"$@" >"$out" 2>"$err"
rc=$?
cat "$out"
cat "$err" >&2
if [[ $rc -ne 0 ]] && tracer_crash_only; then
  echo "retry_lsan_tracer_crash.sh: LeakSanitizer's tracer crashed at exit after the tests passed" \
    "(google/sanitizers#1353); running once more"
  "$@"
  rc=$?
fi
exit $rc
