"""How many OpenMP threads a compiled C call runs on: measured per program, not guessed.

Splitting a call over every core pays when its parallel loops have work enough for all of them
and every core is free. When the work per step is small, or another process holds a core, one
thread is faster: a thread preempted inside a wavefront step makes every other thread wait at
the step's barrier for a scheduler time slice (milliseconds). At the quick shapes on a 2-core
machine with one core busy, every core was up to 4.3x slower than one thread (b2b GEMM).

So each compiled program measures it (`ThreadChoice`, a emit.measured.MeasuredChoice between
one thread and every core, per set of lengths): the first call at a set of lengths warms up on
every core, then each count is tried, then the faster runs and the other is probed ever more
rarely while it loses. Results do not depend on the choice: threads split loops whose iterations
write disjoint elements, each computed the same way.

$POLYFT_THREADS fixes the count (nothing is measured); without it $OMP_NUM_THREADS does (its first
entry, as OpenMP reads it), so `OMP_NUM_THREADS=1` means one thread; both must be positive integers
(`SettingError` otherwise, when the program is compiled).

Two things OpenMP does not survive are checked here, in Python, before a call starts its threads
(libgomp's own answer to either is to hang or to exit the process with status 1):
* a fork: the child of a process whose libgomp has started its thread pool inherits the pool's
  state but not its threads, and its first parallel region waits for them forever. Calls in such a
  child (a `multiprocessing.Pool` worker on Linux) run on one thread, which needs no pool.
* threads that cannot be created (an address-space limit, a process near its thread limit): the
  first time a Python thread asks for n threads, n - 1 Python threads are started at once, as
  libgomp would; if that fails the call runs on one thread, with a warning. (libgomp keeps a pool
  per calling thread, so each Python thread is checked for itself.)

The OpenMP runtime's own waiting matters as much: libgomp's idle workers spin 300 000 times
(milliseconds) before they sleep, so on a loaded machine a worker left spinning after a region
takes a core from the thread doing the work. `brief_spin()` is in force while the C runtime loads
the first compiled object (libgomp reads its settings then): SPIN_COUNT spins, tens of
microseconds, keep a wavefront step's barrier quick and then yield. A GOMP_SPINCOUNT or
OMP_WAIT_POLICY of the user's is left alone, and so is a libgomp some other library loaded first.
"""
from __future__ import annotations

import contextlib
import numbers
import os
import re
import threading
import time
import warnings

from polyft.errors import SettingError

from .measured import MeasuredChoice

SPIN_COUNT = 2000


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def brief_spin():
    """GOMP_SPINCOUNT = SPIN_COUNT in the environment while the block runs, unless the user set
    how OpenMP waits (module docstring)."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        yield
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)


_pool = {"started": False, "forked": False}  # a pool of more than one thread in this process; inherited
_checked = threading.local()  # .most / .failed: the most threads this Python thread started / the fewest it could not


def _after_fork_in_child():
    _pool["forked"] = _pool["started"]


os.register_at_fork(after_in_child=_after_fork_in_child)


def setting() -> int | None:
    """The thread count the environment pins: $POLYFT_THREADS, else $OMP_NUM_THREADS; None if neither."""
    for name in ("POLYFT_THREADS", "OMP_NUM_THREADS"):
        text = os.environ.get(name, "").strip()
        if not text:
            continue
        first = text.split(",")[0].strip() if name == "OMP_NUM_THREADS" else text  # OpenMP's list of levels
        if not re.fullmatch(r"[0-9]+", first) or int(first) < 1:
            raise SettingError(f"{name}={text!r} is not a positive integer thread count; set it to, e.g., "
                               f"{cores()}, or unset it to let each program measure its count", op="threads",
                               where=name)
        return int(first)
    return None


def _startable(n: int) -> bool:
    """Whether n - 1 threads can run at once beside this one (module docstring)."""
    if n <= getattr(_checked, "most", 1):
        return True
    if n >= getattr(_checked, "failed", n + 1):  # warned once already
        return False
    done = threading.Event()
    started = []
    try:
        for _ in range(n - 1):
            started.append(threading.Thread(target=done.wait, daemon=True))
            started[-1].start()
    except RuntimeError as e:  # "can't start new thread"
        _checked.failed = n
        warnings.warn(f"polyft: cannot start {n} threads ({e}); this call runs on one thread", RuntimeWarning,
                      stacklevel=4)
        return False
    finally:
        done.set()
        for t in started:
            if t.ident is not None:
                t.join()
    _checked.most = n
    return True


def usable(n: int) -> int:
    """`n`, or 1 where n threads would hang or kill the process (module docstring)."""
    if n == 1 or _pool["forked"] or not _startable(n):
        return 1
    _pool["started"] = True
    return n


class ThreadChoice:
    """The thread count of each call of one compiled program (module docstring). `set_threads(n)`
    makes the calling thread's next OpenMP regions run on n threads; `clock()` reads a clock, in any
    unit (time.perf_counter; the tests pass a fake one)."""

    def __init__(self, set_threads, most: int | None = None, clock=time.perf_counter):
        self.set_threads = set_threads
        self.fixed = setting()
        most = most or cores()
        self.options = [1, most] if most > 1 else [1]
        self._choice = MeasuredChoice(self.options, first=self.options[-1], clock=clock)
        self.last = None  # the count of the latest call

    @property
    def clock(self):
        return self._choice.clock

    @property
    def fixed(self) -> int | None:
        """The pinned count (None: measured)."""
        return self._fixed

    @fixed.setter
    def fixed(self, n):
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise SettingError(f"a thread count must be a positive int or None (measured), got {n!r}",
                               op="threads")
        self._fixed = None if n is None else int(n)

    def run(self, key, call):
        """`call()` on the count chosen for the lengths `key`; its time is recorded."""
        want = self.fixed or self._choice.pick(key)
        n = usable(want)
        self.set_threads(n)
        self.last = n
        t0 = self.clock()
        out = call()
        if self.fixed is None and n == want:
            self._choice.record(key, n, self.clock() - t0)
        return out

    def best(self, key) -> int | None:
        """The count with the lowest median time at `key`, None before both are measured."""
        return self._choice.best(key)
