#!/usr/bin/env bash
# Ranks as processes: `moec launch -n N moec train ...` (TCP communicator, one rank per
# process) logs the same losses, prints the same loss lines and writes byte-identical
# checkpoints as the thread ranks of `moec train --set dp=2` (and ep=2, ep=2 x dp=2, and that
# with ZeRO-1); a process run resumes from its own checkpoint; bad torchrun variables, a
# WORLD_SIZE that is not ep x dp, and --device cuda without a GPU fail with messages; a failing
# rank stops the others.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small=(--set hidden=32 --set ffn=48 --set seq=64 --set batch=4 --set heads=4 --set kv_heads=2 --set val_every=0
       --val-batches 1 --device cpu --steps 3)
fail() { echo "FAIL: $*"; exit 1; }
steps() { grep '"step"' "$1" | sed 's/,"tokens_per_s".*//'; }          # everything but timings
lines() { grep -E 'step [0-9]+/[0-9]+ loss|val_loss|^done' "$1" | sed -e 's/^\[rank 0\] //' -e 's/ [0-9]* tok\/s.*//' -e 's/, [0-9.]*s$//'; }

compare() { # tag nproc sets...
  local tag=$1 n=$2; shift 2
  "$MOEC" train models/tiny.moe "${small[@]}" "$@" --log "$tmp/$tag-th.jsonl" --ckpt-dir "$tmp/$tag-th" 2>"$tmp/$tag-th.err" \
    || { cat "$tmp/$tag-th.err"; fail "$tag: the thread run failed"; }
  "$MOEC" launch -n "$n" "$MOEC" train models/tiny.moe "${small[@]}" "$@" --log "$tmp/$tag-pr.jsonl" --ckpt-dir "$tmp/$tag-pr" \
    >"$tmp/$tag-pr.out" 2>&1 || { cat "$tmp/$tag-pr.out"; fail "$tag: moec launch -n $n failed"; }
  [ "$(steps "$tmp/$tag-th.jsonl" | wc -l)" -eq 4 ] || fail "$tag: expected 3 steps and a validation in the log"
  diff <(steps "$tmp/$tag-th.jsonl") <(steps "$tmp/$tag-pr.jsonl") || fail "$tag: logged losses differ (threads vs processes)"
  [ "$(lines "$tmp/$tag-th.err" | wc -l)" -ge 4 ] || fail "$tag: no loss lines printed"
  diff <(lines "$tmp/$tag-th.err") <(lines "$tmp/$tag-pr.out") || fail "$tag: printed losses differ (threads vs processes)"
  grep -q '^\[rank 0\] ranks: '"$n"' .* as processes' "$tmp/$tag-pr.out" || fail "$tag: no 'as processes' line"
  ! grep -q '^\[rank [1-9]\] .*loss' "$tmp/$tag-pr.out" || fail "$tag: a rank other than 0 printed progress"
  for f in "$tmp/$tag-th"/step-00000003/*; do
    cmp -s "$f" "$tmp/$tag-pr/step-00000003/$(basename "$f")" || fail "$tag: checkpoint file $(basename "$f") differs"
  done
}
compare dp2 2 --set dp=2
compare ep2 2 --set ep=2
compare ep2dp2 4 --set ep=2 --set dp=2
compare ep2dp2z 4 --set ep=2 --set dp=2 --set zero=true   # ZeRO-1's reduce_scatter/all_gather over TCP

# resume a process run from its own checkpoint: same losses as the uninterrupted one
"$MOEC" launch -n 2 "$MOEC" train models/tiny.moe "${small[@]}" --set ep=2 --stop-at 2 --log "$tmp/part.jsonl" \
  --ckpt-dir "$tmp/part" >"$tmp/part.out" 2>&1 || { cat "$tmp/part.out"; fail "stop-at 2 failed"; }
"$MOEC" launch -n 2 "$MOEC" train models/tiny.moe "${small[@]}" --set ep=2 --resume --log "$tmp/part.jsonl" \
  --ckpt-dir "$tmp/part" >"$tmp/part2.out" 2>&1 || { cat "$tmp/part2.out"; fail "resume failed"; }
grep -q 'resumed from .* at step 2' "$tmp/part2.out" || fail "no 'resumed' line"
diff <(steps "$tmp/ep2-th.jsonl" | grep '"loss"') <(steps "$tmp/part.jsonl" | grep '"loss"') || fail "resumed process run differs"

# errors: each a message and a non-zero exit, never a hang
expect_fail() { # what-to-grep cmd...
  local want=$1; shift
  if timeout 60 "$@" >"$tmp/e.out" 2>&1; then fail "succeeded: $*"; fi
  grep -q -- "$want" "$tmp/e.out" || { cat "$tmp/e.out"; fail "message lacks '$want': $*"; }
}
expect_fail "WORLD_SIZE=2 processes, but the model asks for ep x dp = 1 x 1 = 1" \
  "$MOEC" launch -n 2 "$MOEC" train models/tiny.moe "${small[@]}"
expect_fail "WORLD_SIZE=3 processes, but the model asks for ep x dp = 1 x 2 = 2" \
  env WORLD_SIZE=3 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2
expect_fail "RANK=2 is not below WORLD_SIZE=2" \
  env WORLD_SIZE=2 RANK=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2
expect_fail "RANK=one: expected a non-negative integer" \
  env WORLD_SIZE=2 RANK=one MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2
expect_fail "MASTER_ADDR is not set" \
  env -u MASTER_ADDR WORLD_SIZE=2 RANK=1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2
# --device cuda where no GPU can be used: the rank says why at once, not after the bootstrap's wait
# (on a GPU machine the ranks train there: tests/unit/test_gpu_parallel.c)
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail "error: --device cuda: " \
    env MOEC_BOOT_TIMEOUT=30 WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2 --device cuda
fi
expect_fail "cannot connect to rank 0" \
  env MOEC_BOOT_TIMEOUT=0.5 WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$MOEC" train models/tiny.moe "${small[@]}" --set dp=2
expect_fail "launch needs -n N" "$MOEC" launch true
# a failing rank: the launcher names it and stops the others (which would sleep 30 s)
start=$SECONDS
expect_fail "rank 1 of 3 failed with exit status 3" "$MOEC" launch -n 3 -- sh -c 'echo "I am $RANK of $WORLD_SIZE"; [ "$RANK" = 1 ] && { sleep 0.5; exit 3; }; sleep 30'
[ $((SECONDS - start)) -lt 15 ] || fail "the other ranks were not stopped"
grep -q '^\[rank 2\] I am 2 of 3$' "$tmp/e.out" || fail "no [rank 2] prefixed line: $(cat "$tmp/e.out")"
# the launcher killed outright (no handler runs): its ranks must not go on without it (each
# rank execs sleep, printing its pid; only those pids are checked and, on a failure, killed)
"$MOEC" launch -n 2 -- sh -c 'echo "rank $RANK pid $$"; exec sleep 300' >"$tmp/orphan.out" 2>&1 &
lp=$!
pids() { sed -n 's/.*rank [0-9]* pid \([0-9]*\)$/\1/p' "$tmp/orphan.out"; }
for _ in $(seq 50); do [ "$(pids | wc -l)" -ge 2 ] && break; sleep 0.1; done
if [ "$(pids | wc -l)" -lt 2 ]; then kill -9 $lp; fail "the probe ranks did not start: $(cat "$tmp/orphan.out")"; fi
kill -9 $lp
wait $lp 2>/dev/null || true
alive() { for p in $(pids); do kill -0 "$p" 2>/dev/null && echo "$p"; done; }
for _ in $(seq 50); do [ -z "$(alive)" ] && break; sleep 0.1; done
if [ -n "$(alive)" ]; then kill -9 $(alive) 2>/dev/null; fail "ranks outlived a killed launcher"; fi
echo "moec launch: processes match the thread ranks (dp=2, ep=2, ep=2 x dp=2, the same with zero, resume); errors are clear; ranks die with the launcher"
