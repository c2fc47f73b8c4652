#!/usr/bin/env bash
# Resume is bit-exact: a run interrupted with --stop-at and continued with --resume logs the
# same losses, step for step, as an uninterrupted run; and the checkpoints it leaves load.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small=(--set hidden=32 --set ffn=48 --set seq=64 --set batch=2 --set heads=4 --set kv_heads=2 --set val_every=0
       --steps 8 --val-batches 1)
"$MOEC" train models/tiny.moe "${small[@]}" --log "$tmp/full.jsonl" 2>"$tmp/full.err"
"$MOEC" train models/tiny.moe "${small[@]}" --log "$tmp/part.jsonl" --ckpt-dir "$tmp/ck" --stop-at 3 2>"$tmp/a.err"
[ -f "$tmp/ck/latest" ] || { echo "no checkpoint after --stop-at 3"; cat "$tmp/a.err"; exit 1; }
grep -q step-00000003 "$tmp/ck/latest" || { echo "latest does not name step 3: $(cat "$tmp/ck/latest")"; exit 1; }
"$MOEC" train models/tiny.moe "${small[@]}" --log "$tmp/part.jsonl" --ckpt-dir "$tmp/ck" --resume 2>"$tmp/b.err"
steps() { grep '"loss"' "$1" | sed 's/,"lr".*//'; }   # step, loss, ce: everything but timings
if ! diff <(steps "$tmp/full.jsonl") <(steps "$tmp/part.jsonl"); then
  echo "FAIL: resumed losses differ from the uninterrupted run"; exit 1
fi
[ "$(steps "$tmp/full.jsonl" | wc -l)" -eq 8 ] || { echo "FAIL: expected 8 logged steps"; exit 1; }
# --resume without a checkpoint is a clear error, not a silent fresh start
if "$MOEC" train models/tiny.moe "${small[@]}" --ckpt-dir "$tmp/none" --resume 2>"$tmp/c.err"; then
  echo "FAIL: --resume with no checkpoint succeeded"; exit 1
fi
grep -q "no checkpoint in" "$tmp/c.err" || { echo "FAIL: message: $(cat "$tmp/c.err")"; exit 1; }
echo "resume is bit-exact over 8 steps (stopped at 3)"
