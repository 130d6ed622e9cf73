#!/usr/bin/env bash
# The main job: set up, then run the demo on the real SmolLM2-135M (tokens/s with and without
# kwker_torch.torch_ops.install(), and whether the tokens are identical).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m kwker_torch.demo "$@"
