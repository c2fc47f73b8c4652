#!/usr/bin/env bash
# Golden diagnostic test. Usage: run_one.sh MOEC NAME (run in tests/diag).
# Runs `MOEC check NAME.moe ARGS...`, where ARGS are the lines of NAME.args if it exists (one
# argument per line), and compares its stderr followed by a line "exit: N" with
# NAME.expected, byte for byte. On a mismatch it prints a diff and fails.
# MOEC_UPDATE=1 rewrites NAME.expected instead (review the diff before committing it).
set -u
moec=$1
name=$2
args=()
if [ -f "$name.args" ]; then
  mapfile -t args < "$name.args"
fi
actual=$(mktemp)
trap 'rm -f "$actual"' EXIT
"$moec" check "$name.moe" "${args[@]}" 2>"$actual" >/dev/null
echo "exit: $?" >>"$actual"
if [ "${MOEC_UPDATE:-0}" = 1 ]; then
  cp "$actual" "$name.expected"
  exit 0
fi
if ! cmp -s "$name.expected" "$actual"; then
  echo "diag test $name: stderr differs from $name.expected (- expected, + actual):"
  diff -u "$name.expected" "$actual" | head -200
  exit 1
fi
