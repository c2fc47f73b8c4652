#!/usr/bin/env bash
# The fusion passes through the driver: og2_8x1b's dump shows no per-expert linear after
# group-linear, one grouped_mlp per layer after grouped-mlp and MXFP8 quantize ops after mxfp8;
# the pass manager's flags; the golden dumps of tiny after every pass; moec train with the flags.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# section FILE PASS: the dump after PASS (kept in a file: `grep -q` on a pipe trips pipefail)
section() {
  [ -f "$1.$2" ] || sed -n "/IR after $2 -----/,/^}/p" "$1" >"$1.$2"
  cat "$1.$2"
}

# og2_8x1b, forward, mxfp8: the issue's acceptance command
"$MOEC" dump models/og2_8x1b.moe --print-after=all --set precision=mxfp8 >"$tmp/og2.mir" || fail "og2 dump"
for p in lower group-linear grouped-mlp mxfp8 dce; do grep -q "// ----- IR after $p ----- //" "$tmp/og2.mir" || fail "no section $p"; done
expert_linears() { section "$tmp/og2.mir" "$1" | grep -c ' = linear(%[0-9]*, %[0-9]*) : [a-z0-9]*\[n[0-9]*_[0-9]*,' || true; }
[ "$(expert_linears lower)" -eq $((16 * 8 * 3)) ] || fail "lower: expected 384 per-expert linears, found $(expert_linears lower)"
[ "$(expert_linears group-linear)" -eq 0 ] || fail "per-expert linears left after group-linear: $(expert_linears group-linear)"
[ "$(section "$tmp/og2.mir" group-linear | grep -c ' = grouped_linear(')" -eq 32 ] || fail "group-linear: expected 2 grouped_linear x 16 layers"
[ "$(section "$tmp/og2.mir" group-linear | grep -c ' = \(dispatch\|combine\)(')" -eq 0 ] || fail "dispatch/combine left after group-linear"
[ "$(section "$tmp/og2.mir" grouped-mlp | grep -c ' = grouped_mlp(')" -eq 16 ] || fail "grouped-mlp: expected one grouped_mlp per layer (16)"
[ "$(section "$tmp/og2.mir" grouped-mlp | grep -c ' = grouped_linear(')" -eq 0 ] || fail "grouped_linear left after grouped-mlp"
# every layer's gate and up were merged (the note names the weights)
for l in $(seq 0 15); do
  section "$tmp/og2.mir" group-linear >/dev/null
  grep -q "weights model.layers.$l.block_sparse_moe.experts.\*.w1.weight, .*experts.\*.w3.weight (2 siblings" "$tmp/og2.mir.group-linear" ||
    fail "layer $l: no merged gate_up note"
done
# mxfp8-projections: q, k, v and o of every layer become one-group grouped GEMMs
np=$(section "$tmp/og2.mir" mxfp8-projections | grep -c '// mxfp8-projections: ' || true)
[ "$np" -eq $((16 * 4)) ] || fail "mxfp8-projections: expected 64 one-group projections (q, k, v, o per layer), found $np"
nq=$(section "$tmp/og2.mir" mxfp8 | grep -c ' = mxfp8_quantize(' || true)
[ "$nq" -eq $((16 * 9)) ] ||
  fail "mxfp8: expected 144 forward quantize ops (xs, w_gate_up, w_down; the projections' two inputs and four weights per layer), found $nq"
grep -q ' = grouped_mlp(.*mx_block=32, mx_share128=0' "$tmp/og2.mir.mxfp8" || fail "grouped_mlp without its MX attributes"
[ "$(section "$tmp/og2.mir" lower | grep -c mxfp8_)" -eq 0 ] || fail "quantize ops before the mxfp8 pass"
# (that router, embedding, norms, attention and lm_head read no MXFP8 value: test_passes.c)

# the training step: the weight gradient's column blocks restart at each expert (counts operand)
"$MOEC" dump models/og2_8x1b.moe --train --set precision=mxfp8 --set mx_block=128 >"$tmp/og2t.mir" || fail "og2 --train"
grep -q ' = mxfp8_quantize(%[0-9]*, %[0-9]*) {block=32, axis=0, share128=1, role="wgrad"}' "$tmp/og2t.mir" || fail "no per-expert column-block quantize"
grep -q 'role="saved"' "$tmp/og2t.mir" || fail "the saved gate_up is not stored in MXFP8"
grep -q ' = grouped_mlp_bwd(' "$tmp/og2t.mir" || fail "no grouped_mlp_bwd"

# --print-after-change: fp32 has nothing for mxfp8 to do
"$MOEC" dump models/tiny.moe --print-after-change >"$tmp/chg.mir" || fail "--print-after-change"
for p in lower group-linear grouped-mlp; do grep -q "IR after $p -----" "$tmp/chg.mir" || fail "--print-after-change: no $p"; done
if grep -q "IR after mxfp8" "$tmp/chg.mir"; then fail "--print-after-change printed mxfp8, which changed nothing"; fi
# --disable-pass and --passes
"$MOEC" dump models/tiny.moe --disable-pass=grouped-mlp >"$tmp/dis.mir"
grep -q ' = grouped_linear(' "$tmp/dis.mir" && ! grep -q ' = grouped_mlp(' "$tmp/dis.mir" || fail "--disable-pass=grouped-mlp"
"$MOEC" dump models/tiny.moe --passes=dce >"$tmp/naive.mir"
grep -q ' = dispatch(' "$tmp/naive.mir" && ! grep -q grouped "$tmp/naive.mir" || fail "--passes=dce should keep the naive graph"
# --pass-timing
"$MOEC" dump models/tiny.moe --train --pass-timing >/dev/null 2>"$tmp/timing"
for p in group-linear grouped-mlp autodiff mxfp8 dce total; do grep -q "^  $p " "$tmp/timing" || fail "--pass-timing: no $p line"; done
# --dump-dir: numbered by place in the pipeline; golden against tests/golden/tiny
"$MOEC" dump models/tiny.moe --train --set precision=mxfp8 --dump-dir="$tmp/dd" >/dev/null || fail "--dump-dir"
for f in 00-after-lower 01-after-group-linear 02-after-grouped-mlp 03-after-parallelize 04-after-mxfp8-projections 05-after-autodiff 06-after-sync 07-after-fold-grad-cast 08-after-mxfp8 09-after-fuse-residual 10-after-fuse-gemm-add 11-after-dce; do
  [ -f "$tmp/dd/$f.mir" ] || fail "--dump-dir: no $f.mir"
  diff -u "tests/golden/tiny/$f.mir" "$tmp/dd/$f.mir" >"$tmp/diff" ||
    { head -40 "$tmp/diff"; fail "$f.mir differs from tests/golden/tiny (if intended: tests/golden/update.sh)"; }
done
if "$MOEC" dump models/tiny.moe --dump-dir=/dev/null/x 2>"$tmp/e1"; then fail "--dump-dir into /dev/null accepted"; fi
grep -q "dump-dir" "$tmp/e1" || fail "--dump-dir message: $(cat "$tmp/e1")"

# moec train takes the same flags (and trains with the fused step)
small=(--set hidden=32 --set ffn=48 --set seq=32 --set batch=2 --set heads=4 --set kv_heads=2 --set val_every=0 --val-batches 1)
"$MOEC" train models/tiny.moe "${small[@]}" --steps 2 --pass-timing --disable-pass=grouped-mlp --print-after=group-linear \
  >"$tmp/train.out" 2>"$tmp/train.err" || { cat "$tmp/train.err"; fail "train with pass flags"; }
grep -q "IR after group-linear" "$tmp/train.out" || fail "train --print-after"
grep -q "^  group-linear " "$tmp/train.err" || fail "train --pass-timing"
# fuse-residual changes no number: the same losses and the same checkpoint bytes without it
# (bf16, so that the fused ops' rounding before the add is exercised)
for mode in on off; do
  flags=(); [ $mode = off ] && flags=(--disable-pass=fuse-residual)
  "$MOEC" train models/tiny.moe "${small[@]}" --set precision=bf16 --steps 3 --seed 7 "${flags[@]}" --log "$tmp/fr_$mode.jsonl" \
    --ckpt-dir "$tmp/fr_$mode" >"$tmp/fr_$mode.out" 2>&1 || { cat "$tmp/fr_$mode.out"; fail "train with fuse-residual $mode"; }
done
"$MOEC" dump models/tiny.moe --train --set precision=bf16 >"$tmp/fr_on.mir"
"$MOEC" dump models/tiny.moe --train --set precision=bf16 --disable-pass=fuse-residual >"$tmp/fr_off.mir"
grep -q 'residual=1' "$tmp/fr_on.mir" || fail "fuse-residual folded no add"
grep -q 'residual=1' "$tmp/fr_off.mir" && fail "--disable-pass=fuse-residual still folds"
sed 's/"time[^,]*,//g; s/"[a-z_]*_s":[0-9.e+-]*,\?//g' "$tmp/fr_on.jsonl" >"$tmp/fr_on.cmp"
sed 's/"time[^,]*,//g; s/"[a-z_]*_s":[0-9.e+-]*,\?//g' "$tmp/fr_off.jsonl" >"$tmp/fr_off.cmp"
grep -q loss "$tmp/fr_on.cmp" || fail "fuse-residual: no losses logged"
diff "$tmp/fr_on.cmp" "$tmp/fr_off.cmp" || fail "fuse-residual changed the logged losses"
n=0
for f in "$tmp"/fr_on/*/*.safetensors "$tmp"/fr_on/*.safetensors; do
  [ -f "$f" ] || continue
  cmp -s "$f" "${f/fr_on/fr_off}" || fail "fuse-residual changed the checkpoint $(basename "$f")"
  n=$((n + 1))
done
[ $n -gt 0 ] || fail "fuse-residual: no checkpoint written"

echo "passes: og2_8x1b dump (grouped, fused, mxfp8), flags, golden dumps of tiny, train with flags ok"
