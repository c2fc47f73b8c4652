#!/usr/bin/env bash
# Installs the Debian packages moec builds with, when any is missing (needs root or sudo).
set -euo pipefail
pkgs=(build-essential cmake flex bison pkg-config libopenblas-dev libhts-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "moec: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
