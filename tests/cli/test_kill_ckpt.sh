#!/usr/bin/env bash
# Killing training at random moments, checkpoint writes included, never loses the last
# complete checkpoint: after each SIGKILL, --resume loads `latest` and continues.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small=(--set hidden=64 --set ffn=128 --set seq=64 --set batch=2 --set val_every=0 --steps 400 --val-batches 1
       --ckpt-dir "$tmp/ck" --ckpt-every 1)
"$MOEC" train models/tiny.moe "${small[@]}" --stop-at 1 2>"$tmp/first.err"
for delay in 0.05 0.11 0.17 0.23 0.31 0.37 0.43 0.5; do
  "$MOEC" train models/tiny.moe "${small[@]}" --resume 2>"$tmp/run.err" &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  before=$(cat "$tmp/ck/latest")
  # the checkpoint that `latest` names must load: resume and take one more step
  if ! "$MOEC" train models/tiny.moe "${small[@]}" --resume --stop-at $(( 10#${before#step-} + 1 )) 2>"$tmp/check.err"; then
    echo "FAIL: after a kill at ${delay}s, resuming from $before failed:"; cat "$tmp/check.err"; exit 1
  fi
done
ls "$tmp/ck" | grep -q '^\.tmp-' && { echo "FAIL: stale temporary checkpoints left behind"; ls -a "$tmp/ck"; exit 1; }
echo "8 kills, every checkpoint named by latest loaded; last: $(cat "$tmp/ck/latest")"
