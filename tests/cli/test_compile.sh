#!/usr/bin/env bash
# moec compile writes a standalone training executable: it trains without the .moe file (or
# its includes), with the baked-in --set values, exactly like `moec train` does.
set -euo pipefail
: "${MOEC:?set MOEC to the moec binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$tmp/src"
# a model split over two files, to check that includes travel too
sed -n '/^model/,$p' models/tiny.moe | sed 's|"../data/chr20_slice.fa.gz"|"'"$PWD"'/data/chr20_slice.fa.gz"|' >"$tmp/src/body.moe"
printf '# main file\ninclude "body.moe"\n' >"$tmp/src/main.moe"
sets=(--set hidden=32 --set ffn=48 --set seq=64 --set batch=2 --set val_every=0)
"$MOEC" compile "$tmp/src/main.moe" -o "$tmp/trainer" "${sets[@]}" >"$tmp/compile.out" || fail "compile: $(cat "$tmp/compile.out")"
grep -q "2 source files" "$tmp/compile.out" || fail "include not embedded: $(cat "$tmp/compile.out")"
"$MOEC" train "$tmp/src/main.moe" "${sets[@]}" --steps 4 --val-batches 1 --log "$tmp/ref.jsonl" 2>/dev/null
mv "$tmp/src" "$tmp/gone"   # the executable must not need the sources any more
(cd "$tmp" && ./trainer --steps 4 --val-batches 1 --log exe.jsonl 2>exe.err) || fail "trainer: $(cat "$tmp/exe.err")"
steps() { grep '"loss"' "$1" | sed 's/,"lr".*//'; }
diff <(steps "$tmp/ref.jsonl") <(steps "$tmp/exe.jsonl") || fail "compiled executable trains differently"
"$tmp/trainer" --help | grep -q "moec training executable" || fail "--help"
# a damaged payload is reported, not run
cp "$tmp/trainer" "$tmp/broken"
size=$(stat -c %s "$tmp/broken")
printf 'XXXX' | dd of="$tmp/broken" bs=1 seek=$((size - 40)) conv=notrunc status=none
if "$tmp/broken" --steps 1 2>"$tmp/broken.err"; then fail "damaged executable ran"; fi
grep -q "damaged" "$tmp/broken.err" || fail "damaged message: $(cat "$tmp/broken.err")"
# compile needs -o, and refuses a bad model
if "$MOEC" compile models/tiny.moe 2>"$tmp/e1"; then fail "compile without -o"; fi
grep -q "needs -o" "$tmp/e1" || fail "-o message"
if "$MOEC" compile models/tiny.moe -o "$tmp/x" --set top_k=9 2>/dev/null; then fail "compiled a bad model"; fi
[ ! -e "$tmp/x" ] || fail "a bad model left an executable behind"
echo "compile: standalone executable trains like moec train; damaged payloads refused"
