#!/usr/bin/env bash
# Regenerates the golden dumps: tiny's training step (mxfp8, so that every pass changes the
# IR) after lower and after each pass. Run from the source root with MOEC set, review the
# diff (git diff tests/golden), and commit it with the change that explains it.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
rm -rf tests/golden/tiny
"$MOEC" dump models/tiny.moe --train --set precision=mxfp8 --dump-dir=tests/golden/tiny >/dev/null
ls tests/golden/tiny
