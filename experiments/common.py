"""What every artefact shares: the row metadata (device, commit, date), the names of its files
(with the preset: registry.tagged), the command line (`python -m polyft.experiments.NAME` runs
what `polyft reproduce NAME` runs) and `sweep`, which measures points into a CSV one at a time,
so that an interrupted run keeps what it measured and --resume measures only what is missing."""
from __future__ import annotations

import argparse
import collections
import datetime
import math
import os
import platform
import subprocess
import sys

import pandas as pd
from tqdm import tqdm

from polyft.emit import isa
from polyft.errors import PolyftError

from .registry import tagged


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


def cpu_family() -> str:
    """The CPU's family and model as /proc/cpuinfo gives them ("family 25 model 1"), or "unknown"."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("cpu family", "model") and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
                if not line.strip():
                    break
    except OSError:
        pass
    return f"family {fields['cpu family']} model {fields['model']}" if len(fields) == 2 else "unknown"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def meta() -> dict:
    """The columns every row carries: where, what code, when, and the ISA level of the
    generated C and of the peers (cap_peers)."""
    level = isa.march()
    env = PEER_ISA.get(level)
    peer = env["ATEN_CPU_CAPABILITY"] if env and _capped(env) else "native"
    return {"device": cpu_name(), "commit": commit(), "date": datetime.date.today().isoformat(),
            "isa": f"{level} ({isa.current().name})", "peer_isa": peer}


# XLA hands its dots to YNNPACK, which picks its kernels from the CPU and ignores
# --xla_cpu_max_isa: "capped at AVX2" it ran a 1024^3 sgemm at 245 GFLOP/s on one AVX-512 core,
# 1.7x the AVX2 peak. Without it XLA emits its own dots, which the cap holds (127 GFLOP/s, 89% of
# the AVX2 peak). On a real AVX2 host JAX would run YNNPACK's AVX2 kernels, maybe a little faster.
XLA_OWN_DOTS = "--xla_cpu_experimental_ynn_fusion_type="

# The ISA ceiling for the peers that $POLYFT_MARCH sets for the generated C, so that an AVX-512
# host measures what an AVX2 host would see from every system: torch's ATen kernels, MKL,
# oneDNN and XLA read these variables when they load (numpy's OpenBLAS too, but numpy is loaded
# before any experiment runs: $OPENBLAS_CORETYPE is the caller's to set).
PEER_ISA = {
    "haswell": dict(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2",
                    XLA_FLAGS=f"--xla_cpu_max_isa=AVX2 {XLA_OWN_DOTS}"),
    "skylake-avx512": dict(ATEN_CPU_CAPABILITY="avx512", MKL_ENABLE_INSTRUCTIONS="AVX512",
                           ONEDNN_MAX_CPU_ISA="AVX512_CORE", XLA_FLAGS="--xla_cpu_max_isa=AVX512"),
}


def cap_peers() -> bool:
    """Cap torch and JAX at the ISA level of $POLYFT_MARCH (PEER_ISA), before they load; a
    level without a cap (native, SSE2) leaves them alone. False where one has already loaded
    under other settings: it runs at the CPU's own level, which is what `meta` then names in
    the rows' peer_isa (a process that imported torch first, a test session, still runs; its
    rows do not claim a cap the peers did not get)."""
    env = PEER_ISA.get(isa.march())
    if not env:
        return True
    if any(m in sys.modules for m in ("torch", "jax")) and not _capped(env):
        return False
    for key, value in env.items():
        if key == "XLA_FLAGS":
            flags = os.environ.get(key, "")
            os.environ[key] = flags if "xla_cpu_max_isa" in flags else f"{flags} {value}".strip()
        else:
            os.environ.setdefault(key, value)
    return True


def _capped(env: dict) -> bool:
    """Whether the peers' ISA variables hold the level's cap (XLA_FLAGS is appended to, not set)."""
    return all(os.environ.get(k) == v for k, v in env.items() if k != "XLA_FLAGS")


def preset_args(parser: argparse.ArgumentParser, quick: str = "small sizes on the CPU (the default)",
                paper: str = "the paper's shapes (for a GPU machine)", out: str | None = None) -> None:
    """The sizes and the folder: --quick (the default) or --paper, and --out DIR (default `out`;
    None: a fresh folder, fresh_out)."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--paper", action="store_true", help=paper)
    parser.add_argument("--out", default=out, metavar="DIR",
                        help=f"output folder (default: {out})" if out else
                        f"output folder (default: a fresh {FRESH}/<date>-<host>/; the committed results/ only when "
                        "named: --out results)")


FRESH = "out"  # where runs write unless told (--out): never the committed results/


def fresh_out(resume: bool = False) -> str:
    """The folder a run writes when --out is not given: out/<date>-<host>, or -2, -3, ... where
    that exists (a run never mixes its files with an earlier run's, and never touches the
    committed results/); with --resume the latest of today's, to go on where it stopped."""
    base = os.path.join(FRESH, f"{datetime.date.today().isoformat()}-{platform.node() or 'host'}")
    folders = [base]
    while os.path.exists(folders[-1]):
        folders.append(f"{base}-{len(folders) + 1}")
    return folders[-2] if resume and len(folders) > 1 else folders[-1]


def preset(args: argparse.Namespace) -> str:
    return "paper" if args.paper else "quick"


def run_args(parser: argparse.ArgumentParser) -> None:
    """How artefacts run, beside preset_args (`polyft reproduce` and every artefact's command line)."""
    parser.add_argument("--resume", action="store_true",
                        help="keep the points already in this preset's CSVs and measure only the missing ones")
    parser.add_argument("--no-plots", action="store_true", help="skip redrawing the plots (experiments/plot.py)")


# -- files -----------------------------------------------------------------------------------

def path(out_dir: str, name: str, preset: str) -> str:
    """Where an artefact's file `name` (as the registry names it) of this preset lives."""
    return os.path.join(out_dir, tagged(name, preset))


def write_text(file: str, text: str) -> None:
    """Write a file whole or not at all (a temporary file beside it, then os.replace): an
    interrupted run leaves the previous version, never half a file."""
    os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
    tmp = f"{file}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, file)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_csv(df: pd.DataFrame, file: str) -> None:
    write_text(file, df.to_csv(index=False))


# -- sweeps ----------------------------------------------------------------------------------

def _cell(value) -> str:
    """A value identifying a point, as text that is the same from the point and read back from
    its CSV (4, 4.0 and "4" alike)."""
    if isinstance(value, float):
        return "" if math.isnan(value) else str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _measured(file: str, columns: list) -> dict:
    """The rows of a sweep's CSV per point: identity (its `columns` as text) -> DataFrame."""
    try:
        old = pd.read_csv(file)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        why = "it is empty" if isinstance(e, pd.errors.EmptyDataError) else e
        raise PolyftError(f"cannot resume from {file}: {why} (delete it, or run without --resume)", op="resume",
                          where="") from None
    missing = [c for c in columns if c not in old]
    if missing:
        raise PolyftError(f"cannot resume from {file}: it has no column {', '.join(missing)} (run without --resume)",
                          op="resume", where="")
    at = collections.defaultdict(list)
    for n, ident in enumerate(zip(*(old[c].map(_cell) for c in columns))):
        at[ident].append(n)
    return {ident: old.iloc[rows] for ident, rows in at.items()}


def sweep(name: str, preset: str, out_dir: str, points: list, measure, key, resume: bool = False) -> pd.DataFrame:
    """Measure every point into <out_dir>/<name>_<preset>.csv and return its rows, in the order of
    `points`. `measure(point)` gives the point's rows; `key(point)` the columns, with their values,
    that identify the point in each of its rows (workload, shape, depth, ...).

    The CSV is rewritten (whole, atomically) after every point, so an interruption loses at most
    the point in progress. With `resume` the points already in the CSV keep their rows and only
    the missing ones are measured; rows of points no longer in `points` are dropped. Without it the
    run starts afresh (overwriting this preset's file only). A progress bar with the time left runs
    on stderr when stderr is a terminal (tqdm's disable=None), so logs and tests stay clean."""
    file = path(out_dir, f"{name}.csv", preset)
    idents = [tuple(_cell(v) for v in key(p).values()) for p in points]
    done = _measured(file, list(key(points[0]))) if resume and os.path.exists(file) and points else {}
    rows = {ident: done[ident] for ident in idents if ident in done}
    todo = [(ident, p) for ident, p in zip(idents, points) if ident not in rows]

    def table() -> pd.DataFrame:
        return pd.concat([rows[ident] for ident in idents if ident in rows], ignore_index=True) if rows \
            else pd.DataFrame()

    with tqdm(total=len(points), initial=len(points) - len(todo), desc=name, unit="point", disable=None,
              leave=False, dynamic_ncols=True) as bar:
        for ident, p in todo:
            bar.set_postfix_str(" ".join(ident), refresh=True)
            rows[ident] = pd.DataFrame(measure(p))
            write_csv(table(), file)
            bar.update()
    if not todo and len(done) > len(rows):  # nothing measured, but points dropped
        write_csv(table(), file)
    return table()
