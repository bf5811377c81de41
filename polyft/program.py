"""The driver, at the top layer: `ft.analyze` traces, models, analyses and schedules a
program (no code generation); `ft.compile` also generates code for a target and loads it
into that target's runtime (emit.targets). Nothing below imports this module; `polyft`
imports it when analyze/compile is first called, so `import polyft` stays light."""
from __future__ import annotations

import numpy as np
import pandas as pd

from polyft.deps.analyze import analyze as dependences
from polyft.deps.model import build, check_sizes
from polyft.emit.c_statements import native_dtype
from polyft.emit.c_target import CTarget, packed_weights
from polyft.emit.targets import select
from polyft.schedule.coarsen import coarsen as coarsen_etdg
from polyft.schedule.schedule import make_schedule, schedule_kind
from polyft.schedule.storage import Storage, extents, storage_mapping

from .errors import InputError, PolyftError
from .fractaltensor import FractalTensor
from .interpret import assemble_outputs, bind_params
from .tracing import trace


class Program:
    """A traced program with its polyhedral model, dependences and schedule (§4.4–§5)."""

    def __init__(self, fn, args, schedule="auto", sizes=None, coarsen=None):
        self._storage = self._local = None
        self.fn = fn
        schedule = schedule_kind(schedule)  # a wrong schedule= fails before tracing
        self.traced = trace(fn, *args)
        self.coarsen_log: list = []
        if coarsen if coarsen is not None else isinstance(schedule, str) and schedule == "auto":
            self.etdg, self.coarsen_log = coarsen_etdg(self.traced, sizes=check_sizes(sizes, self.traced.params))
        else:
            self.etdg = self.traced
        self.model = build(self.etdg, sizes)
        self.deps = dependences(self.model)
        self.schedule = make_schedule(self.model, self.deps, schedule)

    def original_schedule(self):
        return make_schedule(self.model, self.deps, "original")

    @property
    def storage(self) -> Storage:
        """How every buffer is stored under the schedule (schedule.storage): contracted
        intermediates, their ISL mappings element -> cell, live accesses and placement."""
        if self._storage is None:
            self._storage = storage_mapping(self.model, self.schedule, True)
        return self._storage

    def memory(self, sizes: dict | None = None) -> pd.DataFrame:
        """One row per buffer: role, full_bytes (one element per instance), allocated_bytes
        (what is stored in memory shared by all threads), local_bytes (what one thread keeps
        in its own scratch), packed_bytes (the packed copy of a large shared matrix a call
        keeps beside it, `packed`), placement, region (local buffers with one region number are
        never live at once and share a place in the scratch, which holds the largest of them;
        -1 for others) and the ISL mapping element -> cell. A local buffer is counted as the C
        target keeps it: per thread, for its `local_batch(buffer)`. `sizes` gives the lengths
        the program was not built with (none for programs from concrete inputs)."""
        env = _lengths(self.model, sizes)
        width_of = {name: self.local_batch(s.buffer) for name, s in self.storage.buffers.items()}
        widths = {name: w for name, w in width_of.items() if w}
        region = {name: j for j, group in enumerate(self.storage.regions(widths)) for name in group}
        rows = []
        for s in self.storage.buffers.values():
            buf = s.buffer
            width = width_of[buf.name]
            elem = int(np.prod(buf.element_shape, dtype=np.int64)) * native_dtype(buf.dtype).itemsize  # as stored
            cells = int(np.prod(extents(s.cell_dims(width), env, buf.dims), dtype=np.int64)) * elem
            mapping = s.mapping if width is None else s.local[width][1]
            rows.append(dict(buffer=buf.name, role=ROLES[buf.kind],
                             full_bytes=int(np.prod(extents(buf.dims, env), dtype=np.int64)) * elem,
                             allocated_bytes=0 if width else cells, local_bytes=cells if width else 0,
                             packed_bytes=cells if buf.name in self.packed else 0,
                             placement="local" if width else "global", region=region.get(buf.name, -1),
                             mapping=str(mapping.gist_params(self.model.context)) if mapping is not None
                             else "identity"))
        return pd.DataFrame(rows)

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

    def __repr__(self):
        return f"<Program {self.etdg.signature()}, {self.schedule.kind} schedule>"


class CompiledProgram(Program):
    """A program with generated code: call it on inputs like the function itself.

    target "c": C with OpenMP, run through ctypes; "cuda": CUDA through PyCUDA on a GPU;
    "cuda-emulated": the same CUDA source run on the CPU by an emulator (for checking the
    CUDA generator where there is no GPU). `precision` (CUDA targets) of matmul operands:
    "fp32", or "tf32" / "fp16" / "bf16" on tensor cores where the tile shapes allow.
    """

    def __init__(self, fn, args, schedule="auto", sizes=None, target="c", coarsen=None, precision="fp32",
                 contract=True):
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

    @property
    def host_driver(self) -> str:
        """The CUDA targets' host driver (Python) launching the kernels."""
        return self.module.host

    def __call__(self, *inputs):
        values, storage = self._bind(inputs)
        arrays = [storage[b] for b in self.layout.buffers]
        self._run(arrays, values)
        return assemble_outputs(self.etdg, {b: a.astype(b.dtype) if a.dtype != b.dtype else a
                                            for b, a in storage.items()})

    def bind(self, *inputs):
        """For timing: a zero-argument callable that runs the program on these inputs with
        all buffers already in place (on the GPU for target "cuda"), and a fetch()."""
        values, storage = self._bind(inputs)
        return self._run.bind([storage[b] for b in self.layout.buffers], values)

    def _bind(self, inputs):
        """Check the inputs and the captured constants (before any native code runs) and
        allocate every buffer."""
        changed = [c for c in self.traced.captured if c.changed()]
        if changed:
            c = changed[0]
            raise InputError(f"the numpy array {c.array.dtype}{list(c.array.shape)} captured as a constant "
                             f"{'at ' + c.where if c.where else ''} changed after compiling: the compiled code holds "
                             "its old value; pass it as an input to the program, or compile again", op="call")
        if len(inputs) != len(self.etdg.inputs):
            raise InputError(f"expected {len(self.etdg.inputs)} inputs "
                             f"({', '.join(n for n, _ in self.etdg.inputs)}), got {len(inputs)}", op="call")
        params = bind_params(self.etdg, inputs)
        for p, v in self.model.sizes.items():
            if params.get(p, v) != v:
                raise InputError(f"compiled for {p} = {v}, called with {p} = {params[p]}", op="call")
        params = {**self.model.sizes, **params}
        storage = {}
        for (name, buf), arg in zip(self.etdg.inputs, inputs):
            if buf is None:
                continue
            arr = arg.to_numpy() if isinstance(arg, FractalTensor) else np.asarray(arg)
            if arr.dtype != np.dtype(buf.dtype):
                raise InputError(f"input {name} should be {buf.dtype}, got {arr.dtype}", op="call")
            storage[buf] = np.ascontiguousarray(arr, dtype=native_dtype(buf.dtype))
        for b in self.layout.buffers:
            if b not in storage:
                if b.kind in ("const", "index"):
                    storage[b] = np.ascontiguousarray(b.value, dtype=native_dtype(b.dtype))
                else:
                    storage[b] = np.empty(self.layout.shape(b, params), dtype=native_dtype(b.dtype))
        return params, storage


def analyze(fn, *inputs_or_specs, schedule="auto", sizes=None, coarsen=None) -> Program:
    """Trace `fn`, build its ISL model and dependences, and schedule it.

    `schedule`: "auto" (the paper's reordering), "original" (the nest as written), or an ISL
    schedule (string, isl.UnionMap or isl.Map) to check and use. `sizes` (e.g. {"L": 8}) fixes
    symbolic lengths as an ISL context; with all lengths known, `sequential_steps` is set.
    `coarsen` (default: with the "auto" schedule) runs the §5.1 coarsening passes first;
    `prog.traced` is the ETDG as traced, `prog.etdg` the one scheduled, `prog.coarsen_log`
    what coarsening did.
    """
    return Program(fn, inputs_or_specs, schedule, sizes, coarsen)


def compile(fn, *inputs_or_specs, target="c", schedule="auto", sizes=None, coarsen=None,
            precision="fp32", contract=True) -> CompiledProgram:
    """Trace, (coarsen,) analyse, schedule and generate code for `fn`; call the result on inputs.
    `precision` of matmul operands on the CUDA targets: "fp32", "tf32", "fp16" or "bf16".
    `contract` (default True) stores intermediate buffers by their storage mapping (only the
    cells live at once); False keeps one element per instance, to compare."""
    return CompiledProgram(fn, inputs_or_specs, schedule, sizes, target, coarsen, precision, contract)


ROLES = {"input": "input", "output": "output", "intermediate": "intermediate", "const": "const", "index": "const"}


def _lengths(model, sizes) -> dict:
    """The model's lengths with `sizes` for those it was built without, checked."""
    env = {**model.sizes, **check_sizes(sizes, model.params, op="memory")}
    missing = [p for p in model.params if p not in env]
    if missing:
        raise PolyftError(f"memory() needs sizes for the lengths {missing} (e.g. sizes={{'{missing[0]}': 8}})",
                          op="memory")
    return env
