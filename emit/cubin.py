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

from . import private_files, runtime_c, tool

FLAGS = ("-cubin", "-O3", "-std=c++14", "-Xptxas", "-v")


def flags() -> tuple:
    """nvcc's flags: FLAGS, and multiplies and adds fused only where the code asks (fmaf: the
    tile GEMM's dot products), as the C target's -ffp-contract=off, unless POLYFT_FP_CONTRACT
    is `fast` (emit/runtime_c.py)."""
    return (*FLAGS, f"--fmad={'true' if runtime_c.contraction() == 'fast' else 'false'}")
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
    key = hashlib.sha256("\0".join([source, arch, release(path), *flags()]).encode()).hexdigest()[:24]
    folder = os.environ.get(CACHE)
    if folder:
        private_files.make_dirs(folder)
        why = private_files.untrusted_dir(os.path.realpath(folder))
        if why is not None:  # the driver would run what another user put there
            raise CompileError(f"{CACHE}={folder} is {why}: cubins are code this process runs; use a folder only "
                               "you can write", op="compile", where="nvcc")
    stem = os.path.join(folder or runtime_c.cache_dir(), f"cubin_{arch}_{key}")
    return stem + ".cubin", stem + ".ptxas"


def _read_private(path: str) -> bytes | None:
    """The bytes of the cache entry `path` if it is a regular file only this user can write (see
    private_files); None if it is absent or anything else (then compiled again, and replaced)."""
    try:
        got = private_files.open_entry(path)
    except (OSError, private_files.NotAFile):
        return None
    if got is None:
        return None
    fd, st = got
    try:
        return private_files.read_fd(fd, st.st_size)
    finally:
        os.close(fd)


def build(source: str, arch: str, fresh: bool = False) -> tuple:
    """(cubin bytes, ptxas' report) for `source` on `arch` (e.g. "sm_90"), compiled unless
    cached (`fresh`: compiled again, replacing the cached files). CompileError with the
    generated lines nvcc complains about."""
    cubin, report = paths(source, arch)
    if not fresh:
        cached = _read_private(cubin), _read_private(report)
        if None not in cached:
            return cached[0], cached[1].decode()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polyft-nvcc-") as d:
        src, out = os.path.join(d, "module.cu"), os.path.join(d, "module.cubin")
        with open(src, "w") as f:
            f.write(source)
        r = tool.run([nvcc(), f"-arch={arch}", *flags(), src, "-o", out], where="generated CUDA")
        if r.returncode != 0 or not os.path.exists(out):
            msg = (r.stderr or r.stdout).strip()
            raise CompileError(f"nvcc failed (-arch={arch}):\n{msg}\n{runtime_c.source_context(source, msg)}",
                               op="compile", where="generated CUDA")
        with open(out, "rb") as f:
            body = f.read()
    for name, data in ((report, r.stderr.encode()), (cubin, body)):  # the cubin last: it marks both done
        tmp = f"{name}.{os.getpid()}"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, name)  # atomic: a concurrent compile of the same source writes the same bytes
    if os.environ.get(LOG):
        with open(os.environ[LOG], "a") as f:
            f.write(f"{os.path.basename(cubin)} {time.monotonic() - start:.1f}\n")
    return body, r.stderr
