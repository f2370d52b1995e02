#!/usr/bin/env bash
# Writes docs/config.md's key tables from the key registry (core/base/config_registry.h), through
# `parallax config --markdown`: everything between the lines "<!-- keys: made by
# scripts/config_docs.sh -->" and "<!-- keys: end -->" is replaced. Run it after adding or changing
# a key; the test command checks that the page and the registry agree (tests/python/test_docs_config.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exe="${PARALLAX_EXE:-build/app/parallax}"
page=docs/config.md
begin='<!-- keys: made by scripts/config_docs.sh -->'
end='<!-- keys: end -->'
grep -qxF "$begin" "$page" && grep -qxF "$end" "$page" || {
    echo "config_docs: $page lacks the marker lines '$begin' and '$end'" >&2
    exit 1
}
tables=$(mktemp)
trap 'rm -f "$tables"' EXIT
"$exe" config --markdown > "$tables"
awk -v begin="$begin" -v end="$end" -v tables="$tables" '
    $0 == begin { print; while ((getline line < tables) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip { print }
' "$page" > "$page.new"
mv "$page.new" "$page"
echo "config_docs: $page's key tables written from the registry"
