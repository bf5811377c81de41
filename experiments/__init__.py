"""One script per paper table/figure; each has run(preset, out_dir) and runs alone with python -m."""

from .common import cap_peers

cap_peers()  # before any experiment loads torch or JAX: the peers at $POLYFT_MARCH's ISA level
