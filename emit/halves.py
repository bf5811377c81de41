"""Half-width storage under precision "fp16" or "bf16" (the CUDA target): the float32 buffers
in global memory hold __half or __nv_bfloat16, halving DRAM traffic; the runtime converts the
inputs once per call as it uploads them and the outputs back to float32 as it fetches them.
Tiles in shared memory, on-chip state and all arithmetic stay float32 (tiles.cuh: ft::In,
ft::narrow), so only what is stored is rounded.

A buffer stays float32 where one load reads it together with a buffer kept on chip (pieces
of one load share one C type): a scan's initial state read by the same load as the state the
block keeps in shared memory. A load's constant pieces (zeros before a scan, padding) are
constant arrays of the narrow type.
"""
from __future__ import annotations

import numpy as np

STORAGE = {"fp16": "__half", "bf16": "__nv_bfloat16"}  # precision -> the C type global buffers hold
DTYPES = {"__half": np.dtype(np.float16), "__nv_bfloat16": np.dtype(np.uint16)}  # bf16: its bits


def narrow_buffers(etdg, local, precision: str) -> dict:
    """buffer name -> the C type its elements are stored as in global memory, for the float32
    buffers not in `local` (kept on chip) under `precision`; none under fp32 and tf32."""
    if precision not in STORAGE:
        return {}
    narrow = {b.resolve().name for b in etdg.buffers if b.resolve().dtype == "float32"} - set(local)
    loads = [[pc.buffer.resolve().name for pc in op.pieces if pc.buffer is not None]
             for st in etdg.statements for op in st.ops if op.op == "load"]
    changed = True
    while changed:  # a buffer given up can make another load mixed
        changed = False
        for names in loads:
            if any(n in narrow for n in names) and not all(n in narrow for n in names):
                narrow -= set(names)
                changed = True
    return {name: STORAGE[precision] for name in narrow}


def to_storage(a: np.ndarray, ctype: str) -> np.ndarray:
    """A float32 array as elements of `ctype`, rounded to nearest even (as __float2half_rn and
    __float2bfloat16_rn; bf16 as the upper 16 bits of the rounded float, NaN kept NaN)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if ctype == "__half":
        with np.errstate(over="ignore"):  # beyond 65504: inf, as on the GPU
            return a.astype(np.float16)
    u = a.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(a)
    rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)  # quiet, sign kept
    return rounded


def from_storage(h: np.ndarray, ctype: str) -> np.ndarray:
    """Elements of `ctype` (as to_storage gives them) as float32, exactly."""
    if ctype == "__half":
        return h.astype(np.float32)
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
