#!/usr/bin/env bash
# Set up posttrain on a fresh Debian machine (Python >= 3.11; root or sudo): system packages,
# then a virtual environment in .venv with posttrain installed (editable). Idempotent.
#   scripts/bootstrap.sh          what the main job needs
#   scripts/bootstrap.sh --test   plus what the test suite needs (headless Chromium, pytest, Ray)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
packages=(bubblewrap git)
if [ "${1:-}" = "--test" ]; then
  extras="[test]"
  packages+=(chromium)
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "posttrain needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
  packages+=("python3-venv")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing system packages: ${missing[*]}"
  $SUDO apt-get install -y -q "${missing[@]}" >/dev/null || {
    $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned (2.13.0, CPU build) in pyproject.toml: an unpinned torch would pull CUDA wheels.
.venv/bin/python -m pip install -q -e ".${extras}"
echo "posttrain is installed in .venv ($(.venv/bin/posttrain version))"
