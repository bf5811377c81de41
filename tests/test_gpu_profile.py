"""The GPU profile (prog.gpu_profile, emit/gpu_profile.py) against the emulator's own count of
every global load and store (prog.emulated_traffic, emit/gpu_count.py), on a case counted by
hand and on the seven workloads; the paper shapes from the access relations alone."""
import numpy as np
import pytest

import polyft as ft
from polyft.cli import main
from polyft.emit.c_family import TILE
from polyft.emit.gpu_profile import grid_barriers
from polyft.errors import PolyftError
from polyft.testing import rel_error
from polyft.experiments.deps_time import lengths
from polyft.workloads import WORKLOADS


def _by_buffer(df):
    return {row.buffer: row for row in df.itertuples()}


def _check_counts(prog, fn, inputs, tolerance=1e-5):
    """The emulator's bytes per buffer against the model's: stores exactly; loads between the
    count with a batch's common loads shared and the count with none shared (equal where
    every load uses the batched dim). The instrumented build computes what eager does (within
    `tolerance`: the precision's)."""
    counted = prog.emulated_traffic(*inputs)
    assert rel_error(counted.attrs["outputs"], fn(*inputs)) < tolerance
    emulated = _by_buffer(counted)
    profile = prog.gpu_profile()
    model = _by_buffer(profile.buffers)
    assert len(counted.attrs["launches"]) == profile.totals.launches  # the same host driver
    assert set(emulated) == set(model)
    for name, e in emulated.items():
        m = model[name]
        assert e.placement == m.placement, name
        assert e.written_bytes == m.global_written_bytes, name
        assert m.shared_read_bytes <= e.read_bytes <= m.global_read_bytes, name
    return emulated, profile


def test_a_batched_matmul_counted_by_hand():
    # out[i] = x[i] @ w for 5 instances, one batch: x 4 x 8, w 8 x 8, out 4 x 8 (float32)
    xs = ft.FractalTensor.from_numpy(np.random.default_rng(0).standard_normal((5, 4, 8)).astype(np.float32), depth=1)
    w = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    fn = lambda xs, w: xs.map(lambda x: x @ w)  # noqa: E731
    prog = ft.compile(fn, xs, w, target="cuda-emulated")
    emulated, profile = _check_counts(prog, fn, (xs, w))
    t = profile.totals
    assert t.global_bytes == 5 * (128 + 256 + 128)  # every instance reads x and w, writes out
    assert t.shared_bytes == 5 * 128 + 256 + 5 * 128  # w once for the batch
    assert t.io_bytes == t.dram_bytes == 5 * 128 + 256 + 5 * 128
    assert t.flops == 5 * 2 * 4 * 8 * 8
    assert emulated["xs"].read_bytes == 5 * 128  # x uses the batched dim: exact
    assert emulated["w"].read_bytes in (256, 5 * 256)  # once for the batch, or once per instance
    assert t.launches == 1 and profile.kernels.launches.sum() == 1


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_the_emulator_counts_what_the_access_relations_say(name):
    mod = WORKLOADS[name]
    inputs = mod.inputs("small")
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    emulated, profile = _check_counts(prog, mod.program, inputs)
    exact = profile.buffers[profile.buffers.shared_read_bytes == profile.buffers.global_read_bytes]
    assert exact.global_read_bytes.sum() > 0  # some loads every workload makes are counted exactly


def test_paper_shapes_from_the_access_relations():
    """Stacked LSTM at the paper's shapes (N 256, depth 32, length 64, hidden 256): every gate
    instance reads its 256 x 256 weights; a batch of the module's 16 sequences shares them."""
    mod, sizes = WORKLOADS["stacked_lstm"], lengths("stacked_lstm", "paper")
    prog = ft.analyze(mod.program, *mod.specs("paper"), sizes=sizes)
    profile = prog.gpu_profile()
    assert prog._cuda_module("fp32").batch == TILE == 16
    n, d, seq, h = 256, 32, 64, 256
    w = _by_buffer(profile.buffers)["wss"]
    gates = n * d * seq * 4
    assert w.global_read_bytes == gates * h * h * 4
    assert w.shared_read_bytes == gates // TILE * h * h * 4
    assert w.distinct_read_bytes == w.dram_bytes == d * 4 * h * h * 4
    io = (n * seq * h + 2 * d * 4 * h * h + d * 4 * h + 2 * n * d * seq * h) * 4  # x, w, u, b; h and c
    assert profile.totals.io_bytes == io
    assert profile.totals.launches == len(profile.kernels) == 1
    assert profile.totals.grid_barriers == d + seq - 1  # one a wavefront step: its gates and cell in one band
    # the program with symbolic lengths, profiled at the same ones: the same accesses and barriers
    symbolic = ft.analyze(mod.program, *mod.specs("paper")).gpu_profile(sizes)
    assert symbolic.buffers.global_read_bytes.tolist() == profile.buffers.global_read_bytes.tolist()
    assert symbolic.totals.grid_barriers == profile.totals.grid_barriers


def test_kernels_ptxas_and_assumptions():
    mod = WORKLOADS["b2b_gemm"]
    prog = ft.analyze(mod.program, *mod.specs("small"), sizes=lengths("b2b_gemm", "small"))
    base = prog.gpu_profile()
    k = base.kernels.iloc[0]
    assert k.registers > 0 and k.spill_stores is not None and k.threads == 256
    assert k.resident_blocks >= 132 and k.blocks_max <= k.resident_blocks
    slow = prog.gpu_profile(launch_s=1e-3)
    assert slow.totals.time_low_us == pytest.approx(base.totals.time_low_us + base.totals.launches * (1e3 - 4))
    assert slow.assumptions["launch_s"] == 1e-3 and "launch_s=0.001" in str(slow)


def test_without_nvcc_the_ptxas_columns_say_why(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    mod = WORKLOADS["b2b_gemm"]
    profile = ft.analyze(mod.program, *mod.specs("small"), sizes=lengths("b2b_gemm", "small")).gpu_profile()
    assert profile.kernels.registers.iloc[0] is None and profile.kernels.resident_blocks.iloc[0] is None
    assert any("nvcc is not on PATH" in n for n in profile.notes)


def test_bad_input():
    mod = WORKLOADS["stacked_rnn"]
    symbolic = ft.analyze(mod.program, *mod.specs("small"))
    with pytest.raises(PolyftError, match=r"needs sizes for the lengths \['D', 'L', 'N'\]"):
        symbolic.gpu_profile()
    with pytest.raises(PolyftError, match="unknown lengths"):
        symbolic.gpu_profile({"Q": 3})
    with pytest.raises(PolyftError, match="unknown assumptions"):
        symbolic.gpu_profile(lengths("stacked_rnn", "small"), hbm=1.0)
    fixed = ft.analyze(mod.program, *mod.specs("small"), sizes=lengths("stacked_rnn", "small"))
    with pytest.raises(PolyftError, match="built for N = 2, not N = 4"):
        fixed.gpu_profile({"N": 4})
    c_prog = ft.compile(mod.program, *mod.inputs("small"), target="c")
    with pytest.raises(PolyftError, match="compiled for the C target: compile it with target='cuda-emulated'"):
        c_prog.gpu_profile()
    with pytest.raises(PolyftError, match="compile it with target='cuda-emulated'"):
        c_prog.emulated_traffic(*mod.inputs("small"))


def test_cli_prints_the_profile(capsys):
    assert main(["inspect", "b2b_gemm", "--target", "cuda", "--profile", "--size", "MT=3"]) == 0
    out = capsys.readouterr().out
    assert "polyft_k0" in out and "global bytes" in out and "DRAM at least" in out and "MT=3" in out
    assert main(["inspect", "b2b_gemm", "--profile"]) == 2
    assert "--target cuda" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_batches_and_grid_barriers_are_the_generated_codes(name):
    """The profile's grid barriers are those the emulated kernel passes in a call, and its
    batches those the module's source runs (none at all for b2b, flash attention and BigBird at
    the paper's shapes: then no load is shared by a batch)."""
    mod = WORKLOADS[name]
    inputs = mod.inputs("small", seed=41)
    prog = ft.compile(mod.program, *inputs, target="cuda-emulated")
    backend = prog._run.backend
    before = backend.grid_barriers
    prog(*inputs)
    passed = backend.grid_barriers - before
    assert passed >= 1 and grid_barriers(prog.module, {}) == passed
    profile, gpu = prog.gpu_profile(), prog._cuda_module("fp32")
    assert profile.totals.grid_barriers == grid_barriers(gpu, {}) == passed
    for module, shared in ((gpu, profile.buffers.shared_read_bytes),
                           (ft.analyze(mod.program, *mod.specs("paper"))._cuda_module("fp32"), None)):
        assert (f"min({module.batch}L, " in module.source) == (module.batch is not None)
        if module.batch is None and shared is not None:
            assert shared.tolist() == profile.buffers.global_read_bytes.tolist()
    if name in ("b2b_gemm", "flash_attention", "bigbird"):
        assert module.batch is None
