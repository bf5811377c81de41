"""Helpers shared by the workload modules: preset lookup and seeded random data."""
from __future__ import annotations

import numpy as np

from polyft.errors import PolyftError


def sizes(workload: str, presets: dict, preset: str, overrides: dict) -> dict:
    """The preset's sizes with `overrides` applied; unknown presets or size names are errors."""
    if preset not in presets:
        raise PolyftError(f"{workload}: no preset {preset!r}; known presets: {', '.join(presets)}",
                          op="inputs")
    out = dict(presets[preset])
    unknown = sorted(set(overrides) - set(out))
    if unknown:
        raise PolyftError(f"{workload}: unknown size(s) {', '.join(unknown)}; "
                          f"the sizes are {', '.join(out)}", op="inputs")
    out.update(overrides)
    return out


def check_divisible(workload: str, what: str, n: int, d: int) -> None:
    if n % d != 0:
        raise PolyftError(f"{workload}: {what} = {n} is not a multiple of {d}", op="inputs")


def randn(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Standard normal float32 data times `scale` (never zeros)."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)
