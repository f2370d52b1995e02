#!/usr/bin/env bash
# Quick start 2: set up, build, and run every test suite (Catch2 suites through meson, pytest).
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

PYTHON="${PYTHON:-python3}"
PARALLAX_EXE="$PWD/build/app/parallax" "$PYTHON" -m pytest -q tests/python
rc=$?
if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
