#!/usr/bin/env bash
# Quick start 2: set up, build, and run every test suite (Catch2 suites through meson, pytest,
# the job view's suite under ThreadSanitizer, the fuzz suite under Address- and
# UndefinedBehaviorSanitizer).
# Ends with the time each part took and one line "N passed, N failed" counting suites.
set -uo pipefail
cd "$(dirname "$0")/.."
times=()
t=$SECONDS
lap() { times+=("$1 $((SECONDS - t)) s"); t=$SECONDS; }
scripts/setup.sh --all || exit 1
lap "set-up and build:"

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
lap "Catch2 suites (meson test):"

# The layering rule (docs/tree.md): includes, kernel calls, test-only hooks, lengths.
if scripts/check_layers.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

PYTHON="${PYTHON:-python3}"
# The fuzz suite's budget here is 45 s: it runs again below, under the sanitizers, for 60 s.
PARALLAX_EXE="$PWD/build/app/parallax" PARALLAX_FUZZ_BUDGET_S="${PARALLAX_FUZZ_BUDGET_S:-45}" \
    "$PYTHON" -m pytest -q --durations=20 tests/python
rc=$?
if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
lap "layering check and pytest:"

# The job view's suite once more under ThreadSanitizer, in its own build of only that target:
# readers snapshot a running job from another thread, and TSan checks that they never touch
# memory the job writes (the suite runs one OpenMP thread per rank: OpenMP is not instrumented).
# -O1 with line tables only (-g1): every report still has file:line, for less compile time.
tsan_ok=0
if [ -f build-tsan/build.ninja ] ||
    meson setup build-tsan -Doptimization=1 -Ddebug=true -Dcpp_args=-g1 \
        -Db_sanitize=thread >/dev/null; then
    if ninja -C build-tsan tests/test_job_view >/dev/null || ninja -C build-tsan tests/test_job_view; then
        TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_job_view && tsan_ok=1
    fi
fi
if [ $tsan_ok -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
lap "ThreadSanitizer build and suite:"

# The fuzz suite once more against AddressSanitizer (leaks included) and
# UndefinedBehaviorSanitizer, in its own build of only the executable (build-asan), with a
# smaller budget, after the deterministic cases of what it found (test_bad_inputs.py): any
# sanitizer report fails the case. Unoptimised with line tables only
# (-O0 -g1): the first build takes about 3 minutes on 2 cores, where -O1 -g took more than
# twice the CPU time (measured; docs/tests.md), and every report still has file:line. HDF5's
# own leaks on damaged files are suppressed (tests/lsan.supp says why); Parallax's are reported.
asan_ok=0
if [ -f build-asan/build.ninja ] ||
    meson setup build-asan -Doptimization=0 -Ddebug=true -Dcpp_args=-g1 \
        -Db_sanitize=address,undefined >/dev/null; then
    if ninja -C build-asan app/parallax >/dev/null || ninja -C build-asan app/parallax; then
        ASAN_OPTIONS="detect_leaks=1" \
        LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
        PARALLAX_EXE="$PWD/build-asan/app/parallax" \
        PARALLAX_FUZZ_BUDGET_S="${PARALLAX_ASAN_FUZZ_BUDGET_S:-60}" PARALLAX_FUZZ_CASE_TIMEOUT_S=120 \
            "$PYTHON" -m pytest -q tests/python/test_bad_inputs.py tests/python/test_fuzz.py &&
            asan_ok=1
    fi
fi
if [ $asan_ok -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
lap "Address/UB sanitizer build and fuzz:"

printf "time: %s\n" "${times[@]}"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
