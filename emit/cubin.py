"""nvcc's machine code (a cubin) for a generated CUDA module, cached on disk: the GPU runtime
loads it (emit/runtime_cuda.py) and the GPU profile reads ptxas' report of it
(emit/gpu_profile.py), so one compile serves both, and a GPU session runs on cubins compiled
beforehand on a machine without a GPU (scripts/gpu_session.sh --rehearse: its cache travels
with the run). Cubins live in $POLYFT_CUBIN_CACHE where that is set (the session's carried
folder, whatever compile cache a test sets), else in the compile cache (POLYFT_CACHE).

A cubin is keyed by the source, the architecture, the flags and nvcc's release (major.minor):
machine code for sm_90 from the same release runs on any driver that release supports. A
compile that misses the cache is appended to $POLYFT_CUBIN_LOG when that is set (the GPU
session reports how many modules it had to compile on the device)."""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import tempfile
import time

from polyft.errors import CompileError

from . import runtime_c, tool

FLAGS = ("-cubin", "-O3", "-std=c++14", "-Xptxas", "-v")
LOG = "POLYFT_CUBIN_LOG"
CACHE = "POLYFT_CUBIN_CACHE"


def nvcc() -> str | None:
    """The nvcc on PATH (None: there is none)."""
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=None)
def release(path: str) -> str:
    """nvcc's release, e.g. "13.0" (from `nvcc --version`)."""
    out = tool.run([path, "--version"], where="nvcc").stdout
    m = re.search(r"release (\d+\.\d+)", out)
    if m is None:
        raise CompileError(f"{path} --version does not name a release: {out.strip()[-200:]!r}", op="compile",
                           where="nvcc")
    return m.group(1)


def paths(source: str, arch: str) -> tuple:
    """(cubin, ptxas report) file names in the cache for `source` on `arch`."""
    path = nvcc()
    if path is None:
        raise CompileError("the CUDA target needs nvcc on PATH to compile its kernels", op="compile", where="nvcc")
    key = hashlib.sha256("\0".join([source, arch, release(path), *FLAGS]).encode()).hexdigest()[:24]
    folder = os.environ.get(CACHE)
    if folder:
        os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder or runtime_c.cache_dir(), f"cubin_{arch}_{key}")
    return stem + ".cubin", stem + ".ptxas"


def build(source: str, arch: str, fresh: bool = False) -> tuple:
    """(cubin bytes, ptxas' report) for `source` on `arch` (e.g. "sm_90"), compiled unless
    cached (`fresh`: compiled again, replacing the cached files). CompileError with the
    generated lines nvcc complains about."""
    cubin, report = paths(source, arch)
    if not fresh:
        try:
            with open(cubin, "rb") as f, open(report) as g:
                return f.read(), g.read()
        except OSError:
            pass
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyft-nvcc-") as d:
        src, out = os.path.join(d, "module.cu"), os.path.join(d, "module.cubin")
        with open(src, "w") as f:
            f.write(source)
        r = tool.run([nvcc(), f"-arch={arch}", *FLAGS, src, "-o", out], where="generated CUDA")
        if r.returncode != 0 or not os.path.exists(out):
            msg = (r.stderr or r.stdout).strip()
            raise CompileError(f"nvcc failed (-arch={arch}):\n{msg}\n{runtime_c.source_context(source, msg)}",
                               op="compile", where="generated CUDA")
        with open(out, "rb") as f:
            body = f.read()
    for name, data, mode in ((report, r.stderr, "w"), (cubin, body, "wb")):  # the cubin last: it marks both done
        tmp = f"{name}.{os.getpid()}"
        with open(tmp, mode) as f:
            f.write(data)
        os.replace(tmp, name)  # atomic: a concurrent compile of the same source writes the same bytes
    if os.environ.get(LOG):
        with open(os.environ[LOG], "a") as f:
            f.write(f"{os.path.basename(cubin)} {time.monotonic() - start:.1f}\n")
    return body, r.stderr
