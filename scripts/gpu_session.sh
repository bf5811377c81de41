#!/usr/bin/env bash
# A GPU session in one command (scripts/gpu_session.py says what each stage does):
#   scripts/gpu_session.sh --rehearse   here, without a GPU: everything up to the first kernel launch
#   scripts/gpu_session.sh [--resume]   on the GPU machine, with .whl and .gpu-cache carried
# $PYTHON picks the Python (default: python3, the one that has torch on the GPU machine).
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_session.py --python "${PYTHON:-$(command -v python3)}" "$@"
