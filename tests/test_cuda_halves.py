"""Half-width storage under precision fp16 / bf16 (emit/halves.py): the float32 buffers in
global memory hold __half / __nv_bfloat16, tiles and arithmetic stay float32. The emulator
rounds what is stored as the GPU does (checked against torch's conversions and against a
numpy model of every rounding), all seven workloads equal eager within the precision's
tolerance, the profile's global bytes halve (and match the emulator's own count), and nvcc
compiles the half-width kernels for sm_80 and sm_90."""
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import polyft as ft
from polyft.emit.cuda_statements import TOLERANCE
from polyft.emit.cuda_target import CudaTarget
from polyft.emit.halves import DTYPES, STORAGE, from_storage, to_storage
from polyft.experiments.deps_time import lengths
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

from test_cuda import TARGETS, TENSOR_CORE_SIZES
from test_gpu_profile import _by_buffer, _check_counts

HALVES = list(STORAGE)
TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _round(x, precision):
    """x rounded to the precision's storage, by torch (an implementation independent of ours)."""
    return torch.from_numpy(np.asarray(x, np.float32)).to(TORCH[precision]).to(torch.float32).numpy()


@pytest.mark.parametrize("precision", HALVES)
def test_host_conversions_round_as_torch(precision):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-6, 6, 4096),
                        np.float32([0.0, -0.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
                                    1.0 + 3 * 2.0 ** -8, 65504.0, 70000.0, np.inf, -np.inf])]).astype(np.float32)
    h = to_storage(x, STORAGE[precision])
    assert h.dtype == DTYPES[STORAGE[precision]] and h.nbytes == x.nbytes // 2
    back = from_storage(h, STORAGE[precision])
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, _round(x, precision))  # ties to even, overflow to inf
    assert np.isnan(from_storage(to_storage(np.float32([np.nan]), STORAGE[precision]), STORAGE[precision]))[0]


def _b2b_rounded(a_tiles, b_tiles, c_tiles, precision):
    """b2b_gemm as the half-width kernel computes it: inputs stored rounded, a @ b in float32
    then rounded as the second GEMM's operand, the sum over N in a float32 accumulator kept
    on chip, the output stored rounded."""
    r = lambda x: _round(x, precision).astype(np.float64)  # noqa: E731
    a, b, c = (t.to_numpy() for t in (a_tiles, b_tiles, c_tiles))
    out = [sum(r(r(a[i]) @ r(b[n])) @ r(c[n]) for n in range(len(b))) for i in range(len(a))]
    return _round(np.array(out), precision)


@pytest.mark.parametrize("precision", HALVES)
def test_the_emulator_rounds_what_is_stored_as_the_gpu(precision):
    """Back-to-back GEMMs on tensor cores, the weights multiplied as stored: every output
    element within one unit in the last place of the storage format of the model above
    (only float32 summation order differs), and the storage really narrow."""
    mod = WORKLOADS["b2b_gemm"]
    inputs = mod.inputs("small", seed=3, **TENSOR_CORE_SIZES["b2b_gemm"])
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated", precision=precision)
    h = STORAGE[precision]
    assert set(prog.layout.narrow) == {"a_tiles", "b_tiles", "c_tiles", "d_tiles"}
    assert set(prog.layout.narrow.values()) == {h} and re.search(rf"\b{h} \*b0;", prog.source)
    assert f"ft::gemm_tc<{h}," in prog.source and f"ft::In<{h}>" in prog.source
    got = prog(*inputs).to_numpy()
    want = _b2b_rounded(*inputs, precision)
    # the gap to the value one relative step (2^-10, 2^-7) above: one or two units in the last place
    ulp = _round(np.abs(want) * (1 + 2.0 ** (-7 if precision == "bf16" else -10)), precision) - np.abs(want)
    assert np.all(np.abs(got - want) <= ulp)
    assert rel_error(got, want) < 1e-3
    assert rel_error(got, mod.program(*inputs)) > 1e-5  # not float32 storage


def _narrow_expected(prog) -> set:
    """The float32 buffers in global memory: all should be stored narrow in these workloads."""
    return {b.name for b in prog.layout.buffers if b.dtype == "float32" and not prog.layout.batch(b)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", HALVES)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workloads_equal_eager_with_half_storage(name, precision, target):
    """Every float32 buffer in global memory (inputs, outputs, intermediates; constant pieces
    of loads as half constants) is narrow; on-chip state stays float32; the result is within
    the precision's tolerance of eager float32, and really rounded."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5, **TENSOR_CORE_SIZES.get(name, {}))
    prog = ft.compile(mod.program, *inputs, target=target, precision=precision)
    assert set(prog.layout.narrow) == _narrow_expected(prog) != set()
    assert not set(prog.layout.narrow) & set(prog.layout.local)
    err = rel_error(prog(*inputs), mod.program(*inputs))
    assert 1e-5 < err < TOLERANCE[precision]


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_profile_bytes_halve_and_match_the_emulator_count(name):
    """Under fp16 every narrow buffer's global bytes are half its fp32 bytes (the rest
    unchanged), and the emulator's count of every load and store agrees with the profile."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=6)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated", precision="fp16")
    _, half = _check_counts(prog, mod.program, inputs, TOLERANCE["fp16"])
    full = ft.analyze(mod.program, *inputs).gpu_profile(precision="fp32")
    h, f = _by_buffer(half.buffers), _by_buffer(full.buffers)
    for name_, row in h.items():
        k = 2 if row.element == "__half" else 1
        for col in ("global_read_bytes", "global_written_bytes", "shared_read_bytes", "dram_bytes", "full_bytes"):
            assert getattr(row, col) * k == getattr(f[name_], col), (name_, col)
    assert 2 * half.totals.global_bytes == full.totals.global_bytes > 0
    assert 2 * half.totals.io_bytes == full.totals.io_bytes


def test_paper_shape_bytes_halve_with_state_on_chip():
    """Flash attention at the paper's shape: under fp16 its running max, sum and output stay
    on chip as in fp32 (the GEMMs take smaller tiles to leave them room), so its global
    bytes are exactly half."""
    mod = WORKLOADS["flash_attention"]
    prog = ft.analyze(mod.program, *mod.specs("paper"), sizes=lengths("flash_attention", "paper"))
    full, half = prog.gpu_profile(precision="fp32"), prog.gpu_profile(precision="fp16")
    assert list(half.buffers.placement) == list(full.buffers.placement)
    assert (half.buffers.placement == "shared").sum() == 4
    assert 2 * half.totals.global_bytes == full.totals.global_bytes
    assert half.totals.dram_ratio <= 1.5 and half.totals.launches == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("precision", HALVES)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_nvcc_compiles_half_storage_for_sm80_and_sm90(name, precision, tmp_path):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.inputs("small", **TENSOR_CORE_SIZES.get(name, {})))
    source = CudaTarget().generate(prog.model, prog.schedule, precision).source
    assert f"ft::In<{STORAGE[precision]}>" in source
    (tmp_path / "k.cu").write_text(source)
    r = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                        "-Xptxas", "-v", "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", r.stderr)]
    assert spills and not any(spills), r.stderr  # ptxas reported, for both architectures: no spills
