#!/usr/bin/env bash
# Run here (with network to PyPI) before a GPU session: downloads what the device lacks into
# .whl/ (git-ignored): wheels of polyft's pure-Python/binary dependencies for the device's
# Python 3.12 on x86-64, and the PyCUDA sdist, which gpu_session.sh builds on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for pkg in islpy pytools platformdirs siphash24 mako; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $plat -d .whl "$pkg"
done
python3 -m pip wheel -q --no-deps -w .whl cgen  # pure Python, published as an sdist only
for w in .whl/*.whl; do  # what they need beyond the device's image (KINDS.md lists it)
  echo "$w needs: $(unzip -p "$w" '*/METADATA' | grep ^Requires-Dist | grep -v extra | cut -d' ' -f2 | tr '\n' ' ')"
done
# the PyCUDA sdist as published (pip download would try to build its metadata here)
python3 - <<'PY'
import json, urllib.request
info = json.load(urllib.request.urlopen("https://pypi.org/pypi/pycuda/json"))
sdist = next(u for u in info["urls"] if u["packagetype"] == "sdist")
urllib.request.urlretrieve(sdist["url"], ".whl/" + sdist["filename"])
PY
ls -la .whl
