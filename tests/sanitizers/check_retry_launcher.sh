#!/usr/bin/env bash
# The ASan test launcher reruns a process only when LeakSanitizer's tracer crashed and nothing else went wrong.
set -uo pipefail
launcher="$(dirname "$0")/retry_lsan_tracer_crash.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# A fake test: its first run prints $1 and exits 1, every later run exits $2.
fake() {
  cat >"$work/fake.sh" <<FAKE
#!/usr/bin/env bash
if [[ ! -f "$work/ran" ]]; then touch "$work/ran"; printf '%b\n' "$1"; exit 1; fi
echo second run; exit $2
FAKE
  chmod +x "$work/fake.sh"
  rm -f "$work/ran"
}
expect() { # name, wanted exit code, wanted runs (1 or 2)
  "$launcher" "$work/fake.sh" >"$work/out" 2>&1
  local rc=$? runs=1
  grep -q 'second run' "$work/out" && runs=2
  if [[ $rc -ne $2 || $runs -ne $3 ]]; then
    echo "FAIL $1: exit $rc after $runs run(s), wanted exit $2 after $3"; cat "$work/out"; failures=$((failures + 1))
  else
    echo "ok   $1"
  fi
}

crash='[  PASSED  ] 1 test.\nTracer caught signal 11: addr=0x200001580\n==1==LeakSanitizer has encountered a fatal error.'
fake "$crash" 0;  expect "a tracer crash alone is run again" 0 2
fake "$crash" 1;  expect "a second failure fails" 1 2
fake "ERROR: LeakSanitizer: detected memory leaks\n$crash" 0;  expect "a leak report is not retried" 1 1
fake "ERROR: AddressSanitizer: heap-buffer-overflow\n$crash" 0;  expect "an ASan report is not retried" 1 1
fake "x.cpp:3:5: runtime error: signed integer overflow\n$crash" 0;  expect "a UBSan report is not retried" 1 1
fake "[  FAILED  ] Suite.Case\n$crash" 0;  expect "a failed test is not retried" 1 1
fake "Segmentation fault" 0;  expect "any other failure is not retried" 1 1

# Test discovery reads stdout alone: what the test writes to stderr must not land there.
printf '#!/usr/bin/env bash\necho "[rlx] seed" >&2\necho "Suite."\necho "  Case"\n' >"$work/list.sh"
chmod +x "$work/list.sh"
if [[ "$("$launcher" "$work/list.sh" 2>/dev/null)" == $'Suite.\n  Case' ]]; then
  echo "ok   stdout carries only the test's stdout"
else
  echo "FAIL stdout carries more than the test's stdout"; failures=$((failures + 1))
fi
exit $((failures > 0))
