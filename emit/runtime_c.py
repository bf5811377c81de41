"""The ctypes runtime: C source compiled into a shared object (cached on disk by a hash of
source, compiler and flags; written atomically so concurrent compiles never clash), run with
ctypes."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from polyft.errors import CompileError, OutOfMemoryError

from .protocol import Runtime

# -ffp-contract=fast: ISO C (-std=c99) would otherwise forbid fusing a*b + c into one FMA
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-std=c99", "-fPIC", "-shared"]


def cache_dir() -> str:
    d = os.environ.get("POLYFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "polyft")
    os.makedirs(d, exist_ok=True)
    return d


def compiler(cc=None) -> str:
    cc = cc or os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise CompileError(f"no C compiler {cc!r} on PATH (set CC)", op="compile")
    return cc


def _version(cc) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]


def source_context(source: str, message: str, around: int = 3) -> str:
    """The generated lines the compiler complained about, with line numbers."""
    lines = source.splitlines()
    shown = []
    for n in sorted({int(m.group(1)) for m in re.finditer(r":(\d+):\d+: (?:fatal )?error", message)}):
        for k in range(max(1, n - around), min(len(lines), n + around) + 1):
            shown.append(f"{'>' if k == n else ' '}{k:5d} | {lines[k - 1]}")
        shown.append("")
    return "\n".join(shown)


def build(source: str, flags=None, cc=None) -> str:
    """Path of the shared object for `source`, compiling it unless cached."""
    cc = compiler(cc)
    flags = list(FLAGS if flags is None else flags)
    key = hashlib.sha256("\0".join([source, cc, _version(cc)] + flags).encode()).hexdigest()[:20]
    d = cache_dir()
    so = os.path.join(d, f"polyft_{key}.so")
    if os.path.exists(so):
        return so
    fd, src = tempfile.mkstemp(suffix=".c", dir=d)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, src, "-o", tmp, "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            msg = r.stderr.replace(src, "polyft.c")
            raise CompileError(f"{cc} {' '.join(flags)} failed:\n{msg}\n{source_context(source, msg)}",
                               op="compile", where="generated C")
        os.replace(tmp, so)  # atomic: a concurrent compile of the same source writes the same file
    finally:
        for p in (src, tmp):
            if os.path.exists(p):
                os.unlink(p)
    return so


class CtypesRuntime(Runtime):
    """The C target's module compiled into a shared object, its `polyft_run(void** bufs,
    const long* params)` called through ctypes on the arrays where they are."""

    def __init__(self, module, flags=None):
        super().__init__(module)
        self.flags = list(FLAGS if flags is None else flags)
        self.path = build(module.source, self.flags)
        self._lib = ctypes.CDLL(self.path)
        self._fn = self._lib.polyft_run
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long)]

    def bind(self, arrays: list, values: dict) -> tuple:
        for a in arrays:
            assert a.flags.c_contiguous  # the caller allocates every buffer contiguously
        params = (ctypes.c_long * max(1, len(self.module.params)))(*[int(values[p]) for p in self.module.params])

        def run():
            if self._fn((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]), params):
                raise OutOfMemoryError("the generated C could not allocate its threads' scratch for local buffers",
                                       op="run", where="generated C")
        return run, (lambda: None)
