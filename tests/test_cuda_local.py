"""The CUDA target keeps the storage's "local" buffers in each block's shared memory (after
the tile arena) where a block owns them: one band of the persistent kernel calls every
statement that touches the buffer, and each element lives within one instance of the band. Checked on the emulator against eager execution,
with nvcc, on a case too large for shared memory (back to global memory), and with a spoiled
placement (two live buffers at one address), which the comparison must catch."""
import re
import shutil

import numpy as np
import pytest

import polyft as ft
from polyft.emit.cuda_arena import SHARED_LIMIT
from polyft.emit.cuda_target import ALIGN, LOCAL_BUDGET, CudaTarget
from polyft.schedule.storage import Storage
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from test_cuda import _nvcc

pytestmark = pytest.mark.usefixtures("compile_cache")

TOL = 1e-5
NAMES = list(WORKLOADS)
# the workloads that keep buffers in shared memory at the small preset, "auto" schedule (the
# others: no local buffer, or one whose elements outlive a band's instance: the dilated and
# grid RNNs' states cross the grid barriers of their sequential loops)
SHARED = ["stacked_lstm", "b2b_gemm", "flash_attention"]
# a kernel's line placing a local buffer: ft_own.b<slot> = (T*)(ft_arena + <offset>);  /* <name>: <n> bytes ...
PLACE = re.compile(r"ft_own\.b(\d+) = \([\w ]+\*\)\(ft_arena \+ (\d+)\);  /\* (\w+): (\d+) bytes")


def reduce_states(prog) -> set:
    """The intermediate buffers a reduce writes (flash attention's m, l, o; b2b_gemm's
    accumulator)."""
    out = set()
    for st in prog.etdg.statements:
        if any(d.op == "reduce" for d in st.dims):
            out |= {am.buffer.resolve().name for am in st.writes if am.buffer.resolve().kind == "intermediate"}
    return out


def places(prog_or_module) -> dict:
    """Buffer name -> (offset, bytes) in the block's dynamic shared memory, from the source."""
    return {m[2]: (int(m[1]), int(m[3])) for m in PLACE.findall(prog_or_module.source)}


def check_places(module, storage):
    """Every local buffer is placed, 64-byte aligned, inside the block's shared memory; two of
    one band that Storage.regions does not group (may be live at once) do not overlap."""
    at = places(module)
    assert set(at) == set(module.layout.local)
    assert module.shared_bytes <= SHARED_LIMIT
    for name, (off, n) in at.items():
        assert off % ALIGN == 0 and n > 0 and off + n <= module.shared_bytes, (name, off, n)
    group = {name: j for j, g in enumerate(storage.regions(module.layout.local)) for name in g}
    for a in at:
        for b in at:
            if a < b and group[a] != group[b] and module.band_of[a] == module.band_of[b]:
                (oa, na), (ob, nb) = at[a], at[b]
                assert oa + na <= ob or ob + nb <= oa, (a, at[a], b, at[b])


@pytest.mark.parametrize("schedule", ["auto", "original"])
@pytest.mark.parametrize("name", NAMES)
def test_local_buffers_in_shared_memory_equal_eager(name, schedule, record_property):
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *mod.inputs("small", seed=41), target="cuda-emulated", schedule=schedule)
    local = prog.layout.local
    record_property("local", dict(local))
    print(f"{name} {schedule}: local {local}, shared memory {prog.module.shared_bytes} bytes")
    for seed in (42, 43):  # fresh data, twice on one compiled program
        fresh = mod.inputs("small", seed=seed)
        err = rel_error(prog(*fresh), mod.program(*fresh))
        assert err < TOL, f"local {local}: relative error {err:.2e}"
    for n, width in local.items():
        s = prog.storage.buffers[n]
        assert s.placement == "local" and width in s.local
    check_places(prog.module, prog.storage)
    assert ("ft_own" in prog.source) == bool(local)
    if schedule == "auto" and name in ("flash_attention", "b2b_gemm"):
        states = reduce_states(prog)
        assert len(states) == (3 if name == "flash_attention" else 1)
        assert states <= set(local), (states, local)


@pytest.mark.parametrize("name", ["flash_attention", "b2b_gemm"])
def test_memory_reports_shared_buffers_as_local(name):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=44)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    mem = prog.memory().set_index("buffer")
    states = reduce_states(prog)
    for n in states:
        row = mem.loc[n]
        assert row.placement == "local" and row.allocated_bytes == 0 and row.local_bytes > 0, row
    for b in prog.layout.buffers:
        if b.kind == "intermediate":
            local = prog.layout.batch(b) is not None
            assert mem.loc[b.name].placement == ("local" if local else "global")
            assert (mem.loc[b.name].allocated_bytes == 0) == local
            if local:
                assert prog.layout.shape(b, {}) == (0,)
                cells = int(np.prod(prog.layout.cells_shape(b, {}))) * np.dtype(b.dtype).itemsize
                assert mem.loc[b.name].local_bytes == cells == places(prog)[b.name][1]
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name, preset", [(n, "small") for n in SHARED])
def test_nvcc_compiles_local_buffers(name, preset, tmp_path):
    """The small preset from concrete inputs."""
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.inputs(preset, seed=0))
    gen = CudaTarget().generate(prog.model, prog.schedule, storage=prog.storage)
    check_places(gen, prog.storage)
    if preset == "small" and name in ("flash_attention", "b2b_gemm"):
        assert reduce_states(prog) <= set(gen.layout.local), gen.layout.local
    assert gen.layout.local, f"{name} keeps no buffer in shared memory"
    assert "const ctx_t* c = &ft_own;" in gen.source
    _nvcc(gen.source, tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name", ["flash_attention", "b2b_gemm"])
def test_reduce_states_stay_on_chip_at_the_paper_shape(name, tmp_path):
    """From the paper's specs (unknown lengths): the band over B x NH x TQ (flash attention)
    or the row tiles (b2b) gives each block one instance, whose cells of the running max, sum
    and output (the accumulator) are a few tiles, so they fit beside the tiles within
    LOCAL_BUDGET: the batch of query tiles is given up for them. nvcc compiles it."""
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("paper"))
    gen = CudaTarget().generate(prog.model, prog.schedule, storage=prog.storage)
    check_places(gen, prog.storage)
    assert reduce_states(prog) <= set(gen.layout.local), gen.layout.local
    assert gen.shared_bytes <= LOCAL_BUDGET
    _nvcc(gen.source, tmp_path)


@pytest.mark.parametrize("sizes", [dict(B=2, NH=3, Lq=12, Lk=20), dict(B=1, NH=1, Lq=4, Lk=4)])
def test_instance_cells_equal_eager(sizes):
    """Flash attention compiled from specs keeps one instance's cells per block (moduli over
    the query tiles of its batch, not every head's); at other lengths than the specs' the
    result still equals eager, on grids of 1 and 3 blocks."""
    mod = WORKLOADS["flash_attention"]
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
    assert reduce_states(prog) <= set(prog.layout.local)
    for n, batch in prog.layout.local.items():
        cells = prog.storage.buffers[n].cell_dims(batch)
        assert cells[:3] == [1, 1, batch.width], (n, cells)  # B, NH dropped; a batch of query tiles
    inputs = mod.inputs("small", seed=49, **sizes)
    for blocks in (1, 3):
        prog._run.backend.max_blocks = blocks
        assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL


def test_too_large_for_shared_memory_falls_back_to_global():
    """Flash attention with [64, 256] output tiles: the tiles alone leave too little shared
    memory for the states of a block's query tiles, so the largest go back to global memory
    (allocated by the caller), and the result still equals eager."""
    mod = WORKLOADS["flash_attention"]
    shape = dict(B=1, NH=1, Lq=128, Lk=128, tq=64, tk=64, d=256)
    inputs = mod.inputs("small", seed=45, **shape)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    storage_local = {n for n, s in prog.storage.buffers.items() if s.placement == "local"}
    local = set(prog.layout.local)
    back = storage_local - local
    assert back, "every local buffer fit: the case does not test the fallback"
    check_places(prog.module, prog.storage)
    mem = prog.memory().set_index("buffer")
    for n in back:
        assert mem.loc[n].placement == "global" and mem.loc[n].allocated_bytes > 0
        b = prog.storage.buffers[n].buffer
        assert prog.layout.shape(b, {}) != (0,) and n not in places(prog)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL


def test_spoiled_placement_is_caught(monkeypatch):
    """Flash attention's running max, sum and output are live at once: each has its own
    region. Put every local buffer in one region (one address) and the emulated result is
    wrong, so the comparisons above can fail."""
    mod = WORKLOADS["flash_attention"]
    inputs = mod.inputs("small", seed=46)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL
    assert len({off for off, _ in places(prog).values()}) == len(prog.layout.local) >= 3

    monkeypatch.setattr(Storage, "regions", lambda self, widths: [list(widths)])
    spoiled = ft.compile(mod.program, *inputs, target="cuda-emulated")
    assert set(spoiled.layout.local) == set(prog.layout.local)
    assert len({off for off, _ in places(spoiled).values()}) == 1  # all at one address
    assert rel_error(spoiled(*inputs), mod.program(*inputs)) > TOL


@pytest.mark.parametrize("name, sizes", [("flash_attention", dict(B=3, NH=3)), ("b2b_gemm", dict(M=72))])
def test_last_block_runs_a_partial_batch(name, sizes):
    """More slot iterations than one batch, not a multiple of it: the last instance's batch is
    short, and every instance finds its shared memory poisoned by the emulator."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=47, **sizes)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    assert prog.layout.local and "+ 15) / 16" in prog.source
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL


@pytest.mark.parametrize("name, sizes", [("b2b_gemm", dict(M=72)), ("flash_attention", dict(B=3, Lq=16))])
def test_compiled_from_specs_sizes_shared_memory_by_moduli(name, sizes):
    """Unknown lengths: a block's cells count their moduli whole, the runtime takes the
    strides of the cells for the lengths of each call."""
    mod = WORKLOADS[name]
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
    assert prog.module.params and prog.layout.local
    check_places(prog.module, prog.storage)
    for overrides in ({}, sizes):
        inputs = mod.inputs("small", seed=48, **overrides)
        assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL, overrides


def test_a_band_kept_whole_for_a_buffer_that_does_not_fit_is_split_again():
    """BigBird: its band is kept whole so that the window buffer stays on chip where it fits
    (the small preset); at the paper's d=512 the tiles alone pass LOCAL_BUDGET, so the buffer
    goes to global memory and the band is split after all: no loop runs serially for it."""
    mod = WORKLOADS["bigbird"]
    small = ft.analyze(mod.program, *mod.specs("small"))
    gen = CudaTarget().generate(small.model, small.schedule, storage=small.storage)
    (kept,) = [why.split()[1] for why in gen.serial]
    assert kept in gen.layout.local
    paper = ft.analyze(mod.program, *mod.specs("paper"))
    gen = CudaTarget().generate(paper.model, paper.schedule, storage=paper.storage)
    assert kept not in gen.layout.local and gen.serial == ()
