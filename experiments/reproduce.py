"""`polyft reproduce`: run the paper's artefacts (the registry in registry.py), draw the plots,
index results/ and summarise what was written where."""
from __future__ import annotations

import glob
import importlib
import os
import time

from polyft.errors import PolyftError

from . import plot
from .registry import ARTEFACTS, INDEX, write_index


def _changed(out_dir, before):
    return sorted(f for f in glob.glob(os.path.join(out_dir, "*")) if os.path.getmtime(f) != before.get(f))


def _step(name, fn, out_dir) -> tuple:
    before = {f: os.path.getmtime(f) for f in glob.glob(os.path.join(out_dir, "*"))}
    t0 = time.perf_counter()
    try:
        fn()
        status = "ok"
    except Exception as e:  # one failing artefact must not hide the others' results
        status = f"FAILED: {type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    print(f"[{name}] {status} in {seconds:.1f} s", flush=True)
    return name, status, seconds, _changed(out_dir, before)


def reproduce(names=None, preset: str = "quick", out_dir: str = "results", plots: bool = True) -> list:
    """Run the named artefacts (all by default), then the plots and the index; returns rows
    (name, status, seconds, files written)."""
    names = list(names or ARTEFACTS)
    unknown = [n for n in names if n not in ARTEFACTS]
    if unknown:
        raise PolyftError(f"unknown artefacts {unknown}; known: {', '.join(ARTEFACTS)}", op="reproduce")
    os.makedirs(out_dir, exist_ok=True)
    rows = [_step(n, lambda n=n: importlib.import_module(ARTEFACTS[n].module).run(preset=preset, out_dir=out_dir),
                  out_dir) for n in names]
    if plots:
        rows.append(_step("plot", lambda: plot.run(out_dir), out_dir))
    write_index(out_dir)
    return rows


def summary(rows, out_dir: str = "results") -> str:
    lines = ["| artefact | reproduces | status | seconds | files |", "|---|---|---|---|---|"]
    for name, status, seconds, files in rows:
        paper = ARTEFACTS[name].paper if name in ARTEFACTS else "plots from the CSVs"
        lines.append(f"| {name} | {paper} | {status} | {seconds:.1f} | {', '.join(files) or '-'} |")
    total = sum(r[2] for r in rows)
    lines.append(f"\n{total:.0f} s in all; what every file shows: {os.path.join(out_dir, INDEX)}")
    return "\n".join(lines)
