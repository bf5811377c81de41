"""`polyft reproduce`: run the paper's artefacts and summarise what was written where."""
from __future__ import annotations

import glob
import importlib
import os
import time

# artefact name -> module (each has run(preset, out_dir))
ARTEFACTS = {
    "table5": "experiments.table5",
    "deps_time": "experiments.deps_time",
    "schedule_vs_isl": "experiments.schedule_vs_isl",
    "cpu_rnn": "experiments.cpu_rnn",
}


def reproduce(names=None, preset: str = "quick", out_dir: str = "results") -> list:
    """Run the named artefacts (all by default); returns rows (name, status, seconds, files)."""
    names = list(names or ARTEFACTS)
    unknown = [n for n in names if n not in ARTEFACTS]
    if unknown:
        from polyft.errors import PolyftError
        raise PolyftError(f"unknown artefacts {unknown}; known: {', '.join(ARTEFACTS)}", op="reproduce")
    rows = []
    for name in names:
        before = {f: os.path.getmtime(f) for f in glob.glob(os.path.join(out_dir, "*"))}
        t0 = time.perf_counter()
        try:
            importlib.import_module(ARTEFACTS[name]).run(preset=preset, out_dir=out_dir)
            status = "ok"
        except Exception as e:  # one failing artefact must not hide the others' results
            status = f"FAILED: {type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        files = sorted(f for f in glob.glob(os.path.join(out_dir, "*"))
                       if os.path.getmtime(f) != before.get(f))
        rows.append((name, status, seconds, files))
        print(f"[{name}] {status} in {seconds:.1f} s", flush=True)
    return rows


def summary(rows) -> str:
    lines = ["| artefact | status | seconds | files |", "|---|---|---|---|"]
    for name, status, seconds, files in rows:
        lines.append(f"| {name} | {status} | {seconds:.1f} | {', '.join(files) or '-'} |")
    return "\n".join(lines)
