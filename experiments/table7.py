"""Table 7: memory traffic with and without deferred access materialisation.

The model (deps/traffic.py, exact from the ISL access relations of the traced program at
concrete sizes): bytes moved when every read goes through its access map to the source
buffer ("deferred", FractalTensor's plan) against bytes moved when every read through a
non-identity view (window, slice, stride, index, gather) first copies the view into its own
buffer ("materialised", what a DAG of tensor operators does: PyTorch, TVM). Counted at the
paper's shapes (the model counts boxes analytically, so they take well under a second):
BigBird as Listing 4 ([16, 64] blocks of [32, 512]) and flash attention as Listing 3
([32, 16, 64] query tiles of [32, 128], 4096 keys), plus every other workload at its
"paper" preset for context. Quick and paper presets are the same here.

Writes results/table7_<preset>.csv (workload, shape, plan, bytes, GB, ratio to deferred),
results/table7_accesses_<preset>.csv (every read and write with its kind and counts) and
results/table7_<preset>.txt (the table beside the paper's measured DRAM bytes).

Measured traffic needs an NVIDIA GPU and Nsight Compute. With `--ncu`, for BigBird and flash
attention at the paper's shapes, each GPU system (generated CUDA, the torch baseline on
CUDA) is run once inside an NVTX range and profiled, summing over its kernels:

    ncu --csv --metrics dram__bytes.sum,lts__t_bytes.sum,l1tex__t_bytes.sum \\
        --nvtx --nvtx-include "table7/" --target-processes all \\
        python -m polyft.experiments.table7 --ncu-child bigbird polyft-cuda-auto

(DRAM, L2 and L1 bytes as in the paper's Table 7) -> <--out DIR>/table7_ncu_paper.csv. Without a
GPU or without `ncu` on PATH, `--ncu` stops with an error saying which is missing.

    python -m polyft.experiments.table7 [--quick | --paper] [--out DIR] [--resume] [--ncu]
"""
from __future__ import annotations

import argparse
import functools
import io
import shutil
import subprocess
import sys

import pandas as pd

import polyft as ft
from polyft.deps.traffic import traffic
from polyft.errors import PolyftError
from polyft.workloads import WORKLOADS, get

from .common import meta, path, sweep, write_csv, write_text
from .deps_time import lengths
from .measure import device_name, gpu_available, systems
from .paper import PAPER_DRAM
from .reproduce import command, command_line

HIGHLIGHT = ("bigbird", "flash_attention")  # the paper's Table 7
NCU_METRICS = {"dram__bytes.sum": "dram", "lts__t_bytes.sum": "l2", "l1tex__t_bytes.sum": "l1"}
NCU_SYSTEMS = ("polyft-cuda-auto", "torch-blocked-cuda", "torch-sdpa-cuda")
NCU_RANGE = "table7"


@functools.lru_cache(maxsize=None)
def model(workload: str, preset: str = "paper"):
    """The traffic model of `workload` at a preset's sizes ("quick" means "paper"): (shape
    string, deps.traffic.Traffic); kept, as run's two tables are made from it."""
    mod, preset = get(workload), "paper" if preset == "quick" else preset
    shape = " ".join(f"{k}={v}" for k, v in mod.PRESETS[preset].items())
    return shape, traffic(ft.trace(mod.program, *mod.specs(preset)), lengths(workload, preset))


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    info = dict(meta(), device="model (exact counts, no device)")

    def plans(name) -> list:
        shape, tr = model(name, preset)
        deferred = tr.bytes("deferred")
        views = sum(r.is_view for r in tr.reads)
        return [dict(workload=name, shape=shape, system=f"model-{plan}", plan=plan, bytes=tr.bytes(plan),
                     GB=tr.bytes(plan) / 1e9, ratio_to_deferred=tr.bytes(plan) / deferred, views=views,
                     table7=name in HIGHLIGHT, preset=preset, **info, status="ok")
                for plan in ("deferred", "materialised")]

    def accesses(name) -> list:
        shape, tr = model(name, preset)
        return [dict(workload=name, shape=shape, **r) for r in tr.rows()]
    df = sweep("table7", preset, out_dir, list(WORKLOADS), plans, key=lambda w: {"workload": w}, resume=resume)
    sweep("table7_accesses", preset, out_dir, list(WORKLOADS), accesses, key=lambda w: {"workload": w},
          resume=resume)
    write_text(path(out_dir, "table7.txt", preset), markdown(df) + "\n")
    return df


def result_text(out_dir: str, preset: str) -> str:
    with open(path(out_dir, "table7.txt", preset)) as f:
        return f.read()


def markdown(df: pd.DataFrame) -> str:
    lines = ["Table 7 (model): bytes moved by the reads and writes of each workload at the paper's shapes,",
             "deferring view materialisation (reads through the access maps) vs materialising every view;",
             "ideal cache, one tile per buffer element, float32 (deps/traffic.py). The paper's measured",
             "A100 DRAM traffic beside it.",
             "",
             "| workload | shape | view reads | deferred GB | materialised GB | materialised / deferred "
             "| paper: DRAM GB on A100 (/ FractalTensor's) |",
             "|---|---|---|---|---|---|---|"]
    for name, g in df.groupby("workload", sort=False):
        d, m = (g[g["plan"] == p].iloc[0] for p in ("deferred", "materialised"))
        got = PAPER_DRAM.get(name, {})
        paper = ", ".join(f"{k} {v} ({v / got['FractalTensor']:.2f}x)" for k, v in got.items()) or "-"
        lines.append(f"| {name}{' (Table 7)' if name in HIGHLIGHT else ''} | {d['shape']} | {d['views']} | "
                     f"{d['GB']:.3f} | {m['GB']:.3f} | {m['ratio_to_deferred']:.2f}x | {paper} |")
    return "\n".join(lines)


# -- measured traffic (ncu, on a GPU) ------------------------------------------------------

def _ncu_available() -> str:
    """'' when ncu can run here, else what is missing."""
    missing = [] if gpu_available() else ["no GPU"]
    missing += [] if shutil.which("ncu") else ["Nsight Compute's `ncu` not on PATH"]
    return "; ".join(missing)


def _ncu_bytes(csv_text: str) -> dict:
    """Sum each metric of ncu's --csv output over the kernels, in bytes."""
    unit = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}
    rows = [line for line in csv_text.splitlines() if line.startswith('"')]  # not the ==PROF== lines
    if not rows or not rows[0].startswith('"ID"'):
        raise PolyftError(f"ncu printed no metrics:\n{csv_text[-2000:]}", op="table7")
    df = pd.read_csv(io.StringIO("\n".join(rows)), dtype=str)
    df = df[df["Metric Name"].isin(NCU_METRICS)]
    value = df["Metric Value"].str.replace(",", "").astype(float)
    df = df.assign(bytes=value * df["Metric Unit"].map(unit))
    return {NCU_METRICS[k]: v for k, v in df.groupby("Metric Name")["bytes"].sum().items()}


def ncu(out_dir: str = "results") -> pd.DataFrame:
    """Profile the GPU systems of BigBird and flash attention at the paper's shapes with ncu ->
    table7_ncu_paper.csv."""
    missing = _ncu_available()
    if missing:
        raise PolyftError(f"table7 --ncu needs an NVIDIA GPU and Nsight Compute: {missing}", op="table7")
    info, rows = meta(), []
    for name in HIGHLIGHT:
        for system in systems(name):
            if system.name not in NCU_SYSTEMS:
                continue
            cmd = ["ncu", "--csv", "--metrics", ",".join(NCU_METRICS), "--nvtx", "--nvtx-include", f"{NCU_RANGE}/",
                   "--target-processes", "all", sys.executable, "-m", "polyft.experiments.table7", "--ncu-child",
                   name, system.name]
            print("[table7]", " ".join(cmd), flush=True)
            if system.absent:
                rows.append(dict(workload=name, system=system.name, status=f"absent: {system.absent}"))
                continue
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise PolyftError(f"ncu failed ({done.returncode}):\n{done.stderr[-2000:]}", op="table7")
            got = _ncu_bytes(done.stdout)
            rows.append(dict(workload=name, system=system.name, status="ok",
                             **{f"{k}_GB": got.get(k, float("nan")) / 1e9 for k in ("dram", "l1", "l2")}))
    df = pd.DataFrame(rows)
    for k, v in info.items():
        df[k] = v
    df["device"] = device_name("cuda")
    write_csv(df, path(out_dir, "table7_ncu.csv", "paper"))
    return df


def _ncu_child(workload: str, system_name: str) -> None:
    """Run one system once inside the NVTX range ncu profiles (after two warm-up runs)."""
    import torch

    system = next(s for s in systems(workload) if s.name == system_name)
    mod = get(workload)
    inputs = mod.inputs("paper", seed=1)
    b = system.build(inputs, workload=workload, sizes=dict(mod.PRESETS["paper"]))
    b.run()
    b.run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NCU_RANGE)
    b.run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def main(argv=None) -> int:
    """The artefact's command line (reproduce.main) with --ncu."""
    ap = command_line("table7", __doc__)
    ap.add_argument("--ncu", action="store_true", help="also measure DRAM/L2/L1 bytes with ncu (GPU only)")
    ap.add_argument("--ncu-child", nargs=2, metavar=("WORKLOAD", "SYSTEM"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ncu_child:
        _ncu_child(*args.ncu_child)
        return 0
    if args.ncu and _ncu_available():
        print(f"error: table7 --ncu needs an NVIDIA GPU and Nsight Compute: {_ncu_available()}", file=sys.stderr)
        return 2
    steps = [("table7 --ncu", lambda: ncu(args.out).to_string(index=False))] if args.ncu else []
    return command(["table7"], args, steps)


if __name__ == "__main__":
    raise SystemExit(main())
