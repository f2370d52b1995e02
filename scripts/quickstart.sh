#!/usr/bin/env bash
# Quick start 1: set up, build, and train the embedded default job (a tiny GPT on the built-in
# Markov source, which needs no files). Extra arguments go to `parallax train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/app/parallax train "$@"
