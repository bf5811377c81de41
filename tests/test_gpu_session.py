"""What a GPU session runs, checked without a GPU: the modules it compiles beforehand are the
ones the `cuda` target builds; the benchmark's rows (each with its precision, the libraries
at fp16 / bf16) are written as they finish and a cut-off run resumes; and the whole
rehearsal (scripts/gpu_session.sh --rehearse: PyCUDA built from the pinned sdist against a
stub libcuda, every cubin compiled) passes here and reports its stages' times."""
import os
import subprocess
import sys

import pandas as pd
import pytest

import polyft as ft
from polyft.emit import targets
from polyft.emit.cuda_target import CudaTarget
from polyft.emit.protocol import Runtime
from polyft.experiments import gpu_bench, gpu_modules
from polyft.workloads import WORKLOADS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Recorded(Runtime):
    """A `cuda` runtime that only keeps the module it was given (no PyCUDA, no GPU)."""
    built = []

    def __init__(self, module):
        super().__init__(module)
        self.built.append(module)

    def bind(self, arrays, values):
        raise AssertionError("nothing runs here")


@pytest.mark.parametrize("label", ["test stacked_lstm fp32", "test flash_attention bf16", "test stacked_rnn original",
                                   "test stacked_lstm grid", "test bigbird fp16 storage", "test larger lstm"])
def test_prepared_modules_are_what_the_cuda_target_compiles(label, monkeypatch):
    """From specs and from inputs, on tensor cores and off: the source the session compiled."""
    monkeypatch.setitem(targets.TARGETS, "cuda", (CudaTarget(), _Recorded))
    _, name, args, schedule, precision = next(p for p in gpu_modules.programs("quick") if p[0] == label)
    args = args() if callable(args) else args
    _Recorded.built.clear()
    ft.compile(WORKLOADS[name].program, *args, target="cuda", schedule=schedule, precision=precision)
    assert [m.source for m in _Recorded.built] == [gpu_modules.source(name, args, schedule, precision)], label


def test_the_benchmark_compiles_the_prepared_modules(monkeypatch):
    """What gpu_bench.measure compiles for a polyft row (from the row's concrete inputs) is the
    module the session compiled beforehand."""
    monkeypatch.setitem(targets.TARGETS, "cuda", (CudaTarget(), _Recorded))
    row = next(r for r in gpu_bench.plan("quick") if r.workload == "b2b_gemm" and r.schedule and r.precision == "fp16")
    inputs = WORKLOADS[row.workload].inputs(row.preset, seed=1, **row.sizes)
    _Recorded.built.clear()
    with pytest.raises(AssertionError, match="nothing runs here"):
        gpu_bench.measure(row, inputs, None, lambda result: result)
    label = f"bench {row.workload} {row.shape} {row.precision}"
    _, name, args, schedule, precision = next(p for p in gpu_modules.programs("quick") if p[0] == label)
    assert [m.source for m in _Recorded.built] == [gpu_modules.source(name, args, schedule, precision)]


def test_the_modules_cover_every_gpu_test_and_benchmark_row():
    labels = [p[0] for p in gpu_modules.programs("paper")]
    assert len(labels) == len(set(labels))
    bench = [r for r in gpu_bench.plan("paper") if r.system == "polyft-cuda"]
    assert len([x for x in labels if x.startswith("bench ")]) == len(bench)
    assert {r.workload for r in bench} == set(WORKLOADS)  # the seven workloads at the paper shapes
    for name in WORKLOADS:  # each in fp32 and a half precision
        assert {r.precision for r in bench if r.workload == name} >= {"fp32"} and \
            {r.precision for r in bench if r.workload == name} & {"fp16", "bf16"}


def test_libraries_run_at_the_precision_beside_polyft():
    rows = gpu_bench.plan("paper")
    systems = {(r.workload, r.system, r.precision) for r in rows}
    for p in ("fp16", "bf16"):
        assert ("flash_attention", "torch-sdpa", p) in systems and ("flash_attention", "polyft-cuda", p) in systems
        assert ("b2b_gemm", "torch-two-matmuls", p) in systems
    assert {("stacked_lstm", "torch-nn-lstm", p) for p in ("fp32", "fp16")} <= systems
    assert all(r.precision in ("fp32", "fp16", "bf16") for r in rows)
    assert all(r.sizes == {} and r.preset == "paper" for r in rows)  # the paper's shapes, BigBird's d=512 too


def _fake_bench(monkeypatch, fail_after=None):
    """gpu_bench.run without a GPU: every row 'measured' at once (the k-th fails, if asked)."""
    import torch
    calls = []

    class Inputs:
        def inputs(self, *a, **k):
            return []

    def measure(row, inputs, reference, expected):
        if fail_after is not None and len(calls) == fail_after:
            raise RuntimeError("the machine went away")
        calls.append(row)
        return dict(seconds=1e-3, seconds_min=1e-3, seconds_max=2e-3, repeats=10, rel_error=1e-6, note="")
    monkeypatch.setattr(gpu_bench, "measure", measure)
    monkeypatch.setattr(gpu_bench, "get", lambda name: Inputs())
    monkeypatch.setattr(gpu_bench, "_reference", lambda workload, inputs: (None, None))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return calls


def test_benchmark_rows_are_kept_as_they_finish_and_a_cut_off_run_resumes(tmp_path, monkeypatch):
    plan = gpu_bench.plan("paper")
    _fake_bench(monkeypatch, fail_after=5)
    with pytest.raises(RuntimeError):
        gpu_bench.run("paper", str(tmp_path))
    kept = pd.read_csv(tmp_path / "gpu_bench.csv")
    assert len(kept) == 5 and list(kept["precision"]) == [r.precision for r in plan[:5]]
    calls = _fake_bench(monkeypatch)
    df = gpu_bench.run("paper", str(tmp_path), resume=True)
    assert calls == plan[5:]  # only what the cut-off run had not measured
    assert len(df) == len(plan) and not df.duplicated(gpu_bench.KEY).any()


def test_benchmark_stops_at_its_deadline(tmp_path, monkeypatch, capsys):
    import time
    calls = _fake_bench(monkeypatch)
    gpu_bench.run("paper", str(tmp_path), deadline=time.time() + 5, row_s=20)
    assert calls == [] and "run again with --resume" in capsys.readouterr().out


@pytest.mark.rehearsal
def test_rehearsal_reaches_the_first_launch_and_reports_its_stages(tmp_path):
    """The pinned files from PyPI, then the rehearsal: PyCUDA built from its sdist (curand
    off, against a stub libcuda where this machine has no driver), imported, and every
    module's cubin compiled (takes minutes: the PyCUDA build)."""
    subprocess.run(["bash", "scripts/fetch_gpu_wheels.sh"], cwd=ROOT, check=True, capture_output=True)
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    r = subprocess.run(["bash", "scripts/gpu_session.sh", "--rehearse", "--fresh", "--preset", "quick"], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    log = (tmp_path / "session.log").read_text()
    assert r.returncode == 0, log + r.stderr[-3000:]
    for stage in ("locate", "pins", "install", "pycuda", "import", "cubins"):
        assert f"== {stage}: at " in log and f"-- {stage}: " in log and f"-- {stage}: FAILED" not in log
    assert "== summary (seconds)" in log and "smoke" not in log  # stops before the first launch
    assert "no device" in log or "sm_" in log  # the stub answers no device; a machine with a driver names it
    build = (tmp_path / "pycuda-build.log").read_text()
    assert "--no-cuda-enable-curand" in build and "wrap_curand" not in build and "-lcurand" not in build
