#!/usr/bin/env bash
# fetch_data.sh -- download the full human chr20 (GRCh37, 63 Mb) from the Debian archive into
# data/chr20.fa.gz (BGZF, as shipped). The file is not in git; data/chr20_slice.fa.gz is.
#
#   scripts/fetch_data.sh            fetch data/chr20.fa.gz (skipped if already there)
#   scripts/fetch_data.sh --slice    also re-cut data/chr20_slice.fa.gz from it (the bundled
#                                    3 Mb slice; the result is byte-identical with gzip 1.12)
#   scripts/fetch_data.sh --force    fetch again even if data/chr20.fa.gz exists
#
# Source: Debian package vt-examples (0.57721+ds-3 in bookworm), file
# usr/share/doc/vt/examples/ref/20.fa.gz. `apt-get download` needs no root; the package
# lists must be current for it, which `apt-get update` does (as root, or through sudo). Where
# neither is possible and the lists are stale, the download fails with a message saying so.
set -euo pipefail

PKG=vt-examples
INNER=usr/share/doc/vt/examples/ref/20.fa.gz
SLICE_FIRST_LINE=500002   # 20.fa.gz: a header line, then 60 bases a line; line 500002 begins at
SLICE_LAST_LINE=550001    # base 30,000,001, and line 550001 ends at base 33,000,000 (1-based)
SLICE_HEADER='>20:30000001-33000000 GRCh37'

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/data/chr20.fa.gz"
slice=0 force=0
for arg in "$@"; do
  case "$arg" in
    --slice) slice=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "fetch_data.sh: error: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "fetch_data.sh: error: $*" >&2; exit 1; }

if [[ -s "$out" && $force == 0 ]]; then
  echo "fetch_data.sh: $out is already there (use --force to fetch again)"
else
  command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian or Ubuntu system (or download $PKG by hand and extract $INNER)"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found: install dpkg"
  work=$(mktemp -d)
  chmod 755 "$work"   # apt-get download runs as _apt where it can
  trap 'rm -rf "$work"' EXIT
  # the package lists: refresh them where we can (root, or sudo without a password)
  if [[ $(id -u) == 0 ]]; then
    apt-get update -qq || echo "fetch_data.sh: warning: apt-get update failed; trying the lists as they are" >&2
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n apt-get update -qq || echo "fetch_data.sh: warning: apt-get update failed; trying the lists as they are" >&2
  else
    echo "fetch_data.sh: not root: skipping apt-get update, using the package lists as they are" >&2
  fi
  ( cd "$work" && apt-get download "$PKG" ) \
    || die "apt-get download $PKG failed; if the package is unknown or the lists are stale, run 'sudo apt-get update' and try again"
  deb=$(ls "$work"/"$PKG"_*.deb 2>/dev/null | head -n 1)
  [[ -n "$deb" ]] || die "apt-get download left no $PKG .deb in $work"
  echo "fetch_data.sh: extracting $INNER from $(basename "$deb")"
  dpkg-deb -x "$deb" "$work/x"
  [[ -s "$work/x/$INNER" ]] || die "$(basename "$deb") has no $INNER"
  gzip -t "$work/x/$INNER" || die "$INNER in $(basename "$deb") is damaged"
  mkdir -p "$root/data"
  cp "$work/x/$INNER" "$out.tmp"
  mv "$out.tmp" "$out"
  echo "fetch_data.sh: wrote $out ($(stat -c %s "$out") bytes)"
fi

if [[ $slice == 1 ]]; then
  { echo "$SLICE_HEADER"; gzip -dc "$out" | sed -n "${SLICE_FIRST_LINE},${SLICE_LAST_LINE}p"; } \
    | gzip -9n > "$root/data/chr20_slice.fa.gz.tmp"
  mv "$root/data/chr20_slice.fa.gz.tmp" "$root/data/chr20_slice.fa.gz"
  echo "fetch_data.sh: wrote $root/data/chr20_slice.fa.gz ($(stat -c %s "$root/data/chr20_slice.fa.gz") bytes)"
fi
