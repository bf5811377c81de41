"""Instance-by-instance execution of an ETDG on numpy buffers, in the original schedule.

This is deliberately naive and independent of ISL: domains are enumerated with Python loops,
access maps are evaluated from the ETDG's `Aff`s, and the original schedule is the position
vector of every statement. It checks the tracer (the result must equal eager execution) and,
recording addresses, it is the brute-force reference for ISL's dependence analysis.
"""
from __future__ import annotations

import itertools

import numpy as np

from . import pytree
from .errors import InputDepthError, InputError, PolyftError
from .etdg import ETDG, Gather
from .fractaltensor import FractalTensor
from .primitives import PRIMITIVES
from .ragged import Ragged, length_at


def bind_params(etdg: ETDG, args) -> dict:
    """Values of the symbolic lengths, read off the concrete inputs' shapes."""
    params = {}
    for (name, buf), arg in zip(etdg.inputs, args):
        if buf is None:
            continue
        if isinstance(arg, FractalTensor) and arg.depth != buf.depth:  # eagerly an operator would refuse it
            raise InputDepthError(f"input {name} should be {buf.type} (a list of depth {buf.depth}), got the list "
                                  f"{arg.type_string} of depth {arg.depth}; FractalTensor.from_numpy(array, "
                                  f"depth={buf.depth}) groups an array as compiled", op="run")
        arr = arg.dense_view() if isinstance(arg, FractalTensor) else np.asarray(arg)
        if arr.shape[buf.depth:] != buf.element_shape or arr.ndim != buf.depth + len(buf.element_shape):
            raise InputError(f"input {name} should be {buf.type}, got an array of shape {list(arr.shape)}",
                             op="run")
        for k, n in enumerate(buf.dims):
            if n.is_concrete:
                if n.const != arr.shape[k]:
                    raise InputError(f"input {name} dim {k} should be {n}, got {arr.shape[k]}", op="run")
            elif len(n.terms) == 1 and not n.floors and n.const == 0 and list(n.terms.values()) == [1]:
                p = next(iter(n.terms))
                if params.setdefault(p, arr.shape[k]) != arr.shape[k]:
                    raise InputError(f"length {p} is {params[p]} elsewhere but {arr.shape[k]} in input {name}",
                                     op="run")
    for a in etdg.assumptions:
        if all(q in params for q in a.expr.params) and not a.holds(params):
            got = ", ".join(f"{q} = {params[q]}" for q in sorted(a.expr.params))
            raise InputError(f"the program was traced assuming {a} ({a.why}); called with {got}", op="run")
    return params


def instances(etdg: ETDG, params: dict):
    """All statement instances (statement, {dim: value}, time vector) in original order."""
    width = max((len(st.position) for st in etdg.statements), default=0)
    out = []
    for st in etdg.statements:
        ranges = [range(d.extent.evaluate(params)) for d in st.dims]
        for point in itertools.product(*ranges):
            env = dict(zip(st.dims, point))
            time = [item if isinstance(item, int) else
                    (item.extent.evaluate(params) - 1 - env[item] if item.reversed else env[item])
                    for item in st.position]
            out.append((tuple(time) + (0,) * (width - len(time)), st, env))
    out.sort(key=lambda x: x[0])
    return [(st, env, time) for time, st, env in out]


def _index(ix, env, params, storage):
    if isinstance(ix, Gather):
        return int(storage[ix.index.resolve()][tuple(a.evaluate(env, params) for a in (*ix.lead, ix.pos))])
    return ix.evaluate(env, params)


def run(etdg: ETDG, *args, record=None):
    """Execute the ETDG; `record(st, env, reads, writes)` sees every instance's addresses
    (reads/writes: lists of (buffer name, index tuple))."""
    params = bind_params(etdg, args)
    storage = {}
    for (name, buf), arg in zip(etdg.inputs, args):
        if buf is not None:
            storage[buf] = arg.to_numpy() if isinstance(arg, FractalTensor) else np.asarray(arg)
    written = {}
    for b in etdg.buffers:
        b = b.resolve()
        if b.kind in ("const", "index"):
            storage[b] = b.value
        elif b.kind in ("intermediate", "output"):
            shape = tuple(n.evaluate(params) for n in b.dims) + b.element_shape
            storage[b] = np.full(shape, np.nan, dtype=b.dtype)
            written[b] = np.zeros(shape[:b.depth], dtype=bool)
    for st, env, _ in instances(etdg, params):
        vals, reads, writes = {}, [], []
        for op in st.ops:
            if op.op == "load":
                vals[op] = _load(op, env, params, storage, written, reads)
            elif op.op == "store":
                buf = op.buffer.resolve()
                idx = tuple(_index(ix, env, params, storage) for ix in op.index)
                if written[buf][idx]:
                    raise PolyftError(f"{st.name} writes {buf.name}{list(idx)} a second time", op="run")
                storage[buf][idx] = _operand(op.inputs[0], vals)
                written[buf][idx] = True
                writes.append((buf.name, idx))
            else:
                operands = [_operand(a, vals) for a in op.inputs]
                vals[op] = np.asarray(PRIMITIVES[op.op].apply(operands, op.attrs), dtype=op.dtype)
        if record is not None:
            record(st, env, reads, writes)
    return assemble_outputs(etdg, storage)


def _operand(a, vals):
    return a[1] if isinstance(a, tuple) else vals[a]


def _load(op, env, params, storage, written, reads):
    live = [pc for pc in op.pieces if all(c.holds(env, params) for c in pc.conds)]
    if len(live) != 1:
        raise PolyftError(f"load {op!r}: {len(live)} pieces apply at {env} (exactly one must)", op="run")
    pc = live[0]
    if pc.buffer is None:
        return np.asarray(pc.const, dtype=op.dtype)
    buf = pc.buffer.resolve()
    idx = tuple(_index(ix, env, params, storage) for ix in pc.index)
    if buf in written and not written[buf][idx]:
        raise PolyftError(f"load {op!r} reads {buf.name}{list(idx)} before it is written", op="run")
    reads.append((buf.name, idx))
    return storage[buf][idx]


def unpack(arr: np.ndarray, dims, element_shape, dtype, lengths: dict) -> FractalTensor:
    """The FractalTensor of an output buffer's array whose dims may be ragged (`lengths`: the
    buffer name -> array of lengths)."""
    depth = len(dims)

    def build(prefix: tuple):
        level = len(prefix)
        n = dims[level]
        count = length_at(n, prefix, lengths) if isinstance(n, Ragged) else arr.shape[level]
        items = [arr[prefix + (k,)] if level == depth - 1 else build(prefix + (k,)) for k in range(count)]
        return FractalTensor(items, depth - level, element_shape, dtype)
    return build(())


def assemble_outputs(etdg, storage):
    """The program's result (FractalTensors / tensors, nested as it returned them) from the
    output buffers' arrays (`storage`: Buffer -> ndarray)."""
    flat = []
    for b in etdg.outputs:
        b = b.resolve()
        arr = storage[b]
        if any(isinstance(n, Ragged) for n in b.dims):  # lengths read from the call's buffers of them
            flat.append(unpack(arr, b.dims, b.element_shape, b.dtype, {k.name: a for k, a in storage.items()}))
        else:
            flat.append(FractalTensor.from_numpy(arr, b.depth) if b.depth else arr)
    return pytree.unflatten(pytree.structure(etdg.out_tree), flat)
