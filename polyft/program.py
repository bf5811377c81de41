"""`ft.analyze`: trace, model, analyse and schedule a program (no code generation). The one
place where the language reaches into deps/ and schedule/, lazily, so that `import polyft`
stays light and the packages keep their left-to-right order."""
from __future__ import annotations

from .tracing import trace


class Program:
    """A traced program with its polyhedral model, dependences and schedule (§4.4–§5)."""

    def __init__(self, fn, args, schedule="auto", sizes=None, coarsen=None):
        from polyft.deps.analyze import analyze
        from polyft.deps.model import build
        from polyft.schedule.coarsen import coarsen as coarsen_etdg
        from polyft.schedule.schedule import make_schedule
        self.fn = fn
        self.traced = trace(fn, *args)
        self.coarsen_log: list = []
        if coarsen if coarsen is not None else schedule == "auto":
            self.etdg, self.coarsen_log = coarsen_etdg(self.traced)
        else:
            self.etdg = self.traced
        self.model = build(self.etdg, sizes)
        self.deps = analyze(self.model)
        self.schedule = make_schedule(self.model, self.deps, schedule)

    def original_schedule(self):
        from polyft.schedule.schedule import make_schedule
        return make_schedule(self.model, self.deps, "original")

    def __repr__(self):
        return f"<Program {self.etdg.signature()}, {self.schedule.kind} schedule>"


TARGETS = ("c", "cuda", "cuda-emulated")


class CompiledProgram(Program):
    """A program with generated code: call it on inputs like the function itself.

    target "c": C with OpenMP, run through ctypes; "cuda": CUDA through PyCUDA on a GPU;
    "cuda-emulated": the same CUDA source run on the CPU by an emulator (for checking the
    CUDA generator where there is no GPU). `precision` (CUDA targets) of matmul operands:
    "fp32", or "tf32" / "fp16" / "bf16" on tensor cores where the tile shapes allow.
    """

    def __init__(self, fn, args, schedule="auto", sizes=None, target="c", coarsen=None, precision="fp32"):
        from .errors import PolyftError
        if target not in TARGETS:
            raise PolyftError(f"unknown target {target!r}; available: {', '.join(TARGETS)}", op="compile")
        if precision != "fp32" and target == "c":
            raise PolyftError(f"precision {precision!r} is for the CUDA targets; the C target computes in fp32",
                              op="compile")
        super().__init__(fn, args, schedule, sizes, coarsen)
        self.precision = precision
        self.target = target
        if target == "c":
            from polyft.emit import c_target
            from polyft.emit.runtime_c import CFunction
            self.source, self.layout = c_target.generate(self.model, self.schedule)
            c_run = CFunction(self.source)
            self._run = lambda arrays, values: c_run(arrays, [values[p] for p in self.model.params])
        else:
            from polyft.emit.runtime_cuda import CudaProgram
            cuda = CudaProgram(self.model, self.schedule, "emulated" if target == "cuda-emulated" else "pycuda",
                               precision)
            self.source, self.host_driver, self.layout = cuda.source, cuda.host, cuda.layout
            self._run = cuda

    def __call__(self, *inputs):
        from .interpret import assemble_outputs
        values, storage = self._bind(inputs)
        arrays = [storage[b] for b in self.layout.buffers]
        self._run(arrays, values)
        return assemble_outputs(self.etdg, {b: a.astype(b.dtype) if a.dtype != b.dtype else a
                                            for b, a in storage.items()})

    def bind(self, *inputs):
        """For timing: a zero-argument callable that runs the program on these inputs with
        all buffers already in place (on the GPU for target "cuda"), and a fetch()."""
        values, storage = self._bind(inputs)
        arrays = [storage[b] for b in self.layout.buffers]
        if self.target == "c":
            return (lambda: self._run(arrays, values)), (lambda: None)
        return self._run.bind(arrays, values)

    def _bind(self, inputs):
        """Check the inputs (before any native code runs) and allocate every buffer."""
        import numpy as np

        from .errors import InputError
        from .fractaltensor import FractalTensor
        from .interpret import bind_params
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
            storage[buf] = np.ascontiguousarray(arr, dtype=_native(buf.dtype))
        for b in self.layout.buffers:
            if b not in storage:
                if b.kind in ("const", "index"):
                    storage[b] = np.ascontiguousarray(b.value, dtype=_native(b.dtype))
                else:
                    shape = tuple(n.evaluate(params) for n in b.dims) + b.element_shape
                    storage[b] = np.empty(shape, dtype=_native(b.dtype))
        return params, storage


def _native(dtype: str) -> str:
    """The dtype of a buffer as the generated code reads and writes it: float16 tiles are
    computed and stored as float (kernels.CTYPES), so their buffers are float32 there."""
    return "float32" if dtype == "float16" else dtype


def analyze(fn, *inputs_or_specs, schedule="auto", sizes=None, coarsen=None) -> Program:
    """Trace `fn`, build its ISL model and dependences, and schedule it.

    `schedule`: "auto" (the paper's reordering), "original" (the nest as written), or an ISL
    schedule (string or isl.UnionMap) to check and use. `sizes` (e.g. {"L": 8}) fixes
    symbolic lengths as an ISL context; with all lengths known, `sequential_steps` is set.
    `coarsen` (default: with the "auto" schedule) runs the §5.1 coarsening passes first;
    `prog.traced` is the ETDG as traced, `prog.etdg` the one scheduled, `prog.coarsen_log`
    what coarsening did.
    """
    return Program(fn, inputs_or_specs, schedule, sizes, coarsen)


def compile(fn, *inputs_or_specs, target="c", schedule="auto", sizes=None, coarsen=None,
            precision="fp32") -> CompiledProgram:
    """Trace, (coarsen,) analyse, schedule and generate code for `fn`; call the result on inputs.
    `precision` of matmul operands on the CUDA targets: "fp32", "tf32", "fp16" or "bf16"."""
    return CompiledProgram(fn, inputs_or_specs, schedule, sizes, target, coarsen, precision)
