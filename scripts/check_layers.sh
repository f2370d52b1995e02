#!/usr/bin/env bash
# The layering rule of the library, checked on the sources. The order of the layers is stated in
# one place, the table of docs/tree.md (its second column: the folders of each layer, bottom to
# top; two folders in one row are peers); this script reads it from there and checks:
#   1. a file includes its own folder's layer and lower ones, never a higher layer or a peer;
#   2. core/meson.build lists its source groups (comments "# base:", "# model:", ...) in the
#      table's order;
#   3. no call of the CPU kernels (px::cpu::) outside kernels/: kernels/ops.h is the only door;
#   4. no test-only mutation hook in library sources: tests plant bugs by wrapping from outside;
#   5. no library unit over 900 lines: a .cpp counted with its own header (x.cpp + x.h), a
#      header without a .cpp alone.
# Prints each violation with its file and line, and exits 1 if there is any.
set -uo pipefail
cd "$(dirname "$0")/.."

max_lines=900
failures=0
fail() {
    echo "check_layers: $*"
    failures=$((failures + 1))
}

# The table's rows, in order: "| <n> <name> | `folder/`, `folder/` | ... |".
mapfile -t rows < <(grep -E '^\| [0-9]+ [^|]+ \| `' docs/tree.md)
if [ "${#rows[@]}" -lt 2 ]; then
    echo "check_layers: no layer table in docs/tree.md (rows '| <n> <name> | \`folder/\` | ... |')"
    exit 1
fi
folders=()  # every layer folder
level=()    # its row
names=()    # its row's name ("numerics and tensors", "model", ...)
for i in "${!rows[@]}"; do
    cells=$(echo "${rows[$i]}" | cut -d'|' -f3)
    name=$(echo "${rows[$i]}" | cut -d'|' -f2 | sed -E 's/^ *[0-9]+ +//; s/ +$//')
    for f in $(echo "$cells" | grep -o '`[^`]*`' | tr -d '`'); do
        folders+=("${f%/}")
        level+=("$i")
        names+=("$name")
    done
done

folder_of() {  # the index in folders of a path's layer folder, or -1 (the longest match wins)
    local i best=-1 len=0
    for i in "${!folders[@]}"; do
        case "$1" in "${folders[$i]}"/*)
            if [ "${#folders[$i]}" -gt "$len" ]; then best=$i; len=${#folders[$i]}; fi ;;
        esac
    done
    echo "$best"
}

# The library's sources: every file under the top folders the layers are in (core/, kernels/,
# ...), so that a file outside every layer's folder is named too.
mapfile -t tops < <(printf '%s\n' "${folders[@]}" | cut -d/ -f1 | sort -u)
mapfile -t sources < <(git ls-files --cached --others --exclude-standard -- \
                           $(printf '%s/ ' "${tops[@]}") | grep -E '\.(h|cpp|cu|cuh)$')

for f in "${sources[@]}"; do
    [ -f "$f" ] || continue
    me=$(folder_of "$f")
    if [ "$me" -lt 0 ]; then
        fail "$f is in no layer of docs/tree.md"
        continue
    fi
    # 1. includes
    while IFS=: read -r line target; do
        them=$(folder_of "$target")
        if [ "$them" -lt 0 ]; then
            case "$target" in */*)
                [ -e "$target" ] && fail "$f:$line includes $target, which is in no layer" ;;
            esac
        elif [ "${level[$them]}" -gt "${level[$me]}" ]; then
            fail "$f:$line includes $target: ${folders[$me]} may not include the higher layer ${folders[$them]}"
        elif [ "${level[$them]}" -eq "${level[$me]}" ] && [ "$them" -ne "$me" ]; then
            fail "$f:$line includes $target: ${folders[$me]} and ${folders[$them]} are peers (one layer), neither includes the other"
        fi
    done < <(grep -n -o -E '^#include "[^"]+"' "$f" | sed -E 's/#include "([^"]+)"/\1/')
    # 3. the CPU kernels only through ops
    case "$f" in
        kernels/*) ;;
        *) grep -n -E '(px::)?\bcpu::' "$f" | while IFS= read -r hit; do
               echo "check_layers: $f:${hit%%:*} calls a CPU kernel directly: go through kernels/ops.h"
           done | grep . && failures=$((failures + 1)) ;;
    esac
    # 4. test-only mutation hooks
    if grep -n -i -E '\bmutation' "$f" >/dev/null; then
        fail "$f:$(grep -n -i -m1 -E '\bmutation' "$f" | cut -d: -f1) names a test mutation: plant it from the tests by wrapping"
    fi
    # 5. length: a unit with its header
    case "$f" in
        *.cpp | *.cu)
            n=$(wc -l < "$f")
            h="${f%.*}.h"
            [ "${f##*.}" = cu ] && [ -f "${f%.*}.cuh" ] && h="${f%.*}.cuh"
            [ -f "$h" ] && n=$((n + $(wc -l < "$h")))
            [ "$n" -gt "$max_lines" ] &&
                fail "$f with its header has $n lines, over $max_lines: split it along its seams" ;;
        *.h | *.cuh)
            if [ ! -f "${f%.*}.cpp" ] && [ ! -f "${f%.*}.cu" ]; then
                n=$(wc -l < "$f")
                [ "$n" -gt "$max_lines" ] &&
                    fail "$f has $n lines, over $max_lines: split it along its seams"
            fi ;;
    esac
done

# 2. core/meson.build's groups ("  # <layer>: ...") follow the table's order.
last=-1
while IFS= read -r group; do
    i=-1
    for k in "${!folders[@]}"; do
        [ "${folders[$k]}" = "core/$group" ] && i=$k
    done
    if [ "$i" -lt 0 ]; then
        fail "core/meson.build has a group '$group' that is no layer folder core/$group in docs/tree.md"
    elif [ "${level[$i]}" -lt "$last" ]; then
        fail "core/meson.build lists core/$group after a higher layer: keep docs/tree.md's order"
    else
        last=${level[$i]}
    fi
done < <(grep -o -E "^  # [a-z]+:" core/meson.build | sed -E 's/^  # ([a-z]+):/\1/')

if [ "$failures" -gt 0 ]; then
    echo "check_layers: $failures violation(s) in ${#sources[@]} library files"
    exit 1
fi
echo "check_layers: ${#sources[@]} library files follow the layering rule of docs/tree.md (${#rows[@]} layers)"
