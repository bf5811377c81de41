"""The boundary between a compiled polyft program and another framework's arrays, shared by
`ft.torch` (polyft/interop_torch.py) and `ft.jax` (polyft/interop_jax.py).

A `Boundary` compiles the program once from specs, checks the framework's arguments against
the inputs' types (naming the argument, in the framework's terms), runs the program on the
arrays where they are, and differentiates it by a second compiled program: the pullback, built
with `ft.vjp` and compiled on first use (inference never pays for it).

The tensor convention: an input or output of type `[N, L]float32[1, H]` (a list of depth 2) is
one array of shape [N, L, 1, H]: the list dims lead, the element's dims follow (`dense_view`'s
layout). A static tensor (`float32[H, H]`) is an array of its own shape. Ragged lists have no
such array and are refused here.

The pullback program takes the forward's inputs and one cotangent per output and returns one
gradient per float input: it runs the forward again before the backward (both in one compiled
program), so nothing of the forward call is kept but its inputs."""
from __future__ import annotations

import inspect
import weakref

import numpy as np

from . import pytree
from .errors import InputError, PolyftError
from .fractaltensor import FractalTensor
from .ragged import Ragged
from .types import Spec

FLOATS = ("float16", "float32", "float64")
_BACKWARD_OPTIONS = ("target", "coarsen", "precision", "contract", "sizes")  # the pullback's share of them


_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn -> {(specs, options): Boundary}


def boundary(fn, specs, options: dict, api: str) -> "Boundary":
    """The Boundary of `fn` at `specs` with ft.compile's `options`, compiled once per process: ft.torch
    and ft.jax functions of one function share it (and its pullback), unless an array the function
    captured has changed since (then it is compiled again, as ft.compile would be). `api` names
    the entry point in messages ("ft.torch.function")."""
    specs = [_spec(s, k, api) for k, s in enumerate(specs)]
    key = (tuple(map(str, specs)), repr(sorted(options.items())))
    try:
        known = _SHARED.setdefault(fn, {})
    except TypeError:  # not weakly referable (a callable object): not shared
        known = {}
    found = known.get(key)
    if found is None or any(c.changed() for c in found.forward.traced.captured):
        found = known[key] = Boundary(fn, specs, options, api)
    return found


class Boundary:
    """`fn` compiled from `specs` (Specs) for calls from another framework; `options` are
    ft.compile's keyword arguments (the pullback gets those that do not name the forward's
    statements: schedule= and alternative= only as "auto" / "original" / True / False, not as ISL
    schedules). `api` names the entry point in messages (its construction's: calls name theirs)."""

    def __init__(self, fn, specs, options: dict, api: str):
        from .program import compile as compile_program
        self.fn = fn
        self.specs = specs
        self.options = options
        self.forward = compile_program(fn, *self.specs, **options)
        etdg = self.forward.etdg
        self.names = [name for name, _ in etdg.inputs]
        self.inputs = [buf for _, buf in etdg.inputs]
        self.outputs = [b.resolve() for b in etdg.outputs]
        self.structure = pytree.structure(etdg.out_tree)
        for b in self.outputs:
            if any(isinstance(n, Ragged) for n in b.dims):
                raise PolyftError(f"the output {b.name} is the ragged list {b.type}, which is no one tensor; return "
                                  "regular lists (pad them)", op=api)
        self.sizes = dict(self.forward.model.sizes)
        self.differentiable = [k for k, b in enumerate(self.inputs) if b.dtype in FLOATS]
        self._pullback = None
        self._rules = [(b.dtype, b.depth + len(b.element_shape), b.element_shape,
                        [(r, n.const if n.is_concrete else _single_param(n)) for r, n in enumerate(b.dims)])
                       for b in self.inputs]

    @property
    def name(self) -> str:
        return self.forward.etdg.name

    def describe(self, k: int) -> str:
        """Input k's expected tensor in words: `float32 tensor [N, L, 1, 16] (a [N, L] list of [1, 16]
        elements)`."""
        b = self.inputs[k]
        dims = [str(n) for n in b.dims] + [str(s) for s in b.element_shape]
        list_of = f" (a [{', '.join(dims[:b.depth])}] list of [{', '.join(dims[b.depth:])}] elements)" if b.depth \
            else ""
        return f"{b.dtype} tensor [{', '.join(dims)}]{list_of}"

    def check(self, args: list, dtype_of, what, api: str) -> dict:
        """The lengths the arguments give ({name: int}), once every argument has the dtype, rank,
        element shape and list lengths of its input. `dtype_of(arg)`: its dtype as numpy names it
        (None: not a tensor of this framework); `what(arg)`: how the framework writes it, and `api`
        the entry point, for messages."""
        if len(args) != len(self.inputs):
            raise InputError(f"{self.name} takes {len(self.inputs)} tensors ({', '.join(self.names)}), got "
                             f"{len(args)}", op=api)
        params = dict(self.sizes)
        for k, (arg, (dtype, ndim, element, dims)) in enumerate(zip(args, self._rules)):
            shape = getattr(arg, "shape", None)
            if dtype_of(arg) != dtype or len(shape) != ndim or tuple(shape[ndim - len(element):]) != element:
                raise self._wrong(k, arg, what, api)
            for r, n in dims:
                if isinstance(n, str):
                    if params.setdefault(n, shape[r]) != shape[r]:
                        raise InputError(f"argument {k} ({self.names[k]}) has {n} = {shape[r]} (dim {r} of "
                                         f"{what(arg)}), where another argument has {n} = {params[n]}", op=api)
                elif n is not None and n != shape[r]:
                    raise self._wrong(k, arg, what, api)
        return params

    def _wrong(self, k, arg, what, api) -> InputError:
        return InputError(f"argument {k} ({self.names[k]}) of {self.name} should be a {self.describe(k)}, got "
                          f"{what(arg)}", op=api)

    def output_shapes(self, params: dict) -> list:
        """The outputs' array shapes for the lengths `params` (what `check` returned)."""
        return [tuple(n.evaluate(params) for n in b.dims) + b.element_shape for b in self.outputs]

    def run(self, arrays) -> list:
        """The outputs (numpy arrays, flat) of the forward program on `arrays`, each allocated by
        this call."""
        return self.forward.run_arrays(*arrays)

    def gradients(self, arrays, cotangents) -> list:
        """One gradient per input (None for an integer input) of the outputs against `cotangents`
        (one array per output), by the compiled pullback."""
        grads = iter(self.pullback.run_arrays(*arrays, *cotangents))
        return [next(grads) if k in self.differentiable else None for k in range(len(self.inputs))]

    @property
    def pullback(self):
        """The compiled pullback (built on first use): (inputs..., cotangents...) -> the float
        inputs' gradients."""
        if self._pullback is None:
            from .program import compile as compile_program
            cts = [Spec(b.type) for b in self.outputs]
            options = {k: v for k, v in self.options.items() if k in _BACKWARD_OPTIONS or _general(k, v)}
            self._pullback = compile_program(pullback_program(self.fn, self.names, self.differentiable,
                                                              [b.name for b in self.outputs]),
                                             *self.specs, *cts, **options)
        return self._pullback


def pullback_program(fn, names: list, differentiable: list, outputs: list):
    """The program (inputs..., cotangents...) -> the gradients of `fn`'s inputs numbered in
    `differentiable` (ft.vjp with respect to those, the others closed over), its parameters named
    after fn's inputs and `d_<output>`."""
    from .autodiff import vjp
    n = len(names)

    def backward(*args):
        inputs, cts = list(args[:n]), args[n:]

        def partial(*xs):
            for k, x in zip(differentiable, xs):
                inputs[k] = x
            return fn(*inputs)
        _, pullback = vjp(partial, *[inputs[k] for k in differentiable])
        return pullback(*cts)

    parameter = inspect.Parameter.POSITIONAL_ONLY
    backward.__signature__ = inspect.Signature([inspect.Parameter(p, parameter)
                                                for p in [*names, *(f"d_{o}" for o in outputs)]])
    backward.__name__ = f"pullback_{getattr(fn, '__name__', 'fn')}"
    return backward


def _general(option: str, value) -> bool:
    """Whether a schedule= or alternative= value applies to any program (not an ISL schedule of the
    forward's statements)."""
    return option in ("schedule", "alternative") and (value is None or isinstance(value, bool)
                                                      or isinstance(value, str) and value in ("auto", "original"))


def _spec(s, k: int, api: str) -> Spec:
    """Argument k's spec: a Spec, or the type of an example array / FractalTensor."""
    if isinstance(s, FractalTensor):
        s = Spec(s.ftype) if s.is_regular else s
    elif isinstance(s, np.ndarray):
        s = Spec(_static_type(s))
    if not isinstance(s, Spec):
        raise PolyftError(f"spec {k} is a {type(s).__name__}; give an ft.spec('[N, L]float32[1, 16]') (or an example "
                          "numpy array or regular FractalTensor) per tensor argument", op=api)
    if any(isinstance(n, Ragged) for n in s.type.lengths):
        raise PolyftError(f"spec {k} is the ragged list {s}, which is no one tensor; pad it to a regular list (and "
                          "mask), or call ft.compile with FractalTensor.from_list", op=api)
    return s


def _static_type(arr: np.ndarray):
    from .types import FTType
    return FTType((), arr.shape, arr.dtype.name)


def _single_param(n) -> str | None:
    """The parameter a list dim is (`N`), or None for an expression of them (`L - 1`: checked by the
    program)."""
    if len(n.terms) == 1 and not n.floors and n.const == 0 and list(n.terms.values()) == [1]:
        return next(iter(n.terms))
    return None
