#!/usr/bin/env bash
# The layering rule of the library (docs/tree.md), checked on the sources:
#   1. layers, bottom to top: core/base, kernels, core/model, core/comm, core/io, core/parallel,
#      core/train, validators, app (and bindings); a file includes its own layer and lower ones;
#   2. no call of the CPU kernels (px::cpu::) outside kernels/: kernels/ops.h is the only door;
#   3. no test-only mutation hook in library sources: tests plant bugs by wrapping from outside;
#   4. no library source file over 900 lines.
# Prints each violation with its file and line, and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."

layers=(core/base kernels core/model core/comm core/io core/parallel core/train validators app bindings)
max_lines=900
failures=0

rank_of() {  # the layer index of a path, or -1 when it is not in the library
    local i
    for i in "${!layers[@]}"; do
        case "$1" in "${layers[$i]}"/*) echo "$i"; return ;; esac
    done
    echo -1
}

fail() {
    echo "check_layers: $*"
    failures=$((failures + 1))
}

mapfile -t sources < <(git ls-files -- 'core/*' 'kernels/*' 'validators/*' 'app/*' 'bindings/*' |
                       grep -E '\.(h|cpp|cu|cuh)$')

for f in "${sources[@]}"; do
    [ -f "$f" ] || continue
    me=$(rank_of "$f")
    if [ "$me" -lt 0 ]; then
        fail "$f is in no layer: put it in one of ${layers[*]}"
        continue
    fi
    # 1. includes
    while IFS=: read -r line target; do
        them=$(rank_of "$target")
        if [ "$them" -lt 0 ]; then
            case "$target" in core/* | kernels/* | validators/* | app/* | bindings/*)
                fail "$f:$line includes $target, which is in no layer" ;;
            esac
        elif [ "$them" -gt "$me" ]; then
            fail "$f:$line includes $target: ${layers[$me]} may not include the higher layer ${layers[$them]}"
        fi
    done < <(grep -n -o -E '^#include "[^"]+"' "$f" | sed -E 's/#include "([^"]+)"/\1/')
    # 2. the CPU kernels only through ops
    case "$f" in
        kernels/*) ;;
        *) grep -n -E '(px::)?\bcpu::' "$f" | while IFS= read -r hit; do
               echo "check_layers: $f:${hit%%:*} calls a CPU kernel directly: go through kernels/ops.h"
           done | grep . && failures=$((failures + 1)) ;;
    esac
    # 3. test-only mutation hooks
    if grep -n -i -E '\bmutation' "$f" >/dev/null; then
        fail "$f:$(grep -n -i -m1 -E '\bmutation' "$f" | cut -d: -f1) names a test mutation: plant it from the tests by wrapping"
    fi
    # 4. length
    n=$(wc -l < "$f")
    if [ "$n" -gt "$max_lines" ]; then
        fail "$f has $n lines, over $max_lines: split it along its seams"
    fi
done

if [ "$failures" -gt 0 ]; then
    echo "check_layers: $failures violation(s) in ${#sources[@]} library files"
    exit 1
fi
echo "check_layers: ${#sources[@]} library files follow the layering rule"
