"""GPU benchmark: the generated CUDA beside each library at its best, at the same precision,
on one GPU, every row checked against an fp32 reference before it is timed.

* the seven workloads at their paper shapes (`--paper`; the default "quick" preset is the
  attention and GEMM workloads and a small LSTM, for a first look): polyft in fp32 and in
  fp16 (bf16 for the stacked RNN, whose linear cell grows past fp16's range at the paper
  shape), and bf16 too for b2b, flash attention and BigBird;
* libraries: FlashAttention-2 through scaled_dot_product_attention with fp16 and bf16
  inputs (its flash backend, asked for by name), SDPA in fp32; cuDNN's LSTM in fp16 and in
  fp32 (TF32 as torch enables it: `torch.backends.cudnn.allow_tf32`, on by default); cuBLAS
  GEMMs in fp16, bf16 and fp32 (TF32 as torch enables it:
  `torch.backends.cuda.matmul.allow_tf32`, off by default); a blocked BigBird in each; the
  per-cell eager loops of the other RNNs in fp32 (no library has these cells). The `note`
  column names what ran (the SDPA backend, the TF32 switches).
* errors: against the library's result in fp32 with TF32 off (eager numpy is too slow at
  these shapes; CI checks the libraries against eager).

Each row is appended to <out>/gpu_bench.csv as it finishes, so a run cut off keeps what it
measured; `--resume` skips the rows already there (same device), `--deadline` (a Unix time)
stops before a row that would start too late. Needs PyCUDA and a GPU (scripts/gpu_session.sh).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import NamedTuple

import numpy as np
import pandas as pd

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import get

from . import baselines
from .common import meta

RNNS = ("stacked_rnn", "stacked_lstm", "dilated_rnn", "grid_rnn")
ATTENTION = ("b2b_gemm", "flash_attention", "bigbird")
HALF = {"stacked_rnn": "bf16"}  # the reduced precision of each workload's polyft row (default fp16)
LIBRARY = {"stacked_rnn": (baselines.rnn_cell_loop, ("fp32",)),
           "stacked_lstm": (baselines.nn_lstm, ("fp32", "fp16")),
           "dilated_rnn": (baselines.dilated_cell_loop, ("fp32",)),
           "grid_rnn": (baselines.grid_cell_loop, ("fp32",)),
           "b2b_gemm": (baselines.two_matmuls, ("fp32", "fp16", "bf16")),
           "flash_attention": (baselines.sdpa, ("fp32", "fp16", "bf16")),
           "bigbird": (baselines.blocked_bigbird, ("fp32", "fp16", "bf16"))}
SIZES = {  # per preset: the workload's preset and its overrides
    "quick": {"stacked_lstm": ("paper", dict(N=256, D=4, L=32)),
              "b2b_gemm": ("paper", {}),
              "flash_attention": ("paper", dict(B=2, NH=8, Lq=1024, Lk=1024)),
              "bigbird": ("paper", dict(B=4, nb=32))},
    "paper": {name: ("paper", {}) for name in (*RNNS, *ATTENTION)},
}
KEY = ["workload", "shape", "system", "precision"]


class Row(NamedTuple):
    """One row to measure: polyft's program (`schedule` set) or the library's."""
    workload: str
    preset: str  # the workload's preset
    sizes: dict
    system: str
    precision: str
    schedule: str | None

    @property
    def shape(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.sizes.items()) or self.preset


def plan(preset: str) -> list:
    """Every row of a run, in the order they run: per workload, polyft's then the library's."""
    rows = []
    for name, (wpreset, sizes) in SIZES[preset].items():
        precisions = ["fp32", HALF.get(name, "fp16")] + (["bf16"] if name in ATTENTION else [])
        rows += [Row(name, wpreset, sizes, "polyft-cuda", p, "auto") for p in precisions]
        fn, library = LIBRARY[name]
        rows += [Row(name, wpreset, sizes, f"torch-{fn.__name__.replace('_', '-')}", p, None) for p in library]
    return rows


def _gpu_time(fn, repeats=10, warmup=2) -> list:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def _switches() -> str:
    import torch
    return (f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
            f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")


def _library(row: Row, inputs):
    """(timed call, result as numpy, note) of the library at the row's precision."""
    import torch
    fn, _ = LIBRARY[row.workload]
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[row.precision]
    base = fn(*inputs, device="cuda", dtype=dtype) if dtype is not None else fn(*inputs, device="cuda")
    note = _switches() if row.precision == "fp32" else ""
    if row.workload == "flash_attention" and dtype is not None:  # FlashAttention-2, asked for by name
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def run():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return base.run()

        def result():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return base.result()
        return run, result, "SDPA flash backend (FlashAttention-2)"
    return base.run, base.result, note


def _reference(workload: str, inputs) -> np.ndarray:
    """The library's fp32 result with TF32 off: what every row of the workload is checked against."""
    import torch
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fn, _ = LIBRARY[workload]
        base = fn(*inputs, device="cuda")
        return base.result(), base.expected
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def measure(row: Row, inputs, reference, expected) -> dict:
    """The row's times and error."""
    if row.schedule is not None:
        mod = get(row.workload)
        prog = ft.compile(mod.program, *inputs, target="cuda", schedule=row.schedule, precision=row.precision)
        err = rel_error(expected(prog(*inputs)), reference)
        run, _fetch = prog.bind(*inputs)
        times, note = _gpu_time(run), f"{prog._run.backend.launched} launches"
    else:
        run, result, note = _library(row, inputs)
        err = rel_error(result(), reference)
        times = _gpu_time(run)
    return dict(seconds=statistics.median(times), seconds_min=min(times), seconds_max=max(times),
                repeats=len(times), rel_error=err, note=note)


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False, deadline: float | None = None,
        row_s: float = 20.0) -> pd.DataFrame:
    """Measures the preset's rows, appending each to <out_dir>/gpu_bench.csv as it finishes;
    stops before a row that would start later than `deadline` - `row_s`."""
    import torch
    info = meta()
    info["host"], info["device"] = info["device"], torch.cuda.get_device_name()  # the CPU, the GPU
    path = os.path.join(out_dir, "gpu_bench.csv")
    os.makedirs(out_dir, exist_ok=True)
    done = pd.read_csv(path) if resume and os.path.exists(path) else pd.DataFrame(columns=KEY + ["device"])
    if not resume and os.path.exists(path):
        os.remove(path)
    have = {tuple(str(v) for v in r) for r in done[done["device"] == info["device"]][KEY].itertuples(index=False)}
    todo = [r for r in plan(preset) if (r.workload, r.shape, r.system, r.precision) not in have]
    print(f"gpu_bench {preset}: {len(todo)} rows to measure ({len(have)} already in {path})", flush=True)
    loaded = None
    for k, row in enumerate(todo):
        if deadline is not None and time.time() > deadline - row_s:
            print(f"gpu_bench: stopped at the time budget with {len(todo) - k} rows left; "
                  "run again with --resume to measure them", flush=True)
            break
        if loaded is None or loaded[0] != (row.workload, row.preset, row.shape):
            loaded = None
            gc.collect()
            torch.cuda.empty_cache()
            inputs = get(row.workload).inputs(row.preset, seed=1, **row.sizes)
            loaded = ((row.workload, row.preset, row.shape), inputs, *_reference(row.workload, inputs))
        start = time.monotonic()
        got = measure(row, *loaded[1:])
        line = dict(workload=row.workload, shape=row.shape, system=row.system, precision=row.precision,
                    schedule=row.schedule or "", **got, preset=preset, **info)
        pd.DataFrame([line]).to_csv(path, mode="a", header=not os.path.exists(path), index=False)
        print(f"  {row.workload:16s} {row.shape:28s} {row.system:24s} {row.precision:5s} "
              f"{got['seconds'] * 1e3:10.3f} ms  err {got['rel_error']:.1e}  ({time.monotonic() - start:.0f} s)",
              flush=True)
    return pd.read_csv(path) if os.path.exists(path) else pd.DataFrame()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paper", action="store_true", help="the seven workloads at the paper's shapes")
    ap.add_argument("--out", default="results", help="folder of gpu_bench.csv (default: results)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in gpu_bench.csv")
    ap.add_argument("--deadline", type=float, help="Unix time by which to stop starting rows")
    args = ap.parse_args()
    df = run("paper" if args.paper else "quick", args.out, args.resume, args.deadline)
    print(df.to_string() if len(df) else "no rows")
    print(f"wrote {os.path.join(args.out, 'gpu_bench.csv')}")
