"""`ft.jax.function`: a compiled polyft program as a JAX function, usable under `jax.jit`,
`jax.grad` and `jax.vmap` (polyft/interop.py has the conventions).

The program runs on the host through `jax.pure_callback` (JAX hands it numpy views of its
buffers and copies the outputs back); a `jax.custom_vjp` makes its gradient the compiled
pullback, called through a second callback. JAX traces neither: under `jax.jit` each is one
opaque call in the compiled computation, under `jax.vmap` one call per example
(vmap_method="sequential"). Float64 programs need `jax_enable_x64`.
"""
from __future__ import annotations

import jax
import numpy as np

from . import pytree
from .interop import boundary as shared

API = "ft.jax.function"  # what messages name


def function(fn, *specs, target: str = "c", **compile_options):
    """`fn` compiled for `target` from `specs` (ft.spec, or example arrays), as a JAX function:
    one array per spec, a list of type [N, L]float32[1, H] as an array [N, L, 1, H] (list dims
    first). It returns what `fn` returns, with JAX arrays for its tensors and lists; its gradient
    with respect to every float input is fn's pullback, compiled on first use with the same target.
    `compile_options` go to ft.compile (schedule= and alternative= to the forward only)."""
    boundary = shared(fn, specs, dict(target=target, **compile_options), API)

    def outputs(args) -> list:
        params = boundary.check(args, _dtype, _what, API)
        return [jax.ShapeDtypeStruct(shape, b.dtype) for shape, b in zip(boundary.output_shapes(params),
                                                                        boundary.outputs)]

    def forward(*args):
        return jax.pure_callback(lambda *arrays: boundary.run(arrays), outputs(args), *args,
                                 vmap_method="sequential")

    def gradients(args, cts):
        diff = boundary.differentiable
        shapes = [jax.ShapeDtypeStruct(args[k].shape, args[k].dtype) for k in diff]
        n = len(args)

        def run(*arrays):
            grads = boundary.gradients(arrays[:n], arrays[n:])
            return [grads[k] for k in diff]
        got = iter(jax.pure_callback(run, shapes, *args, *cts, vmap_method="sequential"))
        return tuple(next(got) if k in diff else None for k in range(n))

    @jax.custom_vjp
    def call(*args):
        return forward(*args)

    call.defvjp(lambda *args: (forward(*args), args), gradients)

    def program(*args):
        return pytree.unflatten(boundary.structure, call(*args))

    program.boundary = boundary
    program.__name__ = boundary.name
    return program


def _dtype(x):
    """An array's dtype as numpy names it; None for something that is not an array."""
    dtype = getattr(x, "dtype", None)
    return np.dtype(dtype).name if dtype is not None and hasattr(x, "shape") else None


def _what(x) -> str:
    if _dtype(x) is None:
        return f"a {type(x).__name__}"
    return f"a {_dtype(x)} array {list(x.shape)}"
