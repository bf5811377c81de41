"""The ctypes runtime: C source compiled into a shared object, run with ctypes.

The objects are cached on disk (POLYFT_CACHE, else ~/.cache/polyft) under a hash of source,
compiler and flags. A cache outlives crashes, full disks and other processes, so nothing in it
is trusted: the directory must be private to this user (else a private temporary one is used),
every entry must be a regular file of this user's that no one else can write
(emit/private_files.py), and every object carries a checksum record and is verified before it
is loaded (a truncated object mapped by the loader kills the process with SIGBUS instead of
raising); the loader is handed only a file that passed those checks.
Each object is written to a private temporary directory and published with one os.replace,
so concurrent compiles of the same source never see a partial file; the directory is named by the
builder's pid and host, so that one a killed compile left behind is deleted by the next compile
(`clean_stale`). The compiler runs under a time limit (emit/tool.py, $POLYFT_CC_TIMEOUT)."""
from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import struct
import tempfile
import time
import warnings

from polyft.errors import CompileError, OutOfMemoryError, SettingError

from . import private_files, tool
from .isa import compiler, features, march
from .protocol import Runtime
from .threads import ThreadChoice, brief_spin

# -ffp-contract=off: no multiply and add fuse unless the generated code asks (ft_fma: a GEMM's
# dot products, as BLAS and so numpy's matmul fuse them; the exp/tanh polynomials), so that
# elementwise `x * 2 - x` rounds twice, as numpy's does (fused, 3e38 * 2 - 3e38 is 3e38, not inf).
# $POLYFT_FP_CONTRACT=fast lets the compiler fuse any (`contraction`).
# -fno-trapping-math: the generated code never reads the floating-point exception flags, and
# without it GCC will not turn a comparison that may trap (a NaN operand) into a vector select
# unless the ISA has masks (AVX-512): on AVX2 and SSE no loop of ft_expf would vectorise.
# The -march level comes first, from isa.march() unless given (`compile_flags`).
FLAGS = ["-O3", "-fno-trapping-math", "-fopenmp", "-std=c99", "-fPIC", "-shared"]
CONTRACT_ENV = "POLYFT_FP_CONTRACT"


def contraction() -> str:
    """The -ffp-contract mode: `off` unless $POLYFT_FP_CONTRACT says `fast` (faster elementwise
    chains of multiplies and adds, rounded once where numpy rounds twice)."""
    mode = os.environ.get(CONTRACT_ENV, "").strip() or "off"
    if mode not in ("off", "fast"):
        raise SettingError(f"{CONTRACT_ENV}={mode!r} is neither 'off' (the default: compiled code rounds every "
                           "multiply and add as numpy does) nor 'fast' (the compiler may fuse them)",
                           op="compile", where=CONTRACT_ENV)
    return mode


def compile_flags(level: str | None = None) -> list:
    """The compiler flags for the generated C built for -march=`level` (isa.march() if None)."""
    return [f"-march={level or march()}", f"-ffp-contract={contraction()}"] + FLAGS


def _level(flags) -> str | None:
    """The -march level in a list of flags, if any."""
    return next((f.split("=", 1)[1] for f in flags if f.startswith("-march=")), None)

# The checksum record appended to every cached object: magic, size and sha256 of the bytes
# before it. It lives inside the file rather than in a sidecar so that one atomic rename
# publishes object and checksum together (two renames would let concurrent writers pair one
# process's object with another's checksum) and the cache holds one file per entry. The
# loader maps only what the ELF headers name, so the appended bytes are never read by it.
RECORD = struct.Struct("<8sQ32s")
MAGIC = b"POLYFT1\0"

_fallback_dir = None


def cache_dir() -> str:
    """The compile cache directory (its real path), created 0700 if needed. When it cannot be
    created or written (read-only home, a file in the way), or is not private to this user
    (private_files.untrusted_dir: someone else's, writable by others, inside a directory others
    can write), a private temporary directory for this process instead: compiling then costs
    more but still works, and no one else's code is loaded."""
    global _fallback_dir
    d = os.environ.get("POLYFT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "polyft")
    try:
        private_files.make_dirs(d)
        real = os.path.realpath(d)
        why = private_files.untrusted_dir(real)
        if why is None:
            if os.access(real, os.W_OK | os.X_OK):
                return real
            why = "not writable"
    except OSError as e:
        why = e.strerror or str(e)
    if _fallback_dir is None:
        _fallback_dir = tempfile.mkdtemp(prefix="polyft-cache-")  # 0700, this user's
        atexit.register(shutil.rmtree, _fallback_dir, True)
    warnings.warn(f"polyft: cannot use the compile cache {d} ({why}); compiling into {_fallback_dir} "
                  "for this process instead (set POLYFT_CACHE to a directory of your own that only you "
                  "can write)", stacklevel=2)
    return _fallback_dir


def cache_subdir(name: str) -> str | None:
    """A directory `name` inside the compile cache, private like it (for another compiler's own
    cache: PyCUDA's cubins), or None when it cannot be made so (then that compiler caches nothing)."""
    d = os.path.join(cache_dir(), name)
    try:
        private_files.make_dirs(d)
        why = private_files.untrusted_dir(d)
    except OSError as e:
        why = e.strerror or str(e)
    if why is None:
        return d
    warnings.warn(f"polyft: cannot use {d} as a cache ({why}); compiling without one", stacklevel=2)
    return None


@functools.lru_cache(maxsize=None)
def _version(cc) -> str:
    return tool.run([cc, "--version"], where=cc).stdout.split("\n")[0]


STALE = 24 * 3600  # seconds after which any build directory is abandoned, whoever made it
_HOST = socket.gethostname()


def _builder(name: str):
    """(pid, host) of the process that made the build directory `name`, or None (another scheme)."""
    m = re.fullmatch(r"build-(\d+)@(.*)-\w+", name)
    return (int(m.group(1)), m.group(2)) if m else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, running
        pass
    return True


def clean_stale(d: str) -> list:
    """Delete the build directories in the cache `d` that a killed compile left: made on this host
    by a process that is gone, or older than STALE (another host's, or an older scheme's). The
    ones removed. (Processes that share a cache and a host name share a pid space too, as on one
    machine; containers that share a cache directory need host names of their own.)"""
    removed = []
    now = time.time()
    for entry in os.scandir(d):
        if not entry.name.startswith("build-"):
            continue
        owner = _builder(entry.name)
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE
        except FileNotFoundError:
            continue  # its builder finished meanwhile
        if old or owner is not None and owner[1] == _HOST and not _alive(owner[0]):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def source_context(source: str, message: str, around: int = 3) -> str:
    """The generated lines the compiler complained about, with line numbers."""
    lines = source.splitlines()
    shown = []
    for n in sorted({int(m.group(1)) for m in re.finditer(r":(\d+):\d+: (?:fatal )?error", message)}):
        for k in range(max(1, n - around), min(len(lines), n + around) + 1):
            shown.append(f"{'>' if k == n else ' '}{k:5d} | {lines[k - 1]}")
        shown.append("")
    return "\n".join(shown)


def damage(data: bytes) -> str | None:
    """Why the bytes of a cached object must not be loaded, or None when they are intact."""
    body, record = data[:-RECORD.size], data[-RECORD.size:]
    if len(data) < RECORD.size or not record.startswith(MAGIC):
        return f"no checksum record at its end ({len(data)} bytes: truncated, or not written by polyft)"
    _, size, digest = RECORD.unpack(record)
    if size != len(body):
        return f"{len(body)} bytes where its record says {size}"
    if hashlib.sha256(body).digest() != digest:
        return "its contents differ from the sha256 in its record"
    return None


def _discard(path: str, inode=None) -> None:
    """Delete a bad cache entry; with `inode`, only if no other process has replaced it since."""
    try:
        if inode is None or os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass  # already gone (a concurrent process discarded it), or the rebuild will replace it


def open_verified(path: str) -> int | None:
    """A descriptor of the cached object `path` once it has passed every check (a regular file of
    this user's, writable by no one else, of bounded size, intact by its checksum record), or
    None when there is none to use. A damaged or untrusted entry is deleted, to be rebuilt (with
    a warning when it was not a file polyft wrote); a directory in its place is a CompileError."""
    try:
        got = private_files.open_entry(path)
    except private_files.NotAFile as e:
        if e.kind == "a directory":
            raise CompileError(f"the compile cache entry {path} is a directory, not an object polyft wrote: "
                               "remove it, or set POLYFT_CACHE to another directory", op="compile",
                               where=path) from None
        warnings.warn(f"polyft: the compile cache entry {path} is {e.kind}, not an object polyft wrote; "
                      "it is removed and compiled again", stacklevel=3)
        _discard(path)
        return None
    except OSError as e:  # EMFILE, EACCES, EIO
        raise CompileError(f"cannot open the compile cache entry {path} ({e.strerror or e}){_os_hint(e)}",
                           op="compile", where=path) from None
    if got is None:
        return None
    fd, st = got
    if damage(private_files.read_fd(fd, st.st_size)) is None:
        return fd
    os.close(fd)
    _discard(path, st.st_ino)
    return None


def _intact(so: str) -> bool:
    """Whether `so` holds an intact object of this user's; a damaged one is deleted, to be rebuilt."""
    fd = open_verified(so)
    if fd is None:
        return False
    os.close(fd)
    return True


def _check_output(cc, flags, r, out, source, src) -> None:
    """Raise CompileError unless the compiler succeeded and wrote a shared object: a failed
    build must never reach the cache, where every later process would load it."""
    command = " ".join([cc, *flags])
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).replace(src, "polyft.c")
        if not msg.strip():
            status = (f"was killed by signal {-r.returncode}" if r.returncode < 0
                      else f"exited with status {r.returncode}")
            raise CompileError(f"{command} {status} and printed nothing", op="compile", where="generated C")
        raise CompileError(f"{command} failed:\n{msg}\n{source_context(source, msg)}",
                           op="compile", where="generated C")
    if not os.path.exists(out):
        got = "no output file"
    else:
        with open(out, "rb") as f:
            head = f.read(4)
            size = os.fstat(f.fileno()).st_size
        if head == b"\x7fELF":
            return
        got = "an empty file" if size == 0 else f"{size} bytes that are not an ELF object (they start {head!r})"
    raise CompileError(f"{command} exited with status 0 but wrote {got} instead of a shared object",
                       op="compile", where="generated C")


ICE_RETRY = "-fno-tree-slp-vectorize"  # the flag a build that crashed the compiler is retried with


def _build(source: str, flags, cc) -> tuple[str, int]:
    """(path, open descriptor) of the verified shared object for `source`, compiled unless cached."""
    cc = compiler(cc)
    flags = list(compile_flags() if flags is None else flags)
    level = _level(flags)  # "native" differs from machine to machine: its macros are in the key
    key = hashlib.sha256("\0".join([source, cc, _version(cc), *sorted(features(level, cc) if level else ())]
                                    + flags).encode()).hexdigest()[:20]
    d = cache_dir()
    so = os.path.join(d, f"polyft_{key}.so")
    fd = open_verified(so)
    if fd is not None:
        return so, fd
    work = None
    try:  # in a private directory named by its builder: concurrent builds never touch each other's files
        clean_stale(d)
        work = tempfile.mkdtemp(prefix=f"build-{os.getpid()}@{_HOST}-", dir=d)
        src, out = os.path.join(work, "polyft.c"), os.path.join(work, "polyft.so")
        with open(os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(source)
        r = tool.run([cc, *flags, src, "-o", out, "-lm"])
        if r.returncode != 0 and "internal compiler error" in (r.stderr or ""):
            # a compiler bug, not the source's: GCC 12's SLP vectoriser crashes on some AVX-512
            # loops ("in vectorizable_live_operation"); built again without it, with a warning
            warnings.warn(f"{cc} crashed compiling the generated C (an internal compiler error); "
                          f"compiling it again with {ICE_RETRY}", RuntimeWarning, stacklevel=3)
            flags = [*flags, ICE_RETRY]
            r = tool.run([cc, *flags, src, "-o", out, "-lm"])
        _check_output(cc, flags, r, out, source, src)
        with open(out, "rb+") as f:
            body = f.read()
            f.write(RECORD.pack(MAGIC, len(body), hashlib.sha256(body).digest()))
        os.chmod(out, 0o500)  # read and run by this user only, whatever the umask
        os.replace(out, so)  # atomic: a concurrent build of the same source writes an equivalent file
    except OSError as e:  # a full disk (ENOSPC), a quota, an I/O error
        raise CompileError(f"could not write the compiled object {so} ({e.strerror or e}){_os_hint(e)}",
                           op="compile", where=so) from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    fd = open_verified(so)
    if fd is None:  # replaced or damaged between the rename and now: nothing to trust
        raise CompileError(f"the compiled object {so} changed as it was published (another process "
                           "writing into the cache?)", op="compile", where=so)
    return so, fd


def _os_hint(e: OSError) -> str:
    """What to do about an OSError met while compiling into the cache."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ": free some space or set POLYFT_CACHE elsewhere"
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return (": every file descriptor is in use; close files this program keeps open, or raise the "
                "limit (ulimit -n, resource.setrlimit(resource.RLIMIT_NOFILE, ...))")
    return ""


def build(source: str, flags=None, cc=None) -> str:
    """Path of the verified shared object for `source`, compiling it unless cached intact."""
    so, fd = _build(source, flags, cc)
    os.close(fd)
    return so


def _noexec(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(path)).f_flag & os.ST_NOEXEC)
    except OSError:
        return False


def load(source: str, flags=None, cc=None) -> tuple[str, ctypes.CDLL]:
    """The path of `source`'s shared object and the object loaded: the loader is handed the path
    while it still names the file that passed the checks (`open_verified`). An intact file that the
    loader rejects anyway (say, copied from another machine) is rebuilt once; if the rebuilt
    one is rejected too, CompileError, and it does not stay in the cache."""
    for attempt in (1, 2):
        path, fd = _build(source, flags, cc)
        try:
            if not private_files.still_names(path, fd):
                raise OSError(f"{path} was replaced after it was checked")
            with brief_spin():  # libgomp reads it when the first object loads it
                return path, ctypes.CDLL(path)
        except OSError as e:
            if "Too many open files" in str(e):
                raise CompileError(f"cannot load {path}: {e}{_os_hint(OSError(errno.EMFILE, ''))}", op="compile",
                                   where=path) from None
            _discard(path)
            if _noexec(path):
                raise CompileError(f"the compile cache {os.path.dirname(path)} is on a filesystem mounted noexec, "
                                   "where no compiled code can be loaded: set POLYFT_CACHE to a directory on one "
                                   f"that allows running programs (the loader: {e})", op="compile",
                                   where=path) from None
            if attempt == 2:
                raise CompileError(f"the loader rejects the freshly compiled {path}: {e}",
                                   op="compile", where=path) from None
        finally:
            os.close(fd)


class CtypesRuntime(Runtime):
    """The C target's module compiled into a shared object, its `polyft_run(void** bufs,
    const long* params)` called through ctypes on the arrays where they are, each call on the
    OpenMP thread count `threads` (emit/threads.py) measures as fastest for its lengths.
    `threads`: another module's ThreadChoice to share (one pin and one `last` for the programs of
    a schedule choice, each measured apart: its key holds the shared object's path)."""

    def __init__(self, module, flags=None, threads=None):
        super().__init__(module)
        self.flags = list(compile_flags(module.march) if flags is None else flags)
        self.path, self._lib = load(module.source, self.flags)
        self._fn = self._lib.polyft_run
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_long)]
        if threads is not None:
            self.threads = threads
            return
        try:  # the OpenMP runtime the object links (libgomp, libomp): found through it
            set_threads = self._lib.omp_set_num_threads
            set_threads.argtypes = [ctypes.c_int]
            self.threads = ThreadChoice(set_threads)
        except AttributeError:  # built without OpenMP
            self.threads = ThreadChoice(lambda n: None, most=1)

    def bind(self, arrays: list, values: dict) -> tuple:
        for a in arrays:
            assert a.flags.c_contiguous  # the caller allocates every buffer contiguously
        pointers, call = self.caller(values)
        bound = pointers(*[a.ctypes.data for a in arrays])
        return (lambda arrays=arrays: call(bound)), (lambda: None)  # holds the arrays `bound` points into

    def caller(self, values: dict) -> tuple:
        """(the ctypes array type of the buffers' pointers, a function running the program on one of
        them) at the lengths `values`: what depends on the lengths alone is made once, here (the
        call path of polyft.calls keeps both)."""
        lengths = [int(values[p]) for p in self.module.params]
        key = (self.path, *lengths)
        params = (ctypes.c_long * max(1, len(lengths)))(*lengths)
        fn, threads = self._fn, self.threads

        def call(pointers):
            if threads.run(key, lambda: fn(pointers, params)):
                raise OutOfMemoryError("the generated C could not allocate its threads' scratch for local buffers",
                                       op="run", where="generated C")
        return ctypes.c_void_p * len(self.module.layout.buffers), call
