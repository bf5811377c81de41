"""Every CUDA module a GPU session runs, known without a GPU: the GPU tests' (tests/test_cuda.py,
tests/test_cuda_grid.py, tests/test_cuda_halves.py) and the GPU benchmark's (experiments/gpu_bench.py), so that
scripts/gpu_session.sh compiles their cubins beforehand (emit.cubin's cache) and the GPU's
few minutes go to running them.

    python -m polyft.experiments.gpu_modules prepare [--preset paper] [--arch sm_90] [-j N]
    python -m polyft.experiments.gpu_modules smoke       # on a GPU: one small program equals eager
    python -m polyft.experiments.gpu_modules sanitize    # on a GPU, under compute-sanitizer: small shapes

A module is what `ft.compile(..., target="cuda")` generates: the same source as
`ft.analyze(...)._cuda_module(precision)` (a test checks that), so it is generated here
without PyCUDA.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import polyft as ft
from polyft.workloads import WORKLOADS

# sizes whose tiles allow tensor cores (multiples of 16) for the attention and GEMM workloads
# (and for the LSTM, whose 1-row steps become 16-row GEMMs when 16 sentences share a block)
TENSOR_CORE_SIZES = {"stacked_lstm": dict(N=20, D=3, L=4, H=16),
                     "flash_attention": dict(B=1, NH=2, Lq=32, Lk=48, tq=16, tk=16, d=32),
                     "b2b_gemm": dict(M=32, N=48, K=32, P=32, tm=16, tn=16),
                     "bigbird": dict(B=1, nb=8, bs=16, d=32)}
LARGER_LSTM = dict(N=32, D=4, L=16, H=64)  # the GPU test of a larger LSTM
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def test_programs():
    """(label, workload, args, schedule, precision) of every `target="cuda"` compile in the GPU
    tests; args are what the test passes (specs or inputs: the source may differ)."""
    for name, sizes in TENSOR_CORE_SIZES.items():  # test_cuda: test_precisions_within_tolerance
        for precision in PRECISIONS:
            yield f"test {name} {precision}", name, WORKLOADS[name].inputs("small", seed=21, **sizes), "auto", precision
    for name, mod in WORKLOADS.items():
        for schedule in ("original", "auto"):  # test_cuda: test_cuda_equals_eager
            yield f"test {name} {schedule}", name, mod.specs("small"), schedule, "fp32"
        # test_cuda_grid: test_gpu_persistent_kernel_equals_eager_in_one_launch
        yield f"test {name} grid", name, mod.inputs("small", seed=80), "auto", "fp32"
    for name, mod in WORKLOADS.items():  # test_cuda_halves: test_workloads_equal_eager_with_half_storage
        for precision in ("fp16", "bf16"):
            yield (f"test {name} {precision} storage", name,
                   mod.inputs("small", seed=5, **TENSOR_CORE_SIZES.get(name, {})), "auto", precision)
    yield "test larger lstm", "stacked_lstm", WORKLOADS["stacked_lstm"].inputs("small", seed=6, **LARGER_LSTM), \
        "auto", "fp32"


SMOKE = ("stacked_lstm", WORKLOADS["stacked_lstm"].inputs("small", seed=5), "fp32")


def sanitized_programs():
    """The small shapes the session runs under compute-sanitizer (racecheck, synccheck): one
    recurrent network with a wavefront and grid barriers, one attention on tensor cores."""
    yield "stacked_lstm", WORKLOADS["stacked_lstm"].inputs("small", seed=3), "fp32"
    attention = WORKLOADS["flash_attention"].inputs("small", seed=3, **TENSOR_CORE_SIZES["flash_attention"])
    yield "flash_attention", attention, "fp16"


def bench_programs(preset: str):
    """(label, workload, inputs, schedule, precision) of every polyft row of gpu_bench, which
    compiles for its concrete inputs (other code than for specs with symbolic lengths); the
    inputs as a function making them, since at the paper's shapes they take gigabytes."""
    from .gpu_bench import plan
    for row in plan(preset):
        if row.system.startswith("polyft"):
            yield (f"bench {row.workload} {row.shape} {row.precision}", row.workload,
                   functools.partial(WORKLOADS[row.workload].inputs, row.preset, seed=1, **row.sizes),
                   row.schedule, row.precision)


def source(workload: str, args, schedule: str, precision: str) -> str:
    """The CUDA source `ft.compile(..., target="cuda")` generates (`args`: the inputs or specs,
    or a function making them)."""
    prog = ft.analyze(WORKLOADS[workload].program, *(args() if callable(args) else args), schedule=schedule)
    return prog._cuda_module(precision).source


def programs(preset: str) -> list:
    """Every module of the GPU tests, the smoke and sanitizer runs, and the benchmark at `preset`."""
    runs = [("smoke", SMOKE), *(("sanitize", p) for p in sanitized_programs())]
    return [*test_programs(), *((f"{why} {name} {precision}", name, inputs, "auto", precision)
                                for why, (name, inputs, precision) in runs), *bench_programs(preset)]


def _build(job):
    """Compiles the k-th of `programs(preset)` (a worker regenerates the list: inputs need not pickle)."""
    from polyft.emit import cubin
    preset, k, arch = job
    label, workload, args, schedule, precision = programs(preset)[k]
    start = time.monotonic()
    src = source(workload, args, schedule, precision)
    path, _ = cubin.paths(src, arch)
    hit = os.path.exists(path)
    cubin.build(src, arch)
    return label, os.path.basename(path), hit, time.monotonic() - start


def prepare(preset: str, arch: str, jobs: int) -> list:
    """Compiles every module's cubin into the cache; (label, file, was cached, seconds) each."""
    work = [(preset, k, arch) for k in range(len(programs(preset)))]
    done = []
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for label, name, hit, seconds in pool.map(_build, work):
            done.append((label, name, hit, seconds))
            print(f"  {label:60s} {'cached' if hit else 'compiled'} {seconds:6.1f} s  {name}", flush=True)
    return done


def smoke() -> None:
    """One small program on the GPU: equal to eager, in one launch (fails fast before the long stages)."""
    from polyft.testing import rel_error
    name, inputs, precision = SMOKE
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *inputs, target="cuda", precision=precision)
    err = rel_error(prog(*inputs), mod.program(*inputs))
    print(f"smoke: {name} small on the GPU, relative error {err:.2e}, launches {prog._run.backend.launched}")
    if not err < 1e-5:
        sys.exit(f"smoke: the GPU result differs from eager ({err:.2e})")


def sanitize() -> None:
    """The small programs once each (under compute-sanitizer, which reports what it finds), on
    one block: racecheck and synccheck look inside blocks, and a sanitizer that ran blocks one
    after another would leave the others spinning at the software grid barrier."""
    from polyft.emit.cuda_statements import TOLERANCE
    from polyft.testing import rel_error
    for name, inputs, precision in sanitized_programs():
        mod = WORKLOADS[name]
        prog = ft.compile(mod.program, *inputs, target="cuda", precision=precision)
        prog._run.backend._capacity = [1] * len(prog.module.arities)  # one block (above)
        err = rel_error(prog(*inputs), mod.program(*inputs))
        print(f"sanitize: {name} {precision} relative error {err:.2e}", flush=True)
        if not err < TOLERANCE[precision]:
            sys.exit(f"sanitize: {name} differs from eager ({err:.2e})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["prepare", "smoke", "sanitize", "list"])
    ap.add_argument("--preset", default="paper", help="the benchmark's preset (default: paper)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    if a.what == "prepare":
        start = time.monotonic()
        done = prepare(a.preset, a.arch, a.jobs)
        files = sorted({name for _, name, _, _ in done})
        print(f"cubins: {len(done)} modules, {len(files)} distinct, {sum(1 for d in done if not d[2])} compiled, "
              f"{time.monotonic() - start:.1f} s")
    elif a.what == "list":
        for label, *_ in programs(a.preset):
            print(label)
    else:
        {"smoke": smoke, "sanitize": sanitize}[a.what]()
