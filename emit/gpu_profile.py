"""A GPU profile of the CUDA target that needs no GPU (`prog.gpu_profile(sizes)`).

Everything in it comes from what the target generates and from the polyhedral model, never
from reading the generated code:

* kernels: the block size and dynamic shared memory of the CudaModule; registers, spills,
  stack and static shared memory from `nvcc -arch=sm_90 -cubin -Xptxas -v` on its source
  (None, with the reason, where nvcc is absent or fails); launches and grids per call by
  running the module's host driver with a launch callback that only records them.
* buffers: where each lives (global memory, or a block's shared memory for those the module
  keeps on chip), its element as stored (half width under fp16 and bf16: emit.halves), its
  bytes, and the bytes per call its accesses move to and from global memory; all bytes at the
  stored width (inputs+outputs too, so the ratios compare like with like).
* global bytes per call, from the access relations at any lengths (deps.traffic's code
  traffic: every access of every statement instance moves its tile, counted with ISL
  cardinalities, never by enumerating instances), for the buffers in global memory. The
  emulator counts the same at small lengths (emit.gpu_count; tests compare the two).
* DRAM: what must come from DRAM at least, assuming an L2 that keeps every buffer that fits
  in it (DRAM_ASSUMPTION); the rest of the global bytes are L2 (or L1) hits at best.
* a roofline time per call from named, overridable assumptions (H100 SXM by default).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import islpy as isl
import numpy as np
import pandas as pd

from polyft.deps.model import build
from polyft.deps.traffic import count, model_code_traffic, tile_bytes
from polyft.errors import PolyftError
from polyft.schedule.storage import extents

from . import private_files, runtime_c
from .c_family import TILE, tiled_loops
from .c_statements import instance_flops, native_dtype
from .halves import DTYPES
from .isl_ast import build_ast, call_loops, level, loop_key

# H100 SXM5: HBM3 bandwidth, dense tensor-core peaks, FP32 (non-tensor) peak, SMs, L2, and the
# cost of one kernel launch from the host (launch latency plus the host loop's turn)
H100 = {"dram_bytes_per_s": 3.35e12, "tensor_flops_fp16": 989e12, "tensor_flops_tf32": 494e12,
        "fp32_flops": 67e12, "sms": 132, "l2_bytes": 50 * 2**20, "launch_s": 4e-6,
        "grid_sync_s": 1e-6, "threads_per_sm": 2048, "registers_per_sm": 65536, "shared_per_sm": 228 * 1024,
        "blocks_per_sm": 32}

DRAM_ASSUMPTION = ("DRAM at least: the distinct elements of the inputs read and of the outputs "
                   "written, once each, plus, for an intermediate in global memory larger than the "
                   "L2, its distinct elements written and read once each; an intermediate that fits "
                   "in the L2 and every repeated access are assumed L2 hits")

ROOFLINE_ASSUMPTION = ("time = launches x launch_s + (steps - launches) x grid_sync_s + max(flops / peak, "
                       "bytes / dram_bytes_per_s) / utilisation; steps: the schedule's sequential steps, each "
                       "ending in a launch or a grid barrier; utilisation: the mean over launches of "
                       "min(1, blocks / sms); matmul flops at the precision's tensor peak (fp32: fp32_flops), "
                       "others at fp32_flops; low: bytes = DRAM at least, high: bytes = the global bytes with "
                       "a batch's common loads shared, all from DRAM")

MOVES = ("load", "store")  # operations that move tiles and compute nothing
ARCH = "sm_90"
PTXAS_FLAGS = ["-cubin", "-O3", "-std=c++14", "-Xptxas", "-v"]


@dataclass
class GpuProfile:
    """`kernels`: one row per kernel; `statements`: one row per statement (instances, flops,
    global bytes read and written per call); `buffers`: one row per buffer (placement, bytes,
    global bytes per call); `totals`: the call's totals (a pandas Series); `assumptions`:
    the device numbers the estimates used; `notes`: why a column is None."""

    kernels: pd.DataFrame
    statements: pd.DataFrame
    buffers: pd.DataFrame
    totals: pd.Series
    assumptions: dict
    notes: list = field(default_factory=list)

    def __str__(self) -> str:
        t, mb = self.totals, lambda n: f"{n / 1e6:,.1f}"
        k = self.kernels
        kernels = pd.DataFrame({
            "kernel": k.kernel, "launches": k.launches,
            "blocks": [f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in zip(k.blocks_min, k.blocks_max)],
            "resident": k.resident_blocks, "instances": k.instances_max, "threads": k.threads,
            "smem dyn+static": [f"{d}+{st}" for d, st in zip(k.shared_dynamic, k.shared_static)],
            "regs": k.registers, "spills st/ld": [f"{a}/{b}" for a, b in zip(k.spill_stores, k.spill_loads)],
            "stack": k["stack"]})
        b = self.buffers
        buffers = pd.DataFrame({"buffer": b.buffer, "role": b.role, "placement": b.placement,
                                "stored MB": b.stored_bytes.map(mb), "read MB": b.global_read_bytes.map(mb),
                                "read (shared) MB": b.shared_read_bytes.map(mb),
                                "written MB": b.global_written_bytes.map(mb), "DRAM MB": b.dram_bytes.map(mb)})
        lines = ["kernels (blocks: per launch; resident: blocks that fit at once; instances: the most a band has "
                 "at once):", kernels.to_string(index=False), "",
                 "buffers (bytes per call to and from global memory; shared: a batch's common loads once):",
                 buffers.to_string(index=False), "",
                 "per call:",
                 f"  launches {t.launches}, blocks per launch {t.blocks_min}-{t.blocks_max}, sequential steps "
                 f"(grid barriers) {t.steps}",
                 f"  global MB {mb(t.global_bytes)} per instance, {mb(t.shared_bytes)} with a batch's common loads "
                 f"shared; inputs+outputs MB {mb(t.io_bytes)}: ratio {t.global_ratio:.2f}, {t.shared_ratio:.2f} shared",
                 f"  DRAM MB at least {mb(t.dram_bytes)}: ratio {t.dram_ratio:.2f} to inputs+outputs",
                 f"  GFLOP {t.flops / 1e9:,.2f} (matmul {t.matmul_flops / 1e9:,.2f}); registers max {t.registers_max}, "
                 f"spilled bytes {t.spill_bytes}",
                 f"  roofline time {t.time_low_us / 1e3:,.3f} - {t.time_high_us / 1e3:,.3f} ms",
                 "", "assumptions: " + ", ".join(f"{k}={v:g}" for k, v in self.assumptions.items()),
                 f"  {DRAM_ASSUMPTION}", f"  {ROOFLINE_ASSUMPTION}"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def profile(module, model, schedule, sizes: dict, precision: str = "fp32", **assumptions) -> GpuProfile:
    """The profile of `module`, the CudaModule generated for `model` (deps.model.PolyModel)
    under `schedule` (schedule.Schedule), at `sizes` (every length the model leaves open)."""
    unknown = set(assumptions) - set(H100)
    if unknown:
        raise PolyftError(f"unknown assumptions {sorted(unknown)}; known: {', '.join(H100)}", op="gpu_profile")
    dev = {**H100, **assumptions}
    notes = []
    ptx, why = ptxas(module.source)
    if why:
        notes.append(f"registers, spills, static shared memory and resident blocks are None: {why}")
    rows, grids = [], []
    for k in range(len(module.arities)):
        info = ptx.get(f"polyft_k{k}", {}) if ptx is not None else {}
        resident = resident_blocks(module.threads, info["registers"], module.shared_bytes + info["smem"], dev) \
            if info else None
        mine = [(kk, b, n) for kk, b, n in launches(module, sizes, resident) if kk == k]
        grids += mine
        blocks = [b for _, b, _ in mine if b is not None]
        rows.append(dict(kernel=f"polyft_k{k}", launches=len(mine), blocks_min=min(blocks, default=None),
                         blocks_max=max(blocks, default=None), resident_blocks=resident,
                         instances_max=max((n for _, _, n in mine if n is not None), default=None),
                         threads=module.threads, shared_dynamic=module.shared_bytes, shared_static=info.get("smem"),
                         registers=info.get("registers"), spill_stores=info.get("spill_stores"),
                         spill_loads=info.get("spill_loads"), stack=info.get("stack")))
    kernels = pd.DataFrame(rows)
    on_chip = set(module.layout.local)
    concrete = model if all(p in model.sizes for p in model.params) else build(model.etdg, sizes)
    statements, buffers = _traffic(concrete, module.layout, on_chip, batches(model, schedule), sizes,
                                   dev["l2_bytes"])
    steps = _steps(model, schedule)
    if steps is None:
        notes.append("grid barriers are not in the time: the sequential steps need a program built for these "
                     "lengths (ft.analyze(..., sizes=...) or concrete inputs)")
    totals = _totals(kernels, statements, buffers, grids, steps, dev, precision)
    if len(kernels) == 1:  # the call's bytes and time are the kernel's
        for col in ("global_bytes", "dram_bytes", "flops", "time_low_us", "time_high_us"):
            kernels[col] = [totals[col]]
    else:
        notes.append("global bytes, flops and time are per call (totals), not split among the kernels")
    return GpuProfile(kernels, statements, buffers, totals, dev, notes)


def launches(module, sizes: dict, capacity: int | None = None) -> list:
    """(kernel, blocks, instances) of every launch one call makes: the module's host driver
    run with a launch callback that records them (no kernel runs). The driver asks for the
    most instances its kernel's bands have at once (None: not bounded); as the runtimes do,
    a launch gets at most the `capacity` blocks that are resident at once (None: unknown)."""
    missing = [p for p in module.params if p not in sizes]
    if missing:
        raise PolyftError(f"the GPU profile needs the lengths {missing} (e.g. sizes={{'{missing[0]}': 8}})",
                          op="gpu_profile")
    namespace: dict = {}
    exec(compile(module.host, "<polyft host driver>", "exec"), namespace)
    out = []

    def launch(k, most):
        most = None if most is None else int(most)
        blocks = most if capacity is None else capacity if most is None else min(most, capacity)
        if blocks != 0:  # an empty grid launches nothing
            out.append((k, blocks, most))
    namespace["run"](launch, *[sizes[p] for p in module.params])
    return out


def resident_blocks(threads: int, registers: int, shared: int, dev: dict) -> int:
    """Blocks resident at once on the whole GPU (what a persistent kernel's grid may be): per
    SM the fewest its threads, registers (per warp, in units of 256), shared memory (with the
    1 KB reserved per block) and block slots allow, times the SMs."""
    warps = -(-threads // 32)
    regs = -(-registers * 32 // 256) * 256 * warps
    per_sm = min(dev["threads_per_sm"] // threads, dev["registers_per_sm"] // max(1, regs),
                 dev["shared_per_sm"] // (shared + 1024), dev["blocks_per_sm"])
    return per_sm * dev["sms"]


_PTXAS = {"registers": r"Used (\d+) registers", "smem": r"(\d+) bytes smem", "stack": r"(\d+) bytes stack frame",
          "spill_stores": r"(\d+) bytes spill stores", "spill_loads": r"(\d+) bytes spill loads"}


def ptxas(source: str, arch: str = ARCH) -> tuple:
    """(kernel name -> {registers, smem, stack, spill_stores, spill_loads}, None), or (None,
    why) where nvcc is absent or fails. Cached on disk by the source's hash (nvcc takes
    seconds per module)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None, "nvcc is not on PATH"
    key = hashlib.sha256("\0".join([source, arch, *PTXAS_FLAGS]).encode()).hexdigest()[:20]
    cached = os.path.join(runtime_c.cache_dir(), f"ptxas_{key}.json")
    try:
        got = private_files.open_entry(cached, limit=1 << 20)
        if got is not None:
            with os.fdopen(got[0], "rb") as f:
                return json.loads(private_files.read_fd(f.fileno(), got[1].st_size)), None
    except (OSError, ValueError, private_files.NotAFile):
        pass  # measured again, and written over
    with tempfile.TemporaryDirectory(prefix="polyft-ptxas-") as d:
        src = os.path.join(d, "module.cu")
        with open(src, "w") as f:
            f.write(source)
        r = subprocess.run([nvcc, f"-arch={arch}", *PTXAS_FLAGS, src, "-o", os.path.join(d, "module.cubin")],
                           capture_output=True, text=True)
    if r.returncode:
        return None, f"nvcc failed: {(r.stderr or r.stdout).strip()[-500:]}"
    out, name = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Function properties for (\w+)", line) or re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            out.setdefault(name, {k: 0 for k in _PTXAS})
            continue
        for k, pattern in _PTXAS.items():
            m = re.search(pattern, line)
            if m and name is not None:
                out[name][k] = int(m.group(1))
    tmp = f"{cached}.{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        json.dump(out, f)
    os.replace(tmp, cached)  # atomic: concurrent profiles write equivalent files
    return out, None


def batches(model, schedule) -> dict:
    """statement name -> (dim position, first iteration, instances per batch) for the
    statements the CUDA target runs a batch of instances at a time: those under the loop
    c_family.tiled_loops picks (at most TILE instances of it per block and call, counted from
    its lower bound; a bound that is not a constant leaves the statement out)."""
    ast = build_ast(schedule.map, model.context)  # as the target builds it
    tiles = tiled_loops(model.etdg, ast, schedule.parallel, TILE)
    out = {}
    for name, loops in call_loops(ast):
        for lp in loops:
            init = lp.for_get_init()
            if loop_key(lp) not in tiles or init.get_type() != isl.ast_expr_type.int:
                continue
            m, d = schedule.per_statement[name], level(lp)
            for p in range(m.dim(isl.dim_type.in_)):  # the statement dim the tiled loop runs over
                same = isl.Constraint.equality_alloc(isl.LocalSpace.from_space(m.get_space())).set_coefficient_val(
                    isl.dim_type.in_, p, 1).set_coefficient_val(isl.dim_type.out, d, -1)
                if m.is_subset(m.add_constraint(same)):
                    out[name] = (p, init.get_val().to_python(), tiles[loop_key(lp)])
    return out


def _shared_pairs(domain: isl.Set, batch: tuple, sizes: dict) -> int:
    """Loads of a tile that every instance of a batch reads alike: one per batch, i.e. the
    points of `domain` with its batched dim replaced by the batch's number."""
    p, lo, tb = batch
    n = domain.dim(isl.dim_type.set)
    xs = [f"x{k}" for k in range(n)]
    ys = [f"floor(({x} - ({lo})) / {tb})" if k == p else x for k, x in enumerate(xs)]
    space = domain.get_space()
    params = [space.get_dim_name(isl.dim_type.param, k) for k in range(space.dim(isl.dim_type.param))]
    to_batch = isl.Map(f"[{', '.join(params)}] -> {{ [{', '.join(xs)}] -> [{', '.join(ys)}] }}")
    return count(domain.reset_tuple_id().apply(to_batch), sizes)


def _traffic(model, layout, on_chip: set, batched: dict, sizes: dict, l2_bytes: int) -> tuple:
    """(statements, buffers) tables: global bytes per call per statement and per buffer (the
    accesses to buffers kept on chip left out): `global_*` every access of every instance
    moving its tile (deps.traffic's code traffic); `shared_*` the same with a load that all
    instances of a batch read alike (it does not use the batched dim) moved once per batch;
    distinct elements per buffer for the DRAM estimate."""
    code = model_code_traffic(model)
    stmts = {st.name: st for st in model.etdg.statements}

    def stored(name, n):  # bytes of float32 elements as buffer `name` stores them (emit.halves: narrow)
        return n * DTYPES[layout.narrow[name]].itemsize // 4 if name in layout.narrow else n
    per_st = {name: dict(statement=name, instances=count(d, sizes), global_read_bytes=0, global_written_bytes=0,
                         shared_read_bytes=0) for name, d in model.domains.items()}
    per_buf = {}  # buffer name -> [read, written, shared read]
    elements = {}  # (buffer name, kind) -> isl set of the elements accessed
    for (name, am, m), a in zip(model.accesses, code.accesses):
        buf, st = a.buffer, stmts[name]
        nbytes = shared = stored(buf, a.bytes)
        if a.kind == "read" and name in batched:
            dim = st.dims[batched[name][0]]
            uses = set().union(*((ix.pos.dims if am.is_gather else ix.dims) for ix in am.index)) if am.index else set()
            if dim not in uses:
                shared = _shared_pairs(m.domain(), batched[name], sizes) * stored(buf, a.tile_bytes)
        key = (buf, a.kind)
        elements[key] = m.range() if key not in elements else elements[key].union(m.range())
        row = per_buf.setdefault(buf, [0, 0, 0])
        row[a.kind == "write"] += nbytes
        row[2] += shared if a.kind == "read" else 0
        if buf not in on_chip:
            if a.kind == "read":
                per_st[name]["global_read_bytes"] += nbytes
                per_st[name]["shared_read_bytes"] += shared
            else:
                per_st[name]["global_written_bytes"] += nbytes
    rows = []
    for b in layout.buffers:
        tb = stored(b.name, tile_bytes(b))
        read, written, shared = per_buf.get(b.name, (0, 0, 0))
        distinct_read = count(elements[b.name, "read"], sizes) * tb if (b.name, "read") in elements else 0
        distinct_written = count(elements[b.name, "write"], sizes) * tb if (b.name, "write") in elements else 0
        full = int(np.prod(extents(b.dims, sizes), dtype=np.int64)) * tb
        kept = stored(b.name, int(np.prod(layout.cells_shape(b, sizes), dtype=np.int64)) * native_dtype(b.dtype).itemsize)
        placement = "shared" if b.name in on_chip else "global"
        if placement == "shared":
            dram = 0
        elif b.kind in ("input", "const", "index", "lengths"):
            dram = distinct_read
        elif b.kind == "output":
            dram = distinct_written
        else:
            dram = distinct_written + distinct_read if kept > l2_bytes else 0
        glob = placement == "global"
        rows.append(dict(buffer=b.name, role=b.kind, placement=placement, element=layout.narrow.get(b.name, b.dtype),
                         full_bytes=full, stored_bytes=kept,
                         global_read_bytes=read if glob else 0, shared_read_bytes=shared if glob else 0,
                         global_written_bytes=written if glob else 0, distinct_read_bytes=distinct_read,
                         distinct_written_bytes=distinct_written, dram_bytes=dram))
    st = pd.DataFrame(list(per_st.values()))
    flops = {s.name: (instance_flops([op for op in s.ops if op.op not in MOVES]),
                      instance_flops([op for op in s.ops if op.op == "matmul"])) for s in model.etdg.statements}
    st["flops"] = [flops[n][0] * i for n, i in zip(st.statement, st.instances)]
    st["matmul_flops"] = [flops[n][1] * i for n, i in zip(st.statement, st.instances)]
    return st, pd.DataFrame(rows)


def _steps(model, schedule) -> int | None:
    """The schedule's sequential steps (None where it was built without the lengths:
    schedule.sequential_steps needs them)."""
    return schedule.sequential_steps if all(p in model.sizes for p in model.params) else None


def _totals(kernels, statements, buffers, grids, steps, dev: dict, precision: str) -> pd.Series:
    io = int(buffers.full_bytes[buffers.role.isin(["input", "output"])].sum())
    read, written = int(buffers.global_read_bytes.sum()), int(buffers.global_written_bytes.sum())
    shared = int(buffers.shared_read_bytes.sum()) + written
    dram = int(buffers.dram_bytes.sum())
    flops, mm = int(statements.flops.sum()), int(statements.matmul_flops.sum())
    peak = {"fp32": dev["fp32_flops"], "tf32": dev["tensor_flops_tf32"]}.get(precision, dev["tensor_flops_fp16"])
    compute = mm / peak + (flops - mm) / dev["fp32_flops"]
    blocks = [b for _, b, _ in grids if b is not None]
    util = float(np.mean([min(1.0, b / dev["sms"]) for b in blocks])) if blocks else 1.0
    overhead = len(grids) * dev["launch_s"] + max(0, (steps or 0) - len(grids)) * dev["grid_sync_s"]
    regs = [r for r in kernels.registers if r is not None]
    spills = [s for s in list(kernels.spill_stores) + list(kernels.spill_loads) if s is not None]
    return pd.Series(dtype=object, data=dict(
        launches=len(grids), blocks_min=min(blocks, default=0), blocks_max=max(blocks, default=0),
        global_bytes=read + written, global_read_bytes=read, global_written_bytes=written, shared_bytes=shared,
        io_bytes=io, shared_ratio=shared / io if io else float("nan"),
        global_ratio=(read + written) / io if io else float("nan"), dram_bytes=dram,
        dram_ratio=dram / io if io else float("nan"), flops=flops, matmul_flops=mm,
        registers_max=max(regs) if regs else None, spill_bytes=sum(spills) if spills else None,
        utilisation=util, steps=steps,
        time_low_us=1e6 * (overhead + max(compute, dram / dev["dram_bytes_per_s"]) / util),
        time_high_us=1e6 * (overhead + max(compute, shared / dev["dram_bytes_per_s"]) / util)))
