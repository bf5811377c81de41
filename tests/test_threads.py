"""The C runtime's thread count per call (emit/threads.py): measured, pinned by $POLYFT_THREADS,
and invisible in the results.

* `ThreadChoice` with calls whose time depends on the count they run on, timed by a fake clock
  (exact on a loaded machine; noise from a seeded generator): it warms up, tries each count,
  keeps the faster, probes the slower ever more rarely while it loses, and switches when the
  load changes, noise or not; separately per set of lengths; $POLYFT_THREADS pins it. One test
  times real sleeps (30 ms apart, three tries) to check the real clock is the default.
* `brief_spin`: GOMP_SPINCOUNT while libgomp loads, a user's setting left alone.
* a compiled program gives bit-identical results on one thread and on every core, and its
  calls go through the choice.
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import polyft as ft
from polyft.errors import SettingError
from polyft.testing import rel_error
from polyft.emit import measured as M
from polyft.emit import threads as T
from polyft.workloads import WORKLOADS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
    """A fake clock, in milliseconds, and a call that moves it on by `cost[count]`, the count being
    the one last set, times `noise()` where given: what the choice measures is exact, however
    busy the machine (the real clock: test_the_real_clock_is_measured)."""

    def __init__(self, cost, noise=None):
        self.cost, self.noise, self.count, self.counts, self.now = dict(cost), noise, None, [], 0

    def set(self, n):
        self.count = n

    def time(self):
        return self.now

    def call(self):
        self.counts.append(self.count)
        self.now += self.cost[self.count] * (self.noise() if self.noise else 1)
        return 0


@pytest.fixture(autouse=True)
def measured(monkeypatch):
    """No pinned count unless a test sets one."""
    monkeypatch.delenv("POLYFT_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def started(cost: dict, most: int, noise=None):
    clock = Clock(cost, noise)
    return clock, T.ThreadChoice(clock.set, most=most, clock=clock.time)


def runs(choice, clock, calls: int, key=()) -> list:
    """The counts of `calls` more calls."""
    for _ in range(calls):
        choice.run(key, clock.call)
    return clock.counts[-calls:]


def probes(counts, slow) -> list:
    """Where the calls on `slow` are, after the warm-up and the first tries."""
    return [k for k, n in enumerate(counts) if n == slow and k >= 3]


def test_it_keeps_the_faster_count_and_probes_the_other_ever_more_rarely():
    clock, choice = started({1: 1, 4: 600}, most=4)
    runs(choice, clock, 60)
    assert clock.counts[:3] == [4, 1, 4]  # warm-up on every core, then each count once
    assert probes(clock.counts, 4) == [5, 10, 19, 36]  # after 2 calls, then 4, 8, 16 between
    assert choice.best(()) == 1
    runs(choice, clock, 3000)
    gaps = np.diff(probes(clock.counts, 4))
    assert gaps.max() == M.MAX_INTERVAL + 1 and list(gaps[-3:]) == [M.MAX_INTERVAL + 1] * 3  # and no further apart


def test_a_probe_costs_at_most_a_share_of_the_time():
    """Where the other count is not far slower, the probes come once the calls since the last
    took PROBE_SHARE times the other's time: 20 x 6 ms of 1 ms calls, not 256 calls."""
    clock, choice = started({1: 1, 4: 6}, most=4)
    runs(choice, clock, 3000)
    gaps = np.diff(probes(clock.counts, 4))
    assert list(gaps[:5]) == [5, 9, 17, 33, 65]  # the intervals double ...
    assert set(gaps[5:]) == {M.PROBE_SHARE * 6 + 1}  # ... until the time rule comes first


def test_the_end_of_a_long_load_is_found_within_a_share_of_the_time():
    """A busy spell long enough for the probes to grow 256 calls apart, then the spell ends:
    every core is probed again once the calls since the last probe took PROBE_SHARE times its
    time (20 x 24 ms, 60 calls of 8 ms), not up to 256 calls (2 s) later."""
    clock, choice = started({1: 9, 2: 24}, most=2)
    runs(choice, clock, 2000)
    while clock.counts[-1] != 2:  # up to a probe of every core, which loses
        runs(choice, clock, 1)
    assert choice.best(()) == 1
    clock.cost = {1: 8, 2: 4}  # the other process is done
    after = runs(choice, clock, 100)
    assert 2 in after and after.index(2) <= 20 * 24 // 8 == M.PROBE_SHARE * 24 // 8 and choice.best(()) == 2
    assert after[-30:].count(2) >= 25  # every core from then on, but for probes of one thread


def test_a_change_of_load_is_found_again():
    clock, choice = started({1: 8, 2: 4}, most=2)
    assert runs(choice, clock, 10) == [2, 1, 2, 2, 2, 1, 2, 2, 2, 2]
    assert choice.best(()) == 2
    clock.cost = {1: 9, 2: 24}  # another process takes a core
    # a probe of 1 loses to 2's times from before the change (the next probe: 8 calls on); 2's
    # own calls turn its median of 3 after 2 calls, and 1's probe time stands for 1
    assert runs(choice, clock, 12) == [1, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1]
    assert choice.best(()) == 1


def test_the_end_of_a_load_is_found_at_the_next_probe():
    clock, choice = started({1: 9, 2: 24}, most=2)
    assert runs(choice, clock, 10) == [2, 1, 2, 1, 1, 2, 1, 1, 1, 1]
    clock.cost = {1: 8, 2: 4}  # the other process is done
    # the probe of 2 wins at once; 1 is probed 2 calls later and loses, then 4 calls later
    assert runs(choice, clock, 10) == [2, 2, 2, 1, 2, 2, 2, 2, 1, 2]
    assert choice.best(()) == 2


@pytest.mark.parametrize("seed", range(50))
def test_noisy_times_still_find_a_change_of_load(seed):
    """The times of a loaded machine: every call 3% either way, one in ten 1.5-3x slower (it
    was preempted). After the load changes so that 1 thread's new time ties with 2 threads'
    old one (the worst case: the choice goes by the noise until 2's own calls show it slower),
    the choice ends on 1 and runs at most 6 of the 40 calls on 2 (3-6 in 5000 seeds' runs)."""
    rng = random.Random(seed)

    def noise():
        return rng.uniform(0.97, 1.03) * (rng.uniform(1.5, 3) if rng.random() < 0.1 else 1)

    clock, choice = started({1: 16, 2: 4}, most=2, noise=noise)
    runs(choice, clock, 10)
    assert choice.best(()) == 2
    clock.cost = {1: 4, 2: 24}
    after = runs(choice, clock, 40)
    assert choice.best(()) == 1 and after.count(2) <= 6, after


def test_each_set_of_lengths_is_measured_apart():
    clock, choice = started({1: 1, 2: 4}, most=2)
    runs(choice, clock, 6, ("small",))
    clock.cost = {1: 4, 2: 1}
    runs(choice, clock, 6, ("large",))
    assert (choice.best(("small",)), choice.best(("large",))) == (1, 2)


def test_the_real_clock_is_measured():
    """Without a clock of its own the choice times calls with time.perf_counter: of a call that
    sleeps 30 ms on 2 threads and not at all on 1 it keeps 1, 2 run only as the warm-up, the
    first try and the probes after 2 and 4 calls. A machine busy enough to stall the quick call
    for tens of milliseconds can fail a try; three tries are made."""
    for attempt in range(3):
        counts = []
        choice = T.ThreadChoice(counts.append, most=2)
        assert choice.clock is time.perf_counter
        for _ in range(12):
            choice.run((), lambda: time.sleep({1: 0.0, 2: 0.03}[counts[-1]]))
        if choice.best(()) == 1 and counts.count(2) == 4:
            return
    pytest.fail(f"kept {choice.best(())}, ran {counts}")


def test_polyft_threads_pins_the_count(monkeypatch):
    monkeypatch.setenv("POLYFT_THREADS", "3")
    clock, choice = started({3: 0}, most=8)
    runs(choice, clock, 5)
    assert clock.counts == [3] * 5 and choice.best(()) is None


def test_omp_num_threads_pins_the_count_below_polyft_threads(monkeypatch):
    """$OMP_NUM_THREADS (its first level) pins the count as it would any OpenMP program's;
    $POLYFT_THREADS, polyft's own, takes precedence over it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1,4")
    clock, choice = started({1: 0}, most=8)
    assert runs(choice, clock, 4) == [1] * 4 and choice.best(()) is None
    monkeypatch.setenv("POLYFT_THREADS", "2")
    clock, choice = started({2: 0}, most=8)
    assert runs(choice, clock, 4) == [2] * 4


def test_omp_num_threads_1_runs_a_compiled_program_on_one_thread(monkeypatch):
    """It was ignored: calls still ran on every core."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    prog = ft.compile(rows, ROWS_XS, ROWS_W)
    for _ in range(4):
        assert rel_error(prog(ROWS_XS, ROWS_W), rows(ROWS_XS, ROWS_W)) < 1e-5
        assert prog.threads.last == 1


@pytest.mark.parametrize("name", ["POLYFT_THREADS", "OMP_NUM_THREADS"])
@pytest.mark.parametrize("value", ["abc", "2.5", "-1", "0", "\u00b2"])
def test_a_thread_count_that_is_not_a_positive_int_is_a_setting_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as e:
        T.ThreadChoice(lambda n: None, most=2)
    assert f"{name}={value!r}" in str(e.value) and "positive integer" in str(e.value)
    monkeypatch.delenv(name)
    choice = T.ThreadChoice(lambda n: None, most=2)
    for bad in (0, -1, 2.5, "2", True):
        with pytest.raises(SettingError):
            choice.fixed = bad
    choice.fixed = np.int64(2)
    assert choice.fixed == 2 and type(choice.fixed) is int


def test_one_core_means_one_thread():
    clock, choice = started({1: 0}, most=1)
    runs(choice, clock, 4)
    assert clock.counts == [1] * 4


def test_brief_spin_leaves_a_users_setting_alone(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with T.brief_spin():
        assert os.environ["GOMP_SPINCOUNT"] == str(T.SPIN_COUNT)
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    with T.brief_spin():
        assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name", ["stacked_lstm", "flash_attention"])
def test_results_do_not_depend_on_the_thread_count(name):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5)
    prog = ft.compile(mod.program, *inputs)
    outs = {}
    for n in (1, T.cores()):
        prog.threads.fixed = n
        outs[n] = prog(*inputs)
        assert prog.threads.last == n
    assert all(rel_error(o, outs[1]) == 0.0 for o in outs.values())  # bit for bit
    assert rel_error(outs[1], mod.program(*inputs)) < 1e-5
    prog.threads.fixed = None
    for _ in range(4):
        prog(*inputs)
    assert prog.threads.last in prog.threads.options


def assert_same_bits_on_1_to_3_threads(prog, fn, *inputs):
    """`prog` gives the same bits on 1, 2 and 3 threads, and agrees with `fn` run eagerly."""
    outs = []
    for n in (1, 2, 3):
        prog.threads.fixed = n
        outs.append(prog(*inputs))
    assert all(rel_error(o, outs[0]) == 0.0 for o in outs)
    assert rel_error(outs[0], fn(*inputs)) < 1e-5


def test_tiles_of_a_parallel_loop_are_split_among_the_threads():
    """A tiled parallel loop advances by ft_split(iterations, 16): at most 16 instances a
    tile, narrower when the threads would otherwise not all get one (16 map instances were
    one tile, one thread's work); any count of threads gives the same bits."""
    def rows(xs, w):
        return xs.map(lambda x: ft.tanh(x @ w))
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32) / 6
    prog = ft.compile(rows, ft.spec("[N]float32[2, 32]"), ft.spec("float32[32, 32]"))
    assert "c1 += c1_w" in prog.source and "ft_split(" in prog.source
    for N in (1, 5, 16, 33):
        xs = ft.FractalTensor.from_numpy(np.random.default_rng(N).standard_normal((N, 2, 32)).astype(np.float32), 1)
        assert_same_bits_on_1_to_3_threads(prog, rows, xs, w)


def test_a_parallel_loop_around_a_tiled_one_is_flattened():
    """A parallel loop whose body is a tiled parallel loop runs as one loop over (outer
    iteration, tile), the tiles ft_split(inner, 16, outer) wide: with fewer outer iterations
    than threads (a wavefront step over one layer) the inner tiles are still shared out.
    Every shape, including empty and single iterations, gives the same bits on 1-3 threads."""
    def rows(xss, w):
        return xss.map(lambda xs: xs.map(lambda x: ft.tanh(x @ w)))
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    prog = ft.compile(rows, ft.spec("[M, N]float32[8, 64]"), ft.spec("float32[64, 64]"))
    assert re.search(r"const long c2_w = ft_split\(.*, 16, c1_m\);", prog.source), prog.source
    assert re.search(r"for \(long c1_c2 = 0; c1_c2 < c1_m \* c2_t; c1_c2 \+= 1\)", prog.source)
    for M, N in ((1, 16), (1, 1), (2, 33), (3, 5), (5, 2)):
        xss = ft.FractalTensor.from_numpy(
            np.random.default_rng(M * N).standard_normal((M, N, 8, 64)).astype(np.float32), 2)
        assert_same_bits_on_1_to_3_threads(prog, rows, xss, w)


def test_only_a_tiled_loop_with_bounds_of_its_own_is_flattened():
    """An inner loop whose bounds use the outer iterator (a triangle) keeps its own loop."""
    from polyft.emit.isl_ast import _tiled_inside, build_ast, loop_key
    import islpy as isl
    for text, flat in (("[N] -> { S[i, j] -> [i, j] : 0 <= i < N and 0 <= j < 16 }", True),
                       ("[N] -> { S[i, j] -> [i, j] : 0 <= i < N and 0 <= j <= i }", False)):
        ast = build_ast(isl.UnionMap(text), isl.Set("[N] -> { : N > 2 }"))
        inner = ast.for_get_body()
        assert _tiled_inside(ast, inner, [True, True], {loop_key(inner): 16}) == flat
        assert not _tiled_inside(ast, inner, [True, True], {})  # not tiled
        assert not _tiled_inside(ast, inner, [True, False], {loop_key(inner): 16})  # not parallel


# -- what OpenMP does not survive: a fork, threads that cannot start ---------------------------
def rows(xs, w):
    return xs.map(lambda x: ft.tanh(x @ w))


ROWS_XS = ft.FractalTensor.from_numpy(np.random.default_rng(3).standard_normal((40, 4, 32)).astype(np.float32), 1)
ROWS_W = np.random.default_rng(4).standard_normal((32, 32)).astype(np.float32) / 6
FORKED = {}  # the program a forked worker finds in its copy of this module


def forked_call(seed):
    """In a forked worker: the parent's program on fresh inputs; its error and thread count."""
    xs = ft.FractalTensor.from_numpy(np.random.default_rng(seed).standard_normal((40, 4, 32)).astype(np.float32), 1)
    prog = FORKED["prog"]
    return rel_error(prog(xs, ROWS_W), rows(xs, ROWS_W)), prog.threads.last


def test_a_program_run_on_two_threads_works_in_a_forked_child():
    """libgomp's pool does not survive a fork (the child's first parallel region waited forever):
    a multiprocessing.Pool worker (fork, Linux's default) runs the parent's program on one thread.
    The timeout makes a regression fail instead of hanging the suite."""
    import multiprocessing
    prog = FORKED["prog"] = ft.compile(rows, ROWS_XS, ROWS_W)
    prog.threads.fixed = 2
    for _ in range(3):
        assert rel_error(prog(ROWS_XS, ROWS_W), rows(ROWS_XS, ROWS_W)) < 1e-5
    assert prog.threads.last == 2
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(forked_call, range(4)).get(timeout=120)
    assert all(err < 1e-5 and n == 1 for err, n in results), results
    assert prog(ROWS_XS, ROWS_W) is not None and prog.threads.last == 2  # the parent is unchanged


def test_threads_that_cannot_start_fall_back_to_one_with_a_warning():
    """Under an address-space limit that leaves no room for 16 thread stacks, libgomp exited the
    process with status 1 ("Thread creation failed"); the call now runs on one thread, warns once,
    and gives the right result. In a subprocess, since the old failure ends the process."""
    script = textwrap.dedent("""
        import re, resource, warnings, numpy as np
        import polyft as ft
        from polyft.testing import rel_error
        def rows(xs, w):
            return xs.map(lambda x: ft.tanh(x @ w))
        xs = ft.FractalTensor.from_numpy(np.random.default_rng(3).standard_normal((40, 4, 32)).astype(np.float32), 1)
        w = np.random.default_rng(4).standard_normal((32, 32)).astype(np.float32)
        prog = ft.compile(rows, xs, w)
        prog.threads.fixed = 16
        vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 20 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            errs = [rel_error(prog(xs, w), rows(xs, w)) for _ in range(3)]
        print(max(errs), prog.threads.last, len(caught), caught[0].message if caught else "")
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("POLYFT_THREADS", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    err, last, warned, message = r.stdout.split(maxsplit=3)
    assert float(err) < 1e-5 and last == "1" and warned == "1", r.stdout
    assert "cannot start 16 threads" in message


def test_a_grandchild_of_the_process_that_ran_on_two_threads_runs_too():
    """The child never starts a pool of its own, but its libgomp state is the parent's stale one,
    which its own child inherits (as it inherits the note that a pool started): the grandchild
    runs on one thread as well. os.fork directly (a
    Pool's workers may not have children); each process is waited for at most 60 s."""
    prog = ft.compile(rows, ROWS_XS, ROWS_W)
    prog.threads.fixed = 2
    prog(ROWS_XS, ROWS_W)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, then the grandchild: each writes its error and count, then exits at once
        try:
            inner = os.fork()
            err = rel_error(prog(ROWS_XS, ROWS_W), rows(ROWS_XS, ROWS_W))
            os.write(write, f"{'grandchild' if inner == 0 else 'child'} {err} {prog.threads.last}\n".encode())
            if inner:
                waited(inner)
        finally:
            os._exit(0)
    os.close(write)
    waited(pid)
    with os.fdopen(read) as f:
        lines = sorted(f.read().split("\n")[:-1])
    assert [line.split()[0] for line in lines] == ["child", "grandchild"], lines
    assert all(float(line.split()[1]) < 1e-5 and line.split()[2] == "1" for line in lines), lines


def waited(pid, seconds=60):
    """Wait for the process `pid`, killing it (and failing) past `seconds`."""
    for _ in range(seconds * 10):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"process {pid} still ran after {seconds} s: it hung")
