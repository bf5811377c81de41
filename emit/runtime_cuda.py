"""The CUDA runtimes: a CudaModule's host driver launches its persistent kernel on a back end,
once per call, on as many blocks as the back end can keep resident at once (`capacity`) and
no more than the program has instances in a band; every back end counts its launches
(`launched`).

* `PyCudaRuntime` on `PyCudaBackend` (the `cuda` extra, imported lazily): nvcc through
  PyCUDA's compiler cache, device buffers, the grid sized from the occupancy of the kernel
  (its registers and shared memory against the SM's), launch errors checked when the
  outputs are fetched.
* `EmulatedRuntime` on `EmulatedBackend`: the same `.cu` compiled as C++ for the CPU with the
  emulator header (emit/emulate.hpp: threads as fibers, block, warp and grid barriers, warp
  shuffles and WMMA with the tensor cores' rounding), a grid of at most `max_blocks` blocks
  (EMULATED_BLOCKS) run together — so CI, which has nvcc but no GPU, checks what the
  generated CUDA computes, grid barriers included, not only that it compiles.
"""
from __future__ import annotations

import ctypes
import os
from abc import ABC, abstractmethod

import numpy as np

from polyft.errors import CompileError, DeviceError

from . import runtime_c
from .halves import from_storage, to_storage
from .protocol import Runtime

with open(os.path.join(os.path.dirname(__file__), "emulate.hpp")) as _f:
    EMULATOR = _f.read()
EMULATED_THREADS = 64  # two warps: block-wide and warp-wide barriers both matter
# blocks of an emulated grid: more than one, so that the grid barrier and the sharing out of a
# band's instances matter; few, since the persistent kernel's grid-stride loops take any number
EMULATED_BLOCKS = 3
TOO_MANY = -(1 << 30)  # emulate.hpp's FT_TOO_MANY


def ctx_dtype(layout, params) -> np.dtype:
    """The C struct `ctx_t` as a numpy dtype: every field is 8 bytes, so no padding."""
    fields = [(p, np.int64) for p in params]
    for k, b in enumerate(layout.buffers):
        fields.append((f"b{k}", np.uint64))
        fields += [(f"s{k}_{r}", np.int64) for r in range(b.depth)]
    return np.dtype(fields)


def pack_ctx(layout, params, values: dict, pointers: list, shapes: list) -> np.ndarray:
    """The context struct for buffers at `pointers` of `shapes` (the arrays the caller
    allocated); a buffer a block keeps in its shared memory (`layout.width`) gets the strides
    of its cells (`layout.cells_shape`) and no pointer: the kernel sets it to the block's place."""
    ctx = np.zeros(1, dtype=ctx_dtype(layout, params))
    for p in params:
        ctx[p] = values[p]
    for k, (b, ptr, shape) in enumerate(zip(layout.buffers, pointers, shapes)):
        if layout.batch(b):
            ptr, shape = 0, layout.cells_shape(b, values)
        ctx[f"b{k}"] = ptr
        stride = int(np.prod(shape[b.depth:])) if len(shape) > b.depth else 1
        for r in reversed(range(b.depth)):
            ctx[f"s{k}_{r}"] = stride
            stride *= shape[r]
    return ctx


class Backend(ABC):
    """Where a module's kernels run: `upload(array)` and `ctx(struct)` give (handle, device
    address), `download(handle, array)` the array's contents back, `launch` runs kernel k;
    `launched` counts the launches so far."""

    launched = 0
    max_blocks = EMULATED_BLOCKS

    def capacity(self, k: int) -> int:
        """The most blocks of kernel k that run at once (all resident: its grid barrier needs
        that)."""
        return self.max_blocks

    def launch(self, k: int, grid: tuple, args: tuple) -> None:
        """Kernel polyft_k<k> on a 1-D or 2-D grid with `args` (the context's address, then longs)."""
        gx, gy = (list(grid) + [1])[:2]
        if gx > 0 and gy > 0:  # an empty grid launches nothing
            self.launched += 1
            self._launch(k, int(gx), int(gy), args)

    @abstractmethod
    def _launch(self, k: int, gx: int, gy: int, args: tuple) -> None:
        """Kernel k on a gx x gy grid."""


class EmulatedBackend(Backend):
    """The CUDA source as CPU C++ (emit/emulate.hpp): a block's threads are fibers switched
    at barriers, blocks run one after another."""

    name = "emulated"
    flags = ["-x", "c++", "-std=c++14", "-O1", "-fPIC", "-shared", "-w"]  # a subclass may instrument the build

    def __init__(self, source: str, arities: list):
        cxx = os.environ.get("CXX", "c++")
        wrappers = []
        for k, n in enumerate(arities):
            args = ", ".join(["(const ctx_t*)a[0]"] + [f"a[{i + 1}]" for i in range(n)])
            wrappers.append(f"static void ft_trampoline_k{k}(void* p) {{ const long* a = (const long*)p; "
                            f"polyft_k{k}({args}); }}\n"
                            f'extern "C" int polyft_emulate_k{k}(const long* a, long gx, long gy) '
                            f"{{ return ft_launch(ft_trampoline_k{k}, (void*)a, gx, gy, FT_THREADS); }}")
        text = "#define FT_EMULATED\n" + EMULATOR + source + "\n".join(wrappers) + "\n"
        _, self._lib = runtime_c.load(text, self.flags, cc=cxx)
        self._kernels = []
        for k in range(len(arities)):
            fn = getattr(self._lib, f"polyft_emulate_k{k}")
            fn.argtypes = [ctypes.POINTER(ctypes.c_long), ctypes.c_long, ctypes.c_long]
            fn.restype = ctypes.c_int
            self._kernels.append(fn)

    def upload(self, arr: np.ndarray):
        return arr, arr.ctypes.data

    def download(self, handle, arr: np.ndarray) -> np.ndarray:
        return handle

    def ctx(self, ctx: np.ndarray):
        return ctx, ctx.ctypes.data

    def _launch(self, k, gx, gy, args):
        a = (ctypes.c_long * len(args))(*[int(x) for x in args])
        bad = self._kernels[k](a, gx, gy)
        if bad == TOO_MANY:
            raise DeviceError(f"kernel polyft_k{k}: a {gx}x{gy} grid has too many threads to emulate", op="launch")
        if bad > 0:
            raise DeviceError(f"kernel polyft_k{k}: in block ({(bad - 1) % gx}, {(bad - 1) // gx}) threads wait "
                              "at barriers the others never reach (a barrier in divergent code)", op="launch")
        if bad < 0:
            raise DeviceError(f"kernel polyft_k{k}: in block ({(-bad - 1) % gx}, {(-bad - 1) // gx}) threads wait "
                              "at a grid barrier that other blocks never reach (they finished: a grid barrier "
                              "in code not every block runs); on a GPU this hangs", op="launch")


class PyCudaBackend(Backend):
    """Kernels compiled by nvcc through PyCUDA and launched on the current GPU."""

    name = "pycuda"

    def __init__(self, source: str, n_kernels: int, threads: int, shared_bytes: int):
        try:
            import pycuda.autoprimaryctx  # noqa: F401  (the device's primary context)
            import pycuda.driver as drv
            from pycuda.compiler import SourceModule
        except ImportError as e:
            raise DeviceError(f"the CUDA target needs PyCUDA and a GPU ({e}); install polyft[cuda] on a "
                              "machine with an NVIDIA driver, or use target='c'", op="compile") from None
        except Exception as e:  # no driver / no device
            raise DeviceError(f"no usable CUDA device: {e}", op="compile") from None
        self.drv = drv
        major, minor = drv.Context.get_device().compute_capability()
        try:
            # PyCUDA's cubin cache inside polyft's private one (its default is not checked)
            cubins = runtime_c.cache_subdir("pycuda")
            self.module = SourceModule(source, no_extern_c=True, arch=f"sm_{major}{minor}",
                                       options=["-O3", "-std=c++14"], cache_dir=cubins or False)
        except drv.CompileError as e:
            msg = str(e)
            raise CompileError(f"nvcc failed:\n{msg}\n{runtime_c.source_context(source, msg)}",
                               op="compile", where="generated CUDA") from None
        self._kernels = [self.module.get_function(f"polyft_k{k}") for k in range(n_kernels)]
        self.threads, self.shared_bytes = threads, shared_bytes
        self.device = drv.Context.get_device()
        most = self.device.get_attribute(drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if shared_bytes > most:
            raise DeviceError(f"a block needs {shared_bytes} bytes of shared memory for its tiles; "
                              f"{self.device.name()} allows {most}: use smaller tiles", op="compile")
        for fn in self._kernels:
            if shared_bytes > 48 * 1024:  # beyond the default, a kernel must opt in
                fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
            if hasattr(drv.function_attribute, "PREFERRED_SHARED_MEMORY_CARVEOUT"):
                # all of the SM's unified L1/shared memory as shared memory: the residency
                # `_resident` counts on (a smaller carveout would leave blocks of the grid
                # waiting for an SM while the others spin at the grid barrier)
                fn.set_attribute(drv.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
        self._capacity = [self._resident(fn) for fn in self._kernels]

    def _resident(self, fn) -> int:
        """Blocks of `fn` resident at once on the whole GPU: per SM, the fewest that its threads,
        registers (allocated per warp, in units of 256), shared memory (the dynamic arena, the
        static, and the 1 KB the driver reserves per block) and block slots allow; times the SMs."""
        attr, fattr = self.drv.device_attribute, self.drv.function_attribute
        get = self.device.get_attribute

        def optional(name, default):
            return get(getattr(attr, name)) if hasattr(attr, name) else default
        warps = -(-self.threads // 32)
        regs = -(-fn.get_attribute(fattr.NUM_REGS) * 32 // 256) * 256 * warps
        smem = self.shared_bytes + fn.get_attribute(fattr.SHARED_SIZE_BYTES) + \
            optional("RESERVED_SHARED_MEMORY_PER_BLOCK", 1024)
        per_sm = min(get(attr.MAX_THREADS_PER_MULTIPROCESSOR) // self.threads,
                     get(attr.MAX_REGISTERS_PER_MULTIPROCESSOR) // max(1, regs),
                     get(attr.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) // max(1, smem),
                     optional("MAX_BLOCKS_PER_MULTIPROCESSOR", 16))
        if per_sm < 1:
            raise DeviceError(f"a block of {self.threads} threads, {fn.get_attribute(fattr.NUM_REGS)} registers "
                              f"each and {smem} bytes of shared memory does not fit on an SM of "
                              f"{self.device.name()}", op="compile")
        return per_sm * get(attr.MULTIPROCESSOR_COUNT)

    def capacity(self, k: int) -> int:
        return self._capacity[k]

    def upload(self, arr: np.ndarray):
        d = self.drv.to_device(arr)
        return d, int(d)

    def download(self, handle, arr: np.ndarray) -> np.ndarray:
        try:
            self.drv.memcpy_dtoh(arr, handle)  # waits for the launch: its errors show here
        except self.drv.Error as e:
            raise DeviceError(f"the kernel failed: {e}", op="launch") from None
        return arr

    def ctx(self, ctx: np.ndarray):
        return self.upload(ctx)

    def _launch(self, k, gx, gy, args):
        """Asynchronous: a benchmark times the launch with events, `download` waits for it."""
        fn = self._kernels[k]
        try:
            fn(np.uintp(args[0]), *[np.int64(a) for a in args[1:]], block=(self.threads, 1, 1),
               grid=(gx, gy), shared=self.shared_bytes)
        except self.drv.Error as e:
            raise DeviceError(f"kernel polyft_k{k} (grid {gx}x{gy}) failed: {e}", op="launch") from None


class CudaRuntime(Runtime):
    """A CudaModule: its host driver launches its kernels on a back end (`load`)."""

    def __init__(self, module):
        super().__init__(module)
        namespace: dict = {}
        exec(compile(module.host, "<polyft host driver>", "exec"), namespace)
        self._driver = namespace["run"]
        self.backend = self.load(module)

    @abstractmethod
    def load(self, module) -> Backend:
        """The back end running the module's kernels."""

    def bind(self, arrays: list, values: dict) -> tuple:
        """Uploads the buffers once: `run()` launches the whole program on the resident data,
        `fetch()` copies the outputs back. A narrow buffer (emit.halves) is converted to its
        half-width type as it is uploaded, and an output back to float32 as it is fetched;
        `self.uploaded` holds the host arrays handed to the back end (the emulator's global
        memory)."""
        layout, params = self.module.layout, self.module.params
        handles, pointers, self.uploaded = [], [], []
        for b, a in zip(layout.buffers, arrays):
            if b.name in layout.narrow:
                a = to_storage(a, layout.narrow[b.name])
            self.uploaded.append(a)
            h, p = (None, 0) if layout.batch(b) else self.backend.upload(a)  # local: in the blocks' shared memory
            handles.append(h)
            pointers.append(p)
        ctx = pack_ctx(layout, params, values, pointers, [a.shape for a in arrays])
        ctx_handle, ctx_ptr = self.backend.ctx(ctx)
        args = [values[p] for p in params]

        def launch(k, blocks):
            """The persistent kernel on `blocks` (None: as many as fit), at most its capacity."""
            cap = self.backend.capacity(k)
            self.backend.launch(k, (cap if blocks is None else min(int(blocks), cap),), (ctx_ptr,))

        def run():
            self._driver(launch, *args)

        def fetch():
            for k, (h, a) in enumerate(zip(handles, self.uploaded)):
                b = layout.buffers[k]
                if b.kind == "output":
                    got = self.backend.download(h, a)
                    arrays[k][...] = from_storage(got, layout.narrow[b.name]) if b.name in layout.narrow else got
            return ctx_handle  # keeps the device context alive as long as the caller holds it
        return run, fetch


class EmulatedRuntime(CudaRuntime):
    """The module run on the CPU by the emulator (generate it with EMULATED_THREADS)."""

    def load(self, module) -> Backend:
        return EmulatedBackend(module.source, module.arities)


class PyCudaRuntime(CudaRuntime):
    """The module run on the current GPU through PyCUDA."""

    def load(self, module) -> Backend:
        return PyCudaBackend(module.source, len(module.arities), module.threads, module.shared_bytes)
