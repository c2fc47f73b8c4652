#!/usr/bin/env bash
# The main job: builds moec and trains models/tiny.moe on the bundled slice of human chr20,
# on the CPU. Extra arguments go to `moec train` (e.g. --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target moec
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(nproc)}
exec build/moec train models/tiny.moe --log build/tiny_train.jsonl "$@"
