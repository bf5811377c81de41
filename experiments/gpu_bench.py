"""GPU benchmark (issue: CUDA target): generated CUDA against the hand-written libraries,
side by side in one run on one GPU, each checked first (against eager execution, or torch where eager is too slow).

* stacked_lstm (batch 256, hidden 256 / 1024, depth 1..32, length 32/64/128): polyft CUDA
  (auto and original schedules) vs torch.nn.LSTM (cuDNN) and a torch per-layer eager loop;
  and, on tensor cores, in fp16 and bf16 (auto schedule);
* flash_attention vs torch scaled_dot_product_attention; b2b_gemm vs two torch matmuls
  (cuBLAS); bigbird vs a torch blocked implementation: polyft in every precision, its
  error measured against the torch result (eager execution is too slow at these sizes).
Writes <out>/gpu_bench.csv with the device name. Needs PyCUDA and a GPU (scripts/gpu_session.sh).
"""
from __future__ import annotations

import argparse
import os
import statistics

import pandas as pd

import polyft as ft
from polyft.testing import rel_error
from polyft.workloads import get

from . import baselines
from .common import fresh_out, meta

# attention and GEMM shapes: the paper's, except BigBird's d (512 needs more shared memory
# than a block has for the gathered [96, d] key tile) and a smaller batch for "quick"
ATTENTION_SIZES = {
    "quick": {"flash_attention": dict(B=2, NH=8, Lq=1024, Lk=1024), "b2b_gemm": {},
              "bigbird": dict(B=4, nb=32, d=128)},
    "paper": {"flash_attention": {}, "b2b_gemm": {}, "bigbird": dict(d=128)},
}
BASELINES = {"flash_attention": baselines.sdpa, "b2b_gemm": baselines.two_matmuls,
             "bigbird": baselines.blocked_bigbird}
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

LSTM_SWEEP = {
    "quick": [dict(N=256, H=256, L=32, D=d) for d in (1, 4, 8)],
    "paper": [dict(N=256, H=h, L=l, D=d) for h in (256, 1024) for l in (32, 64, 128)
              for d in (1, 4, 8, 12, 16, 20, 24, 28, 32)],
}


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


def _polyft(workload, inputs, schedule, precision="fp32"):
    mod = get(workload)
    prog = ft.compile(mod.program, *inputs, target="cuda", schedule=schedule, precision=precision)
    run, fetch = prog.bind(*inputs)
    return prog, run, fetch


def _torch_lstm_layers(inputs):
    """torch.nn.LSTM (cuDNN, all layers in one call) with our weights on the GPU, and the
    per-layer eager loop (one cuDNN call per layer, as a DAG of layers)."""
    import torch
    x = torch.from_numpy(inputs[0].to_numpy()[:, :, 0, :]).cuda()
    full = baselines.lstm_module(*inputs[1:]).cuda()
    H, D = x.shape[-1], full.num_layers
    layers = []
    for d in range(D):
        one = torch.nn.LSTM(H, H, num_layers=1, batch_first=True).cuda()
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(one, f"{name}_l0").copy_(getattr(full, f"{name}_l{d}"))
        layers.append(one)

    def cudnn():
        with torch.no_grad():
            return full(x)[0]

    def per_layer():
        with torch.no_grad():
            h = x
            for layer in layers:
                h = layer(h)[0]
            return h
    return cudnn, per_layer


def run(preset: str = "quick", out_dir: str = "results") -> pd.DataFrame:
    import torch
    info = meta()
    info["device"] = torch.cuda.get_device_name()
    rows = []

    def add(workload, shape, system, times, err):
        rows.append(dict(workload=workload, shape=shape, system=system, seconds=statistics.median(times),
                         seconds_min=min(times), seconds_max=max(times), repeats=len(times), rel_error=err,
                         preset=preset, **info))
        print(f"  {workload:16s} {shape:32s} {system:20s} {rows[-1]['seconds'] * 1e3:9.3f} ms", flush=True)

    mod = get("stacked_lstm")
    for size in LSTM_SWEEP[preset]:
        inputs = mod.inputs("small", seed=1, **size)
        shape = " ".join(f"{k}={v}" for k, v in size.items())
        cudnn, per_layer = _torch_lstm_layers(inputs)
        # the top layer's hidden states [N, L, 1, H]: from eager execution where it is quick,
        # else from cuDNN (checked against eager in CI)
        small = size["N"] * size["D"] * size["L"] <= 8192
        top = mod.program(*inputs)[0].to_numpy()[:, -1] if small else cudnn().cpu().numpy()[:, :, None, :]
        for sched, precision in (("auto", "fp32"), ("original", "fp32"), ("auto", "fp16"), ("auto", "bf16")):
            prog, go, fetch = _polyft("stacked_lstm", inputs, sched, precision)
            err = rel_error(prog(*inputs)[0].to_numpy()[:, -1], top)
            name = f"polyft-cuda-{sched}" + (f"-{precision}" if precision != "fp32" else "")
            add("stacked_lstm", shape, name, _gpu_time(go), err)
        for name, fn in (("torch-cudnn-lstm", cudnn), ("torch-per-layer", per_layer)):
            add("stacked_lstm", shape, name, _gpu_time(fn), rel_error(fn().cpu().numpy()[:, :, None, :], top))

    for workload, sizes in ATTENTION_SIZES[preset].items():
        mod = get(workload)
        inputs = mod.inputs("paper", seed=1, **sizes)
        shape = " ".join(f"{k}={v}" for k, v in sizes.items()) or "paper"
        base = BASELINES[workload](*inputs, device="cuda")
        reference = base.result()  # torch, checked against eager in CI; eager is too slow here
        for precision in PRECISIONS:
            prog = ft.compile(mod.program, *inputs, target="cuda", precision=precision)
            go, fetch = prog.bind(*inputs)
            add(workload, shape, f"polyft-cuda-{precision}", _gpu_time(go),
                rel_error(base.expected(prog(*inputs)), reference))
        add(workload, shape, f"torch-{BASELINES[workload].__name__.replace('_', '-')}", _gpu_time(base.run), 0.0)
    df = pd.DataFrame(rows)
    os.makedirs(out_dir, exist_ok=True)
    df.to_csv(os.path.join(out_dir, "gpu_bench.csv"), index=False)
    return df


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--out", help="output folder (default: a fresh out/<date>-<host>/, as polyft reproduce)")
    args = ap.parse_args()
    out = args.out or fresh_out()
    print(run("paper" if args.paper else "quick", out).to_string())
    print(f"wrote {os.path.join(out, 'gpu_bench.csv')}")
