"""The registry of the paper's artefacts: what each reproduces and every file it writes into
results/, with one sentence on what the file shows. The names here carry no preset; on disk every
file but UNTAGGED ones carries the preset it was made with (tagged: fig7.csv -> fig7_quick.csv).

It is the one list of artefacts: `polyft reproduce` runs them (reproduce.py), and results/README.md
is generated from it (write_index), so the index cannot go stale. Both the reproduce driver and the
plotting script write the index, so it lives below both.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from polyft.emit import isa


PRESETS = ("quick", "paper")


def tagged(name: str, preset: str) -> str:
    """A results file's name carrying its preset, `fig7.csv` -> `fig7_quick.csv`: a --paper run
    never overwrites the quick results, nor a quick run the paper's."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: one of {PRESETS}")
    stem, ext = os.path.splitext(name)
    return f"{stem}_{preset}{ext}"


@dataclass(frozen=True)
class Artefact:
    module: str  # has run(preset, out_dir)
    paper: str  # what of the paper it reproduces
    files: dict  # file name in results/ -> one sentence on what it shows


ARTEFACTS = {
    "table5": Artefact("polyft.experiments.table5", "Figure 6 / Table 5", {
        "table5.txt": "T, the wavefront bounds and the transformed access maps of region3 of the stacked RNN, "
                      "as in Figure 6 and Table 5."}),
    "deps_time": Artefact("polyft.experiments.deps_time", "§5 analysis cost", {
        "deps_time.csv": "How long tracing, the ISL model and the dependence analysis take per workload at the "
                         "paper's sizes, with symbolic and concrete lengths."}),
    "compile_time": Artefact("polyft.experiments.compile_time", "analysis and compilation that scale", {
        "compile_time.csv": "Seconds per stage of ft.compile (trace, coarsen, ISL model, dependences, schedule, "
                            "storage, C source, C compiler) against the layers of a chain, the branches per layer "
                            "and the layers of a transformer encoder, with the schedule each gets; and one layer "
                            "with an n x n weight captured or passed as an input (n up to 4096)."}),
    "schedule_vs_isl": Artefact("polyft.experiments.schedule_vs_isl", "§5.2 reordering", {
        "schedule_vs_isl.csv": "Parallel loop dims, sequential steps and steps as the generated C runs them of "
                               "polyft's schedule against the nest as written and against isl's own scheduler, "
                               "beside the program's critical path, per workload."}),
    "cpu_rnn": Artefact("polyft.experiments.cpu_rnn", "CPU timings of the RNN family", {
        "cpu_rnn.csv": "Eager numpy, generated C (original and auto schedules, the auto one with its measured "
                       "choice of the original order and alone; the stacked LSTM also with a tiled wavefront by "
                       "hand), torch per-cell loops, torch.nn.LSTM and JAX (jax.jit of lax.scan) on the RNN "
                       "workloads at a few depths, on the CPU; `schedule`: the schedule most calls ran."}),
    "grad_bench": Artefact("polyft.experiments.grad_bench", "Differentiation (beyond the paper): forward + backward", {
        "grad_bench.csv": "Forward + backward of the stacked LSTM: polyft's pullback compiled to C (one program "
                          "with the forward) and eager, torch.nn.LSTM's forward+backward and jax.grad of a "
                          "lax.scan LSTM on the CPU, with the program's memory (prog.memory) and, at small shapes, its "
                          "critical path."}),
    "interop": Artefact("polyft.experiments.interop", "Calling compiled programs from torch and JAX (beyond the "
                        "paper)", {
        "interop.csv": "Microseconds per call of a compiled program alone (its native code; its call on numpy "
                       "arrays) and through ft.torch.function (forward without and with autograd, backward through "
                       "the compiled pullback) and ft.jax.function (jax.jit), for a one-element program and the "
                       "character model's two-layer LSTM, with each boundary's cost over the program alone and the "
                       "load average while measuring."}),
    "threads": Artefact("polyft.experiments.threads", "CPU threads that never hurt", {
        "threads.csv": "The generated C of every workload at Figure 7's quick shapes on one thread, on every "
                       "core and at its measured default, with the machine idle and with one core busy, and "
                       "each count's time over one thread's."}),
    "call_overhead": Artefact("polyft.experiments.call_overhead", "The cost of a call beyond its code", {
        "call_overhead.csv": "prog(*inputs) against bind() (buffers bound once) on one thread: x @ W at 8 x 8 "
                             "and 256 x 256 and the stacked LSTM's pullback (79 buffers), with each result "
                             "dropped and with results kept; median, 90th percentile, page faults per call and "
                             "the load average."}),
    "gemm": Artefact("polyft.experiments.gemm", "The generated GEMM against the CPU's peak", {
        "gemm.csv": "GFLOP/s of the generated C's matrix products (x @ W over a batch of rows, x @ W + h @ U as "
                    "one GEMM, an LSTM's four gates) on one core, built for every ISA level the machine runs "
                    "(SSE2, AVX2, AVX-512, native), and unpacked where the C target packs the shared matrices, "
                    "beside torch's and numpy's sgemm on one thread (the gates concatenated, as nn.LSTM) and "
                    "OpenBLAS at each lower level ($OPENBLAS_CORETYPE, in a child process), each level's "
                    "theoretical peak (clock x FP units x lanes x 2) and a probe of independent vector "
                    "operations at its width (multiply-adds, or multiplies and adds apart without FMA)."}),
    "fig2": Artefact("polyft.experiments.fig2", "Figure 2", {
        "fig2.csv": "Time against stack depth of the stacked RNN and the stacked LSTM, every system, the auto "
                    "schedule also alone and (LSTM) a tiled wavefront by hand (GPU systems as absent rows where "
                    "there is no GPU)."}),
    "fig7": Artefact("polyft.experiments.fig7", "Figure 7", {
        "fig7.csv": "End-to-end time of all seven workloads under every system, one shape each."}),
    "fig8": Artefact("polyft.experiments.fig8", "Figure 8", {
        "fig8.csv": "Time of the stacked LSTM, dilated RNN and grid RNN against depth and against sequence "
                    "length, for the \"middle\" and \"large\" models."}),
    "table7": Artefact("polyft.experiments.table7", "Table 7", {
        "table7.csv": "Bytes moved per workload with deferred and with materialised views, modelled exactly "
                      "from the access relations at the paper's shapes.",
        "table7_accesses.csv": "Every read and write behind table7_<preset>.csv: its access map, kind (view or not) "
                               "and tile counts.",
        "table7.txt": "Table 7 as text: the model's GB per plan and their ratio beside the paper's measured "
                      "A100 DRAM traffic."}),
    "memory": Artefact("polyft.experiments.memory", "Storage that follows the live set: memory before and after "
                       "contraction", {
        "memory.csv": "Per workload at the small and the paper shape: bytes of inputs + outputs, of the "
                      "intermediates with one element per instance and as contracted under the auto schedule, "
                      "the packed copies of large weights, their ratios, and the bytes the generated code moves "
                      "beside Table 7's deferred model.",
        "memory_large.csv": "(--paper only) Flash attention compiled in C at a shape whose uncontracted buffers exceed "
                            "the machine's memory: bytes before/after contraction, peak memory, time beside "
                            "torch's SDPA, relative error."}),
}
# what the plotting step (experiments/plot.py) draws from the CSVs above
PLOTS = {
    "fig2.png": "Figure 2: time (log) against stack depth, one line per system, stacked RNN and stacked LSTM.",
    "fig7.png": "Figure 7: time (log) per workload and system as bars, with polyft's speedup over the best "
                "baseline written on polyft's bar and a star on that baseline's.",
    "fig7_speedup.csv": "The speedups annotated in fig7_<preset>.png: polyft's time against the fastest baseline per "
                        "workload.",
    "fig8.png": "Figure 8: time (log) against depth and against sequence length for three RNNs, two model "
                "sizes.",
    "table7.png": "Table 7 (model): GB moved with deferred vs materialised views per workload, with the ratio "
                  "under each name and the paper's measured ratios in a footnote.",
    "memory.png": "Memory before vs after storage contraction: total bytes relative to inputs + outputs (log) per "
                  "workload, with the ratios under each name, paper shape and small shape.",
    "compile_time.png": "Seconds per stage of ft.compile against each family's size (log-log), with the total's "
                        "fitted growth exponent.",
    "depth_scaling.csv": "time(deepest) / time(depth 1) per system from fig2 and fig8 (linear growth would "
                         "equal the depth ratio), and time(depth 20) / time(depth 1) as the paper quotes it.",
}
# files that other scripts (not `polyft reproduce`) write into results/
OTHER = {
    "table7_ncu.csv": "(--paper only) DRAM / L2 / L1 bytes measured with Nsight Compute on a GPU "
                      "(python -m polyft.experiments.table7 --ncu).",
    "gpu_bench.csv": "Generated CUDA against cuDNN, SDPA, cuBLAS and a blocked BigBird on a GPU "
                     "(scripts/gpu_session.sh, experiments/gpu_bench.py).",
}
INDEX = "README.md"
UNTAGGED = ("gpu_bench.csv", INDEX)  # written outside the artefacts' presets: their names carry none


def described() -> dict:
    """Every file results/ may hold (untagged name) -> (who writes it, one sentence)."""
    out = {f: (name, text) for name, a in ARTEFACTS.items() for f, text in a.files.items()}
    out.update({f: ("plot", text) for f, text in PLOTS.items()})
    out.update({f: ("GPU runs", text) for f, text in OTHER.items()})
    out[INDEX] = ("reproduce", "This index, generated from the registry in experiments/registry.py.")
    return out


def entry(file: str) -> tuple | None:
    """(registry name, preset or "-", who writes it, one sentence) of a file in results/: a file
    `x_quick.csv` is described by the entry for `x.csv`; None for a file the registry does not know."""
    known = described()
    if file in UNTAGGED:
        return (file, "-") + known[file]
    if file in {level for levels in isa.LEVELS.values() for level in levels}:
        return (file, "-", "reproduce", f"A folder of the same artefacts with the generated C built for -march={file} "
                "and torch and JAX capped at that level (`POLYFT_MARCH=" + file + " polyft reproduce NAME --out "
                "results/" + file + "`): what a machine of that instruction set would measure; its own index.")
    stem, ext = os.path.splitext(file)
    base, _, preset = stem.rpartition("_")
    name = base + ext
    if preset in PRESETS and name in known and name not in UNTAGGED:
        return (name, preset) + known[name]
    return None


def write_index(out_dir: str = "results") -> str:
    """Write <out_dir>/README.md (index_text) and return its path."""
    path = os.path.join(out_dir, INDEX)
    text = index_text(out_dir)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def index_text(out_dir: str = "results") -> str:
    """results/README.md: every file in out_dir with its preset and one sentence, from the registry."""
    present = sorted({os.path.basename(f) for f in glob.glob(os.path.join(out_dir, "*"))} | {INDEX})
    lines = ["# results/", "",
             "Generated by `polyft reproduce` from the registry in experiments/registry.py (do not edit by "
             "hand). Every file name ends in the preset it was made with: `_quick` (`--quick`, the default: "
             "small sizes on the CPU) or `_paper` (`--paper`: the paper's shapes). Every CSV is tidy (one row "
             "per measurement) with the device, commit and date; every PNG is drawn from the CSVs by "
             "experiments/plot.py.", "",
             "| file | written by | preset | what it shows |", "|---|---|---|---|"]
    found = set()
    for f in present:
        name, preset, who, text = entry(f) or (f, "-", "?", "not in the registry of experiments/registry.py")
        found.add(name)
        lines.append(f"| {f} | {who} | {preset} | {text} |")
    missing = [f for f in described() if f not in found]
    if missing:
        lines += ["", "Not here under either preset (written on a GPU machine, or their artefact was not run "
                  "into this folder): " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"
