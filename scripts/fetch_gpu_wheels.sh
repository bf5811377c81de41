#!/usr/bin/env bash
# Run here (with network to PyPI) before a GPU session: downloads into .whl/ (git-ignored) the
# files scripts/gpu_pins.txt pins (PyCUDA's and cgen's sdists, the wheels of islpy, pytools,
# platformdirs, siphash24 and mako for the GPU machine's Python 3.12 on x86-64) and checks each
# against its sha256; a file already there with the right hash is kept. Carry .whl to the GPU
# machine (scripts/gpu_session.sh checks the hashes again there).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 - <<'PY'
import hashlib, os, sys, urllib.request

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

bad = []
for line in open("scripts/gpu_pins.txt"):
    if not line.strip() or line.startswith("#"):
        continue
    digest, name, url = line.split()
    path = os.path.join(".whl", name)
    if os.path.exists(path) and sha256(path) == digest:
        print(f"kept       {name}")
        continue
    tmp = path + ".part"
    for attempt in (1, 2, 3):
        try:
            urllib.request.urlretrieve(url, tmp)
            break
        except OSError as e:
            print(f"attempt {attempt}: {url}: {e}", file=sys.stderr)
    if os.path.exists(tmp) and sha256(tmp) == digest:
        os.replace(tmp, path)
        print(f"downloaded {name}")
    else:
        bad.append(name)
        print(f"FAILED     {name}: not downloaded, or its sha256 is not the pinned {digest}", file=sys.stderr)
sys.exit(f"{len(bad)} pinned files missing: {', '.join(bad)}" if bad else 0)
PY
ls -la .whl
