"""The driver, at the top layer: `ft.analyze` traces, models, analyses and schedules a
program (no code generation); `ft.compile` also generates code for a target and loads it
into that target's runtime (emit.targets). Nothing below imports this module; `polyft`
imports it when analyze/compile is first called, so `import polyft` stays light."""
from __future__ import annotations

import math

import islpy as isl
import numpy as np

from polyft.deps.analyze import analyze as dependences
from polyft.deps.isl_helpers import maps
from polyft.deps.model import build, check_addressable, check_sizes
from polyft.emit.c_statements import native_dtype
from polyft.emit.c_target import CTarget, packed_weights
from polyft.emit.gpu_count import count as count_traffic
from polyft.emit.race_check import races as find_races
from polyft.emit.targets import select
from polyft.names import tuple_name
from polyft.schedule.coarsen import coarsen as coarsen_etdg
from polyft.schedule.provenance import Coarsening
from polyft.schedule.schedule import make_schedule, schedule_kind
from polyft.schedule.storage import Storage, extents, storage_mapping

from . import calls
from .calls import CONSTANT, CallPath, constant
from .errors import InputError, PolyftError
from .fractaltensor import FractalTensor
from .interpret import assemble_outputs, bind_params
from .ragged import Ragged, check_lengths, lengths_of, padded, used_elements
from polyft.emit.schedule_choice import Variant, schedule_choice
from .tracing import trace


class Program:
    """A traced program with its polyhedral model, dependences and schedule (§4.4–§5)."""

    def __init__(self, fn, args, schedule="auto", sizes=None, coarsen=None):
        self._storage = self._local = None
        self.fn = fn
        schedule = schedule_kind(schedule)  # a wrong schedule= fails before tracing
        self.traced = trace(fn, *args)
        self.coarsen_log: list = []
        coarsened = coarsen if coarsen is not None else isinstance(schedule, str) and schedule == "auto"
        if coarsened:
            self.etdg, self.coarsen_log = coarsen_etdg(self.traced, sizes=check_sizes(sizes, self.traced.params))
        else:
            self.etdg = self.traced
        self.model = build(self.etdg, sizes)
        self.deps = dependences(self.model)
        self._coarsening = Coarsening.of(self.traced, self.etdg, self.coarsen_log, bool(coarsened))
        self.schedule = self.schedule_as(schedule)

    def schedule_as(self, kind):
        """A Schedule of this program's (coarsened) statements: `kind` as schedule= takes it."""
        kind = schedule_kind(kind)
        if not isinstance(kind, str):  # a hand schedule: with coarsen=True, traced names are an error
            self._coarsening.check_names(m.get_tuple_name(isl.dim_type.in_) for m in maps(kind))
        out = make_schedule(self.model, self.deps, kind)
        out.coarsening = self._coarsening
        return out

    def original_schedule(self):
        return self.schedule_as("original")

    @property
    def storage(self) -> Storage:
        """How every buffer is stored under the schedule (schedule.storage): contracted
        intermediates, their ISL mappings element -> cell, live accesses and placement."""
        if self._storage is None:
            self._storage = storage_mapping(self.model, self.schedule, True)
        return self._storage

    def memory(self, sizes: dict | None = None, lengths: dict | None = None) -> pd.DataFrame:
        """One row per buffer: role, full_bytes (one element per instance), allocated_bytes
        (what is stored in memory shared by all threads), local_bytes (what one thread keeps
        in its own scratch), packed_bytes (the packed copy of a large shared matrix a call
        keeps beside it, `packed`), placement, region (local buffers with one region number are
        never live at once and share a place in the scratch, which holds the largest of them;
        -1 for others) and the ISL mapping element -> cell. A local buffer is counted as the C
        target keeps it: per thread, for its `local_batch(buffer)`. `sizes` gives the lengths
        the program was not built with (none for programs from concrete inputs).
        padded_cells counts a buffer's elements (one per instance of the bounding domain: a ragged
        level at its bound), used_cells those within the ragged lengths (`lengths`: {input name:
        array of lengths}; by default the latest call's, else a concrete example's)."""
        env = _lengths(self.model, sizes)
        used = self._ragged_lengths(lengths)
        width_of = {name: self.local_batch(s.buffer) for name, s in self.storage.buffers.items()}
        widths = {name: w for name, w in width_of.items() if w}
        region = {name: j for j, group in enumerate(self.storage.regions(widths)) for name in group}
        rows = []
        for s in self.storage.buffers.values():
            buf = s.buffer
            width = width_of[buf.name]
            elem = math.prod(buf.element_shape) * native_dtype(buf.dtype).itemsize  # as stored; exact ints
            cells = math.prod(extents(s.cell_dims(width), env, buf.dims)) * elem
            mapping = s.mapping if width is None else s.local[width][1]
            padded_cells = math.prod(extents(buf.dims, env))
            ragged = any(isinstance(n, Ragged) for n in buf.dims)
            rows.append(dict(buffer=buf.name, role=ROLES[buf.kind],
                             full_bytes=padded_cells * elem,
                             allocated_bytes=0 if width else cells, local_bytes=cells if width else 0,
                             packed_bytes=cells if buf.name in self.packed else 0,
                             placement="local" if width else "global", region=region.get(buf.name, -1),
                             mapping=str(mapping.gist_params(self.model.context)) if mapping is not None
                             else "identity", padded_cells=padded_cells,
                             used_cells=(used_elements(buf.dims, used, env) if used is not None else None)
                             if ragged else padded_cells))
        import pandas as pd  # here: pandas takes 0.7 s to import, and compiling needs none of it
        return pd.DataFrame(rows)

    def _ragged_lengths(self, given) -> dict | None:
        """{lengths buffer name: array} of the ragged inputs: `given` ({input name: lengths}), else
        the latest call's, else the traced example's; None where some are unknown."""
        out = {}
        for r in getattr(self.traced, "ragged", ()):
            lens = (given or {}).get(r.name)
            lens = np.asarray(lens, dtype=np.int64) if lens is not None else \
                getattr(self, "_called_lengths", {}).get(r.lengths.name, r.example)
            if lens is None:
                return None
            out[r.lengths.name] = lens
        return out

    def local_batch(self, buf):
        """The storage.Batch a thread's scratch for `buf` holds in the C target's code (how
        many iterations of its slot loop; None: the buffer is in memory shared by all threads)."""
        if self._local is None:
            self._local = CTarget.local_batches(self.model, self.schedule, self.storage)
        return self._local.get(buf.resolve().name)

    @property
    def packed(self) -> frozenset:
        """The buffers of which the C target's code packs a copy before it runs (large matrices
        that matmuls share: emit.c_target.packed_weights)."""
        return frozenset(packed_weights(self.model))

    def gpu_profile(self, sizes: dict | None = None, precision: str | None = None, **assumptions):
        """The CUDA target's profile of this program at `sizes` (the lengths it was not built
        with), checkable without a GPU (emit.gpu_profile.GpuProfile: `.kernels`, `.statements`,
        `.buffers`, `.totals`, `.assumptions`): the module the "cuda" target generates, its
        launches, ptxas' registers and spills, global bytes per call from the access relations,
        a DRAM estimate and a roofline time. `assumptions` override the H100 SXM defaults
        (emit.gpu_profile.H100, e.g. dram_bytes_per_s=2.0e12). `precision` of the matmuls
        (default: the program's, else "fp32")."""
        precision = precision or getattr(self, "precision", "fp32")
        env = _lengths(self.model, sizes, op="gpu_profile")
        from polyft.emit.gpu_profile import profile as gpu_profile  # imports pandas
        return gpu_profile(self._cuda_module(precision), self.model, self.schedule, env, precision, **assumptions)

    def _cuda_module(self, precision: str):
        """The module the "cuda" target (a GPU's block size) generates for this program."""
        target, _ = select("cuda", precision)
        return target.generate(self.model, self.schedule, precision, self.storage)

    def __repr__(self):
        return f"<Program {self.etdg.signature()}, {self.schedule.kind} schedule>"

    def __reduce__(self):
        raise PolyftError(f"a {type(self).__name__} holds ISL objects and loaded native code, which cannot be pickled: "
                          "send the function and its inputs or specs instead and call ft.compile / ft.analyze in "
                          "the other process (the compile cache makes that quick), or use a fork-based "
                          "multiprocessing.Pool, whose workers inherit the program", op="pickle")

    def __deepcopy__(self, memo):
        """The program itself: nothing in it changes once built (the thread count it measures aside)."""
        return self


class CompiledProgram(Program):
    """A program with generated code: call it on inputs like the function itself.

    target "c": C with OpenMP, run through ctypes; "cuda": CUDA through PyCUDA on a GPU;
    "cuda-emulated": the same CUDA source run on the CPU by an emulator (for checking the
    CUDA generator where there is no GPU). `precision` (CUDA targets) of matmul operands:
    "fp32", or "tf32" / "fp16" / "bf16" on tensor cores where the tile shapes allow.
    """

    def __init__(self, fn, args, schedule="auto", sizes=None, target="c", coarsen=None, precision="fp32",
                 contract=True, alternative=None):
        generator, runtime = select(target, precision)
        if not isinstance(contract, bool):
            raise PolyftError(f"contract= takes True or False, got {contract!r}", op="compile")
        super().__init__(fn, args, schedule, sizes, coarsen)
        self.precision = precision
        self.target = target
        self._storage = storage_mapping(self.model, self.schedule, contract)
        self.module = generator.generate(self.model, self.schedule, precision, self._storage)
        self.source, self.layout = self.module.source, self.module.layout
        self._run = runtime(self.module)
        self._variant = Variant(self.schedule.kind, self.module, self._run)
        self.schedule_choice = schedule_choice(self, alternative, generator, runtime, contract)
        self._calls = None if getattr(self.traced, "ragged", ()) else CallPath(self)

    def local_batch(self, buf):
        """The storage.Batch of `buf`'s per-thread scratch in the generated code (None: the
        buffer is in the arrays the caller allocates)."""
        return self.layout.batch(buf)

    @property
    def packed(self) -> frozenset:
        """The buffers of which the generated code packs a copy before it runs."""
        return self.layout.packed

    @property
    def threads(self):
        """The C target's thread count per call (emit.threads.ThreadChoice: measured per set of
        lengths; `.fixed = n` pins it, `.last` is the latest call's); None for other targets."""
        return getattr(self._run, "threads", None)

    def _cuda_module(self, precision: str):
        if self.target == "c":
            raise PolyftError("gpu_profile() profiles the CUDA target; this program is compiled for the C target: "
                              "compile it with target='cuda-emulated' (or profile ft.analyze(fn, ...))",
                              op="gpu_profile")
        if self.target == "cuda" and precision == self.precision:
            return self.module
        return super()._cuda_module(precision)

    def emulated_traffic(self, *inputs, **named) -> pd.DataFrame:
        """The bytes this call moves to and from each buffer in global memory, counted by the
        emulator as the generated code and the tile library issue every load and store
        (emit.gpu_count; target "cuda-emulated" only): columns buffer, placement, read_bytes,
        written_bytes; attrs["launches"] is the (kernel, gx, gy) of every launch, and
        attrs["outputs"] the call's result (as `prog(*inputs)` gives it)."""
        if self.target != "cuda-emulated":
            raise PolyftError(f"emulated_traffic() runs the CUDA emulator; this program is compiled for target "
                              f"{self.target!r}: compile it with target='cuda-emulated'", op="emulated_traffic")
        values, given = self._checked(self._positional(inputs, named))
        storage = self._allocated(values, given, self.layout)
        counts, launched = count_traffic(self.module, [storage[b] for b in self.layout.buffers], values)
        import pandas as pd
        out = pd.DataFrame([dict(buffer=b.name, placement="shared" if self.layout.batch(b) else "global",
                                 read_bytes=r, written_bytes=w) for b, (r, w) in zip(self.layout.buffers, counts)])
        out.attrs["launches"] = launched
        out.attrs["outputs"] = self._result(storage)
        return out

    def emulated_races(self, *inputs, **named) -> list:
        """Shared-memory races in this call (emit.race_check; target "cuda-emulated" only): the
        module the "cuda" target generates, at a GPU's block size, run by the emulator with
        every shared-memory access checked against the others of its barrier interval. A list
        of reports, empty where there are none."""
        if self.target != "cuda-emulated":
            raise PolyftError(f"emulated_races() runs the CUDA emulator; this program is compiled for target "
                              f"{self.target!r}: compile it with target='cuda-emulated'", op="emulated_races")
        module = self._cuda_module(self.precision)
        values, given = self._checked(self._positional(inputs, named))
        storage = self._allocated(values, given, module.layout)
        return find_races(module, [storage[b] for b in module.layout.buffers], values)

    @property
    def host_driver(self) -> str:
        """The CUDA targets' host driver (Python) launching the kernels."""
        return self.module.host

    def __call__(self, *inputs, **named):
        inputs = self._positional(inputs, named)
        if self._calls is not None:
            return self._calls.result(self._calls.storage_after(inputs))
        return self._result(self._storage_after(inputs))

    def run_arrays(self, *inputs) -> list:
        """The outputs as plain arrays, flat in the order of `etdg.outputs` (regular outputs:
        `__call__` makes ragged ones lists). None is an input's or a constant's memory, nor memory
        that any value still references (polyft.calls recycles only what nothing references), so a
        caller may hand it out without a copy (ft.torch, ft.jax)."""
        storage = self._calls.storage_after(inputs) if self._calls is not None else self._storage_after(inputs)
        return [_native_to(b.resolve().dtype, storage[b.resolve()]) for b in self.etdg.outputs]

    def _storage_after(self, inputs) -> dict:
        """{buffer: array} once the program has run on `inputs` (checked first)."""
        values, given = self._checked(inputs)

        def call(variant):
            storage = self._allocated(values, given, variant.layout)
            variant.runtime([storage[b] for b in variant.layout.buffers], values)
            return storage
        return self._on_schedule(values, call)

    def _on_schedule(self, values: dict, call):
        """`call(variant)` on this program's schedule, or on the one its schedule_choice picks."""
        if self.schedule_choice is None:
            return call(self._variant)
        pinned = self.threads.fixed  # a pinned thread count is measured apart
        return self.schedule_choice.run((pinned, *(int(values[p]) for p in self.module.params)), call)

    def _result(self, storage: dict):
        """The outputs, from the buffers the call ran on."""
        return assemble_outputs(self.etdg, {b: _native_to(b.dtype, a) for b, a in storage.items()})

    def bind(self, *inputs, **named):
        """For timing: a zero-argument callable that runs the program on these inputs with
        all buffers already in place (on the GPU for target "cuda"), and a fetch(). With a
        schedule_choice, each schedule's buffers are put in place when it first runs."""
        values, given = self._checked(self._positional(inputs, named))
        bound = {}

        def place(variant):
            storage = self._allocated(values, given, variant.layout)
            bound[variant.name] = variant.runtime.bind([storage[b] for b in variant.layout.buffers], values)

        def call(variant):
            if variant.name not in bound:
                place(variant)
            run, fetch = bound[variant.name]
            run()
            return fetch
        place(self._variant)
        fetch = [lambda: None]

        def run():
            fetch[0] = self._on_schedule(values, call)
        return run, (lambda: fetch[0]())

    def _positional(self, inputs: tuple, named: dict) -> tuple:
        """The inputs in order, keyword arguments placed by the traced function's parameter names."""
        if not named:
            return inputs
        named = {tuple_name(k): v for k, v in named.items()}  # as the trace wrote them (polyft.names)
        names = [n for n, _ in self.etdg.inputs]
        wrong = [k for k in named if k not in names or k in names[:len(inputs)]]
        missing = [n for n in names[len(inputs):] if n not in named]
        if wrong or missing:
            problems = ([f"unknown or given twice: {', '.join(wrong)}"] if wrong else []) + \
                ([f"missing: {', '.join(missing)}"] if missing else [])
            raise InputError(f"the program takes ({', '.join(names)}); got {len(inputs)} positional inputs and the "
                             f"keywords {', '.join(named)}: {'; '.join(problems)}", op="call")
        return tuple(inputs) + tuple(named[n] for n in names[len(inputs):])

    def _checked(self, inputs):
        """The lengths and {buffer: array} of the inputs (and ragged lengths), once the inputs and
        the captured constants are checked (before any native code runs)."""
        changed = [c for c in self.traced.captured if c.changed()]
        if changed:
            c = changed[0]
            raise InputError(f"the {c.what} captured as a constant "
                             f"{'at ' + c.where if c.where else ''} changed after compiling: the compiled code holds "
                             "its old value; pass it as an input to the program, or compile again", op="call")
        if len(inputs) != len(self.etdg.inputs):
            raise InputError(f"expected {len(self.etdg.inputs)} inputs "
                             f"({', '.join(n for n, _ in self.etdg.inputs)}), got {len(inputs)}", op="call")
        inputs, lengths = self._ragged(inputs)
        params = bind_params(self.etdg, inputs)
        for p, v in self.model.sizes.items():
            if params.get(p, v) != v:
                raise InputError(f"compiled for {p} = {v}, called with {p} = {params[p]}", op="call")
        params = {**self.model.sizes, **params}
        check_addressable(self.etdg.buffers, params, InputError, "call")
        self.schedule.check_lengths(params)
        storage = {}
        for (name, buf), arg in zip(self.etdg.inputs, inputs):
            if buf is None:
                continue
            arr = arg.dense_view() if isinstance(arg, FractalTensor) else np.asarray(arg)
            if arr.dtype.newbyteorder("=") != np.dtype(buf.dtype):  # either byte order: the copy converts it
                raise InputError(f"input {name} should be {buf.dtype}, got {arr.dtype}", op="call")
            storage[buf] = calls.contiguous(name, arr, native_dtype(buf.dtype))
        for check in getattr(self.traced, "index_checks", ()):  # ids given now, for a gather
            check.check(storage[dict(self.etdg.inputs)[check.ids]], params, InputError)
        for b in self.layout.buffers:
            if b.name in lengths:
                storage[b] = np.ascontiguousarray(lengths[b.name], dtype=native_dtype(b.dtype))
        self._called_lengths = lengths
        return params, storage

    @staticmethod
    def _allocated(params: dict, given: dict, layout) -> dict:
        """{buffer: array} for every buffer of `layout`: the `given` arrays, the others allocated."""
        storage = dict(given)
        for b in layout.buffers:
            if b not in storage:
                storage[b] = constant(b) if b.kind in CONSTANT else calls.allocate(b, layout.shape(b, params))
        return storage

    def _ragged(self, inputs: tuple) -> tuple:
        """The inputs with each ragged list as its padded array (its level as long as the bound),
        and {buffer name: lengths (and lengths - 1)} for the guards; a ragged list where the program
        was compiled for a regular one, or lengths the program cannot run, are InputErrors."""
        ragged = {r.name: r for r in getattr(self.traced, "ragged", ())}
        for (name, buf), arg in zip(self.etdg.inputs, inputs):
            if name not in ragged and isinstance(arg, FractalTensor) and buf is not None and not arg.is_regular:
                raise InputError(f"input {name} is the ragged list {arg.type_string}, but the program was compiled for "
                                 f"the regular {buf.type}: compile it with a ragged example or a spec such as "
                                 f"'[N, <=L]{buf.dtype}[...]'", op="call")
        if not ragged:
            return inputs, {}
        regular = bind_params(_Inputs([(n, None if n in ragged else b) for n, b in self.etdg.inputs]), inputs)
        known = {**regular, **self.model.sizes}
        out, lengths = list(inputs), {}
        for k, ((name, buf), arg) in enumerate(zip(self.etdg.inputs, inputs)):
            r = ragged.get(name)
            if r is None:
                continue
            if not isinstance(arg, FractalTensor) or arg.depth != buf.depth:
                got = arg.type_string if isinstance(arg, FractalTensor) else \
                    f"{type(arg).__name__} {list(np.shape(arg))}"
                raise InputError(f"input {name} was compiled as the ragged list {buf.type} and takes a FractalTensor of "
                                 f"depth {buf.depth} (FractalTensor.from_list), got {got}", op="call")
            lens = lengths_of(arg, r.level)
            bound = r.bound.evaluate(known) if r.bound.params <= known.keys() else int(lens.max(initial=0))
            check_lengths(r, lens, bound)
            out[k] = padded(arg, r.level, lens, bound)
            lengths[r.lengths.name], lengths[r.last.name] = lens, lens - 1
        return tuple(out), lengths


class _Inputs:
    """The inputs of an ETDG, for bind_params on some of them (the others None)."""

    def __init__(self, inputs):
        self.inputs, self.assumptions = inputs, []


def _native_to(dtype: str, a: np.ndarray) -> np.ndarray:
    """A buffer's array as its dtype, from the dtype the generated code stores it in (native_dtype)."""
    return a.astype(dtype) if a.dtype != dtype else a


def analyze(fn, *inputs_or_specs, schedule="auto", sizes=None, coarsen=None) -> Program:
    """Trace `fn`, build its ISL model and dependences, and schedule it.

    `schedule`: "auto" (the paper's reordering), "original" (the nest as written), or an ISL
    schedule (string, isl.UnionMap or isl.Map) to check and use. `sizes` (e.g. {"L": 8}) fixes
    symbolic lengths as an ISL context; with all lengths known, `sequential_steps` is set.
    `coarsen` (default: with the "auto" schedule) runs the §5.1 coarsening passes first;
    `prog.traced` is the ETDG as traced, `prog.etdg` the one scheduled, `prog.coarsen_log`
    what coarsening did, and `prog.schedule.describe()` (`prog.schedule.coarsening`) which traced
    statements each scheduled statement runs: a hand schedule names the traced ones unless
    `coarsen=True`.
    """
    return Program(fn, inputs_or_specs, schedule, sizes, coarsen)


def compile(fn, *inputs_or_specs, target="c", schedule="auto", sizes=None, coarsen=None,
            precision="fp32", contract=True, alternative=None) -> CompiledProgram:
    """Trace, (coarsen,) analyse, schedule and generate code for `fn`; call the result on inputs.
    `precision` of matmul operands on the CUDA targets: "fp32", "tf32", "fp16" or "bf16".
    `contract` (default True) stores intermediate buffers by their storage mapping (only the
    cells live at once); False keeps one element per instance, to compare.
    `alternative` (C target): a second schedule of the same statements, as schedule= takes it,
    compiled on first use; each call runs whichever of the two its lengths ran faster
    (`prog.schedule_choice`: which ran last, `.fixed` to pin one). Default: the original order
    where schedule is "auto" (the wavefront loses where every layer's weights outgrow the caches,
    or the batch alone fills the cores); False: the schedule alone."""
    return CompiledProgram(fn, inputs_or_specs, schedule, sizes, target, coarsen, precision, contract, alternative)


ROLES = {"input": "input", "output": "output", "intermediate": "intermediate", "const": "const", "index": "const",
         "lengths": "lengths"}


def _lengths(model, sizes, op: str = "memory") -> dict:
    """The model's lengths with `sizes` for those it was built without, checked."""
    given = check_sizes(sizes, model.params, op=op)
    fixed = {p: (v, model.sizes[p]) for p, v in given.items() if model.sizes.get(p, v) != v}
    if fixed:
        raise PolyftError(f"the program was built for {', '.join(f'{p} = {b}' for p, (_, b) in fixed.items())}, "
                          f"not {', '.join(f'{p} = {v}' for p, (v, _) in fixed.items())}: build it with symbolic "
                          "lengths (ft.spec) to choose them here", op=op)
    env = {**model.sizes, **given}
    missing = [p for p in model.params if p not in env]
    if missing:
        raise PolyftError(f"{op}() needs sizes for the lengths {missing} (e.g. sizes={{'{missing[0]}': 8}})",
                          op=op)
    return env
