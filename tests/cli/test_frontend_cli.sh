#!/usr/bin/env bash
# The front end through the CLI: every shipped model checks; file errors read alike.
# Run from the source root with $MOEC set (ctest does both).
set -u
fail=0
for m in models/*.moe; do
  out=$("$MOEC" check "$m" 2>&1) || { echo "FAIL: moec check $m: $out"; fail=1; }
  case $out in *": ok: "*) ;; *) echo "FAIL: moec check $m printed: $out"; fail=1 ;; esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect() { # expect WANT CMD...
  local want=$1; shift
  local got
  got=$("$@" 2>&1 >/dev/null)
  local rc=$?
  if [ "$got" != "$want" ] || [ $rc != 1 ]; then
    echo "FAIL: $*"; echo "  want (exit 1): $want"; echo "  got (exit $rc): $got"; fail=1
  fi
}
expect "$tmp/none.moe: error: cannot open: No such file or directory" "$MOEC" check "$tmp/none.moe"
expect "$tmp: error: cannot open: Is a directory" "$MOEC" check "$tmp"
: >"$tmp/empty.moe"
expect "$tmp/empty.moe: error: empty file, expected 'model NAME { ... }'" "$MOEC" check "$tmp/empty.moe"
cp models/tiny.moe "$tmp/locked.moe"
chmod 000 "$tmp/locked.moe"
if ! cat "$tmp/locked.moe" >/dev/null 2>&1; then   # root reads anything: skip there
  expect "$tmp/locked.moe: error: cannot open: Permission denied" "$MOEC" check "$tmp/locked.moe"
else
  echo "skip: unreadable-file case (running as root)"
fi
expect "--set top_kk=1: error: unknown name 'top_kk'; did you mean 'top_k'?" "$MOEC" check models/tiny.moe --set top_kk=1
exit $fail
