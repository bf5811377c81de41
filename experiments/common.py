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

import pandas as pd
from tqdm import tqdm

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


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def meta() -> dict:
    return {"device": cpu_name(), "commit": commit(), "date": datetime.date.today().isoformat()}


def preset_args(parser: argparse.ArgumentParser, quick: str = "small sizes on the CPU (the default)",
                paper: str = "the paper's shapes (for a GPU machine)") -> None:
    """The sizes and the folder: --quick (the default) or --paper, and --out DIR."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--paper", action="store_true", help=paper)
    parser.add_argument("--out", default="results", help="output folder (default: results)")


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
    old = pd.read_csv(file)
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
