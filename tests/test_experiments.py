"""The experiment layer: sweep configs, the measuring machinery, plots from CSVs, the index."""
import os

import numpy as np
import pandas as pd
import pytest

from polyft.experiments import cpu_rnn, fig2, fig7, fig8, measure, memory, plot, registry, reproduce, table7
from polyft.workloads import WORKLOADS

SWEEPS = {"cpu_rnn": cpu_rnn, "fig2": fig2, "fig7": fig7, "fig8": fig8}


@pytest.mark.parametrize("preset", ["quick", "paper"])
@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_sweep_configs_are_well_formed(name, preset):
    points = SWEEPS[name].points(preset)
    assert points
    for p in points:
        mod = WORKLOADS[p.workload]
        full = measure.full_sizes(p.workload, mod.PRESETS, "small", p.sizes)  # unknown size names raise
        mod.specs("small", **p.sizes)
        if p.workload == "dilated_rnn":
            assert full["L"] % 2 ** (full["D"] - 1) == 0
        if "depth" in p.extra:
            assert p.extra["depth"] == full["D"]
        if preset == "quick":  # quick points are checked against eager numpy, and stay small
            assert measure.instances(p.workload, p.sizes) <= measure.EAGER_LIMIT
    if name in ("fig2", "fig8"):  # depth sweeps start at depth 1: the depth-scaling ratio
        assert min(p.extra["depth"] for p in points) == 1
    if name == "fig7":
        assert [p.workload for p in points] == list(WORKLOADS)
    if name == "fig8":
        assert {(p.extra["model"], p.extra["panel"]) for p in points} == {
            (m, k) for m in ("middle", "large") for k in ("depth", "seq_len")}


def test_a_schedule_by_hand_is_measured_only_where_asked():
    """cpu_rnn and fig2 time the stacked LSTM's tiled wavefront and the auto schedule alone
    (checked against eager like every system); the other experiments leave them out."""
    sizes = dict(N=2, H=16, L=6, D=3)
    assert "c-tiled-wavefront" not in [s.name for s in measure.systems("stacked_lstm")]
    assert "c-tiled-wavefront" not in [s.name for s in measure.systems("stacked_rnn", by_hand=True)]
    rows = measure.measure("stacked_lstm", sizes, repeats=1, by_hand=True)
    (row,) = [r for r in rows if r["system"] == "c-tiled-wavefront"]
    assert row["status"] == "ok" and row["rel_error"] < 1e-4 and row["checked_against"] == "numpy-eager"
    # the schedule each polyft row ran: c-auto chose between its two, c-wavefront had only the wavefront
    by = {r["system"]: r["schedule"] for r in rows}
    assert (by["c-original"], by["c-wavefront"], by["c-tiled-wavefront"]) == ("original", "auto", "user")
    assert by["c-auto"] in ("auto", "original") and by["torch-nn-lstm"] == ""


def test_quick_inputs_build():
    for name in ("fig7", "fig8"):
        for p in SWEEPS[name].points("quick"):
            WORKLOADS[p.workload].inputs("small", seed=1, **p.sizes)  # divisibility and sizes hold


def test_measure_checks_times_and_reports_absent_systems():
    rows = measure.measure("stacked_rnn", dict(N=2, H=8, L=4, D=2), repeats=2)
    by = {r["system"]: r for r in rows}
    assert list(by) == [s.name for s in measure.systems("stacked_rnn")]
    for name in ("numpy-eager", "c-original", "c-auto", "c-auto-1thread", "torch-cell-loop"):
        assert by[name]["status"] == "ok" and by[name]["seconds"] > 0 and by[name]["repeats"] >= 2
        assert by[name]["seconds_min"] <= by[name]["seconds"] <= by[name]["seconds_max"]
    assert by["c-auto"]["checked_against"] == "numpy-eager" and by["c-auto"]["rel_error"] < 1e-4
    assert by["c-auto-1thread"]["threads"] == 1 and by["c-auto-1thread"]["rel_error"] < 1e-4
    assert by["triton"]["status"].startswith("absent:") and "not implemented" in by["triton"]["status"]
    jax_absent = measure.baselines_jax.unavailable()  # JAX is optional: measured where installed
    assert by["jax-jit"]["status"] == (f"absent: {jax_absent}" if jax_absent else "ok")
    if not measure.gpu_available():
        for name in ("polyft-cuda-auto", "torch-cell-loop-cuda", "torch-compile-cuda"):
            assert by[name]["status"].startswith("absent: no GPU") and np.isnan(by[name]["seconds"])
    for r in rows:
        assert {"workload", "shape", "system", "device", "seconds", "commit", "date", "preset", "status"} <= set(r)


def test_a_wrong_system_is_a_row_and_fails_the_sweep(tmp_path, monkeypatch):
    real = measure.systems

    def with_a_wrong_one(workload, by_hand=False):
        out = real(workload, by_hand)
        import polyft.experiments.baselines as bl

        def wrong(inputs, workload=None, sizes=None):
            return bl.Baseline(lambda: None, lambda: np.zeros((2, 2, 4, 1, 8), np.float32))
        return out + [measure.System("broken", "cpu", wrong)]
    monkeypatch.setattr(measure, "systems", with_a_wrong_one)
    with pytest.raises(AssertionError, match="disagree"):
        measure.sweep("t", [measure.Point("stacked_rnn", dict(N=2, H=8, L=4, D=2))], "quick", str(tmp_path), 1)
    df = pd.read_csv(tmp_path / "t_quick.csv")  # written before failing
    assert df.set_index("system").loc["broken", "status"].startswith("wrong: rel error")


def test_eager_is_skipped_beyond_the_limit_and_a_torch_baseline_is_the_reference(monkeypatch):
    monkeypatch.setattr(measure, "EAGER_LIMIT", 1)
    by = {r["system"]: r for r in measure.measure("stacked_lstm", dict(N=2, H=8, L=3, D=2), repeats=1)}
    assert by["numpy-eager"]["status"].startswith("skipped")
    assert by["c-auto"]["checked_against"] == "torch-cell-loop (cpu)" and by["c-auto"]["rel_error"] < 1e-4
    assert by["torch-nn-lstm"]["status"] == "ok"  # compared with the top layer of the reference


def _timing_rows(workload, system, depths, base_ms, per_layer_ms, **extra):
    return [dict(workload=workload, shape=f"N=2 H=8 L=4 D={d}", depth=d, system=system, status="ok",
                 device="cpu", seconds=(base_ms + per_layer_ms * d) / 1e3, seconds_min=(base_ms + per_layer_ms * d) / 1e3,
                 seconds_max=(base_ms + per_layer_ms * d) / 1e3, repeats=3, threads=2, preset="quick",
                 commit="abc", date="2024-01-01", **extra) for d in depths]


def test_plots_are_drawn_from_csvs(tmp_path):
    rows = _timing_rows("stacked_rnn", "c-auto", (1, 4, 8), 1.0, 0.25) + \
        _timing_rows("stacked_rnn", "torch-cell-loop", (1, 4, 8), 0.0, 2.0)
    rows.append(dict(rows[0], system="triton", status="absent: no GPU", seconds=np.nan))
    pd.DataFrame(rows).to_csv(tmp_path / "fig2_quick.csv", index=False)
    fig7_rows = [dict(r, workload=w, depth=np.nan) for w in ("stacked_rnn", "bigbird") for r in (
        _timing_rows(w, "c-auto", (1,), 1.0, 1.0)[0], _timing_rows(w, "torch-blocked", (1,), 5.0, 1.0)[0],
        _timing_rows(w, "numpy-eager", (1,), 0.5, 0.0)[0])]
    pd.DataFrame(fig7_rows).to_csv(tmp_path / "fig7_quick.csv", index=False)
    fig8_rows = []
    for model in ("middle", "large"):
        fig8_rows += _timing_rows("grid_rnn", "c-auto", (1, 2), 1.0, 1.0, model=model, panel="depth", seq_len=4)
        fig8_rows += [dict(r, depth=2, seq_len=r["depth"]) for r in _timing_rows(
            "grid_rnn", "c-auto", (4, 8), 1.0, 1.0, model=model, panel="seq_len")]
    pd.DataFrame(fig8_rows).to_csv(tmp_path / "fig8_quick.csv", index=False)
    pd.DataFrame([dict(workload="bigbird", plan=p, GB=g) for p, g in (("deferred", 1.0), ("materialised", 2.5))]) \
        .to_csv(tmp_path / "table7_quick.csv", index=False)

    written = plot.run(str(tmp_path))
    for name in ("fig2_quick.png", "fig7_quick.png", "fig8_quick.png", "table7_quick.png", "fig7_speedup_quick.csv",
                 "depth_scaling_quick.csv"):
        assert str(tmp_path / name) in written and os.path.getsize(tmp_path / name) > 0
    sp = pd.read_csv(tmp_path / "fig7_speedup_quick.csv").set_index("workload")
    assert sp.loc["bigbird", "best_baseline"] == "torch-blocked"  # eager numpy is not a baseline
    assert sp.loc["bigbird", "speedup"] == pytest.approx(6.0 / 2.0)
    ds = pd.read_csv(tmp_path / "depth_scaling_quick.csv")
    fig2_ratio = ds[(ds["artefact"] == "fig2")].set_index("system")["ratio"]
    assert fig2_ratio["c-auto"] == pytest.approx(3.0 / 1.25)
    assert fig2_ratio["torch-cell-loop"] == pytest.approx(8.0)
    assert "triton" not in set(ds["system"])
    assert set(ds[ds["artefact"] == "fig8"]["model"]) == {"middle", "large"}


def test_plot_skips_missing_csvs(tmp_path):
    assert plot.run(str(tmp_path)) == []


def test_index_lists_every_file_with_its_preset(tmp_path):
    for f in ("fig2_quick.csv", "fig2_paper.png", "gpu_bench.csv", "fig7.csv", "mystery.bin"):
        (tmp_path / f).write_text("x")
    path = registry.write_index(str(tmp_path))
    text = open(path).read()
    sentence = registry.ARTEFACTS["fig2"].files["fig2.csv"]
    assert f"| fig2_quick.csv | fig2 | quick | {sentence} |" in text
    assert f"| fig2_paper.png | plot | paper | {registry.PLOTS['fig2.png']} |" in text
    assert "| gpu_bench.csv | GPU runs | - |" in text and "| README.md | reproduce | - |" in text
    for f in ("mystery.bin", "fig7.csv"):  # an artefact's file without its preset is not one the registry knows
        assert f"| {f} | ? | - | not in the registry" in text
    missing = text.split("Not here")[1]
    assert "table7.csv" in missing and "fig2.csv" not in missing and "fig2.png" not in missing


def test_registry_describes_every_file_the_artefacts_write():
    files = registry.described()
    assert {"fig2.csv", "fig7.csv", "fig8.csv", "table7.csv", "fig2.png", "fig7.png", "fig8.png",
            "table7.png", "depth_scaling.csv", "memory.csv", "memory.png"} <= set(files)
    for name, a in registry.ARTEFACTS.items():
        assert a.files, name
    results = os.path.join(os.path.dirname(__file__), "..", "results")
    unknown = {f for f in os.listdir(results) if registry.entry(f) is None}
    assert not unknown, f"results/ files the registry does not describe (or without their preset): {unknown}"
    with open(os.path.join(results, "README.md")) as f:  # the committed index is current
        assert f.read() == registry.index_text(results)


def test_reproduce_refuses_unknown_artefacts():
    from polyft.errors import PolyftError
    with pytest.raises(PolyftError, match="unknown artefacts"):
        reproduce.reproduce(["fig99"])


def test_table7_ncu_fails_clearly_without_a_gpu(capsys, tmp_path):
    if not table7._ncu_available():
        pytest.skip("a GPU and ncu are here")
    assert table7.main(["--ncu", "--out", str(tmp_path)]) == 2
    assert "needs an NVIDIA GPU and Nsight Compute" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_table7_model_rows(tmp_path):
    df = table7.run("quick", str(tmp_path))
    big = df[df["workload"] == "bigbird"].set_index("plan")
    assert big.loc["materialised", "ratio_to_deferred"] > 2 and big.loc["deferred", "views"] > 0
    fa = df[df["workload"] == "flash_attention"].set_index("plan")
    assert fa.loc["materialised", "bytes"] == fa.loc["deferred", "bytes"]
    assert set(df["workload"]) == set(WORKLOADS)
    assert "Table 7 (model)" in (tmp_path / "table7_quick.txt").read_text()


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_torch_baseline_computes_the_workload(workload):
    from polyft.testing import rel_error
    mod = WORKLOADS[workload]
    inputs = mod.inputs("small", seed=3)
    eager = mod.program(*inputs)
    for name, fn, _ in measure.TORCH[workload]:
        b = fn(*inputs)
        assert rel_error(b.result(), b.expected(eager)) < 1e-5, name


def test_ncu_csv_is_summed_over_kernels_in_bytes():
    text = "\n".join([
        "==PROF== Connected to process 1 (python3)",
        '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","k1","dram__bytes.sum","Mbyte","1.5"',
        '"0","1","k1","lts__t_bytes.sum","Kbyte","2,000.0"',
        '"1","1","k2","dram__bytes.sum","byte","500"',
        '"1","1","k2","l1tex__t_bytes.sum","Gbyte","1"',
        '"1","1","k2","sm__cycles.sum","cycle","9"',
        "==PROF== Disconnected from process 1"])
    assert table7._ncu_bytes(text) == {"dram": 1.5e6 + 500, "l2": 2e6, "l1": 1e9}
    with pytest.raises(Exception, match="no metrics"):
        table7._ncu_bytes("==PROF== error")


def test_memory_rows_and_plot(tmp_path):
    from polyft.emit import isa
    with isa.building_for("skylake-avx512"):  # which weights are packed follows the ISA's panel: AVX-512's here
        df = memory.run("quick", str(tmp_path))
    got = pd.read_csv(tmp_path / "memory_quick.csv")
    assert list(got.columns) == memory.COLUMNS + ["device", "commit", "date", "isa", "peer_isa"]
    assert len(got) == len(df) == 2 * len(WORKLOADS)
    assert set(zip(got["workload"], got["preset"])) == {(w, p) for w in WORKLOADS for p in ("small", "paper")}
    assert (got["intermediate_allocated_bytes"] + got["intermediate_local_bytes"]
            <= got["intermediate_full_bytes"]).all()
    assert (got["total_full_bytes"] == got["io_bytes"] + got["intermediate_full_bytes"]).all()
    assert (got["total_allocated_bytes"] == got["io_bytes"] + got["intermediate_allocated_bytes"]
            + got["threads"] * got["intermediate_local_bytes"] + got["packed_bytes"]).all()
    packed = got.set_index(["workload", "preset"])["packed_bytes"]
    assert packed[("stacked_rnn", "paper")] == 32 * 512 * 512 * 4  # its D = 32 weights of 512 x 512
    assert (packed.drop(("stacked_rnn", "paper")) == 0).all()
    assert np.allclose(got["ratio_allocated"], got["total_allocated_bytes"] / got["io_bytes"])
    assert (got["ratio_allocated"] >= 1).all()
    # at the paper's shapes, with 2 threads' scratch (this CI machine's): flash attention and
    # the stacked LSTM within 1.1 x inputs + outputs, every workload within 1.5 x (at the small
    # shapes a thread's batch is the whole problem, so threads x scratch may exceed it)
    paper = got[got["preset"] == "paper"].set_index("workload")
    two = (paper["io_bytes"] + paper["intermediate_allocated_bytes"] + 2 * paper["intermediate_local_bytes"]) \
        / paper["io_bytes"]
    assert (two <= 1.5).all() and (two[["flash_attention", "stacked_lstm"]] <= 1.1).all(), two
    assert (paper["total_allocated_bytes"] < paper["total_full_bytes"]).sum() >= 4
    # contraction moves where elements live, not how often the code loads and stores them;
    # local buffers keep their accesses out of shared memory; an ideal cache moves less still
    assert (got["code_bytes_moved"] <= got["code_bytes_moved_with_local"]).all()
    assert (got["code_dram_bytes_ideal_cache"] <= got["code_bytes_moved"]).all()
    fa = paper.loc["flash_attention"]
    assert fa["code_dram_bytes_ideal_cache"] == fa["io_bytes"] <= fa["deferred_model_bytes"]
    lstm = paper.loc["stacked_lstm"]
    assert lstm["ratio_allocated"] < lstm["ratio_full"] and lstm["contracted"] >= 1
    assert (got["deferred_model_bytes"] > 0).all()
    assert str(tmp_path / "memory_quick.png") in plot.run(str(tmp_path), "quick", ["memory"])


# -- the peers at the ISA level of $POLYFT_MARCH -----------------------------------------------
def test_peers_are_capped_at_the_level_before_they_load(monkeypatch):
    """POLYFT_MARCH=haswell sets torch's, MKL's, oneDNN's and XLA's ISA ceilings (unless the user
    set them), appends to XLA_FLAGS, and names both levels in every row; with torch already
    loaded under other settings the rows name the peers' ISA "native", the level they run at."""
    import sys

    from polyft.experiments import common
    for key in common.PEER_ISA["haswell"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/nowhere")
    monkeypatch.setenv("POLYFT_MARCH", "haswell")
    for name in ("torch", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    common.cap_peers()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_to=/tmp/nowhere --xla_cpu_max_isa=AVX2 {common.XLA_OWN_DOTS}"
    assert common.meta()["isa"] == "haswell (avx2)" and common.meta()["peer_isa"] == "avx2"
    monkeypatch.setitem(sys.modules, "torch", object())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert common.cap_peers() is False  # loaded first: running at the CPU's level, and the rows say so
    assert common.meta()["isa"] == "haswell (avx2)" and common.meta()["peer_isa"] == "native"
    monkeypatch.setenv("POLYFT_MARCH", "native")
    assert common.cap_peers() is True  # native: the peers as they are


def test_torch_runs_avx2_kernels_under_polyft_march_haswell():
    """End to end, in a fresh process: the experiments loaded first, torch reports AVX2."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                                                            "ONEDNN_MAX_CPU_ISA")}
    env["POLYFT_MARCH"] = "haswell"
    r = subprocess.run([sys.executable, "-c", "import polyft.experiments, torch; "
                        "print(torch.backends.cpu.get_cpu_capability())"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("AVX2", "DEFAULT"), r.stdout  # DEFAULT: a CPU without AVX2


JAX_SGEMM = """
import os
import time
import numpy as np
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core: no thread count can pass its peak
import polyft.experiments
import jax
a, b = (jax.device_put(np.random.default_rng(s).standard_normal((768, 768), dtype=np.float32)) for s in (1, 2))
f = jax.jit(lambda a, b: a @ b)
f(a, b).block_until_ready()
best = 1e9
for _ in range(20):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
print(2 * 768 ** 3 / best / 1e9)
"""


def test_jax_runs_no_faster_than_avx2_allows_under_polyft_march_haswell():
    """XLA's AVX2 ceiling holds for its matmuls: in a fresh process under POLYFT_MARCH=haswell,
    pinned to one core, JAX's sgemm stays under that core's AVX2 theoretical peak with a margin
    (load only slows it; the YNNPACK kernels the cap did not reach ran at 1.7x the peak)."""
    pytest.importorskip("jax")
    import subprocess
    import sys

    from polyft.emit import isa
    from polyft.experiments import peak
    if "haswell" not in isa.runnable_levels():
        pytest.skip("this CPU cannot run AVX2 code")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["POLYFT_MARCH"] = "haswell"
    r = subprocess.run([sys.executable, "-c", JAX_SGEMM], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    with isa.building_for("haswell"):
        avx2_peak = peak.theoretical_gflops(isa.current(), peak.clock_ghz())
    assert float(r.stdout.split()[-1]) < 1.2 * avx2_peak, (r.stdout, avx2_peak)


def test_gemm_experiment_times_openblas_at_a_lower_level_in_a_child():
    """The gemm experiment's BLAS at the SSE2 level: numpy's OpenBLAS in a child process loaded
    under $OPENBLAS_CORETYPE, which checks its products against float64 and times the point it
    is asked for. Its 128-bit kernels stay under that level's theoretical peak with a margin
    (the CPU's own kernels, had the core type not taken, run at up to twice that peak)."""
    from polyft.emit import isa
    from polyft.experiments import gemm, peak
    if not gemm.blas_name().startswith("openblas"):
        pytest.skip(f"numpy's BLAS is {gemm.blas_name()}, not OpenBLAS: no core type to choose")
    if "x86-64" not in isa.runnable_levels():
        pytest.skip("not an x86 machine")
    points = [[[256, 1, 256], 0], [[16, 4, 64], 2]]
    blas = gemm.LevelBlas("x86-64", points, 5)
    try:
        assert blas.name.startswith("openblas") and all(e < 1e-5 for e in blas.errors), (blas.name, blas.errors)
        seconds = [blas.best(0), blas.best(1), blas.best(0)]
    finally:
        blas.close()
    assert blas.child.returncode == 0 and all(s > 0 for s in seconds)
    with isa.building_for("x86-64"):
        sse2_peak = peak.theoretical_gflops(isa.current(), peak.clock_ghz())
    assert 2 * 256 ** 3 / min(seconds[0], seconds[2]) / 1e9 < 1.2 * sse2_peak


def test_time_calls_runs_numpys_blas_on_one_thread_and_restores_it():
    """While systems are timed, numpy's BLAS runs on one thread (an idle OpenBLAS worker spins
    about 0.1 s after each call it helps with, taking a core from the next system in turn);
    afterwards its thread count is what it was."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    if not blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl controls")
    seen = []
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        measure.time_calls([(lambda: seen.append(blas_threads()), "cpu")], repeats=3, warmup=1)
        assert blas_threads() == before
    assert seen and all(threads == [1] * len(before) for threads in seen), seen


def test_a_level_whose_openblas_ignored_the_core_type_has_no_blas_row(monkeypatch):
    """An OpenBLAS built for one core ignores $OPENBLAS_CORETYPE: a child that names the
    parent's kernels, not the core asked for, gives its level no row; one that names the core
    asked for (or other kernels) does."""
    from polyft.experiments import gemm
    closed = []

    class Fake:
        def __init__(self, level, points, repeats):
            self.name = "openblas Zen" if level == "haswell" else f"openblas {gemm.LEVEL_BLAS[level]}"

        def close(self):
            closed.append(self.name)
    monkeypatch.setattr(gemm, "blas_name", lambda: "openblas Zen")
    monkeypatch.setattr(gemm, "LevelBlas", Fake)
    kept = gemm.level_blases(["x86-64", "haswell", "skylake-avx512", "native"], [], 1)
    assert sorted(kept) == ["skylake-avx512", "x86-64"] and closed == ["openblas Zen"]
    monkeypatch.setattr(gemm, "blas_name", lambda: "mkl")
    assert gemm.level_blases(["x86-64"], [], 1) == {}


def test_the_probe_of_every_level_stays_under_its_theoretical_peak():
    """The gemm experiment's probe counts a multiply-add as 2 flops a lane and, without FMA, a
    multiply or an add as 1 (its SPLIT chains): at most the level's theoretical peak, with a
    margin for the clock probe's error. Counting SSE2's split chains as multiply-adds would
    read about 1.8x that peak (they issue at ~90% of it on a Zen 4 core)."""
    from polyft.emit import isa
    from polyft.experiments import gemm, peak
    ghz = peak.clock_ghz()
    for level in isa.runnable_levels():
        with isa.building_for(level):
            top = peak.theoretical_gflops(isa.current(), ghz)
        rate = gemm.fma_probe(level, repeats=3)
        assert 0 < rate < 1.1 * top, (level, rate, top)
