"""The C runtime's on-disk compile cache under faults (emit.runtime_c).

* damaged entries (truncated to half, 100 bytes of garbage, a missing or garbled checksum
  record) are rebuilt by the next process, which gets the right numbers instead of a SIGBUS
  or an OSError; each such process runs in a subprocess, since a bad object can crash it;
* an object the loader rejects is rebuilt once, then reported;
* failed builds are never cached: a compiler that exits 0 without writing a shared object,
  and one that fails without a word, raise CompileError saying so;
* a read-only or blocked cache directory falls back to a temporary one, with a warning;
* a full disk raises CompileError naming the object, and leaves no temporary files;
* a compiler that never returns is killed at $POLYFT_CC_TIMEOUT (CompileError naming it and the
  limit); the build directory of a process SIGKILLed mid-compile is removed by the next compile.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import polyft as ft
from polyft.emit import runtime_c
from polyft.errors import CompileError, SettingError
from polyft.testing import rel_error

from helpers import compiler_calls

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("compile_cache")  # conftest.py: a temporary POLYFT_CACHE

PROGRAM = textwrap.dedent("""
    import numpy as np
    import polyft as ft

    def f(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))

    rng = np.random.default_rng(0)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((3, 1, 4)).astype(np.float32), 1)
    w = rng.standard_normal((4, 4)).astype(np.float32)
""")
WORKER = PROGRAM + textwrap.dedent("""
    import json
    from polyft.emit import runtime_c
    from polyft.testing import rel_error
    prog = ft.compile(f, xs, w, target="c")
    print(json.dumps({"err": rel_error(prog(xs, w), f(xs, w)), "so": runtime_c.build(prog.source)}))
""")
ns: dict = {}
exec(PROGRAM, ns)  # the same program in this process
f, XS, W = ns["f"], ns["xs"], ns["w"]


def compile_in_subprocess(cache) -> dict:
    """Compile and run the program in a fresh process using `cache`: its result and object."""
    env = {**os.environ, "POLYFT_CACHE": str(cache), "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"worker exited with {r.returncode}:\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_numbers(prog):
    assert rel_error(prog(XS, W), f(XS, W)) < 1e-5


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(file name, bytes) of the program's object as a fresh process caches it."""
    cache = tmp_path_factory.mktemp("pristine")
    out = compile_in_subprocess(cache)
    assert out["err"] < 1e-5
    with open(out["so"], "rb") as fh:
        data = fh.read()
    assert runtime_c.damage(data) is None
    return os.path.basename(out["so"]), data


# -- damaged entries -------------------------------------------------------------------------
REC = runtime_c.RECORD.size


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


DAMAGE = {
    "truncated to half": lambda d: d[:len(d) // 2],
    "100 bytes of garbage": lambda d: np.random.default_rng(1).bytes(100),
    "no checksum record": lambda d: d[:-REC],  # a loadable object, as older polyft wrote them
    "garbled sha256": lambda d: flip(d, len(d) - 1),
    "garbled size": lambda d: flip(d, len(d) - 33),
    "a flipped byte in the object": lambda d: flip(d, len(d) // 3),
    "empty": lambda d: b"",
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_entry_is_rebuilt_by_the_next_process(pristine, tmp_path, how):
    name, data = pristine
    bad = DAMAGE[how](data)
    assert runtime_c.damage(bad) is not None
    (tmp_path / name).write_bytes(bad)
    out = compile_in_subprocess(tmp_path)
    assert out["so"] == str(tmp_path / name)  # the damaged entry was the one looked up
    assert out["err"] < 1e-5
    rebuilt = (tmp_path / name).read_bytes()
    assert runtime_c.damage(rebuilt) is None and rebuilt != bad
    assert os.listdir(tmp_path) == [name]  # no temporary files left behind


def test_damaged_entry_is_rebuilt_in_process(pristine, tmp_path, monkeypatch):
    """Within one process too: the damaged file is not loaded, the program compiled once more."""
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    name, data = pristine
    (tmp_path / name).write_bytes(data[:-REC])
    calls = compiler_calls(monkeypatch)
    check_numbers(ft.compile(f, XS, W, target="c"))
    assert len(calls) == 1
    assert runtime_c.damage((tmp_path / name).read_bytes()) is None
    check_numbers(ft.compile(f, XS, W, target="c"))
    assert len(calls) == 1  # the rebuilt entry is trusted


def test_rejected_by_the_loader_is_rebuilt_once(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    real, loads = runtime_c.ctypes.CDLL, []

    def flaky(path, *a, **k):
        loads.append(path)
        if len(loads) == 1:
            raise OSError(f"{path}: invalid ELF header")
        return real(path, *a, **k)
    monkeypatch.setattr(runtime_c.ctypes, "CDLL", flaky)
    calls = compiler_calls(monkeypatch)
    check_numbers(ft.compile(f, XS, W, target="c"))
    assert len(loads) == 2 and len(calls) == 2


def test_rejected_again_after_the_rebuild_is_an_error(tmp_path, monkeypatch):
    """An object file (-c) is an ELF file the loader refuses: CompileError, nothing cached."""
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    calls = compiler_calls(monkeypatch)
    with pytest.raises(CompileError) as e:
        runtime_c.load("int polyft_f(void) { return 1; }\n", ["-c", "-fPIC"])
    assert len(calls) == 2
    msg = str(e.value)
    assert str(tmp_path) in msg and re.search(r"ET_DYN|ELF", msg), msg  # the path and the loader's reason
    assert os.listdir(tmp_path) == []


# -- failed builds ---------------------------------------------------------------------------
def fake_compiler(tmp_path, name, body) -> str:
    """An executable that takes a compiler's arguments and runs `body` with $out the -o file."""
    path = tmp_path / name
    path.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n' + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("cc, produced", [
    ("true", "no output file"),
    ("empty", "an empty file"),
    ("text", "not an ELF object"),
])
def test_compiler_succeeding_without_an_object_is_not_cached(tmp_path, monkeypatch, cc, produced):
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    if cc != "true":
        cc = fake_compiler(tmp_path, cc, {"empty": ': > "$out"', "text": 'echo "int main;" > "$out"'}[cc])
    monkeypatch.setenv("CC", cc)
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    msg = str(e.value)
    assert cc in msg and "exited with status 0" in msg and produced in msg, msg
    assert os.listdir(cache) == []
    monkeypatch.delenv("CC")
    check_numbers(ft.compile(f, XS, W, target="c"))  # and a working compiler after it is not fooled


def test_compiler_failing_silently(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    assert e.value.detail.strip()
    assert "false" in str(e.value) and "exited with status 1 and printed nothing" in str(e.value)
    assert os.listdir(tmp_path) == []


# -- an unusable cache directory -------------------------------------------------------------
def compiles_into_fallback(cache: str) -> str:
    """Compile twice with the unusable `cache`: warnings name it and the fallback, which is
    reused; the numbers are right. The fallback directory."""
    with pytest.warns(UserWarning, match="compile cache") as w1:
        check_numbers(ft.compile(f, XS, W, target="c"))
    fallback = runtime_c._fallback_dir
    assert fallback is not None and os.path.isdir(fallback) and fallback != cache
    msg = str(w1[-1].message)
    assert cache in msg and fallback in msg, msg
    with pytest.warns(UserWarning, match="compile cache"):
        so = runtime_c.build(ft.compile(f, XS, W, target="c").source)
    assert os.path.dirname(so) == fallback and runtime_c._fallback_dir == fallback
    return fallback


def test_read_only_cache_directory(tmp_path, monkeypatch, fresh_fallback):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(stat.S_IRUSR | stat.S_IXUSR)  # 0o500
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    try:
        (cache / "probe").write_text("")
        writable = True  # root ignores the mode: make the directory look read-only instead
    except PermissionError:
        writable = False
    if writable:
        os.unlink(cache / "probe")
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if os.fspath(p) == str(cache)
                            else real(p, mode, **k))
    try:
        compiles_into_fallback(str(cache))
        assert os.listdir(cache) == []
    finally:
        cache.chmod(0o700)


def test_cache_path_is_a_file(tmp_path, monkeypatch, fresh_fallback):
    """The cache path names a regular file, so the directory cannot be created."""
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    monkeypatch.setenv("POLYFT_CACHE", str(cache / "polyft"))
    compiles_into_fallback(str(cache / "polyft"))
    assert cache.read_text() == "not a directory"


# -- a full disk -----------------------------------------------------------------------------
def enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_when_publishing(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    with monkeypatch.context() as m:
        m.setattr(runtime_c.os, "replace", enospc)
        with pytest.raises(CompileError) as e:
            ft.compile(f, XS, W, target="c")
    assert str(tmp_path) in str(e.value) and "No space left on device" in str(e.value)
    assert os.listdir(tmp_path) == []
    check_numbers(ft.compile(f, XS, W, target="c"))  # once there is space again


def test_full_disk_while_compiling(tmp_path, monkeypatch):
    """The compiler has written its output when the disk fills up: nothing stays behind."""
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))
    real = runtime_c.tool.run

    def compile_then_fill(args, *a, **k):
        r = real(args, *a, **k)
        if "-o" in args:
            assert os.path.getsize(args[args.index("-o") + 1]) > 0
            enospc()
        return r
    monkeypatch.setattr(runtime_c.tool, "run", compile_then_fill)
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    assert str(tmp_path) in str(e.value) and "No space left on device" in str(e.value)
    assert os.listdir(tmp_path) == []


# -- a compiler that never returns, a compile killed midway ------------------------------------
def hanging_compiler(tmp_path, only_when_compiling=False) -> tuple:
    """An executable that sleeps for 300 s (only when given -o, else it is `cc`), and the file its
    pid goes to: a compiler that hangs, as a wedged wrapper or filesystem would make it."""
    pidfile, path = tmp_path / "cc.pid", tmp_path / "hanging-cc"
    guard = 'case " $* " in *" -o "*) ;; *) exec cc "$@";; esac\n' if only_when_compiling else ""
    path.write_text(f'#!/bin/sh\n{guard}echo $$ > {pidfile}\nexec sleep 300\n')
    path.chmod(0o755)
    return str(path), pidfile


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("only_when_compiling", [False, True])  # hanging at `cc --version` too, or not
def test_a_compiler_that_never_returns_is_killed_at_the_limit(tmp_path, monkeypatch, only_when_compiling):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    cc, pidfile = hanging_compiler(tmp_path, only_when_compiling)
    monkeypatch.setenv("CC", cc)
    monkeypatch.setenv("POLYFT_CC_TIMEOUT", "1.5")
    t0 = time.monotonic()
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    assert time.monotonic() - t0 < 30
    msg = str(e.value)
    assert cc in msg and "within 1.5 s" in msg and "POLYFT_CC_TIMEOUT" in msg, msg
    assert gone(int(pidfile.read_text()))  # killed, not left running
    assert os.listdir(cache) == []
    monkeypatch.delenv("CC")
    monkeypatch.delenv("POLYFT_CC_TIMEOUT")  # a real compile on a loaded machine may take more than 1.5 s
    check_numbers(ft.compile(f, XS, W, target="c"))


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan"])
def test_a_bad_compiler_timeout_is_a_setting_error(monkeypatch, value):
    monkeypatch.setenv("POLYFT_CC_TIMEOUT", value)
    with pytest.raises(SettingError) as e:
        runtime_c.build("int polyft_unused_%s;\n" % abs(hash(value)))
    assert "POLYFT_CC_TIMEOUT" in str(e.value) and repr(value) in str(e.value)


def test_the_build_directory_of_a_killed_compile_is_removed_by_the_next(tmp_path, monkeypatch):
    """A process SIGKILLed while its compiler runs leaves its build directory; the next compile
    (any source) deletes it, and leaves alone the one of a process still running."""
    cache = tmp_path / "cache"
    cc, pidfile = hanging_compiler(tmp_path, only_when_compiling=True)
    env = {**os.environ, "POLYFT_CACHE": str(cache), "PYTHONPATH": ROOT, "CC": cc}
    victim = subprocess.Popen([sys.executable, "-c", WORKER], env=env)
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.1)
        left = [n for n in os.listdir(cache) if n.startswith("build-")]
        assert len(left) == 1 and f"build-{victim.pid}@" in left[0], left
        victim.kill()
        victim.wait()
    finally:
        victim.kill()
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), 9)  # the orphaned compiler
    alive = tempfile.mkdtemp(prefix=f"build-{os.getpid()}@{socket.gethostname()}-", dir=cache)
    assert {n for n in os.listdir(cache) if n.startswith("build-")} == {left[0], os.path.basename(alive)}
    monkeypatch.setenv("POLYFT_CACHE", str(cache))
    runtime_c.build("int polyft_unused_after_kill;\n", ["-c", "-fPIC"])
    assert [n for n in os.listdir(cache) if n.startswith("build-")] == [os.path.basename(alive)]
    os.rmdir(alive)


def test_build_directories_older_than_a_day_are_removed_whoever_made_them(tmp_path):
    keep = tmp_path / "build-1@another-host-abcd1234"
    old = [tmp_path / "build-1@another-host-old12345", tmp_path / "build-x3k9m2q1"]  # the older scheme
    for d in [keep, *old]:
        d.mkdir()
        (d / "polyft.c").write_text("")
    day_ago = time.time() - runtime_c.STALE - 60
    for d in old:
        os.utime(d, (day_ago, day_ago))
    assert sorted(runtime_c.clean_stale(str(tmp_path))) == sorted(d.name for d in old)
    assert os.listdir(tmp_path) == [keep.name]


def test_a_compiler_crash_is_built_again_without_the_slp_vectoriser(tmp_path, monkeypatch):
    """GCC 12 crashes ("internal compiler error") vectorising some AVX-512 loops: the build is
    retried once with runtime_c.ICE_RETRY, with a warning, and gives eager's numbers; a compiler
    that crashes with it too is a CompileError."""
    real = shutil.which(os.environ.get("CC", "cc"))
    crash = 'echo "polyft.c:1:1: internal compiler error: in vectorizable_live_operation" >&2; exit 1'
    for name, when in (("crashes_once", f'*" {runtime_c.ICE_RETRY} "*) exec {real} "$@";;'), ("crashes", "")):
        cc = tmp_path / name
        cc.write_text(f'#!/bin/sh\ncase " $* " in\n  {when}\n  *" -shared "*) {crash};;\nesac\nexec {real} "$@"\n')
        cc.chmod(0o755)
        monkeypatch.setenv("CC", str(cc))
        if name == "crashes_once":
            with pytest.warns(RuntimeWarning, match="internal compiler error"):
                check_numbers(ft.compile(f, XS, W, target="c"))
        else:
            with pytest.raises(CompileError, match=f"(?s){re.escape(runtime_c.ICE_RETRY)}.*internal compiler error"), \
                    pytest.warns(RuntimeWarning):
                ft.compile(f, XS, W, target="c")
