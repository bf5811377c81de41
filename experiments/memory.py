"""Memory before and after storage contraction (§5, issue 12: storage that follows the live set).

The tracer gives every statement instance its own buffer element (single assignment), so an
intermediate buffer is as large as its statement's iteration domain. Under the "auto" schedule,
schedule/storage.py contracts each intermediate to the cells live at once (a modular mapping,
checked with ISL). For all seven workloads at two shapes, the "small" preset (what --quick
measures elsewhere) and the "paper" preset, each program is analysed from its specs
(`ft.analyze(program, *specs(preset))`: traced, coarsened, scheduled; never executed) and
`prog.memory(sizes)` is evaluated at the preset's lengths (deps_time.lengths). Per (workload,
shape), in bytes:

    io_bytes                      inputs + outputs + constants (stored as they are)
    intermediate_full_bytes       intermediates with one element per instance (no contraction)
    intermediate_allocated_bytes  intermediates in memory shared by all threads, contracted
    intermediate_local_bytes      intermediates placed "local": one thread's scratch, as the C
                                  target allocates it (per thread, for its batch of iterations;
                                  buffers never live at once share a region of it)
    threads                       threads the C code runs (this machine's cores)
    packed_bytes                  the packed copies of large shared matrices a C call keeps
                                  (emit.c_target.packed_weights)
    total_full_bytes              io + the intermediates uncontracted
    total_allocated_bytes         io + allocated + threads x local + packed
    ratio_full / ratio_allocated  total / io

and what the generated code moves (deps.traffic.code_traffic on the scheduled, coarsened ETDG).
It has no cache of its own, so every access of every instance moves its tile:
code_bytes_moved counts the accesses to shared memory (arrays all threads see), leaving out
those to local buffers, which stay in a thread's scratch (cache-resident: per thread a few MB
at most); code_bytes_moved_with_local counts every access. Contraction does not change how
often an element is accessed, only where it lives. code_dram_bytes_ideal_cache is the same
generated code under Table 7's rule (an ideal cache: each distinct tile of a shared buffer
moves once, reads and writes), beside deferred_model_bytes, Table 7's deferred plan (deps.
traffic.traffic on the ETDG as traced, every intermediate through DRAM) at the same sizes.
largest_intermediate names the intermediate with the most bytes (shared, or per thread if
local) and its cells.

--quick and --paper both analyse both shapes (fast). Writes results/memory_<preset>.csv (one
row per workload and shape; `preset` names the workload preset of the shape, small or paper;
with device, commit and date).

--paper also *runs* flash attention compiled in C at a shape whose uncontracted buffers would
not fit this machine's memory (LARGE: B=8, NH=16, Lq=Lk=4096, tiles of [32, 128]: 36 GB
uncontracted, 1.07 GB of inputs and outputs), checked against torch's
scaled_dot_product_attention and timed beside it (median of 2 runs each, all cores) with the
process's peak resident memory: results/memory_large_paper.csv.

    python -m polyft.experiments.memory [--quick | --paper] [--out DIR] [--resume]
"""
from __future__ import annotations

import os
import resource
import statistics
import time

import pandas as pd

import polyft as ft
from polyft.deps.traffic import code_traffic, traffic
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS, flash_attention, get

from .common import meta, path, sweep
from .deps_time import lengths
from .reproduce import main

SHAPES = ("small", "paper")
COLUMNS = ["workload", "preset", "shape", "lengths", "io_bytes", "intermediate_full_bytes",
           "intermediate_allocated_bytes", "intermediate_local_bytes", "threads", "packed_bytes", "total_full_bytes",
           "total_allocated_bytes", "ratio_full",
           "ratio_allocated", "intermediates", "contracted", "largest_intermediate",
           "largest_intermediate_allocated_bytes", "largest_intermediate_cells", "code_bytes_moved",
           "code_bytes_moved_with_local", "code_dram_bytes_ideal_cache", "deferred_model_bytes"]


def _text(sizes: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sizes.items())


def _dims(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def measure(name: str, shape: str) -> dict:
    """One row: the memory and traffic of workload `name` at preset `shape`."""
    mod = get(name)
    sizes = lengths(name, shape)
    prog = ft.analyze(mod.program, *mod.specs(shape))
    mem = prog.memory(sizes)
    inter = mem[mem["role"] == "intermediate"]
    io = int(mem.loc[mem["role"] != "intermediate", "full_bytes"].sum())
    full, alloc = int(inter["full_bytes"].sum()), int(inter["allocated_bytes"].sum())
    local = per_thread(inter)
    threads = os.cpu_count()
    packed = int(mem["packed_bytes"].sum())
    total = io + alloc + threads * local + packed
    on_chip = set(inter.loc[inter["placement"] == "local", "buffer"])
    code = code_traffic(prog.etdg, sizes)
    ideal = traffic(prog.etdg, sizes)
    row = dict(workload=name, preset=shape, shape=_text(mod.PRESETS[shape]), lengths=_text(sizes), io_bytes=io,
               intermediate_full_bytes=full, intermediate_allocated_bytes=alloc, intermediate_local_bytes=local,
               threads=threads, packed_bytes=packed, total_full_bytes=io + full, total_allocated_bytes=total,
               ratio_full=(io + full) / io, ratio_allocated=total / io, intermediates=len(inter),
               contracted=int((inter["allocated_bytes"] + inter["local_bytes"] < inter["full_bytes"]).sum()),
               largest_intermediate="", largest_intermediate_allocated_bytes=0, largest_intermediate_cells="",
               code_bytes_moved=code.bytes(exclude=on_chip), code_bytes_moved_with_local=code.bytes(),
               code_dram_bytes_ideal_cache=sum(r.deferred_bytes for r in ideal.reads if r.buffer not in on_chip)
               + sum(w.bytes for w in ideal.writes if w.buffer not in on_chip),
               deferred_model_bytes=traffic(prog.traced, sizes).bytes("deferred"))
    if len(inter):
        stored = inter["allocated_bytes"] + inter["local_bytes"]
        top = inter.loc[stored.idxmax()]
        s = next(s for s in prog.storage.buffers.values() if s.buffer.name == top["buffer"])
        batch = prog.local_batch(s.buffer)
        where = f"local, per thread, {batch.width} iteration(s)" if batch else "global"
        row.update(largest_intermediate=top["buffer"], largest_intermediate_allocated_bytes=int(stored.max()),
                   largest_intermediate_cells=f"{_dims(s.cell_dims(batch))} of {_dims(s.buffer.dims)} ({where})")
    return row


def per_thread(mem: pd.DataFrame) -> int:
    """Bytes of one thread's scratch: per region (buffers that share it), its largest buffer."""
    return int(mem[mem["region"] >= 0].groupby("region")["local_bytes"].max().sum())


LARGE = {"B": 8, "NH": 16, "Lq": 4096, "Lk": 4096, "tq": 32, "tk": 32, "d": 128}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_seconds(fn, repeats: int = 2) -> tuple:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def large_flash_attention(s: dict) -> dict:
    """Flash attention at sizes `s` (LARGE) compiled in C (contracted) against SDPA: one row of
    memory, time, error."""
    import torch
    lengths_ = {"B": s["B"], "NH": s["NH"], "TQ": s["Lq"] // s["tq"], "TK": s["Lk"] // s["tk"]}
    prog = ft.compile(flash_attention.program, *flash_attention.specs("paper", **s))
    mem = prog.memory(lengths_)
    q, k, v = flash_attention.inputs("paper", seed=1, **s)
    seconds, out = _median_seconds(lambda: prog(q, k, v))
    peak = _peak_mb()

    def flat(x):
        return torch.from_numpy(x.to_numpy().reshape(s["B"], s["NH"], -1, s["d"]))
    Q, K, V = flat(q), flat(k), flat(v)
    with torch.no_grad():
        sdpa, ref = _median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(Q, K, V))
    err = rel_error(out.to_numpy().reshape(ref.shape), ref.numpy())
    io = int(mem.loc[mem["role"] != "intermediate", "full_bytes"].sum())
    return dict(workload="flash_attention", shape=_text(s), io_bytes=io, total_full_bytes=int(mem["full_bytes"].sum()),
                total_allocated_bytes=int(mem["allocated_bytes"].sum()) + os.cpu_count() * per_thread(mem),
                local_bytes_per_thread=per_thread(mem), peak_rss_bytes=int(peak * 2**20),
                machine_bytes=_machine_bytes(), seconds_polyft_c=seconds, seconds_torch_sdpa=sdpa,
                rel_error_vs_sdpa=err, threads=os.cpu_count(), torch_threads=torch.get_num_threads(), **meta())


def _machine_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run(preset: str = "quick", out_dir: str = "results", resume: bool = False) -> pd.DataFrame:
    """Both shapes of every workload (whatever the preset: the analysis never runs the program);
    write `out_dir`/memory_<preset>.csv and return it; with preset "paper" also the LARGE flash
    attention run (memory_large_paper.csv)."""
    info = meta()

    def point(p) -> list:
        row = measure(p[1], p[0])
        return [dict({c: row[c] for c in COLUMNS}, **info)]
    df = sweep("memory", preset, out_dir, [(shape, name) for shape in SHAPES for name in WORKLOADS], point,
               resume=resume, key=lambda p: {"workload": p[1], "preset": p[0]})
    if preset == "paper":
        sweep("memory_large", preset, out_dir, [LARGE], lambda s: [large_flash_attention(s)], resume=resume,
              key=lambda s: {"workload": "flash_attention", "shape": _text(s)})
    return df


def result_text(out_dir: str, preset: str) -> str:
    df = pd.read_csv(path(out_dir, "memory.csv", preset)).fillna({"largest_intermediate": "",
                                                                  "largest_intermediate_cells": ""})
    text = table(df)
    large = path(out_dir, "memory_large.csv", preset)
    if preset == "paper" and os.path.exists(large):
        text += "\nflash attention beyond this machine's memory, compiled in C:\n" + \
            pd.read_csv(large).drop(columns=list(meta())).to_string(index=False)
    return text


def table(df: pd.DataFrame) -> str:
    """The rows as text: MB of memory, GB moved."""
    lines = []
    for shape, g in df.groupby("preset", sort=False):
        lines.append(f"{shape} shape: memory in MB (io = inputs + outputs; alloc = io + shared intermediates + "
                     f"threads x local scratch), bytes moved in GB")
        lines.append(f"{'workload':16s} {'io MB':>10s} {'full MB':>11s} {'alloc MB':>10s} {'local/thr MB':>12s} "
                     f"{'full/io':>8s} {'alloc/io':>8s} {'code GB':>9s} {'ideal GB':>9s} {'deferred GB':>11s}  "
                     f"largest intermediate (allocated)")
        for r in g.itertuples():
            lines.append(f"{r.workload:16s} {r.io_bytes / 1e6:10.3f} {r.total_full_bytes / 1e6:11.3f} "
                         f"{r.total_allocated_bytes / 1e6:10.3f} {r.intermediate_local_bytes / 1e6:12.3f} "
                         f"{r.ratio_full:8.2f} {r.ratio_allocated:8.3f} {r.code_bytes_moved / 1e9:9.3f} "
                         f"{r.code_dram_bytes_ideal_cache / 1e9:9.3f} {r.deferred_model_bytes / 1e9:11.3f}  "
                         f"{r.largest_intermediate or '-'} {r.largest_intermediate_cells}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main("memory", __doc__))
