#!/usr/bin/env bash
# The benchmark: moec against the Hugging Face peer (MixtralForCausalLM, bf16, AdamW), same
# model sizes and token count, in the same run, on one GPU. Prints one table row per model.
#   MOEC=build/moec PEER=../shared/peers/hf_mixtral_bench.py bash bench/run_bench.sh [MODEL...]
# Env: STEPS (moec steps, default 8; the first 3 are warm-up), PRECISION (default bf16),
#      LOGDIR (default /tmp/moec-bench), MOEC_ARGS (more `moec train` flags, e.g. --passes=...),
#      PEER_SKIP=1 (reuse the peer's last output in LOGDIR). FLOPs per token = 6 x active params + 6 L hidden seq.
set -uo pipefail
MOEC=${MOEC:-build/moec}
PEER=${PEER:-../shared/peers/hf_mixtral_bench.py}
STEPS=${STEPS:-8}
PRECISION=${PRECISION:-bf16}
LOGDIR=${LOGDIR:-/tmp/moec-bench}
mkdir -p "$LOGDIR"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(genos_1b og2_8x1b)
printf '%-10s %-6s %12s %12s %7s %10s %12s\n' model prec moec_tok/s peer_tok/s ratio moec_TF/s moec_peak
for m in "${models[@]}"; do
  check=$("$MOEC" check models/$m.moe --set precision=$PRECISION) || { echo "$m: check failed"; continue; }
  active=$(echo "$check" | sed -n 's/.*active per token (\([0-9]*\)).*/\1/p')
  read -r L H S < <(grep -E '^\s*(layers|hidden|seq)\s*=' models/$m.moe | awk -F'[=#]' '{gsub(/ /,"",$2); printf "%s ", $2}'; echo)
  "$MOEC" train models/$m.moe --device cuda --set precision=$PRECISION --steps "$STEPS" --set val_every=0 --val-batches 1 \
    --data data/chr20_slice.fa.gz --log "$LOGDIR/moec_$m.jsonl" ${MOEC_ARGS:-} >"$LOGDIR/moec_$m.out" 2>&1
  moec_tps=$(grep '"tokens_per_s"' "$LOGDIR/moec_$m.jsonl" | tail -n +4 | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/' |
             awk '{s+=$1; n++} END {if (n) printf "%.0f", s/n; else print "nan"}')
  peak=$(sed -n "s/^peak GPU memory: \([^(]*\) .*/\1/p" "$LOGDIR/moec_$m.out")
  [ "${PEER_SKIP:-0}" = 1 ] && [ -s "$LOGDIR/peer_$m.out" ] || python3 "$PEER" --preset "$m" --seq "$S" >"$LOGDIR/peer_$m.out" 2>&1
  peer_tps=$(grep -o '"tokens_per_s": *[0-9.]*' "$LOGDIR/peer_$m.out" | tail -1 | sed 's/.*: *//')
  [ -n "$peer_tps" ] || peer_tps=$(grep -o '"tok_per_s": *[0-9.]*' "$LOGDIR/peer_$m.out" | tail -1 | sed 's/.*: *//')
  python3 - "$m" "$PRECISION" "$moec_tps" "${peer_tps:-nan}" "$active" "$L" "$H" "$S" "${peak:-?}" <<'PY'
import sys
m, prec, mt, pt, active, L, H, S, peak = sys.argv[1:]
mt, pt = float(mt), float(pt)
flops = 6 * int(active) + 6 * int(L) * int(H) * int(S)
ratio = mt / pt if pt == pt and pt > 0 else float("nan")
print(f"{m:<10} {prec:<6} {mt:12.0f} {pt:12.0f} {ratio:7.2f} {mt * flops / 1e12:10.1f} {peak:>12}")
PY
done
