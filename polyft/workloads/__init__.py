"""The paper's workloads as polyft programs (Table 6 and Listings 1-4).

Each module has `program`, `PRESETS`, `inputs(preset, seed, **overrides)`,
`specs(preset, **overrides)` and `DESCRIPTION` (see docs/design.md, "Workloads"). `sizes` resolves
a preset with overrides for any of them (what `inputs` and `specs` use).
"""
from __future__ import annotations

from polyft.errors import PolyftError

from . import b2b_gemm, bigbird, dilated_rnn, flash_attention, grid_rnn, stacked_lstm, stacked_rnn
from ._common import sizes

WORKLOADS = {
    "stacked_rnn": stacked_rnn,
    "stacked_lstm": stacked_lstm,
    "dilated_rnn": dilated_rnn,
    "grid_rnn": grid_rnn,
    "b2b_gemm": b2b_gemm,
    "flash_attention": flash_attention,
    "bigbird": bigbird,
}


def get(name: str):
    """The workload module called `name`."""
    try:
        return WORKLOADS[name]
    except (KeyError, TypeError):
        raise PolyftError(f"no workload {name!r}; known workloads: {', '.join(WORKLOADS)}",
                          op="workloads") from None
