#!/usr/bin/env bash
# Quick start 1: set up and build the `parallax` executable (only it: the workbench, the Python
# module and the tests build when first needed), then validate the embedded default job (a tiny
# GPT on the built-in Markov source, which needs no files): the single-device reference and a
# matrix of parallel layouts, compared bit for bit after every step, as a table. Extra arguments
# go to `parallax validate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/app/parallax validate --layouts dp2,tp2,pp2,dp2xtp2xpp2 --steps 20 "$@"
