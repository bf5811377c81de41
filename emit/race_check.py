"""Shared-memory races found by the CUDA emulator (`prog.emulated_races(*inputs)`).

The emulator runs a block's threads one at a time and switches only at barriers, so a read
and a write of one shared cell by two threads between the same two barriers give the same
result in every run: the race is invisible in its output. Here the emulated source is built
with every load and store instrumented (GCC's -fsanitize=thread hooks, as emit/gpu_count.py
counts global traffic) and each access to the block's shared arena is checked against a
shadow of it: per byte, the last writer and the readers since the last block barrier
(the interval: the grid barrier's and the block barrier's generations). Two accesses of a
byte in one interval by different threads, one of them a write, are a race, unless both
threads are lanes of one warp and a warp barrier (__syncwarp, a shuffle, a WMMA operation)
came between them. Each race is reported with its block, its threads, the arena offset and
the block barrier's count. The GPU build is untouched.
"""
from __future__ import annotations

import ctypes

from .gpu_count import FT_HOOK, INSTRUMENTED, hooks
from .runtime_cuda import Backend, CudaRuntime, EmulatedBackend

MAX_REPORTS = 16
SHADOW = FT_HOOK + r"""
extern "C" {
enum { FT_MAX_REPORTS = %d };
struct ft_cell { long long wepoch, repoch; int writer, wwarp, rwarp, rlast; };
static ft_cell* ft_cells;
static unsigned long long* ft_readers;  /* per cell, a bit per thread of the block */
static long ft_words;
static int ft_rwords;
static long long ft_nraces;
static char ft_reports[FT_MAX_REPORTS][160];

static void ft_race_reset(long blocks, int nthreads) {
  free(ft_cells);
  free(ft_readers);
  ft_words = (long)ft_arena_bytes;  /* a cell per byte: two threads may store neighbouring halves */
  ft_rwords = (nthreads + 63) / 64;
  ft_cells = (ft_cell*)calloc(blocks * ft_words + 1, sizeof(ft_cell));  /* epochs 0: none yet */
  ft_readers = (unsigned long long*)calloc(blocks * ft_words * ft_rwords + 1, 8);
}
static const int ft_race_installed = (ft_on_launch = ft_race_reset, 0);

static void ft_report(const char* what, int first, int second, int block, long word) {
  if (ft_nraces < FT_MAX_REPORTS)
    snprintf(ft_reports[ft_nraces], sizeof ft_reports[0], "%%s: threads %%d and %%d of block %%d, shared byte %%ld, "
             "after block barrier %%d", what, first, second, block, word,
             ft_generation[1 + block * FT_GROUPS]);
  ft_nraces++;
}

FT_HOOK void ft_race(const void* p, long n, int write) {
  const uintptr_t a = (uintptr_t)p, lo = (uintptr_t)ft_arena_at;
  if (!ft_in_thread || !ft_cells || a + n <= lo || a >= lo + ft_arena_bytes) return;
  const int self = ft_self, t = self %% ft_nthreads, b = ft_threads[self].block, warp = t / 32;
  const int g = ft_block_group();
  const long long E = ((long long)ft_generation[0] << 32 | (unsigned)ft_generation[g]) + 1;
  const int W = ft_generation[g + 1 + warp];
  const long first = a < lo ? 0 : (long)(a - lo);
  long last = (long)(a + n - 1 - lo);
  if (last >= ft_words) last = ft_words - 1;
  for (long w = first; w <= last; w++) {
    ft_cell* c = &ft_cells[b * ft_words + w];
    unsigned long long* rd = &ft_readers[(b * ft_words + w) * ft_rwords];
    if (c->wepoch == E && c->writer != t && !(c->writer / 32 == warp && c->wwarp != W))
      ft_report(write ? "write after write" : "read after write", c->writer, t, b, w);
    if (write) {
      if (c->repoch == E)
        for (int k = 0; k < ft_rwords; k++)
          for (unsigned long long m = rd[k] & ~(k == t / 64 ? 1ull << (t %% 64) : 0ull); m; m &= m - 1) {
            const int r = k * 64 + __builtin_ctzll(m);
            if (r / 32 == warp && c->rlast == warp && c->rwarp != W) continue;  /* a warp barrier since */
            ft_report("write after read", r, t, b, w);
            k = ft_rwords;
            break;
          }
      c->wepoch = E;
      c->writer = t;
      c->wwarp = W;
    } else {
      if (c->repoch != E) {
        memset(rd, 0, ft_rwords * 8);
        c->repoch = E;
      }
      rd[t / 64] |= 1ull << (t %% 64);
      c->rwarp = W;
      c->rlast = warp;
    }
  }
}
FT_HOOK long long ft_races_found(void) { return ft_nraces; }
FT_HOOK const char* ft_race_report(int k) { return ft_reports[k]; }
}
""" % MAX_REPORTS + hooks("ft_race")


class RaceBackend(EmulatedBackend):
    """The emulator's build of a module with every shared-memory access checked (module doc);
    `races` lists the reports of all launches so far (at most MAX_REPORTS each), `found`
    counts them all."""

    name = "emulated-race-check"
    flags = EmulatedBackend.flags + INSTRUMENTED

    def __init__(self, source: str, arities: list):
        super().__init__(source + SHADOW, arities)
        self._lib.ft_races_found.restype = ctypes.c_longlong
        self._lib.ft_race_report.restype = ctypes.c_char_p
        self._lib.ft_race_report.argtypes = [ctypes.c_int]
        self.races: list = []
        self.found = 0

    def _launch(self, k, gx, gy, args):
        before = self._lib.ft_races_found()
        super()._launch(k, gx, gy, args)
        n = self._lib.ft_races_found()
        self.found += n - before
        self.races += [f"kernel polyft_k{k}: " + self._lib.ft_race_report(i).decode()
                       for i in range(before, min(n, MAX_REPORTS))]


class RaceRuntime(CudaRuntime):
    """A CudaModule run by the race-checking emulator (at the module's own block size)."""

    def load(self, module) -> Backend:
        return RaceBackend(module.source, module.arities)


def races(module, arrays: list, values: dict) -> list:
    """Runs `module` once on `arrays` (one per layout buffer) with lengths `values`: the race
    reports (empty: none found). The outputs land in `arrays` as in a plain run."""
    runtime = RaceRuntime(module)
    runtime(arrays, values)
    return runtime.backend.races
