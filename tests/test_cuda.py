"""The CUDA target: nvcc accepts the generated source for sm_80 and sm_90 (CI has nvcc but no
GPU); the same source, emulated on the CPU, computes what eager execution computes; on a
GPU (marker `gpu`, run by scripts/gpu_session.sh) PyCUDA runs it for real."""
import shutil
import subprocess

import numpy as np
import pytest

import polyft as ft
from emit import cuda_target
from polyft.errors import DeviceError
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

NAMES = list(WORKLOADS)


def _has_gpu() -> bool:
    try:
        import pycuda.autoprimaryctx  # noqa: F401
        return True
    except Exception:
        return False


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name", NAMES)
def test_nvcc_compiles_for_sm80_and_sm90(name, tmp_path):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("small"))
    source, _, _, arities = cuda_target.generate(prog.model, prog.schedule)
    assert len(arities) >= 1
    (tmp_path / "k.cu").write_text(source)
    r = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                        "arch=compute_90,code=sm_90", "-c", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("schedule", ["original", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_emulated_cuda_equals_eager(name, schedule):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=11)
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated", schedule=schedule)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < 1e-5


def test_wavefront_launches_one_kernel_per_step():
    """stacked_rnn "auto": the host loops over the L+D-1 wavefront steps; each launch is a
    2-D grid over (layer, batch)."""
    mod = WORKLOADS["stacked_rnn"]
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
    assert "while (c1 < ((D + L) - 1)):" in prog.host_driver
    assert prog.host_driver.count("launch(") == 1
    assert "blockIdx.y" in prog.source and "__syncthreads()" in prog.source
    assert "ft::load_tile" in prog.source


@pytest.mark.skipif(_has_gpu(), reason="checks the error on machines without a GPU")
def test_cuda_without_gpu_is_a_clear_error():
    mod = WORKLOADS["stacked_rnn"]
    with pytest.raises(DeviceError, match="PyCUDA|CUDA device"):
        ft.compile(mod.program, *mod.specs("small"), target="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs PyCUDA and a CUDA GPU (scripts/gpu_session.sh)")
@pytest.mark.parametrize("schedule", ["original", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_gpu_equals_eager(name, schedule):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=5)
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda", schedule=schedule)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs PyCUDA and a CUDA GPU (scripts/gpu_session.sh)")
def test_gpu_larger_lstm_equals_eager():
    mod = WORKLOADS["stacked_lstm"]
    inputs = mod.inputs("small", seed=6, N=32, D=4, L=16, H=64)
    prog = ft.compile(mod.program, *inputs, target="cuda")
    got = prog(*inputs)
    assert rel_error(got, mod.program(*inputs)) < 1e-5
    assert np.isfinite(got[0].to_numpy()).all()
