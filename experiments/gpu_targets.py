"""Where each workload stands against issue 27's targets for the CUDA target, from the GPU
profile alone (no GPU needed): per workload and precision at a preset's shapes, launches per
call, blocks per launch against the SMs and the band's instances, global bytes per call
against inputs+outputs (the DRAM lower bound, and all global traffic with a batch's common
loads shared, as if no access hit the L2), and spills from ptxas for sm_80 and sm_90.

    python -m polyft.experiments.gpu_targets [--preset paper] [--precision fp32 --precision fp16]

prints the table as Markdown (the README's CUDA section holds its output).
"""
from __future__ import annotations

import argparse

import pandas as pd

from polyft import analyze
from polyft.emit.gpu_profile import H100, profile, ptxas
from polyft.experiments.deps_time import lengths
from polyft.workloads import WORKLOADS

# the bound on DRAM bytes per call, as a multiple of inputs+outputs
DRAM_TARGET = {"flash_attention": 1.5, "stacked_lstm": 1.5}
OTHERS = 3.0
MAX_LAUNCHES = 2


def spills(source: str, arch: str) -> int | None:
    """Bytes of spill stores and loads ptxas reports for the kernel on `arch` (None: no nvcc)."""
    info, _ = ptxas(source, arch)
    return None if info is None else sum(k["spill_stores"] + k["spill_loads"] for k in info.values())


def row(name: str, precision: str, preset: str = "paper") -> dict:
    """One workload's standing at `preset`'s lengths under `precision`."""
    mod = WORKLOADS[name]
    sizes = lengths(name, preset)
    prog = analyze(mod.program, *mod.specs(preset), sizes=sizes)
    module = prog._cuda_module(precision)
    p = profile(module, prog.model, prog.schedule, sizes, precision)
    t, k = p.totals, p.kernels
    instances = int(k.instances_max.max())
    target = DRAM_TARGET.get(name, OTHERS)
    on_chip = p.buffers.buffer[p.buffers.placement == "shared"].tolist()
    sm80, sm90 = spills(module.source, "sm_80"), spills(module.source, "sm_90")
    blocks_ok = t.blocks_min >= min(H100["sms"], instances)
    return dict(workload=name, precision=precision, launches=int(t.launches),
                blocks=f"{t.blocks_min}" if t.blocks_min == t.blocks_max else f"{t.blocks_min}-{t.blocks_max}",
                instances=instances, global_MB=round(t.global_bytes / 1e6, 1), io_MB=round(t.io_bytes / 1e6, 1),
                dram_ratio=round(t.dram_ratio, 2), shared_ratio=round(t.shared_ratio, 2), target=target,
                spills_sm80=sm80, spills_sm90=sm90, on_chip=", ".join(on_chip) or "-",
                met=all([t.launches <= MAX_LAUNCHES, blocks_ok, t.dram_ratio <= target, sm80 == 0, sm90 == 0]),
                l2_met=t.shared_ratio <= target)


def table(precisions=("fp32", "fp16"), preset: str = "paper", names=None) -> pd.DataFrame:
    return pd.DataFrame([row(n, p, preset) for n in (names or WORKLOADS) for p in precisions])


def markdown(df: pd.DataFrame) -> str:
    """The table as the README shows it."""
    yes = {True: "yes", False: "**no**"}
    out = ["| workload | precision | launches / call | blocks / launch (band instances) | global MB / call | "
           "inputs+outputs MB | DRAM bound / io | global traffic / io | target | spills sm_80 / sm_90 | "
           "on chip | targets met (DRAM bound) | traffic within target (no L2 hits) |",
           "|" + "---|" * 13]
    for r in df.itertuples():
        out.append(f"| {r.workload} | {r.precision} | {r.launches} | {r.blocks} ({r.instances}) | {r.global_MB:,} | "
                   f"{r.io_MB:,} | {r.dram_ratio} | {r.shared_ratio} | {r.target} | {r.spills_sm80} / "
                   f"{r.spills_sm90} | {r.on_chip} | {yes[r.met]} | {yes[r.l2_met]} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--precision", action="append", help="fp32, tf32, fp16, bf16 (repeatable; default fp32 and fp16)")
    args = ap.parse_args(argv)
    print(markdown(table(tuple(args.precision or ("fp32", "fp16")), args.preset)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
