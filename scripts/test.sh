#!/usr/bin/env bash
# Quick start 2: set up, build, and run every test suite (Catch2 suites through meson, pytest,
# the job view's suite under ThreadSanitizer).
# Ends with one line "N passed, N failed" counting suites.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

passed=0
failed=0
meson test -C build --print-errorlogs --num-processes 2
if [ -f build/meson-logs/testlog.json ]; then
    p=$(grep -c '"result": "OK"' build/meson-logs/testlog.json || true)
    f=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' build/meson-logs/testlog.json || true)
    passed=$((passed + p))
    failed=$((failed + f))
else
    failed=$((failed + 1))
fi

# The layering rule (README "Layout of the tree"): includes, kernel calls, test-only hooks, lengths.
if scripts/check_layers.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

PYTHON="${PYTHON:-python3}"
PARALLAX_EXE="$PWD/build/app/parallax" "$PYTHON" -m pytest -q tests/python
rc=$?
if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

# The job view's suite once more under ThreadSanitizer, in its own build of only that target:
# readers snapshot a running job from another thread, and TSan checks that they never touch
# memory the job writes (the suite runs one OpenMP thread per rank: OpenMP is not instrumented).
tsan_ok=0
if [ -f build-tsan/build.ninja ] ||
    meson setup build-tsan --buildtype=debugoptimized -Db_sanitize=thread >/dev/null; then
    if ninja -C build-tsan tests/test_job_view >/dev/null || ninja -C build-tsan tests/test_job_view; then
        TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_job_view && tsan_ok=1
    fi
fi
if [ $tsan_ok -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
