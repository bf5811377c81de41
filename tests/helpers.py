"""Small helpers shared by the test modules: seeded random inputs, specs, and the comparison
of a result pytree with the eager reference.

The test modules import it as `helpers` (pytest puts tests/ on sys.path: the rootdir has no
tests/__init__.py, so the default "prepend" import mode applies)."""
from __future__ import annotations

import re
import threading

import numpy as np

import polyft as ft
from polyft.testing import rel_error

TOL = 1e-5  # relative error in float32


def rand(shape, seed):
    """Fresh seeded standard-normal float32 data (never zeros)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def flist(lengths, element_shape, seed):
    """A regular FractalTensor of random data: depth len(lengths)."""
    lengths = tuple(lengths)
    return ft.FractalTensor.from_numpy(rand(lengths + tuple(element_shape), seed), len(lengths))


def spec(lengths, element_shape, dtype="float32"):
    """`ft.spec` of a list with the given (symbolic or concrete) lengths."""
    return ft.spec(f"[{', '.join(map(str, lengths))}]{dtype}[{', '.join(map(str, element_shape))}]")


def assert_same(got, expected):
    """Same pytree, same list types and lengths, values within TOL relative error."""
    if isinstance(expected, ft.Zip):  # a returned zip counts as a tuple of lists
        expected = tuple(expected.components)
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
        return
    if isinstance(expected, ft.FractalTensor):
        assert isinstance(got, ft.FractalTensor), got
        assert got.type_string == expected.type_string, (got.type_string, expected.type_string)
    else:
        expected = np.asarray(expected)
        assert isinstance(got, np.ndarray) and got.shape == expected.shape, (got, expected.shape)
    err = rel_error(got, expected)
    assert err < TOL, f"relative error {err:.2e}"


def compiler_calls(monkeypatch) -> list:
    """The compiler runs (not `cc --version`) made through emit.runtime_c from now on: a list
    that grows with the argument list of each."""
    from polyft.emit import runtime_c
    calls, real = [], runtime_c.tool.run

    def spy(args, *a, **k):
        if "-o" in args:
            calls.append(args)
        return real(args, *a, **k)
    monkeypatch.setattr(runtime_c.tool, "run", spy)
    return calls


def shell_commands(code: str) -> list:
    """The commands of a README bash block: (command, its line in the block, the exit status
    its comment names (`# ... exit status 2`, else 0), the output lines shown under it as
    `#   ...`). Blank and comment lines are not commands."""
    lines, out = code.splitlines(), []
    for k, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        body, _, comment = line.partition("  #")
        shown = []
        for after in lines[k + 1:]:
            if not after.startswith("#   "):
                break
            shown.append(after[4:].strip())
        status = re.search(r"exit status (\d+)", comment)
        out.append((body.strip(), k, int(status.group(1)) if status else 0, shown))
    return out


def in_threads(work, n: int = 4) -> None:
    """work() in n threads at once (each waits at a barrier first); returns when all are done."""
    ready = threading.Barrier(n)

    def start():
        ready.wait()
        work()
    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)


def central_differences(fn, arrays, k, eps=1e-6):
    """d fn(*arrays) / d arrays[k] by central differences (fn: arrays -> a scalar; float64)."""
    grad = np.zeros_like(arrays[k])
    for idx in np.ndindex(arrays[k].shape):
        vals = []
        for sign in (1, -1):
            moved = [a.copy() for a in arrays]
            moved[k][idx] += sign * eps
            vals.append(float(fn(*moved)))
        grad[idx] = (vals[0] - vals[1]) / (2 * eps)
    return grad
