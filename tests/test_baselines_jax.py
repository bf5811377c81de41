"""The JAX baselines (experiments/baselines_jax.py): each agrees with the eager result, and
where JAX cannot be imported (it is the optional `bench` extra) the experiments write an
absent row instead of failing. Only the tests that run JAX skip without it."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from polyft.experiments import baselines_jax, cpu_rnn, measure
from polyft.testing import rel_error
from polyft.workloads import WORKLOADS

# sizes where every list length differs from the others (a swapped axis cannot pass)
SIZES = {"flash_attention": dict(NH=3), "stacked_lstm": dict(N=3, D=2, L=5, H=8)}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_jax_baseline_computes_the_workload(workload):
    """The settings kept and each alternative measured (baselines_jax.OPTIONS), against eager
    numpy on fresh random inputs."""
    pytest.importorskip("jax")
    mod = WORKLOADS[workload]
    inputs = mod.inputs("small", seed=5, **SIZES.get(workload, {}))
    eager = mod.program(*inputs)
    labels = []
    for label, fn in baselines_jax.variants(workload):
        b = fn(*inputs)
        assert rel_error(b.result(), b.expected(eager)) < 1e-5, label
        labels.append(label)
    assert labels[0] == "default" and len(labels) == 1 + sum(len(v) - 1 for v in baselines_jax.OPTIONS[workload][1].values())


def test_the_jax_row_is_measured_beside_torch():
    pytest.importorskip("jax")
    by = {r["system"]: r for r in measure.measure("dilated_rnn", dict(N=2, H=8, L=4, D=2), repeats=1)}
    row = by["jax-jit"]
    assert row["status"] == "ok" and row["seconds"] > 0 and row["checked_against"] == "numpy-eager"
    assert row["rel_error"] < 1e-4 and row["device"] == by["torch-cell-loop"]["device"]


def test_without_jax_the_experiment_writes_an_absent_row(tmp_path, monkeypatch):
    """JAX made unimportable: cpu_rnn still measures everything else, the jax-jit row says why
    it is absent (no time), and the table's fastest peer is a torch one."""
    monkeypatch.setitem(sys.modules, "jax", None)
    assert baselines_jax.unavailable() == "not installed (jax)"
    monkeypatch.setitem(cpu_rnn.SWEEPS, "quick", [("stacked_lstm", dict(N=2, H=8, L=4, D=2))])
    cpu_rnn.run("quick", str(tmp_path), repeats=1)
    df = pd.read_csv(tmp_path / "cpu_rnn_quick.csv")
    row = df.set_index("system").loc["jax-jit"]
    assert row["status"] == "absent: not installed (jax)" and np.isnan(row["seconds"])
    assert (df[df["system"] != "jax-jit"]["status"].isin(["ok"])).sum() >= 5
    text = cpu_rnn.table(df)
    assert "c-auto vs fastest peer (torch, JAX)" in text and "jax-jit" not in text
    assert "(torch-" in text.splitlines()[-1]
    for workload in WORKLOADS:  # every experiment's systems: an absent jax-jit row
        (jax_row,) = [s for s in measure.systems(workload) if s.name == "jax-jit"]
        assert jax_row.absent == "not installed (jax)"


def test_polyft_and_the_experiments_import_without_importing_jax():
    code = ("import sys, polyft, polyft.workloads\n"
            "from polyft.experiments import baselines_jax, cpu_rnn, fig2, fig7, fig8, measure, plot\n"
            "assert 'jax' not in sys.modules, 'jax imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_cpu_rnn_table_names_the_fastest_peer():
    rows = [dict(workload="stacked_lstm", shape="N=2", system=s, status="ok", seconds=t)
            for s, t in (("numpy-eager", 1.0), ("c-auto", 0.01), ("torch-cell-loop", 0.05),
                         ("torch-nn-lstm", 0.03), ("jax-jit", 0.02))]
    last = cpu_rnn.table(pd.DataFrame(rows)).splitlines()[-1]
    assert last.endswith("| 100.0x | 5.00x | 2.00x (jax-jit) |")
