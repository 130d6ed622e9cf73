#!/usr/bin/env bash
# The full test suite: set up, then Rust kernel tests (every ISA tier the host has, against the scalar
# reference), lint, and the Python tests (ops, opcheck, torch.compile, install() on real and
# random-initialised models).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
export KWKER_TORCH_DIR=$($PY -c "import os, torch; print(os.path.dirname(torch.__file__))")
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release -p kwker-kernels
$PY -m ruff check kwker_torch tests benchmarks
$PY -m pytest -q "$@"
