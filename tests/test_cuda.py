"""The CUDA target: nvcc accepts the generated source for sm_80 and sm_90 (CI has nvcc but no
GPU); the same source, emulated on the CPU, computes what eager execution computes; on a
GPU (marker `gpu`, run by scripts/gpu_session.sh) PyCUDA runs it for real."""
import shutil
import subprocess

import numpy as np
import pytest

import polyft as ft
from polyft.emit.cuda_arena import SHARED_LIMIT
from polyft.emit.cuda_statements import PRECISIONS, TOLERANCE
from polyft.emit.cuda_target import CudaTarget
from polyft.errors import CompileError, DeviceError, PolyftError
# the GPU tests' sizes, where a GPU session finds them to compile their modules beforehand
from polyft.experiments.gpu_modules import LARGER_LSTM, TENSOR_CORE_SIZES
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

NAMES = list(WORKLOADS)


def _has_gpu() -> bool:
    try:
        import pycuda.autoprimaryctx  # noqa: F401
        return True
    except Exception:
        return False


# the emulator everywhere; a real GPU where PyCUDA finds one (marker gpu: scripts/gpu_session.sh)
TARGETS = ["cuda-emulated", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="needs PyCUDA and a CUDA GPU (scripts/gpu_session.sh)")])]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name", NAMES)
def test_nvcc_compiles_for_sm80_and_sm90(name, tmp_path):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("small"))
    gen = CudaTarget().generate(prog.model, prog.schedule)
    assert len(gen.arities) >= 1 and gen.shared_bytes > 0
    _nvcc(gen.source, tmp_path)


def _nvcc(source, tmp_path):
    (tmp_path / "k.cu").write_text(source)
    r = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                        "arch=compute_90,code=sm_90", "-c", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(TENSOR_CORE_SIZES))
def test_nvcc_compiles_tensor_core_gemms_for_sm80_and_sm90(name, precision, tmp_path):
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.inputs("small", **TENSOR_CORE_SIZES[name]))
    source = CudaTarget().generate(prog.model, prog.schedule, precision).source
    assert f"ft::gemm_tc<{PRECISIONS[precision][0]}," in source
    _nvcc(source, tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("name, sizes", [("stacked_lstm", dict(N=256, D=32, L=64, H=1024)),
                                         ("flash_attention", {}), ("b2b_gemm", {}), ("bigbird", dict(d=128)),
                                         ("bigbird", {}), ("bigbird", dict(bs=64))])
def test_gpu_benchmark_sizes_fit_a_block_and_compile(name, sizes, tmp_path):
    """The paper's shapes (BigBird at d=512 with blocks of 32 and 64 rows, and at d=128) and
    the LSTM at hidden 1024: the tiles fit in the shared memory of an H100 / H200 block (the
    LSTM batching fewer sentences per block at hidden 1024), on tensor cores, and nvcc
    compiles them."""
    mod = WORKLOADS[name]
    prog = ft.analyze(mod.program, *mod.specs("paper", **sizes))
    gen = CudaTarget().generate(prog.model, prog.schedule, "fp16")
    assert gen.shared_bytes <= SHARED_LIMIT
    assert "ft::gemm_tc<__half," in gen.source
    _nvcc(gen.source, tmp_path)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("name", list(TENSOR_CORE_SIZES))
def test_precisions_within_tolerance(name, precision, target):
    """Every matmul of these sizes runs on tensor cores unless fp32; the result is within
    the precision's tolerance of eager float32, and fp32 stays exact to 1e-5."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=21, **TENSOR_CORE_SIZES[name])
    prog = ft.compile(mod.program, *inputs, target=target, precision=precision)
    assert ("ft::gemm_f32<" in prog.source) == (precision == "fp32")
    assert ("ft::gemm_tc<" in prog.source) == (precision != "fp32")
    err = rel_error(prog(*inputs), mod.program(*inputs))
    assert err < TOLERANCE[precision]
    if precision != "fp32":
        assert err > 1e-6  # the operands were rounded: the reduced precision is really used


def test_shapes_tensor_cores_cannot_take_fall_back_to_fp32():
    """fp32 arithmetic on the fp16-stored data (emit/halves.py): the result is eager's on the
    inputs rounded to fp16, to the rounding of the stored output."""
    mod = WORKLOADS["flash_attention"]  # the small preset's tiles are 4x8
    inputs = mod.inputs("small", seed=22)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated", precision="fp16")
    assert "ft::gemm_tc<" not in prog.source.split("namespace ft {")[-1].split("}  // namespace ft")[-1]
    rounded = [ft.FractalTensor.from_numpy(x.to_numpy().astype(np.float16).astype(np.float32), depth=x.depth)
               for x in inputs]
    got = prog(*inputs)
    assert rel_error(got, mod.program(*rounded)) < 1e-3 < TOLERANCE["fp16"]
    assert rel_error(got, mod.program(*inputs)) < TOLERANCE["fp16"]


def test_precision_errors():
    mod = WORKLOADS["b2b_gemm"]
    with pytest.raises(PolyftError, match="precision 'fp16' is for the CUDA targets"):
        ft.compile(mod.program, *mod.specs("small"), target="c", precision="fp16")
    with pytest.raises(CompileError, match="unknown precision 'fp8'"):
        ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated", precision="fp8")


def test_batches_fused_elementwise_runs_and_accumulating_matmuls():
    """stacked_lstm: a block runs 16 sentences (the batch loop is tiled: its band dim counts
    tiles); the gate statement is two [16, 8] @ [8, 8] GEMMs accumulated into one tile plus
    one fused bias pass, each GEMM reading the 16 sentences' rows where they are (ft::Batch);
    the cell's nine elementwise operations are one pass."""
    mod = WORKLOADS["stacked_lstm"]
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
    assert "+ 15) / 16" in prog.source
    gates, cell = (prog.source.split(f"__device__ static void {n}_t0(")[1].split("\n}\n")[0]
                   for n in ("S_b3", "S_b0"))
    assert gates.count("ft::gemm_f32<16, 8, 8, false, false,") == 1 and gates.count("ft::gemm_f32<16, 8, 8, true, false,") == 1
    assert gates.count("ft::Batch<1>{") == 2
    assert cell.count("for (int _ef = threadIdx.x; _ef < _nb * 8;") == 1
    assert cell.count("(ft_arena + ") == 2  # h and c, which are stored; the gates stay in registers


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", ["original", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_equals_eager(name, schedule, target):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=11)
    prog = ft.compile(mod.program, *mod.specs("small"), target=target, schedule=schedule)
    assert rel_error(prog(*inputs), mod.program(*inputs)) < 1e-5


def test_wavefront_is_one_launch_per_call():
    """stacked_rnn "auto": the wavefront's L+D-1 steps are a loop inside one persistent
    kernel, each step a band over (layer, batch tile) and a grid barrier; the host launches it
    once per call."""
    mod = WORKLOADS["stacked_rnn"]
    inputs = mod.inputs("small", seed=12)
    prog = ft.compile(mod.program, *mod.specs("small"), target="cuda-emulated")
    assert prog.host_driver.count("launch(") == 1 and "while" not in prog.host_driver
    assert "for (long c1 = 0; c1 < D + L - 1; c1 += 1)" in prog.source
    assert prog.source.count("ft_grid_sync();") == 1 and "__syncthreads()" in prog.source
    backend = prog._run.backend
    for calls in (1, 2):
        assert rel_error(prog(*inputs), mod.program(*inputs)) < 1e-5
        assert backend.launched == calls


@pytest.mark.skipif(_has_gpu(), reason="checks the error on machines without a GPU")
def test_cuda_without_gpu_is_a_clear_error():
    mod = WORKLOADS["stacked_rnn"]
    with pytest.raises(DeviceError, match="PyCUDA|CUDA device"):
        ft.compile(mod.program, *mod.specs("small"), target="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs PyCUDA and a CUDA GPU (scripts/gpu_session.sh)")
def test_gpu_larger_lstm_equals_eager():
    mod = WORKLOADS["stacked_lstm"]
    inputs = mod.inputs("small", seed=6, **LARGER_LSTM)
    prog = ft.compile(mod.program, *inputs, target="cuda")
    got = prog(*inputs)
    assert rel_error(got, mod.program(*inputs)) < 1e-5
    assert np.isfinite(got[0].to_numpy()).all()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("mode, fused", [("off", False), ("fast", True)])
def test_nvcc_fuses_an_elementwise_multiply_and_add_only_when_asked(mode, fused, monkeypatch, tmp_path):
    """`a * b + 3` rounds twice on the GPU too, as numpy's (`--fmad=false`: PTX mul.rn then add),
    unless POLYFT_FP_CONTRACT=fast lets nvcc fuse it (an fma.rn)."""
    from polyft.emit import cubin
    monkeypatch.setenv("POLYFT_FP_CONTRACT", mode)
    x = ft.FractalTensor.from_numpy(np.ones((4, 2, 8), np.float32), 1)
    prog = ft.analyze(lambda xs, ys: ft.map(lambda a, b: a * b + 3.0, xs, ys), x, x)
    (tmp_path / "k.cu").write_text(CudaTarget().generate(prog.model, prog.schedule).source)
    flags = [f for f in cubin.flags() if f not in ("-cubin", "-Xptxas", "-v")]  # the runtime's, as PTX
    r = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", *flags, str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    assert ("fma.rn.f32" in ptx) == fused and ("mul.rn.f32" in ptx) != fused
