#!/usr/bin/env bash
# Run on the GPU machine (device tool: carry .whl; see README "GPU sessions"): installs the
# carried wheels, builds PyCUDA from its sdist against the local CUDA, then runs the GPU
# tests and the GPU benchmark, leaving logs and CSVs in $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# polyft itself, editable: deps/ schedule/ emit/ experiments/ import as polyft.* only once installed
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
ls "$CUDA_ROOT/include/cuda.h" >/dev/null || { echo "no cuda.h under $CUDA_ROOT"; exit 1; }
rm -rf /tmp/pycuda-src && mkdir /tmp/pycuda-src && tar xzf .whl/pycuda-*.tar.gz -C /tmp/pycuda-src
( cd /tmp/pycuda-src/pycuda-* \
  && python3 configure.py --cuda-root="$CUDA_ROOT" \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . ) \
  2>&1 | tail -20 | tee "$OUT/pycuda-build.log"
python3 -c "import pycuda.autoprimaryctx, pycuda.driver as d; print('pycuda', d.get_version(), d.Context.get_device().name())" \
  | tee -a "$OUT/device.txt" || exit 1
python3 -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu-tests.log"
python3 -m polyft.experiments.gpu_bench --out "$OUT" 2>&1 | tee "$OUT/gpu-bench.log"
