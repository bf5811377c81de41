"""Resource limits and signals (emit.tool, emit.runtime_c, emit.c_statements, polyft.program):

* large temporaries live in the scratch, not on the stack: a program with 1.5 MB of them runs
  in a thread of 1 MB and on OpenMP threads of 1 MB (it crashed with SIGSEGV);
* a compiler never outlives polyft: SIGTERM to the compiling process kills its compiler (and
  the compiler's children), as does the compiling process's death;
* no free file descriptor, SIGCHLD ignored, a noexec cache, an input copy that does not fit:
  each a PolyftError saying what to do;
* an input in the other byte order is taken (copied to the native one), as a captured one is.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import polyft as ft
from polyft.emit import runtime_c
from polyft.errors import CompileError
from polyft.testing import rel_error

from test_cache_faults import ROOT, XS, W, f, gone

pytestmark = pytest.mark.usefixtures("compile_cache")


def python(code: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


BIG_TEMPORARIES = """
    import threading
    import numpy as np
    import polyft as ft
    from polyft.testing import rel_error

    def layers(x, w):
        for _ in range(3):
            x = ft.tanh(x @ w) + x
        return x

    def f(xs, w):  # 1.5 MB of temporaries an element (256 KB each): all on the stack, were they allowed
        return xs.map(lambda x: layers(x, w))

    rng = np.random.default_rng(0)
    xs = ft.FractalTensor.from_numpy(rng.standard_normal((4, 128, 512)).astype(np.float32), 1)
    w = (rng.standard_normal((512, 512)) / 20).astype(np.float32)
    prog = ft.compile(f, xs, w, target="c")
    out = {}
    threading.stack_size(1 << 20)
    t = threading.Thread(target=lambda: out.setdefault("y", prog(xs, w)))
    t.start()
    t.join()
    print(rel_error(out["y"], f(xs, w)))
"""


def test_large_temporaries_run_in_threads_of_one_megabyte(tmp_path):
    r = python(BIG_TEMPORARIES, {"OMP_STACKSIZE": "1M", "OMP_NUM_THREADS": "2", "POLYFT_CACHE": str(tmp_path)})
    assert r.returncode == 0, f"exited with {r.returncode}:\n{r.stderr[-3000:]}"
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-5


def compiler_with_a_child(tmp_path) -> tuple:
    """A compiler (for -o) that starts a child sleeping 300 s and waits for it, and the file the
    child's pid goes to; `cc --version` and the like run the real compiler."""
    pidfile, path = tmp_path / "child.pid", tmp_path / "slow-cc"
    path.write_text('#!/bin/sh\ncase " $* " in *" -o "*) ;; *) exec cc "$@";; esac\n'
                    f'sleep 300 &\necho $! > {pidfile}\nwait\n')
    path.chmod(0o755)
    return str(path), pidfile


COMPILE = """
    import polyft as ft
    from polyft.emit import runtime_c
    runtime_c.build("int polyft_unused_orphan;\\n", ["-c", "-fPIC"])
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_compiler_does_not_outlive_the_compiling_process(tmp_path, how):
    """SIGTERM (its default action): the compiler's process group is killed first. SIGKILL: the
    kernel kills the compiler (PR_SET_PDEATHSIG); its own child is left to the compiler's fate,
    so only the compiler's death is checked there."""
    cc, pidfile = compiler_with_a_child(tmp_path)
    env = {**os.environ, "PYTHONPATH": ROOT, "CC": cc, "POLYFT_CACHE": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(COMPILE)], env=env)
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.1)
        child = int(pidfile.read_text())
        compiler = int(open(f"/proc/{child}/stat").read().split()[3])  # the sleep's parent: the compiler
        p.send_signal(getattr(signal, how))
        p.wait(timeout=60)
        watched = [compiler, child] if how == "SIGTERM" else [compiler]
        for _ in range(100):
            if all(gone(q) or _zombie(q) for q in watched):
                break
            time.sleep(0.1)
        assert all(gone(q) or _zombie(q) for q in watched), f"left running: {watched}"
    finally:
        p.kill()
        if pidfile.exists() and not gone(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    except OSError:
        return True


def test_sigchld_ignored_is_a_compile_error_saying_what_to_do():
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with pytest.raises(CompileError) as e:
            runtime_c.build("int polyft_unused_sigchld;\n", ["-c", "-fPIC"])
    finally:
        signal.signal(signal.SIGCHLD, old)
    msg = str(e.value)
    assert "SIGCHLD" in msg and "signal.SIG_DFL" in msg, msg


def test_no_free_file_descriptor_is_a_compile_error_saying_what_to_do(tmp_path):
    r = python("""
        import resource, numpy as np, polyft as ft
        from polyft.errors import CompileError
        xs = ft.FractalTensor.from_numpy(np.ones((2, 1, 4), np.float32), 1)
        ft.compile(lambda xs: xs.map(lambda x: x + 1.0), xs, target="c")  # every module polyft imports, imported
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        held = []
        try:
            while True:
                held.append(open("/dev/null"))
        except OSError:
            pass
        try:
            ft.compile(lambda xs: xs.map(lambda x: x * 3.0), xs, target="c")
            print("COMPILED")
        except CompileError as e:
            print("CompileError:", str(e).replace("\\n", " "))
    """, {"POLYFT_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("CompileError:") and "ulimit -n" in last and "file descriptor" in last, last


def test_a_noexec_cache_is_a_compile_error_saying_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFT_CACHE", str(tmp_path))

    class NoExec:
        f_flag = os.ST_NOEXEC

    def refuse(path, *a, **k):
        raise OSError(f"{path}: failed to map segment from shared object")
    monkeypatch.setattr(runtime_c.os, "statvfs", lambda p: NoExec())
    monkeypatch.setattr(runtime_c.ctypes, "CDLL", refuse)
    with pytest.raises(CompileError) as e:
        ft.compile(f, XS, W, target="c")
    msg = str(e.value)
    assert "noexec" in msg and "POLYFT_CACHE" in msg and str(tmp_path) in msg, msg


def test_an_input_copy_that_does_not_fit_is_an_out_of_memory_error(tmp_path):
    r = python("""
        import resource, numpy as np, polyft as ft
        from polyft.errors import OutOfMemoryError
        def f(xs):
            return xs.map(lambda x: x * 2.0)
        spec = ft.spec("[N]float32[1, 65536]")
        prog = ft.compile(f, spec, target="c")
        row = np.ones((1, 1, 65536), np.float32)
        xs = np.broadcast_to(row, (8192, 1, 65536))  # 2 GiB, a stride of 0
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, resource.RLIM_INFINITY))
        try:
            prog(xs)
            print("RAN")
        except OutOfMemoryError as e:
            print("OutOfMemoryError:", str(e).replace("\\n", " "))
    """, {"POLYFT_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("OutOfMemoryError:") and "input xs" in last and "a stride of 0" in last \
        and "np.ascontiguousarray" in last, last


def test_an_input_in_the_other_byte_order():
    other = ">f4" if sys.byteorder == "little" else "<f4"
    arr = np.random.default_rng(0).standard_normal((3, 1, 4)).astype(other)
    w = np.random.default_rng(1).standard_normal((4, 4)).astype(other)
    xs = ft.FractalTensor.from_numpy(arr, 1)
    prog = ft.compile(f, xs, w, target="c")
    assert rel_error(prog(xs, w), f(xs, w)) < 1e-5
