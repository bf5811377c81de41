"""Time every JAX baseline's settings side by side at fig7's quick shapes, each checked against
eager first (experiments/baselines_jax.py: OPTIONS, variants): how its defaults were chosen.

    python -m polyft.experiments.jax_settings
"""
from __future__ import annotations

import numpy as np

from polyft.testing import rel_error
from polyft.workloads import get

from .baselines_jax import variants
from .fig7 import QUICK
from .measure import time_calls


def main() -> int:
    """Time every workload's alternatives side by side at fig7's quick shapes (checked first)."""
    for workload, sizes in QUICK.items():
        mod = get(workload)
        inputs = mod.inputs("small", seed=1, **sizes)
        eager = mod.program(*inputs)
        built = [(label, fn(*inputs)) for label, fn in variants(workload)]
        for label, b in built:
            assert rel_error(b.result(), b.expected(eager)) < 1e-4, (workload, label)
        times = time_calls([(b.run, "cpu") for _, b in built], repeats=9)
        best = min(float(np.median(t)) for t in times)
        print(workload, " ".join(f"{label} {np.median(t) * 1e3:.3f} ms ({np.median(t) / best:.2f})"
                                 for (label, _), t in zip(built, times)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
