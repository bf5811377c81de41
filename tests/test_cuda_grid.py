"""The CUDA target's persistent kernel (emit/cuda_host.py): every parallel loop of a band is
flattened into the blocks' grid-stride loop, the whole schedule is one launch per call, and
the grid barrier between bands is what makes it correct. Checked on the emulator, whose
blocks run together as fibers, at grids of 1, 2 and 3 blocks (the kernel takes any grid)."""
import re

import pytest

import polyft as ft
from polyft.emit import runtime_cuda
from polyft.emit.cuda_target import CudaTarget
from polyft.emit.runtime_cuda import EmulatedBackend
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from test_cuda import _has_gpu

pytestmark = pytest.mark.usefixtures("compile_cache")

TOL = 1e-5
# the lengths (ISL parameters) of the paper's shapes, from each workload's paper preset
PAPER_LENGTHS = {
    "stacked_rnn": lambda p: dict(N=p["N"], D=p["D"], L=p["L"]),
    "stacked_lstm": lambda p: dict(N=p["N"], D=p["D"], L=p["L"]),
    "dilated_rnn": lambda p: dict(N=p["N"], L=p["L"]),
    "grid_rnn": lambda p: dict(N=p["N"], D=p["D"], L1=p["L1"], L2=p["L2"]),
    "b2b_gemm": lambda p: dict(MT=p["M"] // p["tm"], NT=p["N"] // p["tn"]),
    "flash_attention": lambda p: dict(B=p["B"], NH=p["NH"], TQ=p["Lq"] // p["tq"], TK=p["Lk"] // p["tk"]),
    "bigbird": lambda p: dict(B=p["B"], NB=p["nb"]),
}
H100_SMS = 132


@pytest.fixture(scope="module")
def compiled():
    """name -> the workload compiled from its small specs (once per module)."""
    return {name: ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
            for name, mod in WORKLOADS.items()}


@pytest.mark.parametrize("blocks", [1, 2, 3])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_equals_eager_on_any_grid_in_one_launch(name, blocks, compiled):
    mod, prog = WORKLOADS[name], compiled[name]
    backend = prog._run.backend
    backend.max_blocks = blocks
    before = backend.launched
    inputs = mod.inputs("small", seed=60 + blocks)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL
    assert backend.launched == before + 1
    assert prog.host_driver.count("launch(") == 1


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs PyCUDA and a CUDA GPU (scripts/gpu_session.sh)")
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_gpu_persistent_kernel_equals_eager_in_one_launch(name):
    """On a GPU: one launch per call on as many resident blocks as the bands can use (the
    grid barrier with real concurrency)."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=80)
    prog = ft.compile(mod.program, *inputs, target="cuda")
    backend = prog._run.backend
    sms = backend.device.get_attribute(backend.drv.device_attribute.MULTIPROCESSOR_COUNT)
    assert backend.capacity(0) >= sms  # at least a block on every SM
    for calls in (1, 2):
        assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL
        assert backend.launched == calls


def _without_grid_barriers(source: str) -> str:
    kernel = source.index('extern "C" __global__')
    return source[:kernel] + source[kernel:].replace("ft_grid_sync();", ";")


@pytest.mark.parametrize("name", ["stacked_lstm", "dilated_rnn", "grid_rnn"])
def test_a_missing_grid_barrier_gives_a_wrong_result(name, compiled):
    """The kernel's grid barriers removed: one block still computes the right result (it runs
    every band in order), several do not (a block runs ahead into the next step and reads
    what the others have not written yet), so the comparisons above can fail."""
    mod, prog = WORKLOADS[name], compiled[name]
    inputs = mod.inputs("small", seed=70)
    want = mod.program(*inputs)

    def spoiled(blocks):  # a program of its own per grid: a call's plan keeps the grid its runtime had
        p = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
        p._run.backend = EmulatedBackend(_without_grid_barriers(prog.source), prog.module.arities)
        p._run.backend.max_blocks = blocks
        return p(*inputs)
    assert rel_error(spoiled(1), want) < TOL
    assert not rel_error(spoiled(2), want) < TOL


def _blocks_at(module, lengths: dict):
    """The blocks the host driver asks for at `lengths` (before the runtime's cap)."""
    namespace: dict = {}
    exec(module.host, namespace)
    asked = []
    namespace["run"](lambda k, blocks: asked.append(blocks), *[lengths[p] for p in module.params])
    assert len(asked) == 1
    return asked[0]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_parallel_loop_is_mapped_at_the_paper_shape(name):
    """No parallel loop runs serially inside a block except to keep a buffer on chip (the
    gates of the LSTMs' cells), and the bands have at least as many instances as an H100 has
    SMs at the paper's sizes (b2b_gemm's 256 row tiles: one a block, unbatched so that its
    accumulator stays on chip)."""
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("paper"))
    gen = CudaTarget().generate(prog.model, prog.schedule, storage=prog.storage)
    assert all(why.endswith("so that it stays on chip") for why in gen.serial), gen.serial
    assert _blocks_at(gen, PAPER_LENGTHS[name](mod.PRESETS["paper"])) >= H100_SMS


def test_inner_parallel_loops_join_the_band():
    """grid_rnn: the wavefront's cells (c4, c5: a triangle whose bounds name c4) are flattened
    with the batch tiles over their bounding box, each instance guarded by the loop's bounds;
    dilated_rnn: each dilation's parallel chains (c4) join the batch tiles, in bands inside
    the sequential loop over a chain's steps (one grid barrier a step)."""
    grid = ft.analyze(WORKLOADS["grid_rnn"].program, *WORKLOADS["grid_rnn"].specs("small"))
    src = CudaTarget().generate(grid.model, grid.schedule, storage=grid.storage).source
    assert re.search(r"const long c5 = .*ft_r % ft_n0_2", src) and re.search(r"if \(.*c5 <= min\(L1 - 1, c3 - c4\)", src)
    dil = ft.analyze(WORKLOADS["dilated_rnn"].program, *WORKLOADS["dilated_rnn"].specs("small"))
    src = CudaTarget().generate(dil.model, dil.schedule, storage=dil.storage).source
    assert src.count("const long c4 = ") == 2  # the two dilated layers of the small preset
    assert re.search(r"for \(long c3 = 0; c3 < L / 2; c3 \+= 1\)\s*\{\s*const long ft_n0_0", src)


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_independent_statements_share_one_band(blocks):
    """dilated_rnn traced from arrays: its schedule runs every layer at each step (a
    hyperplane over the layers), the layers' statements told apart by a parallel time dim:
    they form one band (instances of each layer's statement one after the other in the flat
    index, one grid barrier) instead of a band and a barrier each; equal to eager."""
    mod = WORKLOADS["dilated_rnn"]
    inputs = mod.inputs("small", seed=72)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    kernel = prog.source.split('extern "C" __global__')[1]
    assert kernel.count("ft_grid_sync();") == 2 and "ft_r -= ft_t2;" in kernel
    prog._run.backend.max_blocks = blocks
    assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL


def test_emulated_grid_defaults_to_a_few_blocks(compiled):
    assert compiled["b2b_gemm"]._run.backend.max_blocks == runtime_cuda.EMULATED_BLOCKS > 1


def test_a_parallel_loop_under_a_loop_naming_the_band_runs_serially_with_its_reason():
    """stacked_rnn skewed by the sentence (the wavefront of sentence i starts at step i): the
    steps' loop has bounds naming the band's iterator, so it cannot be interchanged outward;
    the layer loop inside it runs serially in the sentence's block, with the reason in the
    kernel and in `serial`, and the result equals eager on any grid."""
    mod = WORKLOADS["stacked_rnn"]
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated",
                      schedule="{ S_b0[i, j, k] -> [i, k + j + i, j] }")
    assert prog.schedule.parallel == [True, False, True]
    (why,) = prog.module.serial
    assert "the loop over c1" in why and "bounds naming the band's iterators" in why
    assert f"/* parallel loop not mapped to blocks: {why} */" in prog.source
    inputs = mod.inputs("small", seed=71)
    for blocks in (1, 3):
        prog._run.backend.max_blocks = blocks
        assert rel_error(prog(*inputs), mod.program(*inputs)) < TOL
