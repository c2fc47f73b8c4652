#!/usr/bin/env bash
# The GPU executor against the PyTorch/transformers reference file (tests/parity): the same
# checks as test_parity, with --device cuda. Skips (and says so) where there is no GPU.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
"$(dirname "$MOEC")/test_parity" --device cuda
