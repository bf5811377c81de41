"""The emulator's shared-memory race check (emit/race_check.py, `prog.emulated_races`): a
kernel with a read and a write of the same shared cells in one barrier interval by different
threads is reported, though its emulated result cannot show it; the seven workloads, at the
GPU's 256 threads a block, have none and compute what eager execution does."""
import dataclasses

import pytest

import polyft as ft
from polyft.emit import race_check
from polyft.emit.cuda_statements import TOLERANCE
from polyft.emit.runtime_cuda import EmulatedRuntime
from polyft.errors import PolyftError
from polyft.experiments.gpu_modules import TENSOR_CORE_SIZES
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS


def _without_barrier_after_first_gemm(source: str) -> str:
    """The block barrier after the first GEMM of the statements removed: the next GEMM reads
    the tile the first one's threads write, in the same interval."""
    library_end = source.index("}  // namespace ft")
    gemm = source.index("ft::gemm_f32<", library_end)
    barrier = source.index("__syncthreads();", gemm)
    return source[:barrier] + ";" + source[barrier + len("__syncthreads();"):]


def test_a_read_and_a_write_in_one_interval_are_found():
    mod = WORKLOADS["b2b_gemm"]
    inputs = mod.inputs("small", seed=31)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    assert prog.emulated_races(*inputs) == []
    module = prog._cuda_module("fp32")
    racy = dataclasses.replace(module, source=_without_barrier_after_first_gemm(module.source))
    values, given = prog._checked(prog._positional(inputs, {}))

    def arrays():
        storage = prog._allocated(values, given, racy.layout)
        return storage, [storage[b] for b in racy.layout.buffers]
    storage, bufs = arrays()
    EmulatedRuntime(racy)(bufs, values)  # threads in ascending order, switched at barriers only
    assert rel_error(prog._result(storage), mod.program(*inputs)) < 1e-5  # the race does not show
    _, bufs = arrays()
    found = race_check.races(racy, bufs, values)
    assert found and all(" of block " in r and "shared byte" in r for r in found)
    assert any(r.split(": ")[1] in ("read after write", "write after read") for r in found)


def test_races_need_the_emulator():
    mod = WORKLOADS["b2b_gemm"]
    prog = ft.compile(mod.program, *mod.specs("small"), target="c")
    with pytest.raises(PolyftError, match="emulated_races"):
        prog.emulated_races(*mod.inputs("small"))


@pytest.mark.slow
@pytest.mark.parametrize("name, precision", [(n, "fp32") for n in WORKLOADS]
                         + [(n, "fp16") for n in TENSOR_CORE_SIZES])
def test_workloads_have_no_shared_memory_races(name, precision):
    """At the block size a GPU runs (256 threads; on tensor cores in fp16): no races, and the
    result is eager's."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=32, **(TENSOR_CORE_SIZES[name] if precision == "fp16" else {}))
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated", precision=precision)
    module = prog._cuda_module(precision)
    assert module.threads == 256
    values, given = prog._checked(prog._positional(inputs, {}))
    storage = prog._allocated(values, given, module.layout)
    assert race_check.races(module, [storage[b] for b in module.layout.buffers], values) == []
    assert rel_error(prog._result(storage), mod.program(*inputs)) < TOLERANCE[precision]
