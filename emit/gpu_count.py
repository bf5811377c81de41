"""Global-memory traffic counted by running the CUDA emulator (target "cuda-emulated") with
every memory access of the generated code and the tile library instrumented.

The emulated source is compiled as CPU C++ with GCC's ThreadSanitizer instrumentation
(`-fsanitize=thread`), but without its runtime: the compiler calls `__tsan_read4(addr)`,
`__tsan_write16(addr)`, `__tsan_memcpy(...)`, ... before each load, store and block copy, and
those hooks are defined here (COUNTERS). Each hook adds the access's bytes to the buffer
whose array holds the address: the arrays the runtime hands the kernels are the GPU's
global memory; shared memory (the arena, a block's local buffers), registers (locals of the
thread fibers), the context struct and `__device__` constants are other addresses and are
not counted. So the count is every byte every thread loads from or stores to global memory,
as the generated code issues it, without any cache; nothing in the GPU build changes.
"""
from __future__ import annotations

import ctypes

import numpy as np

from polyft.errors import PolyftError

from .runtime_cuda import Backend, CudaRuntime, EmulatedBackend

FT_HOOK = '#define FT_HOOK __attribute__((no_sanitize_thread, visibility("default")))\n'


def hooks(access: str) -> str:
    """The hooks GCC emits calls to under -fsanitize=thread, each calling `access(address,
    bytes, is_write)` (a C function defined before them); `memcpy` & co. in the emulated code
    become __tsan_memcpy & co., which must also do the copy."""
    return r"""
extern "C" {
#define FT_SIZED(n) \
  FT_HOOK void __tsan_read##n(void* p) { ACCESS(p, n, 0); } \
  FT_HOOK void __tsan_write##n(void* p) { ACCESS(p, n, 1); } \
  FT_HOOK void __tsan_unaligned_read##n(void* p) { ACCESS(p, n, 0); } \
  FT_HOOK void __tsan_unaligned_write##n(void* p) { ACCESS(p, n, 1); }
FT_SIZED(1) FT_SIZED(2) FT_SIZED(4) FT_SIZED(8) FT_SIZED(16)
FT_HOOK void __tsan_read_range(void* p, long n) { ACCESS(p, n, 0); }
FT_HOOK void __tsan_write_range(void* p, long n) { ACCESS(p, n, 1); }
FT_HOOK void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
  ACCESS(s, n, 0); ACCESS(d, n, 1); return memcpy(d, s, n);
}
FT_HOOK void* __tsan_memmove(void* d, const void* s, unsigned long n) {
  ACCESS(s, n, 0); ACCESS(d, n, 1); return memmove(d, s, n);
}
FT_HOOK void* __tsan_memset(void* d, int v, unsigned long n) { ACCESS(d, n, 1); return memset(d, v, n); }
FT_HOOK void __tsan_func_entry(void*) {}
FT_HOOK void __tsan_func_exit(void*) {}
FT_HOOK void __tsan_init(void) {}
}
""".replace("ACCESS", access)


# instrumented, but linked without GCC's sanitizer runtime (-nodefaultlibs drops it): the hooks
# are the only definitions; loop-to-memcpy rewriting is off so that the generated code's copies
# stay loads and stores
INSTRUMENTED = ["-fsanitize=thread", "-fno-tree-loop-distribute-patterns", "-nodefaultlibs",
                "-Wl,--no-as-needed", "-lstdc++", "-lm", "-lc", "-lgcc_s"]
MAX_RANGES = 256
COUNTERS = FT_HOOK + r"""
extern "C" {
enum { FT_MAX_RANGES = %d };
static uintptr_t ft_lo[FT_MAX_RANGES], ft_hi[FT_MAX_RANGES];
static long long ft_bytes[FT_MAX_RANGES][2];  /* read, written */
static int ft_ranges;
FT_HOOK void ft_count(const void* p, long n, int write) {
  const uintptr_t a = (uintptr_t)p;
  for (int r = 0; r < ft_ranges; r++)
    if (a >= ft_lo[r] && a < ft_hi[r]) { ft_bytes[r][write] += n; return; }
}
FT_HOOK int ft_count_range(const void* p, long n) {
  if (ft_ranges == FT_MAX_RANGES) return -1;
  ft_lo[ft_ranges] = (uintptr_t)p;
  ft_hi[ft_ranges] = (uintptr_t)p + n;
  ft_bytes[ft_ranges][0] = ft_bytes[ft_ranges][1] = 0;
  return ft_ranges++;
}
FT_HOOK long long ft_counted(int r, int write) { return ft_bytes[r][write]; }
}
""" % MAX_RANGES + hooks("ft_count")


class CountingBackend(EmulatedBackend):
    """The emulator's build of a module with every global access counted (module doc);
    `launches` records (kernel, gx, gy) of every launch."""

    name = "emulated-counting"
    flags = EmulatedBackend.flags + INSTRUMENTED

    def __init__(self, source: str, arities: list):
        super().__init__(source + COUNTERS, arities)
        self._lib.ft_count_range.argtypes = [ctypes.c_void_p, ctypes.c_long]
        self._lib.ft_counted.restype = ctypes.c_longlong
        self.launches: list = []
        self.ranges: dict = {}  # address -> range number

    def upload(self, arr: np.ndarray):
        """The array itself (the emulator's global memory), its bytes counted from now on."""
        if arr.nbytes and arr.ctypes.data not in self.ranges:
            r = self._lib.ft_count_range(arr.ctypes.data, arr.nbytes)
            if r < 0:
                raise PolyftError(f"more than {MAX_RANGES} buffers to count", op="emulated_traffic")
            self.ranges[arr.ctypes.data] = r
        return super().upload(arr)

    def counted(self, arr: np.ndarray) -> tuple:
        """(bytes read, bytes written) of the array uploaded as `arr`, so far."""
        r = self.ranges.get(arr.ctypes.data) if arr.nbytes else None
        return (0, 0) if r is None else (self._lib.ft_counted(r, 0), self._lib.ft_counted(r, 1))

    def _launch(self, k, gx, gy, args):
        self.launches.append((k, gx, gy))
        super()._launch(k, gx, gy, args)


class CountingRuntime(CudaRuntime):
    """A CudaModule run by the counting emulator (generate it with EMULATED_THREADS)."""

    def load(self, module) -> Backend:
        return CountingBackend(module.source, module.arities)


def count(module, arrays: list, values: dict) -> tuple:
    """Run `module` (a CudaModule for the emulator) once on `arrays` (one per layout buffer,
    as a runtime takes them) with lengths `values`: ([(bytes read, bytes written) per layout
    buffer], [(kernel, gx, gy) per launch]). The outputs land in `arrays` as in a plain run."""
    runtime = CountingRuntime(module)
    runtime(arrays, values)
    backend = runtime.backend
    return [backend.counted(a) for a in runtime.uploaded], backend.launches

