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

PYTHON="${PYTHON:-python3}"
passed=0
failed=0
count() { if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi; }

# The sanitizers' build trees, each building only what it runs: the job view's suite under
# ThreadSanitizer (-O1 with line tables only, -g1: every report still has file:line, for less
# compile time) and the executable under Address- and UndefinedBehaviorSanitizer (-O0 -g1: -O1 -g
# took more than twice the CPU time, measured; docs/tests.md). They build in the background at
# the idle CPU priority (SCHED_IDLE: only on a core no suite wants; nice 19 without chrt) while
# the suites below run, and the rest after them; their output is in build/sanitizers.log.
idle() { if command -v chrt >/dev/null; then chrt --idle 0 "$@"; else nice -n 19 "$@"; fi; }
sanitizer_builds() {
    { [ -f build-tsan/build.ninja ] ||
        meson setup build-tsan -Doptimization=1 -Ddebug=true -Dcpp_args=-g1 \
            -Db_sanitize=thread >/dev/null; } &&
        idle ninja -C build-tsan tests/test_job_view || return 1
    { [ -f build-asan/build.ninja ] ||
        meson setup build-asan -Doptimization=0 -Ddebug=true -Dcpp_args=-g1 \
            -Db_sanitize=address,undefined >/dev/null; } &&
        idle ninja -C build-asan app/parallax
}
sanitizer_builds > build/sanitizers.log 2>&1 &
sanitizers_pid=$!

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
scripts/check_layers.sh
count $?

# pytest on every core (pytest-xdist; each test has its own folders and display). The fuzz suite
# runs once, below, under the sanitizers: they see every crash and exit code the normal build
# would, and memory errors besides. The deterministic bad-input cases run in both builds: the
# optimised build is the one users run, and its behaviour on them is checked as such.
PARALLAX_EXE="$PWD/build/app/parallax" \
    "$PYTHON" -m pytest -q -n "${PARALLAX_TEST_JOBS:-auto}" --durations=20 tests/python \
    --ignore=tests/python/test_fuzz.py
count $?
lap "layering check and pytest:"

# The bug zoo (tests/zoo/README.md): its torchrun launches are shared by the file's tests through
# one fixture, so it runs as one pytest process of its own (each launch uses up to 4 processes).
PARALLAX_EXE="$PWD/build/app/parallax" "$PYTHON" -m pytest -q --durations=5 tests/zoo
count $?
lap "bug zoo:"

wait "$sanitizers_pid"
sanitizers_built=$?
[ $sanitizers_built -eq 0 ] || { echo "test: a sanitizer build failed:"; tail -40 build/sanitizers.log; }
lap "sanitizer builds (the part after the suites):"

# The job view's suite once more under ThreadSanitizer: readers snapshot a running job from
# another thread, and TSan checks that they never touch memory the job writes (the suite runs one
# OpenMP thread per rank: OpenMP is not instrumented).
tsan_ok=1
if [ $sanitizers_built -eq 0 ]; then
    TSAN_OPTIONS="halt_on_error=1" build-tsan/tests/test_job_view && tsan_ok=0
fi
count $tsan_ok
lap "ThreadSanitizer suite:"

# The fuzz suite against AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer, after
# the deterministic cases of what it found (test_bad_inputs.py): any sanitizer report fails the
# case. HDF5's own leaks on damaged files are suppressed (tests/support/lsan.supp says why);
# Parallax's are reported.
asan_ok=1
if [ $sanitizers_built -eq 0 ]; then
    ASAN_OPTIONS="detect_leaks=1" \
    LSAN_OPTIONS="suppressions=$PWD/tests/support/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    PARALLAX_EXE="$PWD/build-asan/app/parallax" \
    PARALLAX_FUZZ_BUDGET_S="${PARALLAX_ASAN_FUZZ_BUDGET_S:-60}" PARALLAX_FUZZ_CASE_TIMEOUT_S=120 \
        "$PYTHON" -m pytest -q tests/python/test_bad_inputs.py tests/python/test_fuzz.py &&
        asan_ok=0
fi
count $asan_ok
lap "Address/UB sanitizer bad inputs and fuzz:"

printf "time: %s\n" "${times[@]}"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
