#!/usr/bin/env bash
# The benchmark: moec against the Hugging Face peer (MixtralForCausalLM, bf16, AdamW), same
# model sizes and token count, in the same run, on one GPU. Prints one table row per model.
#   MOEC=build/moec PEER=../shared/peers/hf_mixtral_bench.py bash bench/run_bench.sh [MODEL...]
# Env: STEPS (moec steps, default 8; the first 3 are warm-up), PRECISION (default bf16),
#      LOGDIR (default /tmp/moec-bench), MOEC_ARGS (more `moec train` flags, e.g. --passes=...),
#      PEER_SKIP=1 (reuse the peer's last output in LOGDIR). FLOPs per token = 6 x active params + 6 L hidden seq.
# Memory: peak, held between steps (weights, AdamW moments, bf16 copies) and step = peak - held,
# for moec (from `moec train`) and the peer (its peak_gib, static_gib, step_gib), both counted as
# torch.cuda.max_memory_allocated counts (bytes in tensors); step_mem_ratio is moec's step memory
# over the peer's; moec_reserved is what moec's pool held from the driver at most (its cached
# buffers and size-class rounding on top). Step times are tokens per step / tokens per second.
set -uo pipefail
MOEC=${MOEC:-build/moec}
PEER=${PEER:-../shared/peers/hf_mixtral_bench.py}
STEPS=${STEPS:-8}
PRECISION=${PRECISION:-bf16}
LOGDIR=${LOGDIR:-/tmp/moec-bench}
mkdir -p "$LOGDIR"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(genos_1b og2_8x1b)
printf '%-10s %-6s %11s %11s %6s %9s %8s %8s | %-23s | %-23s | %s\n' model prec moec_tok/s peer_tok/s ratio moec_TF/s moec_ms peer_ms \
  "moec GiB peak/held/step" "peer GiB peak/held/step" "step_mem_ratio moec_reserved"
for m in "${models[@]}"; do
  check=$("$MOEC" check models/$m.moe --set precision=$PRECISION) || { echo "$m: check failed"; continue; }
  active=$(echo "$check" | sed -n 's/.*active per token (\([0-9]*\)).*/\1/p')
  B=$(grep -E '^\s*batch\s*=' models/$m.moe | awk -F'[=#]' '{gsub(/ /,"",$2); print $2}')
  read -r L H S < <(grep -E '^\s*(layers|hidden|seq)\s*=' models/$m.moe | awk -F'[=#]' '{gsub(/ /,"",$2); printf "%s ", $2}'; echo)
  "$MOEC" train models/$m.moe --device cuda --set precision=$PRECISION --steps "$STEPS" --set val_every=0 --val-batches 1 \
    --data data/chr20_slice.fa.gz --log "$LOGDIR/moec_$m.jsonl" ${MOEC_ARGS:-} >"$LOGDIR/moec_$m.out" 2>&1
  moec_tps=$(grep '"tokens_per_s"' "$LOGDIR/moec_$m.jsonl" | tail -n +4 | sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/' |
             awk '{s+=$1; n++} END {if (n) printf "%.0f", s/n; else print "nan"}')
  peak=$(sed -n "s/^peak GPU memory: \([^(]*\) .*/\1/p" "$LOGDIR/moec_$m.out")
  reserved=$(sed -n "s/^peak GPU memory: .*reserved from the driver: \([^)]*\)).*/\1/p" "$LOGDIR/moec_$m.out")
  held=$(sed -n "s/^GPU memory held between steps: \([^;]*\);.*/\1/p" "$LOGDIR/moec_$m.out")
  [ "${PEER_SKIP:-0}" = 1 ] && [ -s "$LOGDIR/peer_$m.out" ] || python3 "$PEER" --preset "$m" --seq "$S" >"$LOGDIR/peer_$m.out" 2>&1
  peer_tps=$(grep -o '"tokens_per_s": *[0-9.]*' "$LOGDIR/peer_$m.out" | tail -1 | sed 's/.*: *//')
  [ -n "$peer_tps" ] || peer_tps=$(grep -o '"tok_per_s": *[0-9.]*' "$LOGDIR/peer_$m.out" | tail -1 | sed 's/.*: *//')
  python3 - "$m" "$PRECISION" "$moec_tps" "${peer_tps:-nan}" "$active" "$L" "$H" "$S" "${peak:-?}" "${held:-?}" "$LOGDIR/peer_$m.out" "${B:-1}" "${reserved:-?}" <<'PY'
import json, sys
m, prec, mt, pt, active, L, H, S, peak, held, peer_out, B, reserved = sys.argv[1:]
mt, pt = float(mt), float(pt)
flops = 6 * int(active) + 6 * int(L) * int(H) * int(S)
ratio = mt / pt if pt == pt and pt > 0 else float("nan")
def gib(s):  # "28.85 GiB" / "512.00 MiB" -> GiB
    try:
        v, u = s.split()
        return float(v) / {"GiB": 1, "MiB": 1024, "KiB": 1024**2, "B": 1024**3}[u]
    except ValueError:
        return float("nan")
mp, mh = gib(peak), gib(held)
ms = mp - mh
peer = {}
for line in open(peer_out, errors="replace"):
    if line.startswith("{"):
        try: peer = json.loads(line)
        except ValueError: pass
pp, ph, pst = (peer.get(k, float("nan")) for k in ("peak_gib", "static_gib", "step_gib"))
moec_ms = 1000 * int(S) * int(B) / mt if mt > 0 else float("nan")
peer_ms = 1000 * peer.get("step_s", float("nan"))
print(f"{m:<10} {prec:<6} {mt:11.0f} {pt:11.0f} {ratio:6.2f} {mt * flops / 1e12:9.1f} {moec_ms:8.1f} {peer_ms:8.1f} | "
      f"{mp:7.2f} {mh:7.2f} {ms:7.2f} | {pp:7.2f} {ph:7.2f} {pst:7.2f} | {ms / pst if pst and pst == pst else float('nan'):.2f} {gib(reserved):7.2f}")
PY
done
