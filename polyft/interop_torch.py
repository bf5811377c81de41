"""`ft.torch.function`: a compiled polyft program as a function on torch tensors, differentiated by
torch's autograd through polyft's compiled pullback (polyft/interop.py has the conventions).

Eager calls where an input requires grad go through a `torch.autograd.Function` (others run the
program directly, with no autograd node); under `torch.compile` the same forward and pullback run
as two `torch.library` custom ops with fake (shape) implementations, so Dynamo puts the program in
its graph without a graph break and AOTAutograd traces the backward through the pullback op. (A
custom op's eager dispatch costs some 40 us a call, more than the rest of the boundary: hence the
two paths.)

Zero copy: a CPU tensor that is contiguous and of the input's dtype is read where it is (its
numpy view); the outputs are torch tensors over the arrays the program wrote, which no live value
references (CompiledProgram.run_arrays), so no call's result is overwritten by a later one.
"""
from __future__ import annotations

import itertools
import re

import torch

from . import pytree
from .interop import FLOATS, Boundary, boundary

API = "ft.torch.function"  # what messages name
DTYPES = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
          torch.int32: "int32", torch.int64: "int64"}


def function(fn, *specs, target: str = "c", **compile_options) -> "Function":
    """`fn` compiled for `target` from `specs` (ft.spec, or example arrays), as a callable on torch
    tensors: one CPU tensor per spec, a list of type [N, L]float32[1, H] as a tensor [N, L, 1, H]
    (list dims first). It returns what `fn` returns, with torch tensors for its tensors and lists;
    gradients flow to every float input (`loss.backward()`), computed by fn's pullback, compiled
    on the first backward with the same target. `compile_options` go to ft.compile (schedule=
    and alternative= to the forward only)."""
    return Function(boundary(fn, specs, dict(target=target, **compile_options), API))


class Function:
    """A compiled polyft program called on torch tensors (made by `ft.torch.function`).
    `.program` is the forward's CompiledProgram, `.pullback` the backward's (compiled when first
    needed)."""

    def __init__(self, boundary: Boundary):
        self.boundary = boundary
        self.custom_ops = _register(boundary)  # (forward, pullback); here: Dynamo cannot trace a registration

    @property
    def program(self):
        return self.boundary.forward

    @property
    def pullback(self):
        return self.boundary.pullback

    def __call__(self, *tensors):
        if torch.compiler.is_compiling():
            outs = self.custom_ops[0](*tensors)
        elif torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            outs = _Apply.apply(self.boundary, *tensors)
        else:  # nothing to differentiate: no autograd node
            outs = _forward(self.boundary, tensors)
        return pytree.unflatten(self.boundary.structure, outs)

    def __repr__(self):
        return f"<ft.torch.function {self.boundary.name}: {self.program.etdg.signature()}>"


def _dtype(t):
    """A CPU tensor's dtype as numpy names it; None for anything else (a CUDA tensor included)."""
    return DTYPES.get(t.dtype) if isinstance(t, torch.Tensor) and t.device.type == "cpu" else None


def _what(t) -> str:
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}"
    where = "" if t.device.type == "cpu" else f" on {t.device} (the program reads CPU tensors: .cpu() it)"
    return f"a {str(t.dtype).replace('torch.', '')} tensor {list(t.shape)}{where}"


def _forward(boundary: Boundary, tensors) -> list:
    """The outputs as tensors over the program's arrays; the inputs read through their numpy views
    (no copy), once checked."""
    boundary.check(tensors, _dtype, _what, API)
    return [torch.from_numpy(a) for a in boundary.run([t.detach().numpy() for t in tensors])]


class _Apply(torch.autograd.Function):
    """The eager path: the forward program, and the compiled pullback as backward."""

    @staticmethod
    def forward(ctx, boundary, *tensors):
        outs = _forward(boundary, tensors)
        ctx.boundary = boundary
        ctx.save_for_backward(*tensors)
        ctx.mark_non_differentiable(*[o for o, b in zip(outs, boundary.outputs) if b.dtype not in FLOATS])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *cotangents):
        grads = _gradients(ctx.boundary, ctx.saved_tensors, cotangents)
        return (None, *[g if need else None for g, need in zip(grads, ctx.needs_input_grad[1:])])


def _gradients(boundary: Boundary, tensors, cotangents) -> list:
    """One tensor per input (None for an integer one): the pullback on the inputs and cotangents."""
    arrays = [t.detach().numpy() for t in tensors]
    cts = [c.detach().numpy() for c in cotangents]
    return [None if g is None else torch.from_numpy(g) for g in boundary.gradients(arrays, cts)]


_NUMBER = itertools.count()


def _register(boundary: Boundary) -> tuple:
    """The forward and the pullback as custom ops `polyft::<name>_<n>` and `..._pullback`, the
    forward's autograd formula calling the pullback op (for torch.compile)."""
    name = f"polyft::{re.sub(r'[^0-9A-Za-z_]', '_', boundary.name)}_{next(_NUMBER)}"
    args = [f"Tensor x{k}" for k in range(len(boundary.inputs))]
    cts = [f"Tensor ct{k}" for k in range(len(boundary.outputs))]
    diff = boundary.differentiable

    def forward(*tensors):
        return _forward(boundary, tensors)

    def pullback(*tensors):
        n = len(boundary.inputs)
        grads = _gradients(boundary, tensors[:n], tensors[n:])
        return [grads[k] for k in diff]

    fwd = torch.library.custom_op(name, forward, mutates_args=(), schema=f"({', '.join(args)}) -> Tensor[]")
    bwd = torch.library.custom_op(f"{name}_pullback", pullback, mutates_args=(),
                                  schema=f"({', '.join(args + cts)}) -> Tensor[]")

    @fwd.register_fake
    def _(*tensors):
        params = boundary.check(tensors, _dtype, _what, API)
        return [torch.empty(shape, dtype=_TORCH[b.dtype]) for shape, b in zip(boundary.output_shapes(params),
                                                                              boundary.outputs)]

    @bwd.register_fake
    def _(*tensors):
        return [torch.empty_like(tensors[k]) for k in diff]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grads):
        got = iter(bwd(*ctx.saved_tensors, *grads))
        return tuple(next(got) if k in diff else None for k in range(len(boundary.inputs)))

    fwd.register_autograd(backward, setup_context=setup_context)
    return fwd, bwd


_TORCH = {name: dtype for dtype, name in DTYPES.items()}
